"""Issue 22 (images from a registry), pure: which jobs the launcher pulls an image for, the node
side's command line (no secret on it), the registry of a reference, and every failure as one line
naming the node, its host and the cause (podman's real error lines, as it printed them against
clusters/registry.sh's registry); the manifest shows the digest per host. The real pulls:
tests/test_container_registry.py."""

from __future__ import annotations

import json
import shlex

import pytest

from launchers.containers import imagepull
from launchers.errors import LaunchError
from launchers.records import manifest
from launchers.spec import RunSpec

REF = "127.0.0.1:5055/launch-python:test"
WHERE = "node 0 on host vm (this machine)"


def job(**kw) -> RunSpec:
    base = dict(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=("report.py",),
        program_args=(),
        run_dir="/r",
        name="r",
        python="/venv/bin/python",
        container_image=REF,
        container_runtime="podman",
        container_python="python3",
        container_workdir="/w",
    )
    return RunSpec(**{**base, **kw})


def test_pulled_for_podman_only():
    assert imagepull.needed(job())
    assert not imagepull.needed(job(container_runtime="apptainer", container_image="/i.sif"))
    assert not imagepull.needed(job(container_image="", container_runtime="auto"))
    assert (
        imagepull.ensure_here(job(container_image="", container_runtime="auto"), WHERE, "vm") == {}
    )


def test_the_node_side_command_names_the_image_and_no_secret():
    words = imagepull.argv("/venv/bin/python", REF)
    assert words[:2] == ["/venv/bin/python", "-c"] and json.loads(words[3]) == {
        "image": REF,
        "answer_s": imagepull.TIMEOUT_S,
        "pull_s": imagepull.PULL_S,
    }
    assert "auth" not in words[3] and "--creds" not in words[2] and "password" not in words[2]
    assert shlex.split(imagepull.shell("/venv/bin/python", REF)) == words  # what an SSH host runs


@pytest.mark.parametrize(
    "ref, registry",
    [
        (REF, "127.0.0.1:5055"),
        ("nvcr.io/nvidia/pytorch:24.05", "nvcr.io"),
        ("localhost/launch-python:test", "localhost"),
        ("ubuntu:22.04", "docker.io"),
        ("library/ubuntu", "docker.io"),
    ],
)
def test_registry_of_a_reference(ref, registry):
    assert imagepull.registry_of(ref) == registry


def answer(**rec) -> str:
    return "IMAGE " + json.dumps({"host": "vm", "pulled": False, **rec}) + "\n"


@pytest.mark.parametrize(
    "error, words",
    [
        (
            "Error: initializing source docker://127.0.0.1:5055/launch-python:denied: reading "
            "manifest denied in 127.0.0.1:5055/launch-python: unauthorized: authentication "
            "required",
            [
                "wrong or missing registry credentials (unauthorized)",
                "podman login 127.0.0.1:5055",
                "REGISTRY_AUTH_FILE",
                "[podman: reading manifest denied in 127.0.0.1:5055/launch-python: unauthorized",
            ],
        ),
        (
            "Error: initializing source docker://127.0.0.1:5055/launch-python:absent: reading "
            "manifest absent in 127.0.0.1:5055/launch-python: manifest unknown: manifest unknown",
            ["the image is not in the registry (manifest unknown)"],
        ),
        (
            "Error: initializing source docker://127.0.0.1:5056/x:y: pinging container registry "
            "127.0.0.1:5056: Get "
            '"https://127.0.0.1:5056/v2/": dial tcp 127.0.0.1:5056: connect: connection refused',
            ["the registry 127.0.0.1:5055 is not reachable (connection refused)"],
        ),
        (
            "timeout: no answer from the registry in 30 s",
            ["cannot pull image", ": no answer from the registry in 30 s"],
        ),
        ("Error: something new", ["podman pull failed [podman: something new]"]),
    ],
)
def test_a_failure_is_one_line_naming_the_node_host_and_cause(error, words):
    with pytest.raises(LaunchError) as e:
        imagepull.read(WHERE, REF, answer(error=error), "", 0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{WHERE}: cannot pull image {REF}: ")
    assert all(w in msg for w in words), msg


def test_no_answer_from_the_node_side_is_one_line_too():
    with pytest.raises(
        LaunchError, match=r"^node 0 on host vm \(this machine\): cannot check image .*: boom$"
    ):
        imagepull.read(WHERE, REF, "", "Traceback ...\nboom\n", 1)


def test_an_answer_gives_the_hosts_digest():
    rec = imagepull.read(
        WHERE, REF, "noise\n" + answer(pulled=True, digest="sha256:ab", pull_s=0.4), "", 0
    )
    assert (rec["host"], rec["pulled"], rec["digest"]) == ("vm", True, "sha256:ab")
    assert (
        imagepull.pulled_line(WHERE, REF, rec)
        == f"launch: {WHERE}: pulled {REF} (sha256:ab) in 0.4 s"
    )


def test_hosts_pull_once_each_and_every_failing_host_is_named_in_the_one_line():
    assert imagepull.per_host(["h1", "h1", "h2", "h1", "h3"]) == [0, 2, 4]
    said: list[str] = []
    ok = [
        ("node 0 on host h1", "h1", answer(pulled=True, digest="sha256:ab", pull_s=2.5), "", 0),
        ("node 2 on host h2", "h2", answer(digest="sha256:ab"), "", 0),
    ]
    assert imagepull.judge(REF, ok, say=said.append) == {"h1": "sha256:ab", "h2": "sha256:ab"}
    # h2 had it: nothing said
    assert said == [f"launch: node 0 on host h1: pulled {REF} (sha256:ab) in 2.5 s"]
    bad = ok + [
        (
            "node 4 on host h3",
            "h3",
            answer(error="Error: x: manifest unknown: manifest unknown"),
            "",
            0,
        )
    ]
    with pytest.raises(LaunchError) as e:
        imagepull.judge(REF, bad, ["node 6 on host h4: connection refused"], say=said.append)
    assert str(e.value).startswith(
        "node 6 on host h4: connection refused; node 4 on host h3: cannot pull image "
    )
    assert "manifest unknown" in str(e.value) and "\n" not in str(e.value)


def test_the_manifest_shows_the_image_and_its_digest_per_host():
    lines = manifest.format_manifest(
        {"container_image": REF, "image_digests": {"vm": "sha256:ab"}}, "/r/m.json"
    )
    assert f"  container image: {REF}  (sha256:ab on vm)" in lines
    assert "  container image: -" in manifest.format_manifest(
        {"container_image": None}, "/r/m.json"
    )
