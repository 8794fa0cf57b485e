"""Issue 35 item 5: an image reference is read by the runtime's own grammar and is never an option;
every path that goes into a mount spec is refused (one line, before anything starts) where the
runtime's mount option would split it; `~` in --container-mount is the submitting user's home; a
Slurm cluster whose srun lacks pyxis's --container-image is named before submit. Pure (the dev Slurm
cluster's own srun --help is read in test_slurm_srun_without_pyxis_is_named_before_submit)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from launchers.containers import container, containeropts
from launchers.errors import LaunchError
from launchers.spec import RunSpec, build_spec


def build(backend, **flags):
    return build_spec(backend, dict(flags, options={}), ["-m", "json"])


def refused(backend, tmp_path, **flags) -> str:
    with pytest.raises(LaunchError) as e:
        build(backend, **flags)
    msg = str(e.value)
    assert "\n" not in msg
    # nothing written
    assert [p.name for p in tmp_path.iterdir() if p.name not in ("code", "bin")] == []
    return msg


# ---- an image is an image reference, never an option --------------------------------------------

OPTIONS = ["--privileged", "-v/:/host", "--volume=/:/host", "-it", "--device=/dev/mem"]


@pytest.mark.parametrize(
    "backend,runtime",
    [("ssh", "podman"), ("slurm", "pyxis"), ("slurm", "apptainer"), ("local", "podman")],
)
@pytest.mark.parametrize("image", OPTIONS)
def test_an_option_is_never_an_image(backend, runtime, image, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}/bin:{os.environ['PATH']}")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / runtime).write_text("#!/bin/sh\n")
    (tmp_path / "bin" / runtime).chmod(0o755)
    msg = refused(backend, tmp_path, container_image=image, container_runtime=runtime)
    assert (
        f"--container-image {image!r} is not an image {runtime} accepts (an option is never an "
        "image)" in msg
    )
    assert "accepted: " in msg


GOOD = {
    "podman": [
        "img",
        "localhost/train:1",
        "python:3.11",
        "docker.io/library/python:3.11",
        "registry.example.com:5000/team/train_v2@sha256:" + "a" * 64,
        "docker://nvcr.io/nvidia/pytorch:24.05-py3",
        "containers-storage:localhost/train:1",
        "oci-archive:/images/train.tar",
        "[::1]:5000/train",
    ],
    "pyxis": [
        "img",
        "nvcr.io#nvidia/pytorch:24.05-py3",
        "docker://nvcr.io#nvidia/pytorch:24.05-py3",
        "me@registry.example.com:5000#team/train:1",
        "/lustre/containers/pytorch.sqsh",
        "./train.sqsh",
        "ubuntu:22.04",
        "podman://localhost/train:1",
    ],
    "apptainer": [
        "/images/train.sif",
        "./train.sif",
        "train.sif",
        "img",
        "docker://python:3.11",
        "oras://ghcr.io/team/train:1",
        "library://sylabs/default/alpine:3.19",
        "docker-daemon:train:1",
    ],
}
BAD = {
    "podman": [
        "Library/Python",
        "train:",
        "reg.io/Team/train:1",
        "a//b",
        "docker://-x",
        "oci-archive:-x",
        "nvcr.io#nvidia/pytorch:24.05-py3",
        "train@sha256:short",
    ],
    "pyxis": ["train.sqsh:x:y", "nvcr.io#Nvidia/pytorch", "#x", "docker://--privileged"],
    "apptainer": ["train:1", "docker://Upper/case", "oras://-x", "weird:x"],
}


@pytest.mark.parametrize("runtime,image", [(r, i) for r, imgs in GOOD.items() for i in imgs])
def test_the_runtimes_own_grammar_accepts(runtime, image):
    assert containeropts.check_image(image, runtime) == image


@pytest.mark.parametrize("runtime,image", [(r, i) for r, imgs in BAD.items() for i in imgs])
def test_the_runtimes_own_grammar_refuses(runtime, image):
    with pytest.raises(LaunchError, match=f"is not an image {runtime} accepts; accepted: ") as e:
        containeropts.check_image(image, runtime)
    assert "\n" not in str(e.value)


# ---- paths that go into a mount spec ------------------------------------------------------------


@pytest.mark.parametrize(
    "runtime,name,char",
    [
        ("pyxis", "a:b", "':'"),
        ("pyxis", "a,b", "','"),
        ("pyxis", "my runs", "' '"),
        ("apptainer", "a:b", "':'"),
        ("apptainer", "a,b", "','"),
        ("apptainer", "my runs", "' '"),
        ("podman", "a:b", "':'"),
    ],
)
def test_a_run_dir_the_runtimes_mount_spec_would_split_is_refused_before_anything(
    runtime, name, char, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    backend = "slurm" if runtime == "pyxis" else "ssh"
    msg = refused(
        backend,
        tmp_path,
        container_image="img",
        container_runtime=runtime,
        run_dir=str(tmp_path / name / "r1"),
    )
    assert msg.startswith(f"the run dir '{tmp_path}/{name}/r1' holds {char}, which ")
    assert containeropts.MOUNT_OPTION[runtime] in msg and "refused before anything starts" in msg


def test_the_launch_dir_is_checked_too(tmp_path, monkeypatch):
    code = tmp_path / "code" / "my project"
    code.mkdir(parents=True)
    monkeypatch.chdir(code)
    msg = refused("slurm", tmp_path, container_image="img", run_dir=str(tmp_path / "r1"))
    assert msg.startswith(
        f"the launch dir (the container's working directory) '{code}' holds ' ', which "
        "srun --container-mounts cannot take"
    )


def test_podman_takes_a_run_dir_with_a_space_or_comma_as_one_word(tmp_path, monkeypatch):
    """podman -v splits SRC:DST[:OPTS] on ':' only (its options on ','), and the spec is one argv
    word."""
    monkeypatch.chdir(tmp_path)
    for name in ("my runs", "a,b"):
        s = build(
            "ssh",
            container_image="img",
            container_runtime="podman",
            run_dir=str(tmp_path / name / "r1"),
        )
        assert (s.run_dir, s.run_dir, False) in container.mounts(s, "/opt/src/launchers")


def test_the_last_guard_names_a_path_any_spec_brings(tmp_path):
    """A RunSpec made another way (the API, a resume) meets the same check where the mount spec is
    made."""
    sp = RunSpec(
        backend="slurm",
        nodes=1,
        gpus_per_node=1,
        program=("-m", "json"),
        program_args=(),
        run_dir="/shared/runs/r1",
        name="r1",
        python="/venv/bin/python",
        container_image="img",
        container_runtime="pyxis",
        container_python="python3",
        container_workdir="/shared/code",
        torch_extensions_dir="/shared/runs/.torch_extensions/a b",
    )
    with pytest.raises(
        LaunchError,
        match=(
            r"^the torch extensions dir '/shared/runs/.torch_extensions/a b' holds "
            r"' ', which srun --container-mounts cannot take"
        ),
    ):
        container.srun_args(sp)


def test_tilde_in_a_container_mount_is_the_submitting_users_home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/me")
    assert containeropts.parse_mount("~/data:/data:ro", "/code") == "/home/me/data:/data:ro"
    assert containeropts.parse_mount("~:/h", "/code") == "/home/me:/h"
    s = build("slurm", container_image="img", container_mounts=("~/data:/data",))
    assert s.container_mounts == ("/home/me/data:/data",)
    msg = refused(
        "slurm", tmp_path, container_image="img", container_mounts=("~nosuchuser-35/x:/x",)
    )
    assert msg == (
        "--container-mount '~nosuchuser-35/x:/x': '~nosuchuser-35/x' names no home directory known "
        "here; give an absolute SRC or ~/PATH (your home)"
    )
    assert "is relative" in refused(
        "slurm", tmp_path, container_image="img", container_mounts=("/x:~/x",)
    )


# ---- a runtime the nodes lack is named before submit ---------------------------------------------


def test_pyxis_missing_from_srun_help_is_one_line():
    with_pyxis = (
        "Usage: srun [OPTIONS(0)...]\n      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"
    )
    assert containeropts.pyxis_missing(with_pyxis) is None
    msg = containeropts.pyxis_missing("Usage: srun [OPTIONS(0)...]\n      --container=PATH\n")
    assert msg.startswith(
        "--container-runtime pyxis: this cluster's srun has no --container-image "
        "(`srun --help` does not list it: the pyxis plugin is not installed"
    )
    assert "\n" not in msg


@pytest.mark.slurm
def test_slurm_srun_without_pyxis_is_named_before_submit(tmp_path):
    """The dev cluster has no pyxis: `launch slurm --container-runtime pyxis` stops before sbatch,
    in one line, and no run dir is made (was: the job ran and ended FAILED, node(s) 0 recorded no
    exit)."""
    if not shutil.which("srun"):
        pytest.fail("srun is not on PATH: bring the dev Slurm cluster up (make slurm-up)")
    run_dir = tmp_path / "r1"
    p = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "launch"),
            "slurm",
            "--nodes",
            "1",
            "--container-image",
            "img",
            "--container-runtime",
            "pyxis",
            "--run-dir",
            str(run_dir),
            "--",
            "-m",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode != 0
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert (
        len(err) == 1
        and "--container-runtime pyxis: this cluster's srun has no --container-image" in err[0]
    ), p.stderr
    assert not run_dir.exists()
    p = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "launch"),
            "doctor",
            "--slurm",
            "--container-runtime",
            "pyxis",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode != 0 and "this cluster's srun has no --container-image" in p.stderr, (
        p.stderr
    )
