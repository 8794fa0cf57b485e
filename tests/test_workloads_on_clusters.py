"""The convnet workload on every backend: the same 4-rank job gives the same param_sha256 locally, over SSH,
and on Slurm after a USR2 preemption + requeue in the middle (checkpoint at the signal, resume from it).
The DeepSpeed workload on Slurm: USR2 in the middle -> its checkpoint at the next step, requeue, resume, finish."""
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, read_json, require_cluster, run_launch

DS_STEPS = 600
DS_ARGS = ["-m", "workloads.deepspeed_zero", "--zero-stage", "2", "--dataset", "digits", "--max-steps", str(DS_STEPS),
           "--checkpoint-every", "200", "--seed", "5", "--log-every", "2"]
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
    require_slurm()
    p = run_launch("slurm", "--nodes", "2", "--gpus-per-node", "2", "--time", "10", "--run-dir", "runs/s", "--", *ARGS)
    assert p.returncode == 0, p.stderr
    preempt_when("runs/s", 20)
    assert run_launch("wait", "runs/s", "--timeout", "400").returncode == 0, run_launch("status", "runs/s").stdout
    st = read_json("runs/s/status.json")
    assert st["state"] == "COMPLETED" and st["attempt"] >= 1
    rank0 = Path("runs/s/logs/node0/rank0.log").read_text()
    assert "preempted: checkpoint at step" in rank0 and "resumed from step-" in rank0
    final = read_json("runs/s/final.json")
    assert final["step"] == 160 and final["param_sha256"] == reference["param_sha256"]


def require_slurm() -> None:
    up = subprocess.run([str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True)
    require_cluster("the dev Slurm cluster", up.returncode == 0, "make slurm-up")


def preempt_when(run_dir: str, step: int) -> None:
    """USR2 to the run's Slurm job (what a preemption notice sends) once its metrics reach `step`."""
    job = Path(run_dir, "slurm", "jobs").read_text().split()[-1]
    deadline = time.monotonic() + 240
    while last_step(run_dir) < step:
        assert time.monotonic() < deadline, f"training never reached step {step}"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)


@pytest.mark.slurm
def test_slurm_preempted_deepspeed_checkpoints_requeues_and_finishes(workdir):
    """The agreed stop reaches DeepSpeed through the one training loop: a preempted ZeRO-2 job writes a
    checkpoint at the step it stopped on, is requeued, resumes from exactly that checkpoint and finishes."""
    require_slurm()
    p = run_launch("slurm", "--nodes", "2", "--gpus-per-node", "1", "--time", "10", "--run-dir", "runs/d", "--",
                   *DS_ARGS)
    assert p.returncode == 0, p.stderr
    preempt_when("runs/d", 10)
    assert run_launch("wait", "runs/d", "--timeout", "400").returncode == 0, run_launch("status", "runs/d").stdout
    st = read_json("runs/d/status.json")
    assert st["state"] == "COMPLETED" and st["attempt"] >= 1, st
    rank0 = Path("runs/d/logs/node0/rank0.log").read_text()
    stopped = [int(x) for x in re.findall(r"preempted: checkpoint at step (\d+) written", rank0)]
    assert len(stopped) == 1 and 10 <= stopped[0] < DS_STEPS, rank0[-3000:]
    s = stopped[0]
    name = f"step-{s:08d}"
    meta = read_json(f"runs/d/checkpoints/{name}/launch_meta.json")
    assert meta["step"] == s and meta["world_size"] == 2 and meta["zero_stage"] == 2
    assert len(list(Path("runs/d/checkpoints", name).glob("*zero_pp_rank_*_optim_states.pt"))) == 2
    assert f"resumed from {name} (step {s}," in rank0
    m = [json.loads(ln) for ln in Path("runs/d/metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert max(x["step"] for x in m if x["attempt"] == 0) <= s < min(x["step"] for x in m if x["attempt"] >= 1)
    final = read_json("runs/d/final.json")
    assert final["step"] == DS_STEPS and final["attempt"] >= 1 and final["zero_stage"] == 2
    assert Path("runs/d/checkpoints/latest").read_text().strip() == f"step-{DS_STEPS:08d}"


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
