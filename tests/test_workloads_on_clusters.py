"""The convnet workload on every backend: the same 4-rank job gives the same param_sha256 locally
and over SSH. Slurm's preempted convnet (bit-exact after the requeue) and the preempted DeepSpeed
job are rows of the Slurm fault suite (tests/faults/test_faults_slurm.py)."""

from pathlib import Path

import pytest

from conftest import read_json, require_cluster, run_launch

ARGS = [
    "-m",
    "workloads.convnet",
    "--dataset",
    "digits",
    "--max-steps",
    "60",
    "--checkpoint-every",
    "25",
    "--seed",
    "11",
    "--log-every",
    "2",
]
SSH_STATE = Path("/run/launch-ssh-hosts")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--run-dir",
        str(d / "run"),
        "--",
        *ARGS,
        cwd=d,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return read_json(d / "run" / "final.json")


@pytest.mark.ssh
def test_ssh_convnet_matches_local(workdir, reference):
    require_cluster("the SSH test hosts", (SSH_STATE / "known_hosts").exists(), "make ssh-up")
    p = run_launch(
        "ssh",
        "--hostfile",
        str(SSH_STATE / "hostfile"),
        "--ssh-config",
        str(SSH_STATE / "ssh_config"),
        "--known-hosts",
        str(SSH_STATE / "known_hosts"),
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--run-dir",
        str(workdir / "runs/h"),
        "--",
        *ARGS,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    final = read_json("runs/h/final.json")
    assert final["step"] == 60 and final["world_size"] == 4
    assert final["param_sha256"] == reference["param_sha256"]
