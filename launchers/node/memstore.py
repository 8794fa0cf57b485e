"""--memory-checkpoint (issue 37): where a node keeps its ranks' in-memory checkpoints, and when
they go away.

Each node has one store: a directory in host memory (/dev/shm, tmpfs) per user, per run and per node
-- `/dev/shm/launch-<user>/mem-<run id>` on an SSH host, with `/slot<S>` under it for each simulated
node of the local backend (they share one machine, so each gets its own "memory") and `/<node name>`
under it for a Slurm node (a site's nodes may share one /dev/shm -- the dev cluster's do -- and a
spare that replaces a lost node is another name, so it finds nothing of the lost one's; on nodes of
their own the name is one more directory). The ranks write it (launchers.memckpt: their own state
every M steps, and the copy a rank of the previous node sends them); it outlives a worker's restart
and dies with its node. The launcher removes a node's store when it declares the node lost (local:
what the node's memory going away is there) and every store of the run when the run ends. Stdlib
only; the ranks are told through the environment (ENV_EVERY, ENV_DIR: launchers.torchrun).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
from typing import Any, Callable

from ..options.values import parse_int

ENV_EVERY = "LAUNCH_MEMORY_CHECKPOINT"  # every M steps, or "auto" (absent: off)
AUTO = -1  # RunSpec.memory_checkpoint of --memory-checkpoint alone (launchers.memplan.Cadence)
ENV_DIR = "LAUNCH_MEMORY_CHECKPOINT_DIR"  # this node's store
SHM = "/dev/shm"


MAX_EVERY = 1_000_000


def fields(pick: Callable[..., Any], said: Callable[[str], str]) -> dict[str, int]:
    """RunSpec's memory_checkpoint: every M steps, AUTO (--memory-checkpoint alone: every step
    unless that costs the training more than memplan.BUDGET), 0 = off
    (--memory-checkpoint-every M implies --memory-checkpoint)."""
    every = pick("memory_checkpoint_every")
    if every is None:
        return {"memory_checkpoint": AUTO if pick("memory_checkpoint", False) else 0}
    return {"memory_checkpoint": parse_int(said("memory_checkpoint_every"), every, 1, MAX_EVERY)}


def _user() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = str(os.getuid())
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or str(os.getuid())


def run_store(run_id: str, root: str = SHM) -> str:
    """The run's stores on a host (every simulated node's on this machine)."""
    return os.path.join(root, f"launch-{_user()}", f"mem-{re.sub(r'[^A-Za-z0-9_.-]', '_', run_id)}")


def node_store(
    run_id: str, slot: int | None, one_machine: bool, root: str = SHM, host: str | None = None
) -> str:
    """A node's store: the host's (one node per host), the simulated node slot's on the local
    backend, or the Slurm node's (host: its name in Slurm)."""
    base = run_store(run_id, root)
    if host:
        return os.path.join(base, re.sub(r"[^A-Za-z0-9_.-]", "_", host).lstrip(".") or "_")
    return os.path.join(base, f"slot{slot if slot is not None else 0}") if one_machine else base


def worker_env(
    every: int, run_id: str, slot: int | None, one_machine: bool, host: str | None = None
) -> dict[str, str]:
    """What a node's ranks are told (nothing when --memory-checkpoint is off: every == 0)."""
    if not every:
        return {}
    return {
        ENV_EVERY: "auto" if every == AUTO else str(every),
        ENV_DIR: node_store(run_id, slot, one_machine, host=host),
    }


def forget_nodes(run_id: str, slots, root: str = SHM) -> list[int]:
    """The local backend: simulated node slots declared lost lose their memory (their store
    removed); those that had one."""
    gone = []
    for s in slots:
        path = node_store(run_id, s, True, root)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(s)
    return gone


def forget_run(run_id: str, root: str = SHM) -> None:
    """The run ended: every store of it on this machine goes."""
    shutil.rmtree(run_store(run_id, root), ignore_errors=True)
