"""Fault suite, local backend (issue 13 items 3 and 6): one table of faults, each injected into a
real `launch local` run (2 simulated nodes x 1 process, the tiny convnet unless the fault needs its
own program). For each: the launcher's exit code is honest, status.json names the first failing
rank/node and the cause (none for a stop), no process carrying the run id survives,
checkpoints/latest names a complete checkpoint, and a `launch resume` ends with the uninterrupted
run's param_sha256. Every fault records one row (tests/faults/record.py -> RELIABILITY.md), pass or
fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from common import (
    agent_pid,
    assert_latest_complete,
    convnet,
    fault_row,
    final_sha,
    first_failure_text,
    first_step_time,
    kill_orphans,
    latest_checkpoint,
    orphans,
    rank_pid,
    read_json,
    run_id,
    seconds,
    status,
    wait_for,
    wait_step,
)
from conftest import LAUNCH, once, run_launch
from launchers import procs

# real training runs of tens of seconds each: `make test` runs them, `make test-fast` (the inner
# loop) does not
pytestmark = pytest.mark.slow

BACKEND = "local"
NODES = ["local", "--nodes", "2", "--gpus-per-node", "1"]
WORLD = 2
TRAIN = convnet(40, 10)  # the reference and every resume (resume_equal compares with it)
SLOW = ["--step-delay", "0.25"]  # fault runs: 40 steps >= 10 s, so the fault lands mid-training
KILL_AT = 12  # after the first checkpoint (step 10), well before the end


class Job:
    """One `launch local` run in the background, in its own session (Ctrl-C goes to its process
    group)."""

    def __init__(
        self,
        wd: Path,
        name: str,
        *opts: str,
        prog: list[str] | None = None,
        out: str | None = None,
        runs: Path | None = None,
    ) -> None:
        self.run_dir = str((runs or wd / "runs") / name)
        self.out, self.err = Path(out or wd / f"{name}.out"), wd / f"{name}.err"
        self.t0 = time.time()
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen(
                [
                    LAUNCH,
                    *NODES,
                    *opts,
                    "--run-dir",
                    self.run_dir,
                    "--",
                    *(prog or [*TRAIN, *SLOW]),
                ],
                stdout=o,
                stderr=e,
                cwd=wd,
                start_new_session=True,
            )
        self.ended: float | None = None
        wait_for(
            lambda: Path(self.run_dir, "run.yaml").is_file() or self.proc.poll() is not None,
            60,
            "run.yaml",
        )
        self.run_id = run_id(self.run_dir)

    def step(self, n: int, attempt: int = 0) -> float:
        return wait_step(
            self.run_dir, n, attempt=attempt, world=WORLD, alive=lambda: self.proc.poll() is None
        )

    def finish(self, timeout: float = 120) -> int:
        rc = self.proc.wait(timeout=timeout)
        self.ended = self.ended or time.time()
        return rc

    def end_line(self) -> str:
        lines = [ln for ln in self.err.read_text().splitlines() if ln.startswith("launch: run ")]
        return lines[-1] if lines else "(no end line)"

    def master_port(self, attempt: int = 0) -> int:
        return yaml.safe_load(Path(self.run_dir, "run.yaml").read_text())["attempts"][attempt][
            "master_port"
        ]


@pytest.fixture(scope="module")
def reference(request):
    """The uninterrupted run: its param_sha256, and launch -> first step (the cold start); made once
    per make test run (the rows run on several workers: conftest.SPLIT_LOCAL)."""

    def make(d):
        t0 = time.time()
        p = run_launch(*NODES, "--run-dir", str(Path(d, "run")), "--", *TRAIN, cwd=d, timeout=180)
        assert p.returncode == 0, p.stderr[-3000:]
        return {
            "sha": final_sha(Path(d, "run")),
            "cold_start_s": seconds(t0, first_step_time(Path(d, "run"), 0)),
        }

    return once(request, "local-faults-ref", make)


def finish_row(job: Job, row: dict, *, code: int, state: str, fault_at: float) -> dict:
    """The checks every fault shares: the exit code, the state, no orphans, latest complete."""
    rc = job.finish()
    st = status(job.run_dir)
    row.update(
        exit_code=rc,
        user_sees=job.end_line(),
        first_failure=first_failure_text(st),
        detection_s=seconds(fault_at, job.ended),
    )
    left = orphans(job.run_id)
    row["orphans"] = len(left)
    assert rc == code, (rc, job.err.read_text()[-3000:])
    assert st["state"] == state, (st, job.err.read_text()[-3000:])
    assert not left, left
    assert_latest_complete(job.run_dir)
    return st


def resume_row(job: Job, row: dict, reference: dict, fault_at: float) -> None:
    """`launch resume` (the normal speed); recovery = fault -> first resumed step; the end equals
    the reference."""
    attempt = len(yaml.safe_load(Path(job.run_dir, "run.yaml").read_text())["attempts"])
    p = run_launch("resume", job.run_dir, "--", *TRAIN, timeout=180)
    row["recovery_s"] = seconds(fault_at, first_step_time(job.run_dir, attempt))
    row["cold_start_s"] = reference["cold_start_s"]
    row["resume_equal"] = final_sha(job.run_dir) == reference["sha"]
    assert p.returncode == 0, p.stderr[-3000:]
    assert row["resume_equal"], (final_sha(job.run_dir), reference["sha"])
    assert not orphans(job.run_id)


def ff(st: dict) -> dict:
    assert st.get("first_failure"), st
    return st["first_failure"]


def inject(wd: Path, name: str, act: Callable[[Job], object], *opts: str) -> tuple[Job, float]:
    """Start a slow run, let it pass its first checkpoint, do `act` to it: (the job, when)."""
    job = Job(wd, name, *opts)
    job.step(KILL_AT)
    t = time.time()
    act(job)
    return job, t


# ------------------------------------------------------------------ the faults
def kill_worker(wd, row, reference):
    job, t = inject(wd, "kw", lambda j: os.kill(rank_pid(j.run_id, 1), signal.SIGKILL))
    st = finish_row(job, row, code=1, state="FAILED", fault_at=t)
    assert (ff(st)["rank"], ff(st)["node"], ff(st)["signal"]) == (1, 1, "SIGKILL"), st
    assert job.end_line() == "launch: run FAILED (rank 1 on node 1, signal SIGKILL)"
    resume_row(job, row, reference, t)


def kill_agent(wd, row, reference):
    job, t = inject(wd, "ka", lambda j: os.kill(agent_pid(j.run_id, 1), signal.SIGKILL))
    st = finish_row(job, row, code=1, state="FAILED", fault_at=t)
    assert ff(st)["node"] == 1 and ff(st)["signal"] == "SIGKILL" and ff(st).get("rank") is None, st
    resume_row(job, row, reference, t)


def kill_launcher(wd, row, reference):
    # the job outlives status + cancel by far
    job = Job(wd, "kl", prog=[*TRAIN, "--step-delay", "1"])
    job.step(3)
    t = time.time()
    job.proc.kill()
    rc = job.finish()
    shown = run_launch("status", job.run_dir)
    row.update(
        exit_code=rc,
        detection_s=seconds(t, time.time()),
        user_sees="status: "
        + next(
            (ln.strip() for ln in shown.stdout.splitlines() if "launcher died" in ln),
            shown.stdout.strip()[:120],
        ),
    )
    st = status(job.run_dir)
    row["first_failure"] = first_failure_text(st) or st.get("reason")
    assert rc == -signal.SIGKILL
    assert (
        st["state"] == "FAILED"
        and st["reason"].startswith("launcher died")
        and st["surviving_pids"]
    ), st
    assert "still alive: pids" in shown.stdout, shown.stdout
    c = run_launch("cancel", job.run_dir, timeout=120)
    left = orphans(job.run_id)
    row["orphans"] = len(left)
    assert c.returncode == 0, c.stderr
    assert not left, left
    assert_latest_complete(job.run_dir)
    resume_row(job, row, reference, t)


def ctrl_c(wd, row, reference):
    job, t = inject(wd, "cc", lambda j: os.killpg(j.proc.pid, signal.SIGINT))
    st = finish_row(job, row, code=130, state="CANCELLED", fault_at=t)
    assert st["first_failure"] is None and st["stopped_by"] == "SIGINT", st
    assert job.end_line() == "launch: run CANCELLED (Ctrl-C)"
    resume_row(job, row, reference, t)


def cancel(wd, row, reference):
    cancels = []
    job, t = inject(
        wd, "cn", lambda j: cancels.append(run_launch("cancel", j.run_dir, timeout=120))
    )
    assert cancels[0].returncode == 0, cancels[0].stderr
    st = finish_row(job, row, code=143, state="CANCELLED", fault_at=t)
    assert st["first_failure"] is None and st["reason"] == "by launch cancel", st
    resume_row(job, row, reference, t)


def hung_rank(wd, row, reference):
    """The hang's stop ends the SIGSTOPped rank first (SIGKILL, its record `ended_as: hung`), so
    rank 0, waiting on it in a collective, cleans up within its grace without the agreed checkpoint:
    the last good one stands (issue 35 item 7). detection_s is the hang -> the run's end."""
    job, t = inject(
        wd, "hg", lambda j: os.kill(rank_pid(j.run_id, 1), signal.SIGSTOP), "--hang-timeout", "15"
    )
    good = latest_checkpoint(job.run_dir)[0]
    st = finish_row(job, row, code=1, state="FAILED", fault_at=t)
    assert ff(st)["rank"] == 1 and ff(st)["reason"].startswith("hang: process stopped"), st
    # rank 0 waits in DDP's all-reduce (backward)
    assert 1 in st["hang"]["stalled_ranks"], st["hang"]
    rec0, rec1 = (read_json(Path(job.run_dir, "status", f"rank{r}.json")) for r in (0, 1))
    assert rec1.get("signal") == "SIGKILL" and rec1.get("ended_as") == "hung", rec1
    # its cleanup completed
    assert rec0.get("exit_code") == 0 and not rec0.get("killed_after_grace"), rec0
    log0 = Path(job.run_dir, "logs", "node0", "rank0.log").read_text()
    done = [
        ln
        for ln in log0.splitlines()
        if ln.startswith("hang stop: rank 0") and ln.endswith("cleanup done")
    ]
    assert done and "preempted: checkpoint" not in log0, log0[-2000:]
    # nothing agreed
    assert latest_checkpoint(job.run_dir)[0] == good, (latest_checkpoint(job.run_dir), good)
    # the timeout + the stacks + the cleanup, not + the grace
    assert row["detection_s"] < 15 + 20, row
    row["user_sees"] = (
        f"{job.end_line()}; rank 0: hang stop, cleanup done, {good} stands; "
        f"run ended {row['detection_s']:.0f} s after the hang"
    )
    resume_row(job, row, reference, t)


DAEMON = """import os, sys, time
pid = os.fork()
if pid == 0:                       # child: a new session, then the daemon grandchild; the child exits at once
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(600)
    os._exit(0)
os.waitpid(pid, 0)
print("DAEMON STARTED", flush=True)
"""  # noqa: E501


def double_fork(wd, row, reference):
    (wd / "daemonize.py").write_text(DAEMON)
    job = Job(wd, "df", prog=["daemonize.py"])
    rc = job.finish()
    swept = [ln for ln in job.err.read_text().splitlines() if "the job left running" in ln]
    row.update(exit_code=rc, user_sees=" / ".join([*swept, job.end_line()]))
    left = orphans(job.run_id, settle_s=2)
    row["orphans"] = len(left)
    assert swept and swept[0].startswith(
        f"launch: killed {WORLD} process(es) the job left running (pids "
    ), swept
    assert rc == 0 and status(job.run_dir)["state"] == "COMPLETED", job.err.read_text()[-2000:]
    assert (
        len(
            [
                1
                for p in Path(job.run_dir, "logs").glob("node*/rank*.log")
                if "DAEMON STARTED" in p.read_text()
            ]
        )
        == WORLD
    )
    assert not left, left


def two_runs(wd, row, reference):
    """Two runs on the same nodes at once; cancelling one leaves the other running to COMPLETED."""
    a = Job(wd, "two-a")
    # still running when a's stop is over
    b = Job(wd, "two-b", prog=[*TRAIN, "--step-delay", "0.6"])
    a.step(KILL_AT)
    assert a.master_port() != b.master_port(), (a.master_port(), b.master_port())
    t = time.time()
    c = run_launch("cancel", a.run_dir, timeout=120)
    st = finish_row(a, row, code=143, state="CANCELLED", fault_at=t)
    other_alive = b.proc.poll() is None and bool(procs.tagged_pids(b.run_id))
    rc = b.finish(timeout=180)
    row["user_sees"] = f"{a.end_line()} / the other run: {b.end_line()}"
    # the other run was not disturbed
    row["other_run_equal"] = final_sha(b.run_dir) == reference["sha"]
    assert c.returncode == 0 and st["reason"] == "by launch cancel", (c.stderr, st)
    assert other_alive, "cancelling one run ended the other"
    assert rc == 0 and status(b.run_dir)["state"] == "COMPLETED", b.err.read_text()[-2000:]
    assert row["other_run_equal"]
    left = orphans(b.run_id)
    row["orphans"] += len(left)
    assert not left, left


def log_flood(wd, row, reference):
    """A rank writes 200 MB of log quickly: no line lost, bounded slowdown against the same program
    writing to /dev/null (bench/log_flood.py measures it side by side)."""
    mb, res = 200, wd / "flood.txt"
    p = subprocess.run(
        [sys.executable, "-u", "flood_worker.py"],
        cwd=wd,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "RANK": "1", "FLOOD_MB": str(mb), "FLOOD_RESULT": str(res)},
        timeout=300,
    )
    assert p.returncode == 0
    direct = float(res.read_text().split()[1])
    job = Job(
        wd,
        "lf",
        "--env",
        f"FLOOD_MB={mb}",
        "--env",
        f"FLOOD_RESULT={res}",
        prog=["flood_worker.py"],
        out=os.devnull,
    )  # the launcher streams it all too (to /dev/null here)
    rc = job.finish(timeout=300)
    n, ours = res.read_text().split()
    n, ours = int(n), float(ours)
    log = Path(job.run_dir, "logs", "node1", "rank1.log")
    with open(log, "rb") as f:
        lines = [ln for ln in f if ln[:1] == b"L"]
    pad = b"x" * 88
    lost = n - sum(1 for i, ln in enumerate(lines) if ln == b"L%09d %s\n" % (i, pad))
    log.unlink()
    ratio = ours / direct
    row.update(
        exit_code=rc,
        flood_s=ours,
        direct_s=direct,
        slowdown=round(ratio, 2),
        lines_lost=lost,
        user_sees=(
            f"{job.end_line()}; {mb} MB logged in {ours:.1f} s vs {direct:.1f} s to "
            f"/dev/null (x{ratio:.1f}), {lost} of {n} lines lost"
        ),
    )
    left = orphans(job.run_id)
    row["orphans"] = len(left)
    assert rc == 0 and status(job.run_dir)["state"] == "COMPLETED", job.err.read_text()[-2000:]
    assert lost == 0 and len(lines) == n, (lost, len(lines), n)
    assert ours <= 10 * direct + 30, (ours, direct)  # generous: a rule, not a speed figure
    assert not left, left


def fill(path: Path, leave: int) -> Path:
    """Take all but `leave` bytes of the file system holding path (one preallocated file)."""
    vfs = os.statvfs(path)
    filler = path / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, vfs.f_bavail * vfs.f_frsize - leave))
    return filler


def disk_full(wd, row, reference):
    """The run dir on a 16 MB tmpfs, filled after the first checkpoint (step 10) to 150 KB free: the
    save of step 20 (2 x ~280 KB) runs out of space."""
    mnt = wd / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    job = None
    try:
        job = Job(wd, "run", runs=mnt / "runs")  # the launcher's own output off the small disk
        job.step(KILL_AT)
        filler = fill(mnt, 150 * 1024)
        t = time.time()
        st = finish_row(job, row, code=1, state="FAILED", fault_at=t)
        ckpt = Path(job.run_dir, "checkpoints")
        said = [
            ln
            for ln in Path(job.run_dir, "logs", "node0", "rank0.log").read_text().splitlines()
            if ln.startswith("disk full: ")
        ]
        row["user_sees"] = f"{job.end_line()} / rank log: {said[0] if said else '(nothing)'}"
        assert ff(st)["exit_code"] == 1, st
        assert said == [
            f"disk full: the checkpoint {ckpt / 'step-00000020'} could not be written (no space "
            "left on device); removed; checkpoints/latest still names step-00000010"
        ], said
        assert (ckpt / "latest").read_text().strip() == "step-00000010" and not (
            ckpt / "step-00000020"
        ).exists()
        filler.unlink()
        resume_row(job, row, reference, t)
        launcher_on_full_disk(job.run_dir, mnt)
    finally:
        if job is not None:
            kill_orphans(job.run_id)
        if subprocess.run(["umount", str(mnt)]).returncode:
            subprocess.run(["umount", "-l", str(mnt)])


def launcher_on_full_disk(run_dir: str, mnt: Path) -> None:
    """The launcher's own record on a disk with no space left: one line naming the path, no
    traceback, no temporary left, the old status.json intact (the issue saw `OSError: [Errno 28]`
    from the status write)."""
    fill(mnt, 0)
    before = Path(run_dir, "status.json").read_text()
    code = (
        "import sys; from launchers.records.rundir import RunDir; "
        f"st = RunDir({run_dir!r}).update_status(reason='x'); print(st['reason'])"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "x\n", p.stderr
    assert (
        p.stderr
        == f"launch: disk full: cannot write {run_dir}/status.json (No space left on device); not "
        "recorded: state COMPLETED\n"
    ), p.stderr
    assert Path(run_dir, "status.json").read_text() == before
    assert not list(Path(run_dir).glob("status.json.tmp*"))


@dataclass(frozen=True)
class Fault:
    name: str
    run: Callable
    slow: bool = False


FAULTS = [
    Fault("SIGKILL of one worker", kill_worker),
    Fault("SIGKILL of one agent", kill_agent),
    Fault("SIGKILL of the launcher, then status/cancel/resume", kill_launcher, slow=True),
    Fault("Ctrl-C", ctrl_c),
    Fault("launch cancel", cancel),
    Fault("hung rank (SIGSTOP, --hang-timeout 15)", hung_rank, slow=True),
    Fault("program double-forks a daemon", double_fork),
    Fault("disk full while a checkpoint is written", disk_full),
    Fault("two runs at once on the same nodes, one cancelled", two_runs, slow=True),
    Fault("a rank writes 200 MB of log quickly", log_flood),
]


@pytest.mark.parametrize(
    "fault",
    [pytest.param(f, id=f.name, marks=[pytest.mark.slow] if f.slow else []) for f in FAULTS],
)
def test_fault(fault, reference, workdir):
    with fault_row(BACKEND, fault.name) as row:
        try:
            fault.run(workdir, row, reference)
        finally:
            # a failed check leaves nothing running
            for p in Path(workdir, "runs").glob("*/run.yaml"):
                kill_orphans(run_id(p.parent))
