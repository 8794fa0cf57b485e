"""--container-image / --container-mount / --container-runtime / --container-python: read and
checked once, for the flags, a profile and the Python API alike (launchers.spec calls fields());
what they render into is launchers.containers.container's. Stdlib only.

Where a runtime wraps: `step` runtimes wrap a whole Slurm step (srun's own flags: pyxis, Slurm's OCI
support), so everything srun starts on a node -- the node task, the torchrun agent, the rank
wrappers -- runs inside; `node` runtimes (podman, apptainer) wrap the agent's command on any
backend.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
from typing import Any, Callable

from ..errors import LaunchError, brief
from .imageref import IMAGE_FORMS, image_ok

RUNTIMES = ("auto", "pyxis", "apptainer", "podman", "oci")
WRAPS = {"pyxis": "step", "oci": "step", "podman": "node", "apptainer": "node"}
ACCEPTED = {  # backend -> the runtimes it can use; auto picks the first usable one
    "slurm": ("pyxis", "oci", "podman", "apptainer"),
    "local": ("podman", "apptainer"),
    "ssh": ("podman", "apptainer"),
}
# the binaries that make a runtime usable on a node (any one of them), checked by `launch doctor`
BINARIES = {
    "pyxis": ("enroot",),
    "oci": ("crun", "runc"),
    "podman": ("podman",),
    "apptainer": ("apptainer", "singularity"),
}
# a node runtime whose client exits 128 + N when signal N ended its container's process
# (podman-run(1), "Exit Status": otherwise the contained command's exit code; conmon records a
# signalled process as 128 + N, as a shell does): what its node's exit code means
# (container.agent_code)
SIGNAL_EXIT_BASE = {"podman": 128}
DEFAULT_PYTHON = "python3"  # the image's interpreter unless --container-python names another
MOUNT_WORDS = "SRC:DST[:ro] with an absolute DST and no ',' (e.g. /data:/data:ro or ~/data:/data)"
_MOUNT_PART = re.compile(r"^[^:,\s\x00]+$")


Limits = tuple[tuple[str, int], ...]  # (podman --ulimit name, value) for a node's container
# what a podman container is given
LIMITS = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC}
PID_MAX = "/proc/sys/kernel/pid_max"


def host_limits(
    getrlimit: Callable[[int], tuple[int, int]] = resource.getrlimit,
    pid_max: Callable[[], int | None] = lambda: _read_int(PID_MAX),
) -> Limits:
    """This host's hard limits for a podman container's `--ulimit NAME=N:N` (soft = hard: raising a
    soft limit to the hard one needs no privilege); nproc at most kernel.pid_max (podman lowers its
    own RLIMIT_NPROC to it). Read where a node's command is built: podman's defaults for root
    (1048576 each) and `--ulimit host` are refused by runc where podman has no CAP_SYS_RESOURCE and
    the host's hard limit is lower. Unlimited: -1 (podman's word)."""
    cap = {"nproc": pid_max()}
    out = []
    for name, which in LIMITS.items():
        hard = getrlimit(which)[1]
        n = cap.get(name) if hard == resource.RLIM_INFINITY else min(hard, cap.get(name) or hard)
        out.append((name, -1 if n is None else n))
    return tuple(out)


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def parse_mount(value: Any, cwd: str) -> str:
    """`SRC:DST[:ro|rw]` -> the same with SRC made absolute (against cwd); ',' and ':' are the
    runtimes' separators (pyxis --container-mounts, podman -v, apptainer --bind) and cannot be in a
    path."""
    parts = value.split(":") if isinstance(value, str) else []
    if (
        not 2 <= len(parts) <= 3
        or not all(_MOUNT_PART.match(p) for p in parts[:2])
        or (len(parts) == 3 and parts[2] not in ("ro", "rw"))
    ):
        raise LaunchError(f"--container-mount {brief(value)} is malformed; expected {MOUNT_WORDS}")
    src, dst = parts[0], parts[1]
    if src.startswith("~"):  # the submitting user's home (~ or ~/x; ~user: that user's)
        src = os.path.expanduser(src)
        if src.startswith("~"):
            raise LaunchError(
                f"--container-mount {brief(value)}: {parts[0]!r} names no home directory known "
                "here; give an absolute SRC or ~/PATH (your home)"
            )
    if not dst.startswith("/"):
        raise LaunchError(
            f"--container-mount {brief(value)}: DST {dst!r} is relative; give an absolute path "
            "inside the container, e.g. /data"
        )
    flags = parts[2:] if parts[2:] == ["ro"] else []
    return ":".join([os.path.normpath(os.path.join(cwd, src)), os.path.normpath(dst), *flags])


PYXIS_FLAG = "--container-image"  # what pyxis's SPANK plugin adds to srun (NVIDIA/pyxis README)


def pyxis_missing(srun_help: str) -> str | None:
    """`srun --help` of the submitting node -> the one line saying pyxis is not there, or None when
    srun lists --container-image (pyxis is a SPANK plugin: srun on the login node lists its options
    when plugstack.conf loads it, as the nodes' srun does)."""
    if PYXIS_FLAG in srun_help:
        return None
    return (
        "--container-runtime pyxis: this cluster's srun has no --container-image (`srun --help` "
        "does not list it: the pyxis plugin is not installed); nothing submitted: use "
        "--container-runtime apptainer or podman (`launch doctor --slurm --container-runtime R` "
        "checks the nodes), or run without --container-image"
    )


def check_srun_pyxis(which: Callable[[str], Any] = shutil.which) -> None:
    """LaunchError (pyxis_missing's line) when this node's `srun --help` lacks --container-image;
    nothing said when srun is not here or does not answer (the Slurm preflight names that)."""
    if not which("srun"):
        return
    try:
        p = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return
    if why := pyxis_missing(p.stdout + p.stderr):
        raise LaunchError(why)


def check_runtime(value: Any, backend: str) -> str:
    """--container-runtime: one of RUNTIMES that this backend can use (auto included)."""
    name = str(value).strip().lower() if isinstance(value, str) else value
    if name not in RUNTIMES:
        raise LaunchError(
            f"--container-runtime {brief(value)} is not accepted; choose one of: "
            f"{', '.join(RUNTIMES)}"
        )
    if name != "auto" and name not in ACCEPTED[backend]:
        raise LaunchError(
            f"--container-runtime {name} is not accepted with the {backend} backend (it wraps a "
            f"Slurm step); accepted with {backend}: auto, {', '.join(ACCEPTED[backend])}"
        )
    return name


def resolve_runtime(value: Any, backend: str, which: Callable[[str], Any] = shutil.which) -> str:
    """--container-runtime for this backend: the one given when the backend can use it, else auto's
    pick -- Slurm: pyxis; SSH: podman (the hosts are checked by `launch doctor`); local: podman or
    apptainer, the first on PATH here."""
    name, usable = check_runtime(value, backend), ACCEPTED[backend]
    if backend != "local":
        return usable[0] if name == "auto" else name
    found = [
        r for r in (usable if name == "auto" else (name,)) if any(which(b) for b in BINARIES[r])
    ]
    if not found:
        wanted = " or ".join(
            b for r in (usable if name == "auto" else (name,)) for b in BINARIES[r]
        )
        raise LaunchError(
            f"--container-image needs a container runtime here: {wanted} is not on PATH; install "
            f"one or run without --container-image"
        )
    return found[0]


def doctor_binaries(value: Any, backend: str) -> tuple[str, tuple[str, ...]]:
    """`launch doctor --container-runtime R`: (what is checked, the binaries any one of which makes
    it usable on a node); auto: Slurm's pyxis, elsewhere podman or apptainer."""
    runtimes = doctor_runtimes(value, backend)
    return " or ".join(runtimes), tuple(b for r in runtimes for b in BINARIES[r])


def doctor_runtimes(value: Any, backend: str) -> tuple[str, ...]:
    name = check_runtime(value, backend)
    return (
        (name,)
        if name != "auto"
        else ACCEPTED[backend][:1]
        if backend == "slurm"
        else ACCEPTED[backend]
    )


# how a node tells whether it has an image, per runtime (`launch doctor --container-image`): podman
# asks its store; apptainer's SIF file and Slurm OCI's bundle (its config.json) are paths; pyxis
# imports at srun time (not checked), so does apptainer for a URI (docker://, library://, oras://)
IMAGE_HAS = {
    "podman": lambda img: {"argv": ["podman", "image", "exists", img]},
    "apptainer": lambda img: None if "://" in img else {"path": img},
    "oci": lambda img: {"path": os.path.join(img, "config.json")},
}


def doctor_image(value: Any, backend: str, runtime: Any) -> dict[str, dict]:
    """`launch doctor --container-image IMAGE`: per runtime that doctor checks (doctor_binaries) and
    that can tell, its binaries and how the node checks the image: {runtime: {"bins": [...], "argv"
    | "path": ...}}."""
    out = {}
    for r in doctor_runtimes("auto" if runtime is None else runtime, backend):
        how = IMAGE_HAS[r](check_image(value, r)) if r in IMAGE_HAS else None
        if how:
            out[r] = {"bins": list(BINARIES[r]), **how}
    return out


# what each runtime's mount option splits on (a path holding one is refused before anything starts):
# podman -v SRC:DST[:OPTS] (':'); apptainer --bind SRC:DST[:OPTS],... (',' ':'; whitespace refused
# too); pyxis --container-mounts SRC:DST[:FLAGS],... (',' ':'; pyxis hands them on to enroot as
# fstab lines, split on whitespace)
MOUNT_SEPARATORS = {"podman": ":", "apptainer": ":, \t", "pyxis": ":, \t"}
MOUNT_OPTION = {
    "podman": "podman -v",
    "apptainer": "apptainer --bind",
    "pyxis": "srun --container-mounts",
}


def check_mount_path(path: str, what: str, runtime: str) -> str:
    """A path that goes into a mount spec of `runtime`: refused in one line when it holds a
    character that the runtime's mount option splits on (MOUNT_SEPARATORS) or a control
    character."""
    seps = MOUNT_SEPARATORS.get(runtime, "")
    bad = sorted({c for c in path if c in seps or ord(c) < 32 or ord(c) == 127})
    if bad:
        said = ", ".join(repr(c) for c in bad)
        raise LaunchError(
            f"{what} {path!r} holds {said}, which {MOUNT_OPTION.get(runtime, runtime)} cannot "
            f"take in a mount path (it splits on {', '.join(repr(c) for c in seps) or 'nothing'}; "
            f"no control characters); refused before anything starts: use a path without them"
        )
    return path


def check_image(value: Any, runtime: str) -> str:
    """An image reference as the runtime's own grammar reads it (IMAGE_FORMS), one word and never an
    option: podman a docker/OCI reference or a transport; pyxis an enroot URI (`registry#image`) or
    a squashfs path; apptainer a SIF path or a URI; Slurm's OCI support a bundle directory
    (absolute)."""
    if (
        not isinstance(value, str)
        or not value.strip()
        or any(c.isspace() or c == "\x00" for c in value)
    ):
        raise LaunchError(
            f"--container-image {brief(value)} is not accepted; give one image reference without "
            "spaces, e.g. nvcr.io#nvidia/pytorch:24.05-py3, ./image.sif or localhost/train:1"
        )
    if runtime == "oci" and not value.startswith("/"):
        raise LaunchError(
            f"--container-image {brief(value)}: with --container-runtime oci the image is an OCI "
            "bundle directory (srun --container=PATH); give its absolute path"
        )
    if runtime in IMAGE_FORMS and not image_ok(value, runtime):
        raise LaunchError(
            f"--container-image {brief(value)} is not an image {runtime} accepts"
            f"{' (an option is never an image)' if value.startswith('-') else ''}; accepted: "
            f"{IMAGE_FORMS[runtime]}"
        )
    return value


def check_python(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise LaunchError(
            f"--container-python {brief(value)} is not accepted; give the image's interpreter, "
            f"e.g. {DEFAULT_PYTHON} or /opt/venv/bin/python"
        )
    return value


def fields(
    backend: str, pick: Callable[[str], Any], cwd: str, paths: tuple[tuple[str, str], ...] = ()
) -> dict[str, Any]:
    """The RunSpec fields of the container options (pick: a key -> the flag's value, else the
    profile's, else None); no image: no container, and the other container options are refused.
    paths: (what, path) of the host paths the job mounts besides the launch dir and
    --container-mount's (the run dir, the snapshot), each checked against the runtime's mount syntax
    (check_mount_path) before anything starts."""
    image, runtime, mounts, python = (
        pick(k)
        for k in ("container_image", "container_runtime", "container_mounts", "container_python")
    )
    if image is None:
        given = [
            f
            for f, v in (
                ("--container-runtime", runtime),
                ("--container-mount", mounts),
                ("--container-python", python),
            )
            if v
        ]
        if given:
            raise LaunchError(
                f"{given[0]} needs --container-image IMAGE (the image every node runs the job in)"
            )
        return {}
    runtime = resolve_runtime("auto" if runtime is None else runtime, backend)
    mounts = tuple(parse_mount(m, cwd) for m in (mounts or ()))
    if mounts and runtime == "oci":
        raise LaunchError(
            "--container-mount is not accepted with --container-runtime oci: the bundle's "
            "config.json lists its mounts (the run dir, the launch dir and launchers among them)"
        )
    image = check_image(image, runtime)
    for what, path in (
        ("the launch dir (the container's working directory)", cwd),
        *paths,
        *((f"--container-mount {m!r}: the path", p) for m in mounts for p in m.split(":")[:2]),
    ):
        if path:
            check_mount_path(path, what, runtime)
    return dict(
        container_image=image,
        container_runtime=runtime,
        container_mounts=mounts,
        container_python=check_python(DEFAULT_PYTHON if python is None else python),
        container_workdir=cwd,
    )


def check_warm(opts: Any, image: Any) -> None:
    """--warm-spares forks from a zygote that runs outside any image: not with --container-image."""
    if opts.get("warm_spares") and image:
        raise LaunchError(
            "--warm-spares is not accepted with --container-image (a zygote runs outside the "
            "image); accepted: one of them"
        )
