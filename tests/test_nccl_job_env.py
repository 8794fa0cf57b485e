"""Every NCCL variable a job gets is validated before anything starts, whatever its source (preset,
profile env, --env, --forward-env), on every backend; the caller's NCCL_* reach a job only when
forwarded."""

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, rank_lines, require_cluster, run_launch

SSH_STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH_OPTS = [
    "--hosts",
    "sshhost1,sshhost2",
    "--ssh-config",
    str(SSH_STATE / "ssh_config"),
    "--known-hosts",
    str(SSH_STATE / "known_hosts"),
]


def refused(p, *needles):
    assert p.returncode == 2, p.stdout + p.stderr
    err = [ln for ln in p.stderr.strip().splitlines() if ln.startswith("launch: error: ")]
    assert len(err) == 1 and all(n in err[0] for n in needles), p.stderr


def nccl_env_of_workers(run_dir):
    reps = [json.loads(ln.split(" ", 1)[1]) for ln in rank_lines(run_dir, "REPORT ")]
    return reps, [{k: v for k, v in r["env"].items() if k.startswith("NCCL_")} for r in reps]


def test_env_nccl_value_nccl_refuses_aborts_local_with_nothing_started(workdir):
    # NCCL_PROTO tokens: parseList in src/graph/tuning.cc (nccl-2.30.7: 'Unrecognized element
    # token')
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--env",
        "NCCL_PROTO=shm",
        "--run-dir",
        "runs/a",
        "--",
        "report.py",
    )
    refused(p, "NCCL_PROTO='shm'", "--env", "tuning.cc")
    assert not (workdir / "runs").exists()


def test_profile_env_is_validated_like_env(workdir):
    (workdir / "p.yaml").write_text("env:\n  NCCL_ALGO: '^ring,^tree'\n")
    p = run_launch("local", "--profile", "p.yaml", "--run-dir", "runs/p", "--", "report.py")
    refused(p, "NCCL_ALGO=")
    assert not (workdir / "runs").exists()


def test_forwarded_variables_are_validated_and_reach_every_worker(workdir):
    p = run_launch(
        "local",
        "--forward-env",
        "NCCL_*",
        "--run-dir",
        "runs/bad",
        "--",
        "report.py",
        env={"NCCL_ALGO": "bogus"},
    )
    refused(p, "NCCL_ALGO='bogus'", "forwarded from your environment")
    assert not (workdir / "runs").exists()
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--forward-env",
        "NCCL_*",
        "--env",
        "NCCL_DEBUG=WARN",
        "--run-dir",
        "runs/ok",
        "--",
        "report.py",
        env={"NCCL_ALGO": "Ring", "NCCL_DEBUG": "INFO"},
    )
    assert p.returncode == 0, p.stderr
    assert "not forwarded" not in p.stderr
    reps, envs = nccl_env_of_workers("runs/ok")
    # --env wins
    assert len(reps) == 2 and all(e == {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN"} for e in envs)


def test_callers_nccl_variables_are_named_once_and_not_passed_on(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--run-dir",
        "runs/n",
        "--",
        "report.py",
        env={"NCCL_ALGO": "Ring", "NCCL_IB_HCA": "mlx5_0"},
    )
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in p.stderr.splitlines() if "not forwarded" in ln]
    assert len(notes) == 1 and "NCCL_ALGO, NCCL_IB_HCA" in notes[0] and "--forward-env" in notes[0]
    reps, envs = nccl_env_of_workers("runs/n")
    assert len(reps) == 2 and envs == [{}, {}]


@pytest.mark.parametrize("glob", ["", "NCCL *", "A=B"])
def test_bad_forward_env_glob(workdir, glob):
    refused(
        run_launch("local", "--forward-env", glob, "--run-dir", "runs/g", "--", "report.py"),
        "--forward-env",
    )
    assert not (workdir / "runs").exists()


@pytest.mark.ssh
def test_env_nccl_refused_on_ssh_before_connecting(workdir):
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the SSH test hosts", st.returncode == 0, "make ssh-up")
    p = run_launch(
        "ssh", *SSH_OPTS, "--env", "NCCL_PROTO=shm", "--run-dir", "runs/s", "--", "report.py"
    )
    refused(p, "NCCL_PROTO='shm'")
    assert not (workdir / "runs").exists()


@pytest.mark.exclusive
@pytest.mark.slurm
def test_env_nccl_refused_on_slurm_nothing_submitted(workdir):
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    before = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    p = run_launch(
        "slurm", "--nodes", "2", "--env", "NCCL_PROTO=shm", "--run-dir", "runs/q", "--", "report.py"
    )
    refused(p, "NCCL_PROTO='shm'")
    assert not (workdir / "runs").exists()
    after = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    assert set(after) <= set(before)


def test_nccl_bench_out_dir_gets_results_csv(tmp_path):
    out = tmp_path / "res"
    p = run_launch(
        "nccl",
        "bench",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--ops",
        "all_reduce",
        "--min-bytes",
        "1K",
        "--max-bytes",
        "1K",
        "--warmup",
        "1",
        "--iters",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["op"] for r in rows] == ["all_reduce"] and rows[0]["ranks"] == "2"
    # run dir as before
    assert (tmp_path / "run" / "results.csv").read_text() == (out / "results.csv").read_text()
    again = run_launch("nccl", "bench", "--ops", "all_reduce", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "never overwritten" in again.stderr
