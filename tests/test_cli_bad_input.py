"""Every bad input: one-line error naming the value, non-zero exit, nothing started, no run dir
left."""

import os
import socket
import sys

import pytest

from conftest import run_launch

BAD = [
    (["--nodes", "0"], "--nodes"),
    (["--nodes", "-2"], "--nodes"),
    (["--nodes", "two"], "'two'"),
    (["--gpus-per-node", "0"], "--gpus-per-node"),
    (["--env", "NOEQUALS"], "NOEQUALS"),
    (["--env", "=value"], "''"),
    (["--master-port", "80"], "80"),
    (["--master-port", "70000"], "70000"),
    (["--dist-backend", "mpi"], "mpi"),
    (["--warm-spares", "--container-image", "docker.io/library/python:3.11"], "--warm-spares"),
]


@pytest.mark.parametrize("flags,needle", BAD)
def test_bad_flag(workdir, flags, needle):
    p = run_launch("local", "--run-dir", "runs/x", *flags, "--", "report.py")
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not os.path.exists("runs/x")


@pytest.mark.parametrize(
    "program,needle",
    [
        ([], "missing program"),
        (["nope.py"], "nope.py"),
        (["-m", "no_such_module_xyz"], "no_such_module_xyz"),
    ],
)
def test_bad_program(workdir, program, needle):
    p = run_launch("local", "--run-dir", "runs/x", "--", *program)
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, (
        p.stderr
    )
    assert not os.path.exists("runs/x")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("nodes: [1, 2\n", "not valid YAML"),
        ("nodez: 2\n", "'nodez'"),
        ("nodes: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
        ("slurm: {partishun: gpu}\n", "partishun"),
        ("- a\n- b\n", "mapping"),
    ],
)
def test_bad_profile(workdir, text, needle):
    (workdir / "p.yaml").write_text(text)
    p = run_launch("local", "--profile", "p.yaml", "--run-dir", "runs/x", "--", "report.py")
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, (
        p.stderr
    )
    assert not os.path.exists("runs/x")


def test_port_in_use(workdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_launch(
            "local", "--master-port", str(port), "--run-dir", "runs/x", "--", "report.py"
        )
    assert p.returncode == 2 and str(port) in p.stderr and "in use" in p.stderr, p.stderr
    assert not os.path.exists("runs/x")


def test_existing_run_dir_refused(workdir):
    os.makedirs("runs/x/checkpoints")
    (workdir / "runs/x/checkpoints/keep").write_text("job data")
    p = run_launch("local", "--run-dir", "runs/x", "--", "report.py")
    assert p.returncode == 2 and "already exists" in p.stderr and "launch resume" in p.stderr
    assert (workdir / "runs/x/checkpoints/keep").read_text() == "job data"


@pytest.mark.parametrize("verb", ["status", "logs", "resume", "cancel"])
def test_not_a_run_dir(workdir, verb):
    os.makedirs("plain")
    p = run_launch(verb, "plain")
    assert (
        p.returncode == 2
        and "not a run dir" in p.stderr
        and len(p.stderr.strip().splitlines()) == 1
    )


def test_profile_layering(workdir):
    (workdir / "p.yaml").write_text(
        "nodes: 3\ngpus_per_node: 2\nenv: {A: from_profile, B: keep}\nname: prof\n"
    )
    p = run_launch(
        "local",
        "--profile",
        "p.yaml",
        "--nodes",
        "2",
        "--env",
        "A=cli",
        "--dry-run",
        "--",
        "report.py",
    )
    assert p.returncode == 0, p.stderr
    assert "2 nodes x 2 processes" in p.stdout
    assert "A=cli" in p.stdout and "B=keep" in p.stdout and "from_profile" not in p.stdout
    assert not os.path.exists("runs")


def test_cli_does_not_import_torch():
    code = "import sys, launchers.cli; print('torch' in sys.modules)"
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_version_and_help():
    assert run_launch("--version").stdout.startswith("launch, version")
    h = run_launch("--help").stdout
    assert "Examples:" in h and "launch local --nodes 4" in h
