"""`--preflight gpu` on Slurm, in each node task before its agent starts: the node runs the GPU
check that local and SSH nodes run (launchers.gpuhealth.tools, judged by
launchers.gpuhealth.verdict), writes its verdict in the run dir
(slurm/gpucheck-<job>-<step>-r<restart>-node<K>.json: the line naming it when bad, else null), then
waits for every node's verdict. A bad node stops at once; every other node reads the verdicts and
stops too, naming the bad nodes -- no agent starts anywhere (node 0 publishes no rendezvous), and
the job ends FAILED with the bad node's line as its first failure (`launch status`). Stdlib only.
"""

from __future__ import annotations

import json
import socket
import sys
import time

from ... import layout
from ...errors import LaunchError, NodeFault
from ...gpuhealth import tools
from ...gpuhealth.verdict import bad_line, node_findings, peers_verdict, summary, warnings

TOOL_TIMEOUT_S = 20.0  # each tool's (as doctor's preflight)
# every node's verdict: the slowest node runs five tools of up to TOOL_TIMEOUT_S each
VERDICT_WAIT_S = 180.0


def verdict_path(run_dir: str, job: str, step: str, restart: int, node: int) -> str:
    return layout.path(run_dir, "gpu_verdict", job=job, step=step, restart=restart, node=node)


def check_node(run_dir: str, where: dict, nnodes: int, gpus_per_node: int | None, stopped) -> None:
    """where: {job, step, restart, node}. LaunchError (the node records it) when this node or
    another is bad, or a verdict does not come within VERDICT_WAIT_S; returns when every node
    passed."""
    me = where["node"]
    attempt = {k: v for k, v in where.items() if k != "node"}
    label = f"node {me} [{socket.gethostname()}]"
    found = node_findings({"gpu_tools": tools.run(TOOL_TIMEOUT_S)}, label, gpus_per_node)
    for w in warnings(found):
        print(f"launch: preflight gpu: warning: {w}", file=sys.stderr, flush=True)
    mine = bad_line(found, label)
    record = {"node": me, "host": socket.gethostname(), "bad": mine}
    layout.atomic_write(
        verdict_path(run_dir, node=me, **attempt), json.dumps(record), durable=False
    )
    if mine:
        raise NodeFault(f"{summary([mine], nnodes)}: {mine}", "gpu")
    deadline = time.monotonic() + VERDICT_WAIT_S
    while True:
        verdicts = {
            k: layout.read_json(verdict_path(run_dir, node=k, **attempt)) for k in range(nnodes)
        }
        done = all(v is not None for v in verdicts.values())
        if done or time.monotonic() >= deadline or stopped():
            why = peers_verdict(verdicts, nnodes, me)
            if why:
                raise LaunchError(why)
            return
        time.sleep(0.2)
