"""The fault suite on the SSH backend (issue 13 items 3 and 6): one table-driven test, a row per
fault.

Each row launches the convnet workload (a few seconds slower per step in attempt 0 only, so the
fault lands mid-run) on 2 of the 4 test hosts (clusters/ssh-hosts.sh; each host a network + PID
namespace), 1 process each, injects the fault, and checks: the launcher's exit code, status.json's
state, first failure (node, rank, host) and cause, no process carrying the run id on any of the 4
hosts, checkpoints/latest naming a complete checkpoint, and `launch resume` ending with the
param_sha256 of an uninterrupted run (computed once). Every row is recorded
(tests/faults/record.py), pass or fail. A cut host (network down, processes running) is named within
CUT_BOUND_S: the host agents' heartbeat (launchers.remote, every second) stops, and the launcher
calls a host lost after launchers.ssh.sshwatch.LOST_S seconds without a word from it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import yaml

from conftest import LAUNCH, ROOT, once, read_json, require_cluster, run_launch
from launchers.ssh.sshwatch import LOST_S
from record import record

pytestmark = pytest.mark.ssh

SCRIPT = ROOT / "clusters" / "ssh-hosts.sh"
STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
OPTS = ["--ssh-config", str(STATE / "ssh_config"), "--known-hosts", str(STATE / "known_hosts")]
HOSTS = ["sshhost1", "sshhost2"]
STEPS, EVERY, FAULT_AT = 40, 10, 12
PROG_ARGS = [
    "slowconvnet.py",
    "--dataset",
    "digits",
    "--max-steps",
    str(STEPS),
    "--checkpoint-every",
    str(EVERY),
    "--seed",
    "7",
    "--log-every",
    "1",
    "--no-tensorboard",
]
HANG_TIMEOUT = 8
CUT_BOUND_S = LOST_S + 5  # heartbeat silence + the launcher's poll, on a loaded 2-core machine

# The workload, slowed down in attempt 0 only (a sleep after each step: the math is untouched, so a
# resumed run must end bit-exact); FAULT_DAEMON=1: rank 1 first double-forks a daemon grandchild
# that outlives it.
SLOW_PROG = """import os, runpy, sys, time
from launchers import heartbeat
delay = float(os.environ.get("FAULT_STEP_S", "0")) if os.environ.get("LAUNCH_ATTEMPT") == "0" else 0.0
beat = heartbeat.step
def step(n=None):
    beat(n)
    time.sleep(delay)
heartbeat.step = step
if os.environ.get("FAULT_DAEMON") == "1" and os.environ.get("RANK") == "1" and os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("DAEMON", os.getpid(), flush=True)
        time.sleep(600)
    os._exit(0)
sys.argv[0] = "workloads.convnet"
runpy.run_module("workloads.convnet", run_name="__main__", alter_sys=True)
"""  # noqa: E501


@pytest.fixture(scope="module", autouse=True)
def hosts_up():
    st = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True, timeout=60)
    said = " / ".join((st.stdout.strip() or st.stderr.strip()).splitlines())
    require_cluster(
        f"the SSH test hosts (clusters/ssh-hosts.sh status: {said})",
        st.returncode == 0,
        "make ssh-up",
    )


@pytest.fixture(scope="module")
def reference(request):
    """The uninterrupted run: its param_sha256 and its cold start (launch -> first step); made once
    per make test run (the exclusive rows and the others run on different workers)."""

    def make(d):
        Path(d, "slowconvnet.py").write_text(SLOW_PROG)
        t0 = time.time()
        p = run_launch(
            "ssh",
            "--hosts",
            ",".join(HOSTS),
            *OPTS,
            "--run-dir",
            "runs/ref",
            "--",
            *PROG_ARGS,
            cwd=d,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        first = metrics(Path(d, "runs/ref"))[0]
        return {
            "sha": read_json(Path(d, "runs/ref/final.json"))["param_sha256"],
            "cold_start_s": first["time"] - t0,
        }

    return once(request, "ssh-faults-ref", make)


# ------------------------------------------------------------------------------------------ helpers
def metrics(run_dir) -> list[dict]:
    p = Path(run_dir, "metrics.jsonl")
    return (
        [yaml.safe_load(ln) for ln in p.read_text().splitlines() if ln.strip()]
        if p.exists()
        else []
    )


def run_id_of(run_dir) -> str:
    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]


def host_pids(k: int) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", f"lssh{k}"], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def tagged(run_id: str) -> dict[str, list[tuple[int, str, str]]]:
    """Every host's processes carrying the run id (root-namespace pid, role, rank), from `ip netns
    pids`."""
    out: dict[str, list] = {}
    for k in range(1, 5):
        for pid in host_pids(k):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"LAUNCH_RUN_ID={run_id}".encode() not in env:
                continue
            rank = next((e[5:].decode() for e in env if e.startswith(b"RANK=")), "")
            role = (
                "host-agent"
                if b"launchers.remote" in cmd
                else "agent"
                if b"torch.distributed.run" in cmd
                else "wrapper"
                if b"launchers.rankexec" in cmd
                else "program"
            )
            out.setdefault(f"sshhost{k}", []).append((pid, role, rank))
    return out


def orphans_after(run_id: str, settle_s: float) -> dict:
    """What is left of the run on the 4 hosts after up to settle_s seconds."""
    deadline = time.monotonic() + settle_s
    while (left := tagged(run_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def pid_of(run_id: str, host: str, role: str, rank: str = "1") -> int:
    pids = [
        p
        for p, r, rk in tagged(run_id).get(host, [])
        if r == role and (rk == rank or role == "agent")
    ]
    assert pids, (host, role, tagged(run_id))
    return min(pids)  # the program, not a daemon it forked later


def latest_complete(run_dir, world: int = 2) -> str | None:
    d = Path(run_dir, "checkpoints")
    name = (d / "latest").read_text().strip() if (d / "latest").exists() else None
    if (
        name
        and (d / name / ".metadata").is_file()
        and all((d / name / f"__{r}_0.distcp").is_file() for r in range(world))
    ):
        return name
    return None


@dataclass
class Run:
    run_dir: str
    proc: subprocess.Popen
    t0: float
    out: Path
    run_id: str = ""
    t_fault: float = 0.0
    detected: float | None = None
    rc: int | None = None
    other: "Run | None" = None
    ref_sha: str = ""
    canceller: subprocess.Popen | None = None
    ended: float = 0.0

    def err(self) -> str:
        return Path(f"{self.out}.err").read_text()


def start(run_dir: str, *extra: str, env_step: str) -> Run:
    out = Path(f"{run_dir}.out")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            LAUNCH,
            "ssh",
            "--hosts",
            ",".join(HOSTS),
            *OPTS,
            "--stop-grace",
            "10",
            "--run-dir",
            run_dir,
            "--env",
            f"FAULT_STEP_S={env_step}",
            *extra,
            "--",
            *PROG_ARGS,
        ],
        stdout=out.open("w"),
        stderr=Path(f"{out}.err").open("w"),
        text=True,
    )
    return Run(run_dir, proc, time.time(), out)


def wait_training(r: Run, step: int = FAULT_AT, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (latest_complete(r.run_dir) and (m := metrics(r.run_dir)) and m[-1]["step"] >= step):
        if r.proc.poll() is not None or time.monotonic() > deadline:
            r.proc.kill()
            raise AssertionError(
                f"never reached step {step} (rc {r.proc.poll()}): {r.err()[-3000:]}"
            )
        time.sleep(0.1)
    r.run_id = run_id_of(r.run_dir)


def named(r: Run) -> bool:
    """The launcher said what happened: "launch: node 1 failed (...); stopping the other nodes",
    "launch: got SIGTERM: stopping every rank (...)", or the end."""
    if "; stopping the other nodes" in r.err() or "launch: got SIG" in r.err():
        return True
    try:
        st = read_json(Path(r.run_dir, "status.json"))
    except (OSError, ValueError):
        return False
    return st.get("state") not in ("RUNNING", "PENDING") or bool(st.get("first_failure"))


def wait_end(r: Run, timeout: float = 180) -> None:
    """Until the launcher exits; notes when status.json first named the end or a failure."""
    deadline = time.monotonic() + timeout
    while r.proc.poll() is None and time.monotonic() < deadline:
        if r.detected is None and named(r):
            r.detected = time.time()
        time.sleep(0.1)
    if r.proc.poll() is None:
        r.proc.kill()
        raise AssertionError(f"the launcher did not end within {timeout} s: {r.err()[-3000:]}")
    r.rc, r.ended = r.proc.returncode, time.time()
    if r.canceller:
        _, err = r.canceller.communicate(timeout=180)
        assert r.canceller.returncode == 0, err
    if r.detected is None and named(r):
        r.detected = time.time()


def resume(run_dir: str, t_fault: float) -> tuple[str | None, float | None]:
    p = run_launch("resume", run_dir, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = [m for m in metrics(run_dir) if m.get("attempt", 0) >= 1]
    return read_json(Path(run_dir, "final.json"))["param_sha256"], (
        resumed[0]["time"] - t_fault if resumed else None
    )


def hosts_cmd(*args: str) -> None:
    subprocess.run([str(SCRIPT), *args], check=True, capture_output=True, timeout=120)


# ------------------------------------------------------------------------------------------- faults
def kill_role(role: str, sig: int = signal.SIGKILL) -> Callable[[Run], None]:
    def inject(r: Run) -> None:
        os.kill(pid_of(r.run_id, "sshhost2", role), sig)

    return inject


def ctrl_c(r: Run) -> None:
    r.proc.send_signal(signal.SIGINT)


def cancel(r: Run) -> None:
    """`launch cancel` in the background: it returns once the launcher ended; the detection is
    measured meanwhile."""
    r.canceller = subprocess.Popen(
        [LAUNCH, "cancel", r.run_dir], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def kill_launcher(r: Run) -> None:
    r.proc.kill()


def kill_host(r: Run) -> None:
    hosts_cmd("kill-host", "2")


def cut_host(r: Run) -> None:
    hosts_cmd("cut-host", "2")
    # the link is down once the command returns (it may wait for the hosts' lock)
    r.t_fault = time.time()


def after_kill_launcher(r: Run, row: dict) -> None:
    """Dead launcher: `launch status` says so (the detection), `launch cancel` ends what is left."""
    p = run_launch("status", r.run_dir)
    r.detected = time.time()
    row["user_sees"] = next(
        (ln.strip() for ln in (p.stdout + p.stderr).splitlines() if "launcher died" in ln), ""
    )
    assert row["user_sees"], p.stdout + p.stderr
    assert run_launch("cancel", r.run_dir, timeout=180).returncode == 0


def revive(r: Run, row: dict) -> None:
    hosts_cmd("revive-host", "2")


def nothing(r: Run) -> None:
    """The fault is in the program itself (FAULT_DAEMON=1): the run goes on to its end."""


def daemon_started(r: Run, row: dict) -> None:
    """The daemon grandchild did start (and the orphan scan then proves it was swept with the
    run)."""
    assert "DAEMON " in Path(r.run_dir, "logs/node1/rank1.log").read_text()


def the_other_completes(r: Run, row: dict) -> None:
    """The second run on the same hosts (another master port) was not touched by the first one's
    cancel."""
    o = r.other
    wait_end(o, timeout=240)
    st = read_json(Path(o.run_dir, "status.json"))
    ports = [
        yaml.safe_load(Path(d, "run.yaml").read_text())["attempts"][-1]["master_port"]
        for d in (r.run_dir, o.run_dir)
    ]
    row["other"] = f"exit {o.rc}, {st['state']}, ports {ports}"
    assert o.rc == 0 and st["state"] == "COMPLETED", (o.rc, st, o.err()[-3000:])
    assert ports[0] != ports[1], ports
    assert read_json(Path(o.run_dir, "final.json"))["param_sha256"] == r.ref_sha
    assert tagged(run_id_of(o.run_dir)) == {}


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[Run], None]
    code: int  # the launcher's exit code
    state: str  # status.json
    first: tuple | None = None  # (node, rank or None, host): the first failure
    cause: str = ""  # in the first failure's reason, else status.json's reason
    extra: tuple = ()
    # then (status/cancel, revive, the other run); always runs
    after: Callable[[Run, dict], None] | None = None
    settle_s: float = 5.0  # how long leftovers may take to go after the launcher ends
    detect_bound: float = 60.0
    step_s: str = "0.3"  # the slow-down per step in attempt 0
    resume: bool = True  # False: the run completed; its own param_sha256 is compared
    other: bool = False  # a second run on the same hosts, started first
    says: str = ""  # in the launcher's stderr
    marks: tuple = field(default=())


FAULTS = [
    Fault("SIGKILL one worker", kill_role("program"), 1, "FAILED", (1, 1, "sshhost2"), "SIGKILL"),
    # node code 128+9
    Fault(
        "SIGKILL one agent",
        kill_role("agent"),
        1,
        "FAILED",
        (1, None, "sshhost2"),
        "",
        says="launch: run FAILED (node 1, signal SIGKILL)",
    ),  # read as local's
    Fault(
        "SIGKILL the launcher",
        kill_launcher,
        -9,
        "FAILED",
        None,
        "launcher died",
        after=after_kill_launcher,
    ),
    Fault("Ctrl-C", ctrl_c, 130, "CANCELLED", None, "SIGINT"),
    Fault("launch cancel", cancel, 143, "CANCELLED", None, "by launch cancel"),
    Fault(
        "hung rank (SIGSTOP)",
        kill_role("program", signal.SIGSTOP),
        1,
        "FAILED",
        (1, 1, "sshhost2"),
        "hang: ",
        extra=("--hang-timeout", str(HANG_TIMEOUT)),
        detect_bound=HANG_TIMEOUT + 15,
    ),
    Fault(
        "program double-forks a daemon",
        nothing,
        0,
        "COMPLETED",
        extra=("--env", "FAULT_DAEMON=1"),
        # not the 45 s stop wait
        step_s="0.05",
        resume=False,
        after=daemon_started,
        detect_bound=35,
    ),
    Fault(
        "host sshd and processes killed",
        kill_host,
        1,
        "FAILED",
        (1, None, "sshhost2"),
        "connection lost",
        after=revive,
        says="node 1 on sshhost2 (10.216.0.12:22) failed: connection lost",
        marks=(pytest.mark.exclusive,),
    ),
    Fault(
        "host network cut",
        cut_host,
        1,
        "FAILED",
        (1, None, "sshhost2"),
        "lost: silent",
        after=revive,
        settle_s=90.0,
        detect_bound=CUT_BOUND_S,
        says="node 1 on sshhost2 (10.216.0.12:22) failed: lost: silent for",
        marks=(pytest.mark.slow, pytest.mark.exclusive),
    ),
    Fault(
        "two runs, one cancelled",
        cancel,
        143,
        "CANCELLED",
        None,
        "by launch cancel",
        other=True,
        after=the_other_completes,
        marks=(pytest.mark.slow,),
    ),
]


def check_end(f: Fault, r: Run) -> tuple[dict, str | None]:
    st = read_json(Path(r.run_dir, "status.json"))
    assert r.rc == f.code, (r.rc, r.err()[-3000:])
    assert f.says in r.err(), r.err()[-3000:]
    assert st["state"] == f.state, st
    ff = st.get("first_failure")
    if f.first is None:
        assert ff is None, ff
        assert f.cause in (st.get("reason") or "") + str(st.get("stopped_by")), st
        return st, None
    node, rank, host = f.first
    assert ff and ff["node"] == node and ff.get("host") == host, ff
    assert rank is None or ff.get("rank") == rank, ff
    assert f.cause in (ff.get("reason") or "") + str(ff.get("signal")), ff
    return (
        st,
        f"node {ff['node']} ({ff.get('host')}) rank {ff.get('rank')}: "
        f"{ff.get('reason') or ff.get('signal')}",
    )


@pytest.mark.parametrize(
    "f", [pytest.param(f, id=f.name.replace(" ", "-"), marks=f.marks) for f in FAULTS]
)
def test_fault(f: Fault, workdir, reference):
    (workdir / "slowconvnet.py").write_text(SLOW_PROG)
    row: dict = {
        "user_sees": "",
        "exit_code": None,
        "cold_start_s": round(reference["cold_start_s"], 1),
    }
    other = start("runs/other", env_step="0.5") if f.other else None
    r = start("runs/f", *f.extra, env_step=f.step_s)
    r.other, r.ref_sha = other, reference["sha"]
    try:
        try:
            wait_training(r)
            assert other is None or other.proc.poll() is None, "the other run ended too soon"
            r.t_fault = time.time()
            f.inject(r)
            wait_end(r)
            row["exit_code"] = r.rc
            row["user_sees"] = next(
                (ln for ln in reversed(r.err().splitlines()) if ln.startswith("launch: ")), ""
            )
        finally:
            try:
                if f.after:
                    f.after(r, row)
            finally:
                left = orphans_after(r.run_id, f.settle_s) if r.run_id else {}
                row["orphans"] = sum(len(v) for v in left.values())
        row["detection_s"] = round(r.detected - r.t_fault, 1) if r.detected else None
        row["launcher_end_s"] = round(r.ended - r.t_fault, 1)  # fault -> the launcher exited
        st, row["first_failure"] = check_end(f, r)
        assert not left, left
        assert row["detection_s"] is not None and row["detection_s"] <= f.detect_bound, row
        assert latest_complete(r.run_dir), "checkpoints/latest names no complete checkpoint"
        if f.resume:
            sha, rec = resume(r.run_dir, r.t_fault)
            row["recovery_s"] = round(rec, 1) if rec is not None else None
        else:
            sha = read_json(Path(r.run_dir, "final.json"))["param_sha256"]
        row["resume_equal"] = sha == reference["sha"]
        assert row["resume_equal"], (sha, reference["sha"])
        assert tagged(r.run_id) == {}
        row["passed"] = True
    finally:
        for run in (r, other):
            if run and run.proc.poll() is None:
                run.proc.kill()
        record("ssh", f.name, **row)
