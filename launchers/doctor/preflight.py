"""`--preflight gpu` (every backend's launch): before anything is created or started, the doctor's probe
with its GPU/NIC tools (launchers.gpuhealth.tools) runs on every node and the faults it finds
(launchers.gpuhealth.verdict: level fail) stop the launch -- one line per bad node, naming it, each device
and fact. Warnings are printed and the launch goes on.

local: the one machine the simulated nodes share, probed once. ssh: every host of the plan, through the
doctor's SSH target (verified host keys). slurm: not here -- the nodes are only known once the job runs, so
each node task runs the same check on its node before its agent starts and waits for every node's verdict
(launchers.backends.slurm.node); a bad node ends the job FAILED, naming it, before any agent starts.
"""
from __future__ import annotations

import os
import secrets
import sys

from .. import layout, ports
from ..errors import LaunchError
from ..gpuhealth.verdict import bad_line, node_findings, summary, warnings
from .targets import NodeRun, run_local, run_ssh

TIMEOUT, TOOL_TIMEOUT = 60.0, 20.0


def _base(spec, nnodes: int) -> dict:
    token = secrets.token_hex(8)
    return {"token": token, "root": layout.runs_root(None), "cwd": os.getcwd(), "nnodes": nnodes,
            "port": ports.derive_port("launch-preflight:" + token), "timeout": TIMEOUT, "collective": False,
            "mb": 1, "gpu": True, "tool_timeout": TOOL_TIMEOUT}


def probe(spec, plan) -> list[NodeRun]:
    """The nodes' answers; none on Slurm (its node tasks check themselves when the job runs)."""
    if spec.backend == "local":
        return run_local(spec.python, _base(spec, 1), TIMEOUT + 120)
    if spec.backend == "ssh":
        return run_ssh(plan.rhosts, plan.settings, spec.python, _base(spec, len(plan.rhosts)), TIMEOUT)
    return []


def bad_lines(runs: list[NodeRun], gpus_per_node: int | None, out=sys.stderr) -> list[str]:
    """One line per node with a fault (or whose probe did not run); warnings go to `out`."""
    bad = []
    for run in runs:
        label = f"node {run.node} [{run.host}]"
        if run.result is None:
            bad.append(f"{label}: the GPU preflight could not run there ({run.error})")
            continue
        found = node_findings(run.result, label, gpus_per_node)
        for w in warnings(found):
            print(f"launch: preflight gpu: warning: {w}", file=out)
        line = bad_line(found, label)
        if line:
            bad.append(line)
    return bad


def check(spec, plan) -> None:
    """Raise LaunchError (nothing started) when a node shows a fault."""
    runs = probe(spec, plan)
    gpus = spec.gpus_per_node if plan.dist_backend != "gloo" else None      # the GPU count matters with nccl
    bad = bad_lines(runs, gpus)
    if bad:
        raise LaunchError(summary(bad, len(runs)) + "\n" + "\n".join(bad))
