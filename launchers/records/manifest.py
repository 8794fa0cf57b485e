"""The run manifest, `manifest.json` in the run dir: what ran, for reproducing it (`launch status
--manifest`).

Two writers, one after the other, each replacing the file at once (layout.atomic_write): the
launcher at submit and at each resume (write_launcher: the git commit and the sha256 of `git diff
HEAD` of the program's tree, the snapshot, the container image -- null without one -- and its digest
per host (launchers.containers.imagepull), the command line with secrets as ***, the resolved NCCL
environment, the hosts), then global rank 0's wrapper once its program runs (add_node_part: Python,
torch, CUDA/NCCL when present, DeepSpeed, and the sha256 of the sorted installed package list, which
it writes beside it as packages.txt). Versions are read from the packages' metadata
(importlib.metadata, torch's version.py as text): never `import torch`. Not to be confused with a
checkpoint step's manifest.json (launchers.ckptptr). A resume that keeps the run's snapshot keeps
the git fields recorded with it (they describe the snapshot's code).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import socket
import sys
import threading
import time
from typing import Any

from .. import __version__, layout
from ..credentials.secretenv import redact, redact_argv
from ..frozen.snapshot import git
from . import fence

FORMAT = 1
GIT_KEYS = ("git_root", "git_commit", "git_dirty", "git_diff_sha256")


def path(run_dir: str) -> str:
    return layout.path(run_dir, "manifest")


def read(run_dir: str) -> dict[str, Any] | None:
    return layout.read_json(path(run_dir))


def _write(run_dir: str, data: dict[str, Any]) -> None:
    layout.atomic_write(
        layout.own_path(run_dir, "manifest"), json.dumps(data, indent=1, sort_keys=True) + "\n"
    )


# tree -> git_fields(tree) being found by prefetch_git
_early: dict[str, tuple[threading.Thread, list]] = {}


def prefetch_git(tree: str) -> None:
    """Find git_fields(tree) in a thread now, for this launch's write_launcher (the launcher starts
    it as its preflight waits on Slurm or the hosts: three git commands off the start path)."""
    if tree not in _early:
        out: list = []
        t = threading.Thread(
            target=lambda: out.append(_git_fields(tree)), daemon=True, name="launch-git"
        )
        _early[tree] = (t, out)
        t.start()


def git_fields(tree: str) -> dict[str, Any]:
    """The commit checked out in tree's work tree and the sha256 of its uncommitted changes (`git
    diff HEAD`: tracked files; untracked ones are in the snapshot, not the diff); nulls outside git.
    What prefetch_git found is used once, by the first call for that tree."""
    t, out = _early.pop(tree, (None, []))
    if t is not None:
        t.join()
    return out[0] if out else _git_fields(tree)


def _git_fields(tree: str) -> dict[str, Any]:
    top = git(tree, "rev-parse", "--show-toplevel")
    commit = git(tree, "rev-parse", "HEAD")
    diff = git(tree, "diff", "HEAD", "--binary") if commit is not None else None
    return {
        "git_root": top.decode().strip() if top else None,
        "git_commit": commit.decode().strip() if commit else None,
        "git_dirty": bool(diff) if diff is not None else None,
        "git_diff_sha256": hashlib.sha256(diff).hexdigest() if diff is not None else None,
    }


def command_line(argv: list[str]) -> str:
    """The launcher's command line as typed (`launch ...`), secret-looking values as ***."""
    first = ["launch"] if os.path.basename(argv[0]) == "launch" else [sys.executable, argv[0]]
    # NAME=VALUE secrets, credentials anywhere: ***
    return shlex.join([*first, *redact_argv(argv[1:])])


def write_launcher(run_dir: str, spec: Any, plan: Any) -> None:
    """The launcher's part (spec: launchers.spec.RunSpec, plan: backends.base.Plan), keeping rank
    0's part of an earlier attempt until this attempt's rank 0 replaces it."""
    old = read(run_dir) or {}
    digest = os.path.basename(spec.snapshot_dir) if spec.snapshot_dir else None
    kept = digest and old.get("snapshot") == digest and all(k in old for k in GIT_KEYS)
    nccl = {k: v for k, v in (plan.nodes[0].env if plan.nodes else ()) if k.startswith("NCCL_")}
    local = [socket.gethostname()] * spec.nodes if spec.backend == "local" else None
    data = {
        "format": FORMAT,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "launchers": __version__,
        **(
            {k: old[k] for k in GIT_KEYS} if kept else git_fields(spec.snapshot_from or os.getcwd())
        ),
        "snapshot": digest,
        "snapshot_dir": spec.snapshot_dir or None,
        "torch_extensions_dir": getattr(spec, "torch_extensions_dir", "") or None,
        "container_image": spec.container_image or None,
        "image_digests": dict(getattr(plan, "image_digests", {})),
        "command_line": command_line(sys.argv),
        "cwd": os.getcwd(),
        "backend": spec.backend,
        "nccl_env": redact(nccl, [k for k, _ in spec.secrets]),
        "hosts": list(plan.hosts) or local,
        "node": old.get("node"),
        **slurm_part(spec),
    }
    _write(run_dir, data)


def slurm_part(spec: Any) -> dict[str, Any]:
    """A Slurm run's site options as given: its sbatch options (profile sbatch_lines, then
    --sbatch-arg) and the lines its batch script runs first (--setup / profile setup)."""
    if spec.backend != "slurm":
        return {}
    o = spec.opts
    return {
        "sbatch_args": [*(o.get("sbatch_lines") or ()), *(o.get("sbatch_args") or ())],
        "setup": list(o.get("setup") or ()),
    }


# ------------------------------------------------------------------------------------ rank 0's part


def version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def torch_cuda() -> str | None:
    """The CUDA version torch was built with (torch/version.py's `cuda`, read as text); None for a
    CPU build."""
    from importlib import metadata

    try:
        text = (
            metadata.distribution("torch")
            .locate_file("torch/version.py")
            .read_text(encoding="utf-8")
        )
    except (metadata.PackageNotFoundError, OSError, ValueError):
        return None
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def packages() -> list[str]:
    """`name==version` of every installed distribution this Python sees, sorted (each name once,
    lower case): the Name and Version headers of each METADATA (PKG-INFO), read up to the first
    blank line -- a full email parse of every METADATA, as importlib.metadata's `.metadata` does,
    cost rank 0 a quarter of a CPU second."""
    from importlib import metadata

    seen: dict[str, str] = {}
    for d in metadata.distributions():
        head = _headers(d.read_text("METADATA") or d.read_text("PKG-INFO") or "")
        name, ver = head.get("name", "").strip(), head.get("version", "").strip()
        if name:
            seen.setdefault(re.sub(r"[-_.]+", "-", name).lower(), ver)
    return sorted(f"{n}=={v}" for n, v in seen.items())


def _headers(text: str) -> dict[str, str]:
    """The first Name and Version headers of a core-metadata text (RFC 822 style: headers end at a
    blank line)."""
    out: dict[str, str] = {}
    for line in text.split("\n", 64):
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key.lower() in ("name", "version"):
            out.setdefault(key.lower(), value)
        if len(out) == 2:
            break
    return out


def node_part(attempt: int, text: str) -> dict[str, Any]:
    nccl = next(
        (
            v
            for n in ("nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl-cu13")
            if (v := version(n))
        ),
        None,
    )
    cuda = torch_cuda()
    return {
        "attempt": attempt,
        "host": socket.gethostname(),
        "rank": 0,
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": version("torch"),
        "cuda": cuda,
        "nccl": nccl if cuda else None,
        "deepspeed": version("deepspeed"),
        "packages_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "packages_count": text.count("\n"),
        "packages_file": layout.FILES["packages"],
    }


def add_node_part(run_dir: str, attempt: int) -> None:
    """Rank 0's part: packages.txt, then manifest.json with `node` set (the launcher's part kept as
    written); nothing from an older attempt than the run's (launchers.records.fence: refused and
    said)."""
    text = "".join(p + "\n" for p in packages())
    layout.present(run_dir)  # a run dir removed meanwhile is not recreated by this
    if fence.check(run_dir, attempt, "rank 0's part of manifest.json"):
        return
    layout.atomic_write(layout.own_path(run_dir, "packages"), text)
    data = read(run_dir) or {"format": FORMAT}
    data["node"] = node_part(attempt, text)
    layout.present(run_dir)
    _write(run_dir, data)


# ------------------------------------------------------------------------------------------ shown


def format_manifest(data: dict[str, Any] | None, path: str) -> list[str]:
    """`launch status --manifest`'s lines."""
    if not data:
        return [
            f"manifest:   none at {path} (a run made before manifests, or its launcher could not "
            "write it)"
        ]
    dash = lambda v: "-" if v is None or v == [] or v == {} else v  # noqa: E731
    git_line = (
        "-"
        if not data.get("git_commit")
        else data["git_commit"]
        + (
            f" + uncommitted changes (git diff HEAD sha256 {data['git_diff_sha256']})"
            if data.get("git_dirty")
            else " (clean)"
        )
    )
    lines = [
        f"manifest:   {path}",
        f"  git:             {git_line}",
        f"  snapshot:        {dash(data.get('snapshot'))}"
        + (f"  ({data['snapshot_dir']})" if data.get("snapshot_dir") else ""),
        f"  torch ext dir:   {dash(data.get('torch_extensions_dir'))}",
        f"  container image: {dash(data.get('container_image'))}"
        + "".join(f"  ({d} on {h})" for h, d in sorted((data.get("image_digests") or {}).items())),
        f"  command line:    {dash(data.get('command_line'))}",
        "  nccl env:        "
        f"{' '.join(f'{k}={v}' for k, v in sorted((data.get('nccl_env') or {}).items())) or '-'}",
        f"  hosts:           {', '.join(data.get('hosts') or []) or '-'}",
    ]
    if data.get("backend") == "slurm":
        lines += [
            f"  sbatch args:     {' '.join(data.get('sbatch_args') or []) or '-'}",
            f"  setup:           {' ; '.join(data.get('setup') or []) or '-'}",
        ]
    node = data.get("node")
    if not node:
        return lines + ["  node:            - (rank 0 adds it once its program runs)"]
    return lines + [
        f"  node:            rank 0 on {node.get('host')}, attempt {node.get('attempt')}",
        f"  versions:        python {node.get('python')}, torch {dash(node.get('torch'))}, cuda "
        f"{dash(node.get('cuda'))}, nccl {dash(node.get('nccl'))}, deepspeed "
        f"{dash(node.get('deepspeed'))}",
        f"  packages:        {node.get('packages_count')} (sha256 {node.get('packages_sha256')}, "
        f"{node.get('packages_file')})",
    ]
