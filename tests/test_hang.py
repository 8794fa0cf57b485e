"""Hang detection (--hang-timeout) with real processes: a rank SIGSTOPped or asleep outside any
collective is named stalled, the ranks waiting for it in all_reduce are named waiting, stacks are in
the run dir, the run ends and nothing is left. Local here; SSH and Slurm at the end (the dev
clusters)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, read_json, require_cluster, run_launch
from launchers import heartbeat, procs
from launchers.hang.stacks import classify, main_thread
from launchers.hang.verdict import hung_ranks
from launchers.hang.watch import hang_decision

TIMEOUT = 10
SSH_STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH_OPTS = [
    "--ssh-config",
    str(SSH_STATE / "ssh_config"),
    "--known-hosts",
    str(SSH_STATE / "known_hosts"),
]

DUMP = """Process 11: python -u w.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 11 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    wrapper (torch/distributed/c10d_logger.py:83)
    <module> (w.py:30)
Thread 12 (idle): "Thread-1"
    wait (threading.py:320)
"""


def test_stack_rules():
    assert main_thread(DUMP) == [
        "all_reduce (torch/distributed/distributed_c10d.py:3252)",
        "wrapper (torch/distributed/c10d_logger.py:83)",
        "<module> (w.py:30)",
    ]
    assert classify("S", DUMP, True)[0] == "waiting"
    assert classify("T", DUMP, True) == (
        "stalled",
        "process stopped (state T: SIGSTOP or a debugger)",
    )
    elsewhere = DUMP.replace(
        "all_reduce (torch/distributed/distributed_c10d.py:3252)", "load (data.py:9)"
    )
    elsewhere = elsewhere.replace(
        "wrapper (torch/distributed/c10d_logger.py:83)", "next (data.py:20)"
    )
    assert classify("S", elsewhere, True) == ("stalled", "stack elsewhere: load (data.py:9)")


def test_decide_behind_in_steps_and_all_waiting():
    w = {"class": "waiting", "why": "in all_reduce", "node": 0}
    v = hang_decision(
        {0: dict(w, step=7), 1: dict(w, step=6), 2: dict(w, step=7)}, 3, 1.0, 5, "/d", 0
    )
    assert (
        v["stalled_ranks"] == [1]
        and v["waiting_ranks"] == [0, 2]
        and "behind" in v["ranks"]["1"]["why"]
    )
    v = hang_decision({0: dict(w, step=7), 1: dict(w, step=7)}, 2, 1.0, 5, "/d", 0)
    assert v["stalled_ranks"] == [0, 1] and "mismatched collectives" in v["ranks"]["0"]["why"]
    v = hang_decision({0: dict(w, step=None)}, 2, 1.0, 5, "/d", 0)
    assert v["stalled_ranks"] == [1] and v["ranks"]["1"]["why"] == "no answer from its node"


def test_hung_ranks_are_the_sure_ones_and_programs_can_read_a_hang_stop(tmp_path, monkeypatch):
    """A hang's stop SIGKILLs the stalled ranks that are stopped, gone or behind; a rank whose stack
    is merely elsewhere (DDP's backward waits there) is spared while a sure one exists.
    heartbeat.hang_stop() reads this attempt's stop.json (None outside a run, for another attempt,
    or with no hang)."""
    els, stop = (
        {"class": "stalled", "why": "stack elsewhere: backward"},
        {"class": "stalled", "why": "process stopped"},
    )
    assert hung_ranks({"stalled_ranks": [0, 1], "ranks": {"0": els, "1": stop}}) == [1]
    assert hung_ranks({"stalled_ranks": [0, 1], "ranks": {"0": els, "1": els}}) == [0, 1]
    monkeypatch.delenv("LAUNCH_RUN_DIR", raising=False)
    assert heartbeat.hang_stop() is None
    monkeypatch.setenv("LAUNCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("LAUNCH_ATTEMPT", "1")
    assert heartbeat.hang_stop() is None
    (tmp_path / "hang" / "attempt0").mkdir(parents=True)
    (tmp_path / "hang" / "attempt0" / "stop.json").write_text(
        '{"reason": "hang", "hung_ranks": [1]}'
    )
    assert heartbeat.hang_stop() is None  # attempt 0's, not this one's
    monkeypatch.setenv("LAUNCH_ATTEMPT", "0")
    assert heartbeat.hang_stop() == {"reason": "hang", "hung_ranks": [1]}


def test_rank_programs_are_the_wrappers_children_not_the_wrappers(tmp_path):
    """The torchrun agent names launchers.rankexec in its command line; it is not a wrapper, so the
    wrapper (the agent's child) is never taken for its rank's program, whatever the pid order (CI:
    pids wrapped round, and a rank's stack was the wrapper's supervise)."""
    from launchers.hang.sample import rank_programs

    run_id = f"t-{os.getpid()}-{time.time_ns()}"
    code = (
        "import "
        "os,subprocess,sys,time\nrole=sys.argv[1]\nnxt={'agent':'wrapper','wrapper':'program'}.get(role)\nenv=dict(os.environ, "  # noqa: E501
        "RANK='0', NODE_RANK='0')\nargv=[sys.executable,'-c',sys.argv[-1],nxt] + "
        "(['-m','launchers.rankexec'] if nxt=='wrapper' else [])\nc=subprocess.Popen(argv + "
        "[sys.argv[-1]], env=env) if nxt else None\ntime.sleep(60)\n"
    )
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "agent",
            "-m",
            "torch.distributed.run",
            "-m",
            "launchers.rankexec",
            code,
        ],
        env=dict(os.environ, LAUNCH_RUN_ID=run_id),
    )
    try:
        deadline = time.monotonic() + 20

        # a child between its fork and its exec still has the wrapper's command line (CI, stop 40)
        def seen():
            pids = procs.tagged_pids(run_id)
            return pids, [p for p in pids if procs.is_rank_wrapper(p)]

        while time.monotonic() < deadline and [len(x) for x in seen()] != [3, 1]:
            time.sleep(0.05)
        pids, wrappers = seen()
        assert len(pids) == 3, pids
        assert len(wrappers) == 1 and agent.pid not in wrappers
        found = rank_programs(run_id)
        assert (
            list(found) == [0]
            and found[0][0] not in (agent.pid, wrappers[0])
            and found[0][0] in pids
        )
    finally:
        for p in procs.tagged_pids(run_id):
            procs.kill(p, 9)
        agent.wait()


def _coordinator(tmp_path, ranks: dict[int, tuple[str, float]]):
    """A Coordinator over one node whose progress record says rank -> (state, last advance)."""
    from launchers import layout
    from launchers.hang.watch import Coordinator, write
    from launchers.records.rundir import RunDir

    spec = {
        "backend": "local",
        "program": ["x.py"],
        "run_dir": str(tmp_path),
        "name": "t",
        "nodes": 1,
        "gpus_per_node": len(ranks),
    }
    (tmp_path / "run.yaml").write_text(
        yaml.safe_dump({"run_id": "t", "spec": spec, "attempts": [{"attempt": 0}]})
    )
    write(
        layout.path(str(tmp_path), "node_progress", node=0),
        {
            "node": 0,
            "attempt": 0,
            "time": 0,
            "ranks": {
                str(r): {
                    "pid": 1,
                    "state": st,
                    "step": 9,
                    "step_time": 0.2,
                    "last_advance": at,
                    "heartbeat": True,
                }
                for r, (st, at) in ranks.items()
            },
        },
    )
    return Coordinator(RunDir(str(tmp_path)), 0, 5.0, 1, len(ranks))


def test_ranks_whose_programs_ended_are_no_hang(tmp_path):
    """n30: a healthy 1x2 run under --hang-timeout 5 was called hung: both ranks had finished their
    last step and exited (exit 0) 3 s later, slowed by the suite's load, and their agent took 2 s
    more to notice, while the node's record still said `R` with the last step's time. An exited rank
    is `gone` (or Z) now; when every rank has ended there is no hang to decide; a live rank that
    stopped advancing is still one, whatever ended beside it. A rank's exit is its last advance (CI,
    stop 39: a resumed Slurm run's rank 0 was still in its teardown 10 s after its last step when
    rank 1 had exited, and the run was called hung on `rank 1: process gone`): the others' silence
    is timed from it."""
    from launchers import layout

    now = time.time()
    c = _coordinator(tmp_path, {0: ("gone", now - 60), 1: ("Z", now - 60)})
    assert c.check(now) is None and layout.read_json(c.path("hang_request")) is None
    c = _coordinator(tmp_path, {0: ("gone", now - 60), 1: ("S", now - 30)})
    assert c.check(now) is None and layout.read_json(c.path("hang_request"))["since"] == now - 30
    (tmp_path / "c").mkdir()
    # rank 0 exited 1 s ago
    c = _coordinator(tmp_path / "c", {0: ("gone", now - 1), 1: ("S", now - 30)})
    assert c.check(now) is None and layout.read_json(c.path("hang_request")) is None
    assert (
        c.check(now + 5.5) is None and layout.read_json(c.path("hang_request"))["since"] == now - 1
    )


def test_tracker_marks_an_exited_rank_program_gone(tmp_path, monkeypatch):
    """The node's sampler keeps a rank whose program exited, as `gone` (it was left as last seen:
    `R`)."""
    from launchers.hang import sample

    prog = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    listed = {0: (prog.pid, 0)}
    monkeypatch.setattr(sample, "rank_programs", lambda run_id, node=None: dict(listed))
    tr = sample.Tracker(str(tmp_path), "t", 0, 0, time.time())
    assert tr.sample(time.time())[0]["state"] in ("S", "R")
    prog.kill()
    prog.wait()
    listed.clear()
    before = tr.ranks[0]["last_advance"]
    t_exit = time.time() + 100  # the sample that finds it gone: its exit is its last advance
    assert (
        tr.sample(t_exit)[0]["state"] == "gone" and tr.ranks[0]["last_advance"] == t_exit > before
    )
    assert tr.sample(t_exit + 50)[0]["last_advance"] == t_exit  # and only that once


@pytest.mark.parametrize(
    "value,why",
    [
        ("0", "is out of range"),
        ("-3", "is out of range"),
        ("abc", "is not accepted"),
        ("nan", "is not accepted"),
        ("inf", "is not accepted"),
    ],
)
def test_bad_hang_timeout(workdir, value, why):
    p = run_launch("local", "--hang-timeout", value, "--run-dir", "runs/b", "--", "hang_worker.py")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"launch: error: --hang-timeout {value!r} {why}; give a number of seconds > 0 (e.g. 300) "
        "in plain decimal digits"
    ], p.stderr
    assert not (workdir / "runs").exists()


def hung_at(run_dir):
    for log in Path(run_dir, "logs").glob("node*/rank*.log"):
        for ln in log.read_text().splitlines():
            if ln.startswith("HANGING "):
                return float(ln.split(" at ")[1])
    raise AssertionError("no rank hung")


def check_hang(run_dir, stalled, world, launcher_end):
    st = read_json(f"{run_dir}/status.json")
    assert st["state"] == "FAILED", st
    hang = st["hang"]
    assert hang["stalled_ranks"] == [stalled] and hang["waiting_ranks"] == [
        r for r in range(world) if r != stalled
    ]
    assert st["first_failure"]["rank"] == stalled and st["first_failure"]["reason"].startswith(
        "hang: "
    )
    for r in range(world):
        text = Path(hang["dir"], f"rank{r}.txt").read_text()
        assert f"# rank {r} pid" in text and ("Thread" in text), text  # a real py-spy stack
    # ended within the timeout + 15 s of the moment the rank hung (the acceptance bound)
    assert launcher_end - hung_at(run_dir) < TIMEOUT + 15
    run_id = yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]
    assert procs.tagged_pids(run_id) == []
    return st


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stop", "sleep"])
def test_local_stalled_rank_is_named_and_the_run_stopped(workdir, mode):
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--hang-timeout",
        str(TIMEOUT),
        "--env",
        "TEST_HANG_RANK=2",
        "--env",
        "TEST_HANG_STEP=4",
        "--env",
        f"TEST_HANG_MODE={mode}",
        "--run-dir",
        "runs/h",
        "--",
        "hang_worker.py",
        timeout=180,
    )
    end = time.time()
    assert p.returncode == 1, p.stderr[-2000:]
    assert "launch: hang: no rank advanced for 10 s; stalled: rank 2" in p.stderr
    st = check_hang("runs/h", 2, 4, end)
    shown = run_launch("status", "runs/h", check=True).stdout
    assert "hang:       stalled 2 (" in shown and "waiting 0, 1, 3" in shown
    why = st["hang"]["ranks"]["2"]["why"]
    assert (
        why.startswith("process stopped") if mode == "stop" else why.startswith("stack elsewhere")
    )
    assert all("all_reduce" in st["hang"]["ranks"][str(r)]["why"] for r in (0, 1, 3))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sleep", "stop"])
def test_local_hang_stop_ends_the_hung_rank_first_and_the_healthy_one_cleans_up(workdir, mode):
    """Issue 35 item 7: a program that answers SIGTERM with a stop agreed over all ranks (the
    workloads' pattern) would wait in that agreement for the hung rank until the grace (30 s) ends.
    The hung rank is ended first (SIGKILL) and hang/attempt<A>/stop.json tells the healthy rank that
    this stop is a hang's: it skips the agreement, cleans up, exits 0 -- and the run ends well
    inside the timeout plus the grace."""
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--hang-timeout",
        str(TIMEOUT),
        "--env",
        "TEST_HANG_RANK=1",
        "--env",
        "TEST_HANG_STEP=4",
        "--env",
        f"TEST_HANG_MODE={mode}",
        "--env",
        "TEST_AGREED=1",
        "--run-dir",
        "runs/c",
        "--",
        "hang_worker.py",
        timeout=180,
    )
    end = time.time()
    assert p.returncode == 1, p.stderr[-2000:]
    st = check_hang("runs/c", 1, 2, end)  # the end within the timeout + 15 s of the hang
    stop = read_json(Path(st["hang"]["dir"], "stop.json"))
    assert stop["reason"] == "hang" and stop["hung_ranks"] == [1] and stop["attempt"] == 0, stop
    assert "CLEANUP DONE rank 0" in Path("runs/c/logs/node0/rank0.log").read_text()
    rec0, rec1 = read_json("runs/c/status/rank0.json"), read_json("runs/c/status/rank1.json")
    # its cleanup completed
    assert rec0["exit_code"] == 0 and not rec0.get("killed_after_grace"), rec0
    # ended first, as hung
    assert rec1["signal"] == "SIGKILL" and rec1.get("ended_as") == "hung", rec1
    assert "AGREED STOP" not in Path("runs/c/logs/node0/rank0.log").read_text()


@pytest.mark.slow
def test_local_program_without_heartbeat_silent_phase_is_not_a_hang_but_a_stop_is(workdir):
    """Progress from the log and CPU time alone: a silent start shorter than the timeout passes,
    then a SIGSTOPped rank is found."""
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--hang-timeout",
        str(TIMEOUT),
        "--env",
        "TEST_HEARTBEAT=0",
        "--env",
        f"TEST_SILENT_S={TIMEOUT - 4}",
        "--env",
        "TEST_HANG_RANK=1",
        "--env",
        "TEST_HANG_STEP=30",
        "--run-dir",
        "runs/n",
        "--",
        "hang_worker.py",
        timeout=180,
    )
    end = time.time()
    assert p.returncode == 1, p.stderr[-2000:]
    assert "STEP 29" in Path("runs/n/logs/node0/rank0.log").read_text()  # got past the silent phase
    check_hang("runs/n", 1, 2, end)
    assert not Path("runs/n/progress/rank0.json").exists()


def test_local_without_a_hang_completes_under_a_timeout(workdir):
    """60 steps of 0.2 s (longer than the timeout: a monitor that missed the advances would call a
    hang) under the same 10 s timeout as the other rows: a rank's exit after its last step (no
    heartbeat then) takes seconds under the suite's load, and 5 s was not always enough (n30)."""
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--hang-timeout",
        str(TIMEOUT),
        "--env",
        "TEST_STEPS=60",
        "--run-dir",
        "runs/ok",
        "--",
        "hang_worker.py",
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    st = read_json("runs/ok/status.json")
    assert st["state"] == "COMPLETED" and st.get("hang") is None
    assert json.loads(Path("runs/ok/progress/rank1.json").read_text())["step"] == 59


@pytest.mark.ssh
def test_ssh_stalled_rank_on_a_host(workdir):
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the SSH test hosts", st.returncode == 0, "make ssh-up")
    (
        """TEST_AGREED: the host's monitor ends the hung rank (SIGKILL) on the verdict, so the """
        """others clean up."""
    )
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,sshhost2,sshhost3",
        *SSH_OPTS,
        "--hang-timeout",
        str(TIMEOUT),
        "--env",
        "TEST_HANG_RANK=2",
        "--env",
        "TEST_HANG_STEP=4",
        "--env",
        "TEST_AGREED=1",
        "--run-dir",
        "runs/s",
        "--",
        "hang_worker.py",
        timeout=240,
    )
    end = time.time()
    assert p.returncode == 1, p.stderr[-2000:]
    st = check_hang("runs/s", 2, 3, end)
    assert st["first_failure"]["node"] == 2
    assert read_json("runs/s/status/rank2.json").get("ended_as") == "hung"
    assert "CLEANUP DONE rank 0" in Path("runs/s/logs/node0/rank0.log").read_text()


@pytest.mark.slurm
def test_slurm_stalled_rank_on_a_node(workdir):
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    (
        """TEST_AGREED: the hung rank's node task ends it (SIGKILL) on the verdict, so rank 0 """
        """cleans up."""
    )
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "10",
        "--hang-timeout",
        str(TIMEOUT),
        "--env",
        "TEST_HANG_RANK=1",
        "--env",
        "TEST_HANG_STEP=4",
        "--env",
        "TEST_AGREED=1",
        "--run-dir",
        "runs/q",
        "--wait",
        "--",
        "hang_worker.py",
        timeout=300,
    )
    end = time.time()
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    st = check_hang("runs/q", 1, 2, end)
    assert st["first_failure"]["node"] == 1
    assert read_json("runs/q/status/rank1.json").get("ended_as") == "hung"
    assert "CLEANUP DONE rank 0" in Path("runs/q/logs/node0/rank0.log").read_text()
