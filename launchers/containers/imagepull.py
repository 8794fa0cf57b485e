"""The job's image on every node's runtime before any node starts (issue 22): podman pulls it once
per host and image digest -- `podman image exists` first (a host that has it asks no registry: a
second launch downloads nothing), else `podman pull`; then the digest of the image the host runs:
its content digest, the sha256 of its config (podman's image ID; the manifest's `config.digest` in
the registry) -- one value for the same image on every host, where manifest digests are not (an
image imported here and pulled back holds two) --, which the launcher records per host in the run's
manifest (manifest.json `image_digests`). What the wrap (launchers.containers.container) runs is
then the image already there.

Credentials are podman's own, never a password on a command line or in run.yaml: the auth file that
REGISTRY_AUTH_FILE names, else `podman login`'s (${XDG_RUNTIME_DIR}/containers/auth.json); a
plain-HTTP registry is one marked `insecure = true` in registries.conf(.d) (clusters/registry.sh
writes the test registry's).

A failure is one line naming the node, its host and the cause (CAUSES: podman's words -> what to
do), within TIMEOUT_S: the registry must have answered (auth and the manifest read: podman says
"Getting image source signatures") within TIMEOUT_S; the download itself may then take up to PULL_S.
Nothing is started anywhere.

The node side is the stdlib module launchers.nodeside.pull (PULL, its source: `python -c PULL JSON`,
like launchers.node.nodecheck's CHECK: a container job's host needs no torch) answering one line
`IMAGE {host, pulled, digest | error}`: the local backend runs it here (ensure_here); the SSH
preflight runs the same line (shell()) on the first node of each host (per_host;
backends.sshcheck.check_image); judge() reads every answer the same way.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from typing import Mapping, Sequence

from ..errors import LaunchError
from ..nodeside import source

TIMEOUT_S = 30  # the registry's answer (credentials, the image's manifest), from the pull's start
PULL_S = 1800  # the whole download, once the registry answered
# the runtimes with a per-host image store the launcher fills (apptainer: a SIF path or
PULLS = ("podman",)
# a URI it fetches itself; pyxis, oci: Slurm steps)

PULL = source("pull")

# what podman's error says -> the cause, in words a user acts on (first match wins; HOST: the
# registry)
CAUSES = (
    (
        "unauthorized",
        "wrong or missing registry credentials (unauthorized): `podman login HOST` there, or "
        "REGISTRY_AUTH_FILE naming an auth.json with HOST's",
    ),
    (
        "authentication required",
        "wrong or missing registry credentials (unauthorized): `podman login HOST` "
        "there, or REGISTRY_AUTH_FILE naming an auth.json with HOST's",
    ),
    ("manifest unknown", "the image is not in the registry (manifest unknown)"),
    ("name unknown", "the repository is not in the registry (name unknown)"),
    ("not found", "the image is not found (not found)"),
    (
        "http response to https client",
        "HOST speaks plain HTTP: mark it `insecure = true` in registries.conf",
    ),
    ("connection refused", "the registry HOST is not reachable (connection refused)"),
    ("no such host", "the registry HOST's name does not resolve"),
    ("timeout:", None),
)


def needed(spec) -> bool:
    """Whether the launcher makes sure of the image before the nodes start (podman; not without a
    container)."""
    return bool(getattr(spec, "container_image", "")) and spec.container_runtime in PULLS


def argv(python: str, image: str) -> list[str]:
    return [
        python,
        "-c",
        PULL,
        json.dumps({"image": image, "answer_s": TIMEOUT_S, "pull_s": PULL_S}),
    ]


def shell(python: str, image: str) -> str:
    """argv() as one shell line (what an SSH host runs); no secret in it."""
    return shlex.join(argv(python, image))


def registry_of(image: str) -> str:
    """The registry host of an image reference (docker.io when the first part names none)."""
    first = image.split("/", 1)[0]
    return (
        first
        if "/" in image and ("." in first or ":" in first or first == "localhost")
        else "docker.io"
    )


def cause(error: str, image: str) -> str:
    """podman's error line -> the cause as one clause, podman's own words after it."""
    low = error.lower()
    # the image: named
    said = re.sub(r"^initializing source \S+: ", "", error.removeprefix("Error: ").strip())
    for words, what in CAUSES:
        if words in low:
            if what is None:
                return said.removeprefix("timeout: ")
            return f"{what.replace('HOST', registry_of(image))} [podman: {said[-160:]}]"
    return f"podman pull failed [podman: {said[-200:]}]"


def read(where: str, image: str, stdout: str, stderr: str, code: int | None) -> dict:
    """One host's answer: its record (host, pulled, digest, pull_s); LaunchError naming `where` and
    the cause."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith("IMAGE ")), None)
    if line is None:
        why = (stderr.strip().splitlines() or [f"exit code {code}"])[-1]
        raise LaunchError(f"{where}: cannot check image {image}: {why}")
    rec = json.loads(line[len("IMAGE ") :])
    if rec.get("error"):
        raise LaunchError(f"{where}: cannot pull image {image}: {cause(rec['error'], image)}")
    return rec


def per_host(hosts: Sequence[str]) -> list[int]:
    """The nodes that pull: the first node on each distinct host (once per host)."""
    first: dict[str, int] = {}
    for k, h in enumerate(hosts):
        first.setdefault(h, k)
    return list(first.values())


def judge(
    image: str,
    answers: Sequence[tuple[str, str, str, str, int | None]],
    errors: Sequence[str] = (),
    say=lambda line: print(line, file=sys.stderr, flush=True),
) -> dict[str, str]:
    """Every host's answer, (where, host, stdout, stderr, exit code): {host: digest}, a line said
    for each host that pulled; LaunchError with every failing host's line ("; "-joined, after
    `errors`: hosts with no answer)."""
    errs, digests = list(errors), {}
    for where, host, out, err, code in answers:
        try:
            rec = read(where, image, out, err, code)
        except LaunchError as e:
            errs.append(str(e))
            continue
        digests[host] = rec.get("digest")
        if rec.get("pulled"):
            say(pulled_line(where, image, rec))
    if errs:
        raise LaunchError("; ".join(errs))
    return digests


def ensure_here(
    spec, where: str, host: str, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The local backend's nodes (all on this machine, `host`): the image there, pulled when
    missing; {host: digest} ({} when the job needs no pull). LaunchError naming `where` when the
    image cannot be had."""
    if not needed(spec):
        return {}
    try:
        r = subprocess.run(
            argv(spec.python, spec.container_image),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            timeout=TIMEOUT_S + PULL_S + 30,
        )
    except OSError as e:
        raise LaunchError(
            f"{where}: cannot check image {spec.container_image}: python {spec.python!r} cannot be "
            f"run ({e.strerror}) (give --python)"
        ) from None
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"{where}: cannot pull image {spec.container_image}: no answer in "
            f"{TIMEOUT_S + PULL_S} s"
        ) from None
    return judge(spec.container_image, [(where, host, r.stdout, r.stderr, r.returncode)])


def pulled_line(where: str, image: str, rec: dict) -> str:
    """The progress line of a host that pulled the image (nothing is said for one that had it)."""
    return f"launch: {where}: pulled {image} ({rec.get('digest')}) in {rec.get('pull_s')} s"
