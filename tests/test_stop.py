"""Stopping a job the way programs expect, on every backend: Ctrl-C -> each program gets exactly one
SIGINT, `launch cancel` -> exactly one SIGTERM, then the stop grace (the program's `finally`
completes), a program that ignores the stop is killed after --stop-grace and the status says so, a
second Ctrl-C kills now; the run is CANCELLED (the same name in the end line, status and the API:
`launch: run CANCELLED (Ctrl-C)`) with no invented first failure, one end line, exit 130 / 143,
nothing left. A peer's crash or a hang stops the surviving programs the same way: one stop signal
and the grace (issue 21 item 5: launchers.stops)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCH, ROOT, read_json, require_cluster, run_launch
from launchers import procs
from launchers.backends.ssh import agent_ended
from launchers.diagnosis import firstfail
from launchers.hang.sample import rank_programs
from launchers.node import rankchild
from launchers.nodeagent import AGENT_ENDED, HEARTBEAT
from launchers.ssh.sshwatch import Prefixed

SSH_STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH = [
    "ssh",
    "--hosts",
    "sshhost1,sshhost2",
    "--ssh-config",
    str(SSH_STATE / "ssh_config"),
    "--known-hosts",
    str(SSH_STATE / "known_hosts"),
]


def rank_logs(run_dir):
    return {int(p.stem[4:]): p.read_text() for p in Path(run_dir, "logs").glob("node*/rank*.log")}


def start(backend_args, run_dir, *extra, world):
    proc = subprocess.Popen(
        [LAUNCH, *backend_args, *extra, "--run-dir", run_dir, "--", "stop_worker.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while (
        sum("READY" in t for t in rank_logs(run_dir).values()) < world
        if Path(run_dir).exists()
        else True
    ):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    return proc


def check_stopped(run_dir, proc, sig_name, code, world, end, out):
    assert proc.returncode == code, out[-3000:]
    logs = rank_logs(run_dir)
    assert sorted(logs) == list(range(world))
    for r, text in logs.items():
        got = [ln for ln in text.splitlines() if ln.startswith("GOT ")]
        assert got == [f"GOT {sig_name}"], (r, got)  # exactly one signal, of the right kind
        assert "CLEANUP DONE" in text, r  # the finally block ran to its end
    st = read_json(f"{run_dir}/status.json")
    assert st["state"] == "CANCELLED" and st["first_failure"] is None, st
    assert end in out.splitlines()
    run_id = yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]
    assert procs.tagged_pids(run_id) == []
    return st


def test_local_ctrl_c_gives_each_program_one_sigint(workdir):
    proc = start(
        ["local", "--nodes", "2", "--gpus-per-node", "2"],
        "runs/i",
        "--env",
        "TEST_CLEANUP_S=3",
        world=4,
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    st = check_stopped("runs/i", proc, "SIGINT", 130, 4, "launch: run CANCELLED (Ctrl-C)", err)
    assert st["stopped_by"] == "SIGINT"
    # `launch wait` exits with the launcher's code
    assert run_launch("wait", "runs/i").returncode == 130


def test_local_cancel_gives_each_program_one_sigterm(workdir):
    proc = start(
        ["local", "--nodes", "1", "--gpus-per-node", "2"],
        "runs/t",
        "--env",
        "TEST_CLEANUP_S=3",
        world=2,
    )
    assert run_launch("cancel", "runs/t").returncode == 0
    out, err = proc.communicate(timeout=120)
    st = check_stopped(
        "runs/t", proc, "SIGTERM", 143, 2, "launch: run CANCELLED (by launch cancel)", err
    )
    assert st["reason"] == "by launch cancel"
    assert run_launch("wait", "runs/t").returncode == 143


def test_local_cancel_with_stop_signal_sigint_gives_each_program_one_sigint(workdir):
    """--stop-signal SIGINT: `launch cancel` reaches each program as one SIGINT (Python's
    KeyboardInterrupt); the launcher itself was still stopped by SIGTERM (exit 143, CANCELLED by
    launch cancel)."""
    proc = start(
        ["local", "--nodes", "1", "--gpus-per-node", "2"],
        "runs/t",
        "--stop-signal",
        "SIGINT",
        "--env",
        "TEST_CLEANUP_S=2",
        world=2,
    )
    assert run_launch("cancel", "runs/t").returncode == 0
    out, err = proc.communicate(timeout=120)
    st = check_stopped(
        "runs/t", proc, "SIGINT", 143, 2, "launch: run CANCELLED (by launch cancel)", err
    )
    assert st["stopped_by"] == "SIGTERM"
    # resume keeps it
    assert yaml.safe_load(Path("runs/t/run.yaml").read_text())["spec"]["stop_signal"] == "SIGINT"


def test_local_program_ignoring_the_stop_is_killed_after_the_grace(workdir):
    proc = start(
        ["local", "--nodes", "1", "--gpus-per-node", "2"],
        "runs/g",
        "--stop-grace",
        "3",
        "--env",
        "TEST_IGNORE=1",
        world=2,
    )
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143
    st = read_json("runs/g/status.json")
    assert (
        st["state"] == "CANCELLED"
        and st["reason"] == "by SIGTERM; ranks 0, 1 did not stop within 3 s; killed"
    )
    assert read_json("runs/g/status/rank0.json")["killed_after_grace"] == 3
    assert "did not stop within 3 s; killed" in err


@pytest.mark.parametrize("how", ["peer crash", pytest.param("hang", marks=pytest.mark.slow)])
def test_local_survivor_of_a_peer_crash_or_a_hang_gets_one_stop_and_the_grace(workdir, how):
    """1 node x 2: rank 1's program is SIGKILLed (a crash) or SIGSTOPped until --hang-timeout fires;
    rank 0 gets one SIGTERM (the run's --stop-signal) and the grace: its 2 s cleanup completes. The
    run FAILED on rank 1."""
    check_survivor(["local", "--nodes", "1", "--gpus-per-node", "2"], how)


@pytest.mark.ssh
def test_ssh_survivor_of_a_hang_gets_one_stop_and_the_grace(workdir):
    """The same on one SSH host (the launcher stops the host's agent for the hang: no longer
    SIGKILL)."""
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the SSH test hosts", st.returncode == 0, "make ssh-up")
    check_survivor([*SSH[:2], "sshhost1", *SSH[3:], "--gpus-per-node", "2"], "hang")


@pytest.mark.ssh
def test_ssh_survivor_of_a_peer_crash_gets_one_stop_and_the_grace(workdir):
    """2 SSH hosts x 1 rank: rank 1's program (on sshhost2) is SIGKILLed; its host's agent ends in
    failure and the launcher stops the other host for the peer failure (launchers.stops: one SIGTERM
    through that host's agent, the run's --stop-grace before any SIGKILL): rank 0 gets exactly one
    SIGTERM and its 2 s cleanup completes. The run FAILED on rank 1 (SIGKILL), nothing of it left on
    either host."""
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the SSH test hosts", st.returncode == 0, "make ssh-up")
    check_survivor([*SSH, "--stop-grace", "20"], "peer crash")


@pytest.mark.slurm
@pytest.mark.parametrize("how", ["peer crash", "hang"])
def test_slurm_survivor_of_a_peer_crash_or_a_hang_gets_one_stop_and_the_grace(workdir, how):
    """The same on the dev Slurm cluster, 2 nodes x 1 (`launch slurm --wait`): the node tasks carry
    out the same stop (launchers.stops) -- one SIGTERM through the survivor's agent and the run's
    --stop-grace."""
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    check_survivor(
        [
            "slurm",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--time",
            "10",
            "--wait",
            "--stop-grace",
            "20",
        ],
        how,
    )


def check_survivor(backend_args, how):
    hang = ["--hang-timeout", "3"] if how == "hang" else []
    proc = start(backend_args, "runs/p", *hang, "--env", "TEST_CLEANUP_S=2", world=2)
    run_id = yaml.safe_load(Path("runs/p/run.yaml").read_text())["run_id"]
    os.kill(rank_programs(run_id)[1][0], signal.SIGSTOP if how == "hang" else signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    survivor = rank_logs("runs/p")[0]
    assert [ln for ln in survivor.splitlines() if ln.startswith("GOT ")] == ["GOT SIGTERM"], (
        survivor
    )
    assert "CLEANUP DONE" in survivor, survivor  # the whole cleanup, not cut short
    rec = read_json("runs/p/status/rank0.json")
    assert rec["exit_code"] == 0 and "killed_after_grace" not in rec, rec
    st = read_json("runs/p/status.json")
    ff = st["first_failure"]
    assert st["state"] == "FAILED" and ff["rank"] == 1, st
    assert (
        ff["reason"].startswith("hang: process stopped")
        if how == "hang"
        else ff["signal"] == "SIGKILL"
    ), st
    assert procs.tagged_pids(run_id) == []


def test_local_second_ctrl_c_kills_now(workdir):
    proc = start(
        ["local", "--nodes", "1", "--gpus-per-node", "2"],
        "runs/k",
        "--stop-grace",
        "120",
        "--env",
        "TEST_IGNORE=1",
        world=2,
    )
    proc.send_signal(signal.SIGINT)
    time.sleep(2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30 and proc.returncode == 130  # not the 120 s grace
    run_id = yaml.safe_load(Path("runs/k/run.yaml").read_text())["run_id"]
    assert procs.tagged_pids(run_id) == []


@pytest.mark.ssh
@pytest.mark.parametrize("how", ["ctrl-c", "cancel"])
def test_ssh_stop_gives_each_program_one_signal(workdir, how):
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the SSH test hosts", st.returncode == 0, "make ssh-up")
    proc = start(SSH, "runs/s", "--env", "TEST_CLEANUP_S=3", world=2)
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
    else:
        assert run_launch("cancel", "runs/s", timeout=180).returncode == 0
    out, err = proc.communicate(timeout=180)
    if how == "ctrl-c":
        check_stopped("runs/s", proc, "SIGINT", 130, 2, "launch: run CANCELLED (Ctrl-C)", err)
    else:
        check_stopped(
            "runs/s", proc, "SIGTERM", 143, 2, "launch: run CANCELLED (by launch cancel)", err
        )


@pytest.mark.slurm
@pytest.mark.parametrize("stop_signal", ["SIGTERM", "SIGINT"])
def test_slurm_cancel_gives_each_program_one_stop_signal(workdir, stop_signal):
    """`launch cancel` of a Slurm run: `scancel --signal=TERM` (INT with --stop-signal SIGINT)
    reaches each program once, the cleanup completes, CANCELLED, `launch wait` exits 143, nothing
    left."""
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "10",
        "--env",
        "TEST_CLEANUP_S=2",
        "--stop-signal",
        stop_signal,
        "--run-dir",
        "runs/q",
        "--",
        "stop_worker.py",
    )
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 120
    while sum("READY" in t for t in rank_logs("runs/q").values()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert run_launch("cancel", "runs/q", timeout=180).returncode == 0
    for r, text in rank_logs("runs/q").items():
        assert [ln for ln in text.splitlines() if ln.startswith("GOT ")] == [
            f"GOT {stop_signal}"
        ], (r, text)
        assert "CLEANUP DONE" in text
    st = read_json("runs/q/status.json")
    assert (
        st["state"] == "CANCELLED"
        and st["first_failure"] is None
        and "launch cancel" in st["reason"]
    )
    assert run_launch("wait", "runs/q").returncode == 143
    run_id = yaml.safe_load(Path("runs/q/run.yaml").read_text())["run_id"]
    assert procs.tagged_pids(run_id) == []


# --------------------------------------------------- a rank that ended on a stop (pure-ish: no run)
# The rank wrapper and the SSH host agent on their own, in a scratch run dir: the wrapper's record
# names the stop it gave the program (`stopped_by`), whatever the program then did, and
# launchers.diagnosis.firstfail never takes that end for a failure of the rank's own (the SSH fault
# row `SIGKILL one agent` under load named rank 1, killed after the grace of the stop its host gave
# it, instead of node 1 whose agent was killed).
PROG = """import os, signal, sys, time
how = os.environ["TEST_HOW"]
if how == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if how == "raise":
    def fail(*_):
        raise RuntimeError("cleanup failed")
    signal.signal(signal.SIGTERM, fail)
if how == "checkpoint":
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(float(os.environ["TEST_CLEANUP_S"])), sys.exit(0)))
print("READY", flush=True)
if how == "crash":
    sys.exit(3)
time.sleep(60)
"""  # noqa: E501


def rank_env(run_dir, run_id, **extra):
    return {
        **os.environ,
        "LAUNCH_RUN_DIR": str(run_dir),
        "LAUNCH_RUN_ID": run_id,
        "RANK": "0",
        "NODE_RANK": "0",
        "LAUNCH_ATTEMPT": "0",
        "LAUNCH_STOP_GRACE": "0.5",
        "TEST_CLEANUP_S": "0.1",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def wait_ready(run_dir, proc):
    log = Path(run_dir, "logs/node0/rank0.log")
    deadline = time.monotonic() + 60
    while "READY" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


@pytest.mark.parametrize(
    "how, sig, want",
    [
        (
            "raise",
            signal.SIGTERM,
            {"exit_code": 1, "exception": "RuntimeError: cleanup failed", "stopped_by": "SIGTERM"},
        ),
        (
            "ignore",
            signal.SIGTERM,
            {"signal": "SIGKILL", "killed_after_grace": 0.5, "stopped_by": "SIGTERM"},
        ),
        ("sleep", signal.SIGHUP, {"signal": "SIGHUP", "stopped_by": "SIGHUP"}),
        ("checkpoint", signal.SIGTERM, {"exit_code": 0, "stopped_by": "SIGTERM"}),
        # a checkpoint request is no stop: its own end
        ("sleep", signal.SIGUSR2, {"signal": "SIGUSR2"}),
        ("crash", None, {"exit_code": 3}),
    ],
)
def test_the_rank_record_names_the_stop_its_program_ended_on(tmp_path, how, sig, want):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "prog.py").write_text(PROG)
    proc = subprocess.Popen(
        [sys.executable, "-m", "launchers.rankexec", "--", "prog.py"],
        cwd=tmp_path,
        env=rank_env(run_dir, "t-rec", TEST_HOW=how),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_ready(run_dir, proc)
    if sig is not None:
        proc.send_signal(sig)
    proc.communicate(timeout=60)
    rec = read_json(run_dir / "status/rank0.json")
    assert {k: rec.get(k) for k in want} == want and ("stopped_by" in want) == (
        "stopped_by" in rec
    ), rec
    mine = firstfail.first_failure([rec], [])
    assert (mine is not None) == (how in ("crash", "sleep") and "stopped_by" not in rec), mine


def test_the_host_agent_says_when_its_agent_ended_before_it_stops_the_ranks_left(tmp_path):
    """launchers.remote run: the torchrun agent SIGKILLed (here a stand-in that starts one rank
    wrapper and kills itself) -- the host agent tells the launcher when it saw that (AGENT_ENDED,
    the node's failure time), then gives the orphaned rank its stop; the rank's record (the stop's)
    and the session's end come after."""
    run_dir, run_id = tmp_path / "run", f"t-agent-{os.getpid()}"
    run_dir.mkdir()
    (tmp_path / "prog.py").write_text(PROG)
    agent = (
        "import os, signal, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-m', 'launchers.rankexec', '--', 'prog.py'])\n"
        "log = os.path.join(os.environ['LAUNCH_RUN_DIR'], 'logs/node0/rank0.log')\n"
        "while 'READY' not in (open(log).read() if os.path.exists(log) else ''):\n"
        "    time.sleep(0.05)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "launchers.remote",
            "run",
            "--node",
            "0",
            "--pid-file",
            str(tmp_path / "pid"),
            "--",
            sys.executable,
            "-c",
            agent,
        ],
        cwd=tmp_path,
        timeout=120,
        env=rank_env(
            run_dir, run_id, TEST_HOW="checkpoint", LAUNCH_STOP_GRACE="5", TEST_CLEANUP_S="1"
        ),
        capture_output=True,
        text=True,
    )
    session_end = time.time()
    out = Prefixed("[h] ", lambda _t: None, skip=HEARTBEAT, notes=(AGENT_ENDED,))
    out.write(p.stdout)
    assert p.returncode == 128 + signal.SIGKILL, p.stdout + p.stderr
    rec = read_json(run_dir / "status/rank0.json")
    assert rec["exit_code"] == 0 and rec["stopped_by"] == "SIGTERM", rec
    seen = agent_ended(out)
    # the program's 1 s cleanup after it
    assert seen + 0.9 < rec["time"] < session_end, (seen, rec, p.stdout)
    assert procs.tagged_pids(run_id) == []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("setpriv", ["setpriv", "none", "old"])
def test_a_rank_program_dies_with_its_sigkilled_wrapper(tmp_path, setpriv):
    """launchers.node.rankchild.cold: the program (in its own process group, out of reach of a kill
    of the wrapper's group) is set to die with its wrapper (PR_SET_PDEATHSIG): through util-linux's
    setpriv where it is there (Debian: always), else ctypes -- also where setpriv is too old for
    --pdeathsig (util-linux < 2.33, RHEL 8: here a stand-in that would fail the rank)."""
    old = tmp_path / "setpriv"
    old.write_text("#!/bin/sh\necho 'setpriv: unrecognized option' >&2\nexit 1\n")
    old.chmod(0o755)
    paths = {"setpriv": rankchild.SETPRIV, "none": ("/nonexistent/setpriv",), "old": (str(old),)}
    assert setpriv != "setpriv" or rankchild.setpriv() is not None  # Debian's util-linux has it
    wrapper = (
        "import os, sys, time\n"
        "from launchers.node import rankchild\n"
        f"rankchild.SETPRIV = {paths[setpriv]!r}\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
        "prog = ['-c', 'import time; print(\"up\", flush=True); time.sleep(60)']\n"
        "print(rankchild.cold(prog, fd), flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "rank.log"
    p = subprocess.Popen(
        [sys.executable, "-c", wrapper, str(log)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    pid = int(p.stdout.readline())
    deadline = time.monotonic() + 30
    while "up" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and p.poll() is None, "the program did not start"
        time.sleep(0.02)
    with open(f"/proc/{pid}/cmdline", "rb") as f:  # the program itself: python -u -c ...
        assert f.read().split(b"\0")[:2] == [sys.executable.encode(), b"-u"]
    p.kill()
    p.wait()
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, "the program outlived its SIGKILLed wrapper"
        time.sleep(0.02)
