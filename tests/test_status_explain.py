"""`launch status` explains: per-rank progress (--ranks), a killed launcher (status.json corrected,
the pids still alive listed), NCCL refusals from the rank logs, the hang verdict
(tests/test_hang.py)."""

import json
import signal
import subprocess
import time
from pathlib import Path

from conftest import LAUNCH, read_json, run_launch
from launchers import procs


def test_ranks_table_from_heartbeats(workdir):
    run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--env",
        "TEST_STEPS=6",
        "--env",
        "TEST_STEP_S=0.05",
        "--run-dir",
        "runs/r",
        "--",
        "hang_worker.py",
        check=True,
        timeout=120,
    )
    st = json.loads(run_launch("status", "runs/r", "--ranks", "--json", check=True).stdout)
    assert [(r["rank"], r["node"], r["step"]) for r in st["ranks"]] == [(0, 0, 5), (1, 1, 5)]
    assert all(
        r["step_time_s"] > 0 and r["straggler"] is not None and r["age_s"] >= 0 for r in st["ranks"]
    )
    out = run_launch("status", "runs/r", "--ranks", check=True).stdout.splitlines()
    head = next(i for i, ln in enumerate(out) if ln.split()[:2] == ["RANK", "NODE"])
    assert [ln.split()[:3] for ln in out[head + 1 : head + 3]] == [["0", "0", "5"], ["1", "1", "5"]]


def test_killed_launcher_is_shown_and_status_json_corrected(workdir):
    proc = subprocess.Popen(
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
            "TEST_STEP_S=1",
            "--",
            "hang_worker.py",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 90
    while "STEP 1" not in (
        Path("runs/k/logs/node0/rank0.log").read_text()
        if Path("runs/k/logs/node0/rank0.log").exists()
        else ""
    ):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    p = run_launch("status", "runs/k", check=True)
    assert "state:      FAILED  (launcher died" in p.stdout and "still alive: pids" in p.stdout
    st = read_json("runs/k/status.json")  # corrected on disk, not only in the printout
    assert (
        st["state"] == "FAILED"
        and st["surviving_pids"]
        and st["reason"].startswith("launcher died")
    )
    run_id = __import__("yaml").safe_load(Path("runs/k/run.yaml").read_text())["run_id"]
    assert set(st["surviving_pids"]) <= set(procs.tagged_pids(run_id)) | set(st["surviving_pids"])
    run_launch("cancel", "runs/k", check=True)
    assert procs.tagged_pids(run_id) == []


def test_nccl_refusals_in_rank_logs_are_listed_once(workdir):
    (workdir / "nccl_warn.py").write_text(
        "import os\nr = os.environ['RANK']\n"
        "print(f'node:{r}:1 [0] NCCL INFO NCCL_PROTO set by environment to shm')\n"
        "print(f'node:{r}:1 [0] misc/param.cc:53 NCCL WARN Unrecognized element token \"shm\"')\n"
    )
    run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/n",
        "--",
        "nccl_warn.py",
        check=True,
    )
    st = json.loads(run_launch("status", "runs/n", "--json", check=True).stdout)
    assert len(st["nccl_refusals"]) == 1 and "Unrecognized element token" in st["nccl_refusals"][0]
    assert "nccl:       rank 0: " in run_launch("status", "runs/n", check=True).stdout


def test_logs_of_a_rank_beyond_the_world_says_the_world_size(workdir):
    run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--env",
        "TEST_STEPS=1",
        "--run-dir",
        "runs/w",
        "--",
        "hang_worker.py",
        check=True,
        timeout=120,
    )
    p = run_launch("logs", "runs/w", "--rank", "7")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"launch: error: --rank 7 has no log in {workdir}/runs/w (world size 2: 1 nodes x 2); "
        "accepted: 0, 1"
    ]


def test_next_steps_name_the_first_failures_log_and_the_next_command(tmp_path):
    """The last lines of `launch status` for a failed run (rendering only; a real local run's are
    compared in docs/TROUBLESHOOTING.md by tests/test_docs_commands.py): the rank's log, on Slurm
    that node's own output file when there, the next command; a node failure without a rank: its
    agent log; nothing for a completed run."""
    from launchers.diagnosis.explain import next_steps

    rd = tmp_path / "my run"
    (rd / "slurm").mkdir(parents=True)
    (rd / "slurm" / "42_1_log.out").write_text("")
    st = {
        "run_dir": str(rd),
        "state": "FAILED",
        "slurm_job_id": "42",
        "first_failure": {"node": 1, "rank": 3},
    }
    assert next_steps(st) == [
        f"see:        {rd}/logs/node1/rank3.log",
        f"slurm out:  {rd}/slurm/42_1_log.out",
        f"next:       launch logs '{rd}' --rank 3",
    ]
    st = {"run_dir": str(rd), "state": "FAILED", "first_failure": {"node": 0, "reason": "lost"}}
    assert next_steps(st) == [
        f"see:        {rd}/logs/node0/agent.log",
        f"next:       launch logs '{rd}'",
    ]
    assert (
        next_steps({**st, "state": "COMPLETED"}) == []
        and next_steps({"run_dir": str(rd), "state": "FAILED"}) == []
    )
