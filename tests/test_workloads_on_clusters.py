"""The convnet workload on every backend: the same 4-rank job gives the same param_sha256 locally, over SSH,
and on Slurm after a USR2 preemption + requeue in the middle (checkpoint at the signal, resume from it)."""
import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, read_json, require_cluster, run_launch

ARGS = ["-m", "workloads.convnet", "--dataset", "digits", "--max-steps", "160", "--checkpoint-every", "50",
        "--seed", "11", "--log-every", "2"]
SSH_STATE = Path("/run/launch-ssh-hosts")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    p = run_launch("local", "--nodes", "2", "--gpus-per-node", "2", "--run-dir", str(d / "run"), "--", *ARGS, cwd=d)
    assert p.returncode == 0, p.stderr[-3000:]
    return read_json(d / "run" / "final.json")


def last_step(run_dir) -> int:
    try:
        lines = Path(run_dir, "metrics.jsonl").read_text().strip().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError):
        return 0


@pytest.mark.slurm
def test_slurm_preempted_convnet_resumes_bit_exact(workdir, reference):
    up = subprocess.run([str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True)
    require_cluster("the dev Slurm cluster", up.returncode == 0, "make slurm-up")
    p = run_launch("slurm", "--nodes", "2", "--gpus-per-node", "2", "--time", "10", "--run-dir", "runs/s", "--", *ARGS)
    assert p.returncode == 0, p.stderr
    job = Path("runs/s/slurm/jobs").read_text().split()[-1]
    deadline = time.monotonic() + 240
    while last_step("runs/s") < 20:
        assert time.monotonic() < deadline, "training never reached step 20"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    assert run_launch("wait", "runs/s", "--timeout", "400").returncode == 0, run_launch("status", "runs/s").stdout
    st = read_json("runs/s/status.json")
    assert st["state"] == "COMPLETED" and st["attempt"] >= 1
    rank0 = Path("runs/s/logs/node0/rank0.log").read_text()
    assert "preempted: checkpoint at step" in rank0 and "resumed from step-" in rank0
    final = read_json("runs/s/final.json")
    assert final["step"] == 160 and final["param_sha256"] == reference["param_sha256"]


@pytest.mark.ssh
def test_ssh_convnet_matches_local(workdir, reference):
    require_cluster("the SSH test hosts", (SSH_STATE / "known_hosts").exists(), "make ssh-up")
    p = run_launch("ssh", "--hostfile", str(SSH_STATE / "hostfile"), "--ssh-config", str(SSH_STATE / "ssh_config"),
                   "--known-hosts", str(SSH_STATE / "known_hosts"), "--nodes", "2", "--gpus-per-node", "2",
                   "--run-dir", str(workdir / "runs/h"), "--", *ARGS)
    assert p.returncode == 0, p.stderr[-3000:]
    final = read_json("runs/h/final.json")
    assert final["step"] == 160 and final["world_size"] == 4
    assert final["param_sha256"] == reference["param_sha256"]
