"""The local backend with real torchrun agents and gloo workers (2 nodes x 2 processes)."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LAUNCH, rank_lines, read_json, run_launch
from launchers import procs


def reports(run_dir):
    return [json.loads(ln[len("REPORT ") :]) for ln in rank_lines(run_dir, "REPORT ")]


def test_2x2_world_ranks_allreduce_and_layout(workdir):
    weird = ["a b", "quote'\"", "$(touch pwned)", "line1\nline2", "ünïcødé ✓", "", "--flag=x y"]
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/r",
        "--env",
        "TEST_SECRET_TOKEN=hunter2",
        "--",
        "report.py",
        *weird,
    )
    assert p.returncode == 0, p.stderr
    reps = sorted(reports("runs/r"), key=lambda r: r["rank"])
    assert [r["rank"] for r in reps] == [0, 1, 2, 3]
    assert {r["world"] for r in reps} == {4}
    assert [r["node_rank"] for r in reps] == ["0", "0", "1", "1"]
    assert {r["sum"] for r in reps} == {10.0}
    assert all(r["argv"] == weird for r in reps)
    assert not (workdir / "pwned").exists()
    env = reps[0]["env"]
    assert env["LAUNCH_RUN_DIR"] == str(workdir / "runs/r") and env["LAUNCH_ATTEMPT"] == "0"
    assert (
        env["LAUNCH_CHECKPOINT_DIR"] == str(workdir / "runs/r/checkpoints") and env["NNODES"] == "2"
    )
    assert 20000 <= int(env["MASTER_PORT"]) < 60000 and env["OMP_NUM_THREADS"] == "1"
    # layout
    for k, ranks in ((0, (0, 1)), (1, (2, 3))):
        assert (workdir / f"runs/r/logs/node{k}/agent.log").exists()
        for r in ranks:
            log = (workdir / f"runs/r/logs/node{k}/rank{r}.log").read_text()
            assert log.startswith(f"===== launch attempt 0 | rank {r} of 4 | node {k}")
    st = read_json("runs/r/status.json")
    assert (
        st["state"] == "COMPLETED"
        and st["nodes"] == {"0": 0, "1": 0}
        and st["first_failure"] is None
    )
    run_yaml = (workdir / "runs/r/run.yaml").read_text()
    assert "hunter2" not in run_yaml and "TEST_SECRET_TOKEN: '***'" in run_yaml
    # the launcher streamed prefixed output while running
    assert "[n1 r3] REPORT" in p.stdout
    # status / logs / list
    s = run_launch("status", "runs/r", check=True).stdout
    assert "COMPLETED" in s and "node0=0" in s
    lg = run_launch("logs", "runs/r", check=True).stdout
    assert sum(1 for ln in lg.splitlines() if ln.startswith("[n1 r2] REPORT")) == 1
    one = run_launch("logs", "runs/r", "--rank", "3", check=True).stdout
    assert one.splitlines()[1].startswith("REPORT") and "[n" not in one
    lst = run_launch("list", check=True).stdout
    assert "r " in lst and "local" in lst and "2x2" in lst and "COMPLETED" in lst


def test_failing_rank_is_first_failure(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/f",
        "--env",
        "TEST_FAIL_RANK=2",
        "--env",
        "TEST_SLEEP=60",
        "--",
        "report.py",
    )
    assert p.returncode == 1, p.stderr
    st = read_json("runs/f/status.json")
    assert st["state"] == "FAILED"
    assert st["first_failure"]["rank"] == 2 and st["first_failure"]["node"] == 1
    assert st["first_failure"]["exit_code"] == 3
    assert "rank 2 on node 1" in run_launch("status", "runs/f").stdout
    assert procs.tagged_pids(yaml_run_id("runs/f")) == []


def yaml_run_id(run_dir):
    import yaml

    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]


def test_sigint_leaves_no_process(workdir):
    p = subprocess.Popen(
        [
            LAUNCH,
            "local",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--run-dir",
            "runs/c",
            "--env",
            "TEST_SLEEP=120",
            "--",
            "report.py",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(rank_lines("runs/c", "sleeping")) < 4:
        assert time.monotonic() < deadline and p.poll() is None, (
            p.stderr.read() if p.poll() is not None else "timeout"
        )
        time.sleep(0.2)
    run_id = yaml_run_id("runs/c")
    assert len(procs.tagged_pids(run_id)) >= 6  # 2 agents + 4 wrappers + 4 workers
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 130
    assert procs.tagged_pids(run_id) == []
    assert read_json("runs/c/status.json")["state"] == "CANCELLED"


def test_cancel_from_another_process(workdir):
    p = subprocess.Popen(
        [
            LAUNCH,
            "local",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--run-dir",
            "runs/k",
            "--env",
            "TEST_SLEEP=120",
            "--",
            "report.py",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while len(rank_lines("runs/k", "sleeping")) < 2:
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.2)
    assert run_launch("cancel", "runs/k").returncode == 0
    assert p.wait(timeout=30) == 143  # terminated (130 is Ctrl-C's)
    assert procs.tagged_pids(yaml_run_id("runs/k")) == []
    st = read_json("runs/k/status.json")
    assert (
        st["state"] == "CANCELLED"
        and st["reason"] == "by launch cancel"
        and st["first_failure"] is None
    )


@pytest.mark.slow
def test_max_restarts_new_attempt_appends(workdir):
    # rank 1 fails in every attempt: 1 + 1 restart = 2 attempts, then FAILED; logs appended, not
    # replaced
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/m",
        "--max-restarts",
        "1",
        "--env",
        "TEST_FAIL_RANK=1",
        "--",
        "report.py",
    )
    assert p.returncode == 1 and "restarting" in p.stderr
    log = (workdir / "runs/m/logs/node0/rank0.log").read_text()
    assert "launch attempt 0" in log and "launch attempt 1" in log
    st = read_json("runs/m/status.json")
    assert st["attempt"] == 1 and st["state"] == "FAILED" and st["first_failure"]["rank"] == 1
    envs = [r["env"]["LAUNCH_ATTEMPT"] for r in reports("runs/m") if r["rank"] == 0]
    assert envs == ["0", "1"]
    # a resume is one more attempt with the same run id and port
    r = run_launch("resume", "runs/m", "--max-restarts", "0")
    assert r.returncode == 1
    reps = [x for x in reports("runs/m") if x["rank"] == 0]
    assert [x["env"]["LAUNCH_ATTEMPT"] for x in reps] == ["0", "1", "2"]
    assert (
        len({x["env"]["LAUNCH_RUN_ID"] for x in reps}) == 1
        and len({x["env"]["MASTER_PORT"] for x in reps}) == 1
    )
