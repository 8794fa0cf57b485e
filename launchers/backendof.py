"""get_backend: the backend a spec names, imported on use (a command pays only for its own
backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import LaunchError

if TYPE_CHECKING:
    from .backends.base import Backend


def get_backend(name: str) -> Backend:
    """The backend named in a spec (imported on use: a command pays only for its own backend)."""
    if name == "local":
        from .backends.local import LocalBackend

        return LocalBackend()
    if name == "ssh":
        from .backends.ssh import SSHBackend

        return SSHBackend()
    if name == "slurm":
        from .backends.slurm.backend import SlurmBackend

        return SlurmBackend()
    raise LaunchError(f"backend {name!r} is not accepted; choose one of: local, ssh, slurm")
