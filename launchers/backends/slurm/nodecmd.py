"""A Slurm node's command: the torchrun builder's (launchers.torchrun.node_command) with what the
agent needs to pass stop signals on, the node's --memory-checkpoint store, in the job's container --
the node task runs it, the dry-run shows it (backend.plan), run.yaml records it for every node."""

from __future__ import annotations

import os
import sys
from typing import Any

from ...containers.container import in_container, wrap
from ...containers.containeropts import host_limits
from ...node import memstore
from ...spec import RunSpec
from ...torchrun import NodeCommand, node_command

NODE_SHOWN = "<its Slurm node name>"  # the dry-run's, in a node's --memory-checkpoint store


def slurm_node_command(
    spec: RunSpec,
    node: int,
    addr: str,
    port: Any,
    run_id: str,
    attempt: int,
    dist: str,
    agent_env: dict[str, str],
    slot: int | None = None,
    host: str | None = None,
) -> NodeCommand:
    """The builder's command, plus what the agent needs to pass stop signals on (shown in the
    dry-run), in the job's container (launchers.containers.container: a pyxis/OCI step is inside
    already, podman/apptainer wrap the agent). slot: the node's place in the allocation when the run
    has spares (LAUNCH_NODE_SLOT). host: the node's name in Slurm, its in-memory checkpoints' store
    (--memory-checkpoint; None: the dry-run's placeholder)."""
    nc = node_command(
        spec,
        node_rank=node,
        master_addr=addr,
        master_port=port,
        run_id=run_id,
        attempt=attempt,
        dist_backend=dist,
        slot=slot,
    )
    env = {**dict(nc.env), **memory_env(spec, run_id, host), **agent_env}
    return wrap(
        spec,
        NodeCommand(node_rank=nc.node_rank, argv=nc.argv, env=tuple(env.items()), secret=nc.secret),
        run_id,
        limits=host_limits(),
    )


def memory_env(spec: RunSpec, run_id: str, host: str | None) -> dict[str, str]:
    """--memory-checkpoint: the node's store is its Slurm node name's (launchers.node.memstore:
    nodes that share one /dev/shm stay apart, a spare that replaces a lost node finds nothing of the
    lost one's)."""
    if host is not None:
        return memstore.worker_env(spec.memory_checkpoint, run_id, None, False, host=host)
    env = memstore.worker_env(spec.memory_checkpoint, run_id, None, False)
    return {**env, memstore.ENV_DIR: os.path.join(env[memstore.ENV_DIR], NODE_SHOWN)} if env else {}


def same_env(spec: RunSpec, nc: NodeCommand) -> bool:
    """Whether the ranks see this task's environment as the agent is given it: no container around
    the agent, and the agent's python this interpreter itself (a --python wrapper script may change
    PATH on its way)."""
    return not in_container(spec) and os.path.realpath(nc.argv[0]) == os.path.realpath(
        sys.executable
    )
