"""First failure, one rule on every backend: the earliest failing rank record of the attempt, even
when the nodes' sessions end in another order. Here rank 2 (node 1) fails first, rank 0 (node 0) two
seconds later, and node 1 ends last (rank 3 takes 6 s to stop), so node 0's session ends first. The
first failure carries the last line of the failing rank's traceback (issue 21), shown in the end
line next to its exit code."""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, read_json, require_cluster, run_launch

PLAN = ["--env", "TEST_PLAN=2:1.0:3,0:3.0:1", "--env", "TEST_SLOW_STOP=3"]
SSH_STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))


def check(run_dir, p):
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    st = read_json(f"{run_dir}/status.json")
    ff = st["first_failure"]
    assert st["state"] == "FAILED" and (ff["rank"], ff["node"], ff["exit_code"]) == (2, 1, 3), st
    # its traceback's last line
    assert ff["exception"] == "RuntimeError: planned failure of rank 2", ff
    assert (
        "launch: run FAILED (rank 2 on node 1, exit code 3: RuntimeError: planned failure of "
        "rank 2)" in p.stderr
    )
    return ff


@pytest.mark.slow
def test_local(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        *PLAN,
        "--run-dir",
        "runs/l",
        "--",
        "order_worker.py",
        timeout=180,
    )
    check("runs/l", p)


@pytest.mark.ssh
def test_ssh_session_order_differs_from_failure_order(workdir):
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the SSH test hosts", st.returncode == 0, "make ssh-up")
    (workdir / "hf").write_text("sshhost1 slots=2\nsshhost2 slots=2\n")
    p = run_launch(
        "ssh",
        "--hostfile",
        "hf",
        "--ssh-config",
        str(SSH_STATE / "ssh_config"),
        "--known-hosts",
        str(SSH_STATE / "known_hosts"),
        *PLAN,
        "--run-dir",
        "runs/s",
        "--",
        "order_worker.py",
        timeout=240,
    )
    ff = check("runs/s", p)
    assert ff["host"] == "sshhost2"
    assert "node 0 failed; stopping the other nodes" in p.stderr  # node 0's session did end first


@pytest.mark.slurm
def test_slurm(workdir):
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--time",
        "10",
        "--wait",
        *PLAN,
        "--run-dir",
        "runs/q",
        "--",
        "order_worker.py",
        timeout=300,
    )
    check("runs/q", p)
