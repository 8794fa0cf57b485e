"""Fault suite, Slurm backend (issue 13): one table-driven test, one row per fault, on the real dev cluster
(slurmctld + 4 slurmd in network namespaces lnode1..4; `make slurm-up`).

Every row asserts what the issue asks: the exit code is honest, status.json names the first failing node/rank
and the cause, no process carrying the run id survives on any node (the nodes share this machine's pid
namespace: one /proc scan sees them all), checkpoints/latest names a complete checkpoint, and a resume (by hand
or by Slurm's requeue) ends with the uninterrupted run's param_sha256. Each row is recorded once, pass or fail
(tests/faults/record.py -> RELIABILITY.md). Every disruption of the shared cluster is undone in a finally
(slurmd restarted and the node resumed, slurmctld SIGCONTed, our jobs scancelled).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from common import (agent_pid, assert_latest_complete, convnet, fault_row, final_sha, first_failure_text,
                    first_step_time, kill_orphans, metrics, orphans, rank_pid, run_id, seconds, wait_for, wait_step)
from conftest import LAUNCH, ROOT, read_json, require_cluster, run_launch

pytestmark = pytest.mark.slurm

CLUSTER = str(ROOT / "slurm" / "dev-cluster.sh")
STEPS, EVERY, HIT = 1000, 100, 150        # faults strike once every rank is past step HIT (a checkpoint exists)
ARGS = convnet(STEPS, EVERY)
SLURM = ["slurm", "--nodes", "2", "--gpus-per-node", "1", "--time", "10"]
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    """param_sha256 of the uninterrupted run (local backend, same shape: the hash is the same on every backend)."""
    d = tmp_path_factory.mktemp("slurm-ref")
    p = run_launch("local", "--nodes", "2", "--gpus-per-node", "1", "--run-dir", str(d / "run"), "--", *ARGS,
                   cwd=d, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return final_sha(d / "run")


@dataclass
class Ctx:
    """One fault's run: its dir, the reference hash, the row being filled."""
    run_dir: str
    ref: str
    row: dict
    t_launch: float = 0.0

    @property
    def rid(self) -> str:
        return run_id(self.run_dir)

    def jobs(self) -> list[str]:
        p = Path(self.run_dir, "slurm", "jobs")
        return [ln.split()[-1] for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []

    def submit(self, *opts: str, prog: list[str] = ARGS, wait_step_: int | None = HIT) -> None:
        self.t_launch = time.time()
        run_launch(*SLURM, *opts, "--run-dir", self.run_dir, "--", *prog, check=True)
        if wait_step_ is not None:
            self.started()

    def started(self) -> None:
        """Both ranks past step HIT of attempt 0; the cold start (launch -> first step) goes in the row."""
        wait_step(self.run_dir, HIT, world=2, timeout=240)
        self.row["cold_start_s"] = seconds(self.t_launch, first_step_time(self.run_dir, 0))

    def status(self) -> dict:
        return __import__("json").loads(run_launch("status", self.run_dir, "--json", check=True).stdout)

    def until(self, pred: Callable[[dict], bool], t_fault: float, timeout: float = 180) -> dict:
        """Poll `launch status` until pred(status); the time from the fault goes in detection_s."""
        def check():
            s = self.status()
            return s if pred(s) else None
        st = wait_for(check, timeout, f"status of {self.run_dir}", 0.3)
        self.row["detection_s"] = round(time.time() - t_fault, 2)
        return st

    def ended(self, t_fault: float, timeout: float = 180) -> dict:
        """The verdict: status terminal, `launch wait`'s exit code, the first failure, no orphans."""
        st = self.until(lambda s: s["state"] in TERMINAL, t_fault, timeout)
        p = run_launch("wait", self.run_dir, timeout=120)
        self.row["exit_code"] = p.returncode
        self.row["first_failure"] = first_failure_text(st)
        self.row["end_line"] = (p.stderr.strip().splitlines() or [""])[-1]
        self.no_orphans()
        return st

    def no_orphans(self) -> None:
        left = orphans(self.rid)
        self.row["orphans"] = self.row.get("orphans", 0) + len(left)
        assert not left, f"processes of the run left: {left}"

    def resumed(self, t_fault: float, attempt: int, by_hand: bool = True) -> None:
        """checkpoints/latest is complete; the resume (launch resume, or Slurm's requeue) starts from it and
        ends with the uninterrupted run's param_sha256; recovery = fault -> first resumed step."""
        name = assert_latest_complete(self.run_dir)
        if by_hand:
            run_launch("resume", self.run_dir, check=True)
        p = run_launch("wait", self.run_dir, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        # a later attempt than `attempt` is fine: another test's node fault may requeue the resumed job
        later = [m for m in metrics(self.run_dir) if (m.get("attempt") or 0) >= attempt and "step" in m]
        assert later and later[0]["step"] > EVERY, f"attempt {attempt} did not start from a checkpoint ({name})"
        self.row["recovery_s"] = seconds(t_fault, first_step_time(self.run_dir, later[0]["attempt"]))
        self.row["resume_equal"] = final_sha(self.run_dir) == self.ref
        assert self.row["resume_equal"], f"resumed param_sha256 {final_sha(self.run_dir)} != {self.ref}"
        self.no_orphans()

    def cleanup(self) -> None:
        for job in self.jobs():
            subprocess.run(["scancel", job], capture_output=True)
        if Path(self.run_dir, "run.yaml").is_file():
            kill_orphans(self.rid)


def failed_on(ctx: Ctx, st: dict, rank: int | None, node: int) -> None:
    ff = st.get("first_failure") or {}
    assert st["state"] == "FAILED" and ctx.row["exit_code"] == 1, (st, ctx.row)
    assert ff.get("node") == node and (rank is None or ff.get("rank") == rank), st


# ------------------------------------------------------------------------------------------ the faults

def sigkill_worker(ctx: Ctx) -> None:
    ctx.submit()
    t = time.time()
    os.kill(rank_pid(ctx.rid, 1), signal.SIGKILL)
    st = ctx.ended(t)
    failed_on(ctx, st, rank=1, node=1)
    assert st["first_failure"].get("signal") == "SIGKILL", st
    ctx.row["user_sees"] = f"{ctx.row['end_line']}; exit 1; launch resume finishes"
    ctx.resumed(t, attempt=1)


def sigkill_agent(ctx: Ctx) -> None:
    ctx.submit()
    t = time.time()
    os.kill(agent_pid(ctx.rid, 1), signal.SIGKILL)
    st = ctx.ended(t)
    failed_on(ctx, st, rank=None, node=1)
    ctx.row["user_sees"] = f"{ctx.row['end_line']}; exit 1; launch resume finishes"
    ctx.resumed(t, attempt=1)


def sigkill_launcher(ctx: Ctx) -> None:
    """`launch slurm --wait` SIGKILLed: the job goes on, status stays honest (RUNNING, then COMPLETED)."""
    ctx.t_launch = time.time()
    launcher = subprocess.Popen([LAUNCH, *SLURM, "--run-dir", ctx.run_dir, "--wait", "--", *ARGS],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ctx.started()
    finally:
        launcher.kill()
        launcher.wait()
    t = time.time()
    assert ctx.status()["state"] == "RUNNING"
    st = ctx.ended(t, timeout=240)
    assert st["state"] == "COMPLETED" and ctx.row["exit_code"] == 0 and st["first_failure"] is None, st
    left = procs_with_arg(ctx.run_dir)
    ctx.row["orphans"] += len(left)
    assert not left, f"the launcher's warm submitter outlived it: {left}"
    ctx.row["resume_equal"] = final_sha(ctx.run_dir) == ctx.ref
    assert ctx.row["resume_equal"]
    ctx.row["user_sees"] = "launch status: RUNNING after the launcher died; launch wait: COMPLETED, exit 0"


def launch_cancel(ctx: Ctx) -> None:
    ctx.submit()
    waiter = subprocess.Popen([LAUNCH, "wait", ctx.run_dir], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    t = time.time()
    c = run_launch("cancel", ctx.run_dir, timeout=180)
    assert c.returncode == 0, c.stderr
    err = waiter.communicate(timeout=120)[1]
    st = ctx.ended(t)
    ctx.row["exit_code"] = waiter.returncode                  # what the user's `launch wait` said
    assert st["state"] == "CANCELLED" and st["first_failure"] is None and "launch cancel" in st["reason"], st
    assert waiter.returncode == 143, err[-2000:]
    ctx.row["user_sees"] = f"{(err.strip().splitlines() or [''])[-1]}; exit 143; launch resume finishes"
    ctx.resumed(t, attempt=1)


def scancel_by_hand(ctx: Ctx) -> None:
    ctx.submit()
    t = time.time()
    subprocess.run(["scancel", ctx.jobs()[-1]], check=True)
    st = ctx.ended(t)
    assert st["state"] in ("CANCELLED", "FAILED") and ctx.row["exit_code"] != 0, st
    assert "scancel" in (st.get("reason") or "") or st["state"] == "CANCELLED", st
    ctx.row["user_sees"] = f"{ctx.row['end_line']}; exit {ctx.row['exit_code']}; launch resume finishes"
    ctx.resumed(t, attempt=1)


def hung_rank(ctx: Ctx) -> None:
    ctx.submit("--hang-timeout", "10")
    t = time.time()
    os.kill(rank_pid(ctx.rid, 1), signal.SIGSTOP)
    st = ctx.ended(t)
    failed_on(ctx, st, rank=1, node=1)
    assert st.get("hang") and 1 in st["hang"].get("stalled_ranks", []), st
    ctx.row["user_sees"] = f"{ctx.row['end_line']}; exit 1 ~10 s after the stop; launch resume finishes"
    ctx.resumed(t, attempt=1)


DAEMON_PROG = """import os, sys, time
if os.fork() == 0:                      # a daemon: double fork, own session, stdio on /dev/null
    os.setsid()
    if os.fork() == 0:
        fd = os.open(os.devnull, os.O_RDWR)
        for k in (0, 1, 2):
            os.dup2(fd, k)
        open(os.path.join(os.environ["LAUNCH_RUN_DIR"], f"daemon-{os.environ['RANK']}"), "w").write(str(os.getpid()))
        time.sleep(600)
    os._exit(0)
os.wait()
print("daemon started", flush=True)
"""


def double_fork_daemon(ctx: Ctx) -> None:
    Path("daemon_prog.py").write_text(DAEMON_PROG)
    ctx.t_launch = time.time()
    p = run_launch(*SLURM, "--run-dir", ctx.run_dir, "--wait", "--", "daemon_prog.py", timeout=240)
    ctx.row["exit_code"] = p.returncode
    ctx.row["end_line"] = (p.stderr.strip().splitlines() or [""])[-1]
    assert sorted(x.name for x in Path(ctx.run_dir).glob("daemon-*")) == ["daemon-0", "daemon-1"]
    assert p.returncode == 0 and read_json(f"{ctx.run_dir}/status.json")["state"] == "COMPLETED", p.stderr[-2000:]
    ctx.no_orphans()
    ctx.row["user_sees"] = f"{ctx.row['end_line']}; exit 0; the daemons are ended with their node's task"


def slurmd_killed(ctx: Ctx) -> None:
    """kill-node: slurmd and every process of node 1's namespace SIGKILLed. Slurm marks the node DOWN after
    SlurmdTimeout, the job NODE_FAIL, and requeues it; attempt 1 resumes from latest on live nodes."""
    ctx.submit()
    dead = read_json(f"{ctx.run_dir}/status/node1.json")["host"]
    t = time.time()
    try:
        subprocess.run([CLUSTER, "kill-node", dead.removeprefix("lnode")], check=True, capture_output=True)
        ctx.until(lambda s: s["state"] == "REQUEUED" or s.get("attempt", 0) >= 1, t, timeout=180)
        ctx.resumed(t, attempt=1, by_hand=False)
    finally:
        subprocess.run([CLUSTER, "up"], capture_output=True)       # slurmd back; ReturnToService=2 resumes it
        resume_nodes([dead])
    st = ctx.status()
    assert st["state"] == "COMPLETED" and st["attempt"] == 1, st
    ctx.row["exit_code"] = 0
    ctx.row["first_failure"] = f"node {dead}: NODE_FAIL (Slurm requeued)"
    ctx.row["user_sees"] = "RUNNING until Slurm's SlurmdTimeout, then REQUEUED, attempt 1 resumes; COMPLETED"


def preempted(ctx: Ctx) -> None:
    ctx.submit()
    t = time.time()
    subprocess.run(["scancel", "--signal=USR2", ctx.jobs()[-1]], check=True)    # what a preemption notice sends
    ctx.until(lambda s: s["state"] == "REQUEUED" or s.get("attempt", 0) >= 1, t)
    ctx.resumed(t, attempt=1, by_hand=False)
    rank0 = Path(ctx.run_dir, "logs/node0/rank0.log").read_text()
    assert "preempted: checkpoint at step" in rank0 and "resumed from step-" in rank0
    ctx.row["exit_code"] = 0
    ctx.row["user_sees"] = "checkpoint at the signal, REQUEUED, attempt 1 resumes from it; COMPLETED"


# ------------------------------------------------------------------------------------------ helpers

def procs_with_arg(arg: str) -> list[int]:
    """Processes with `arg` as one argument (the launcher and its warm submitter carry the run dir)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if arg.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                out.append(int(pid))
        except OSError:
            pass
    return out


def resume_nodes(nodes: list[str]) -> None:
    """Return nodes left DOWN/DRAIN to service (ReturnToService=2 does it once slurmd registers; this is the
    belt and braces for the next tests, which need every node idle)."""
    for node in nodes:
        for state in ("down", "resume"):
            subprocess.run(["scontrol", "update", f"nodename={node}", f"state={state}", "reason=fault-suite"],
                           capture_output=True)
    wait_for(lambda: all(s in ("idle", "mix", "alloc") for s in subprocess.run(
        ["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%t"], capture_output=True, text=True).stdout.split()),
        90, f"{nodes} back in service", 0.5)


@dataclass(frozen=True)
class Fault:
    name: str
    run: Callable[[Ctx], None]
    slow: bool = False


FAULTS = [
    Fault("SIGKILL worker", sigkill_worker),
    Fault("SIGKILL agent", sigkill_agent),
    Fault("SIGKILL launcher (--wait)", sigkill_launcher),
    Fault("launch cancel", launch_cancel),
    Fault("scancel", scancel_by_hand),
    Fault("hung rank (SIGSTOP, --hang-timeout)", hung_rank),
    Fault("double-forked daemon", double_fork_daemon),
    Fault("slurmd killed", slurmd_killed, slow=True),
    Fault("preemption (USR2)", preempted),
]


@pytest.mark.parametrize("fault", [pytest.param(f, id=f.name.split(" (")[0].replace(" ", "-"),
                                                marks=[pytest.mark.slow] if f.slow else [])
                                   for f in FAULTS])
def test_slurm_fault(fault: Fault, workdir, reference):
    up = subprocess.run([CLUSTER, "status"], capture_output=True, text=True)
    require_cluster("the dev Slurm cluster", up.returncode == 0, "make slurm-up")
    with fault_row("slurm", fault.name) as row:
        ctx = Ctx(str(workdir / "runs" / "f"), reference, row)
        try:
            fault.run(ctx)
        finally:
            ctx.cleanup()
