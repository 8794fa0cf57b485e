"""The `checkpoints/latest` pointer: a one-line text file naming the newest *complete* checkpoint.

Stdlib only (no torch): the launcher reads it, the workloads write it. Writing is atomic and durable:
write a temporary file in the same directory, fsync it, os.replace() it over `latest`, fsync the
directory. A reader therefore sees either the old name or the new one, never a partial file.
`launchers.rundir` re-exports both functions; this is the only place the format is defined.
"""
from __future__ import annotations

import os

POINTER = "latest"


def _check_name(name: str) -> None:
    if not name or name != name.strip() or "/" in name or "\n" in name or name in (".", ".."):
        raise ValueError(f"bad checkpoint name {name!r}: expected a plain directory name like 'step-00000050'")


def write_latest(ckpt_dir: str, name: str) -> None:
    """Atomically make `ckpt_dir/latest` name the checkpoint directory `name` (relative to ckpt_dir)."""
    _check_name(name)
    os.makedirs(ckpt_dir, exist_ok=True)
    tmp = os.path.join(ckpt_dir, f".{POINTER}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt_dir, POINTER))
    fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_latest(ckpt_dir: str) -> str | None:
    """The checkpoint name `latest` points to, or None when there is no (or an empty) pointer."""
    try:
        with open(os.path.join(ckpt_dir, POINTER), encoding="utf-8") as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return name or None
