"""SlurmEnv: the one place that reads SLURM_* (submitit's JobEnvironment style), and the nodelist
syntax.

Stdlib only: the console script reads it before click is imported, and every node on its way to
torchrun.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

# what the batch step's loop over attempts (launchers.backends.slurm.steps, --spares) tells each
# step's nodes
STEP_HOSTS, STEP_SLOTS, STEP_ATTEMPT = (
    "LAUNCH_STEP_HOSTS",
    "LAUNCH_STEP_SLOTS",
    "LAUNCH_STEP_ATTEMPT",
)


class NodelistError(ValueError):
    """SLURM_JOB_NODELIST that does not parse."""


@dataclass(frozen=True)
class SlurmEnv:
    job_id: str  # SLURM_JOB_ID ("" outside an allocation)
    array_job_id: str  # SLURM_ARRAY_JOB_ID
    node_id: int  # SLURM_NODEID: this node's index in the allocation
    procid: str  # SLURM_PROCID: this task's rank in the step
    nodelist: str  # SLURM_JOB_NODELIST
    num_nodes: int  # SLURM_JOB_NUM_NODES (or SLURM_NNODES)
    restart_count: int  # SLURM_RESTART_COUNT: how often Slurm requeued the job
    step_id: str  # SLURM_STEP_ID
    # SLURM_ARRAY_TASK_ID: this task's index in a job array (a sweep's run number)
    array_task_id: str = ""
    node_name: str = ""  # SLURMD_NODENAME: this node's name in Slurm
    # LAUNCH_STEP_HOSTS: the hosts of this step in node-rank order (--spares)
    step_hosts: tuple[str, ...] = ()
    step_slots: tuple[int, ...] = ()  # LAUNCH_STEP_SLOTS: each of those hosts' node slot (--spares)
    step_attempt: int | None = None  # LAUNCH_STEP_ATTEMPT: the attempt this step runs (--spares)

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> "SlurmEnv":
        e = os.environ if environ is None else environ
        name, node, procid = (
            e.get("SLURMD_NODENAME", ""),
            e.get("SLURM_NODEID"),
            e.get("SLURM_PROCID", "0"),
        )
        if e.get("SLURM_CONTAINER") and e.get("SLURM_STEP_NODELIST"):
            name, node = container_node(e["SLURM_STEP_NODELIST"])
            procid = node or "0"
        return cls(
            job_id=e.get("SLURM_JOB_ID", ""),
            array_job_id=e.get("SLURM_ARRAY_JOB_ID", ""),
            node_id=_int(node),
            procid=procid,
            nodelist=e.get("SLURM_JOB_NODELIST", ""),
            num_nodes=_int(e.get("SLURM_JOB_NUM_NODES") or e.get("SLURM_NNODES"), 1),
            restart_count=_int(e.get("SLURM_RESTART_COUNT")),
            step_id=e.get("SLURM_STEP_ID", "0"),
            array_task_id=e.get("SLURM_ARRAY_TASK_ID", ""),
            node_name=name,
            step_hosts=tuple(h for h in e.get(STEP_HOSTS, "").split(",") if h),
            step_slots=tuple(_int(k) for k in e.get(STEP_SLOTS, "").split(",") if k),
            step_attempt=_int(e.get(STEP_ATTEMPT), -1) if e.get(STEP_ATTEMPT) else None,
        )

    @property
    def in_allocation(self) -> bool:
        return bool(self.job_id)

    @property
    def submitit_job_id(self) -> str:
        """The id submitit names its per-task files by (the array's id for an array job)."""
        return self.array_job_id or self.job_id or "0"

    def hostnames(self) -> list[str]:
        return job_hostnames(self.nodelist)

    def step_node(self) -> int:
        """This node's rank in a step of the loop over attempts (its host's place in
        LAUNCH_STEP_HOSTS: the step's first host is node 0, the master), else SLURM_NODEID."""
        if not self.step_hosts:
            return self.node_id
        if self.node_name not in self.step_hosts:
            raise NodelistError(
                f"this node ({self.node_name or 'SLURMD_NODENAME unset'}) is not one of the "
                f"step's hosts ({','.join(self.step_hosts)})"
            )
        return self.step_hosts.index(self.node_name)


def container_node(step_nodelist: str) -> tuple[str, str | None]:
    """(this node's name, its index in the step) inside a container of Slurm's own OCI support (srun
    --container): Slurm 22.05 gives the container the step's variables, not the task's (no
    SLURM_NODEID, SLURM_PROCID, SLURMD_NODENAME of its own: those present are the batch step's,
    passed on by srun --export=ALL), so the node is found by its host name in SLURM_STEP_NODELIST
    (one task per node). None when the host is not in the list."""
    import socket

    name = socket.gethostname().split(".")[0]
    try:
        hosts = job_hostnames(step_nodelist)
    except NodelistError:
        return name, None
    return name, (str(hosts.index(name)) if name in hosts else None)


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value) if value else default
    except ValueError:
        return default


def job_hostnames(nodelist: str) -> list[str]:
    """A Slurm nodelist ("gpu[01-03,7],login1") -> host names, in Slurm's order."""
    items, depth, cur = [], 0, ""
    for ch in nodelist:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    try:
        return [h for item in items if item for h in _expand_hosts(item)]
    except ValueError:
        raise NodelistError(f"SLURM_JOB_NODELIST {nodelist!r} is malformed") from None


def _expand_hosts(item: str) -> list[str]:
    if "[" not in item:
        if "]" in item:
            raise ValueError(item)
        return [item]
    pre, _, rest = item.partition("[")
    ranges, close, post = rest.partition("]")
    if not close or not ranges:
        raise ValueError(item)
    heads = []
    for part in ranges.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(item)
        heads += (
            [f"{pre}{k:0{len(lo)}d}" for k in range(int(lo), int(hi) + 1)] if dash else [pre + lo]
        )
    return [h + tail for h in heads for tail in _expand_hosts(post)]
