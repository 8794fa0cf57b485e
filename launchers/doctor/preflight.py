"""`--preflight gpu` (every backend's launch): before anything is created or started, the doctor's
probe with its GPU/NIC tools (launchers.gpuhealth.tools) runs on every node and the faults it finds
(launchers.gpuhealth.verdict: level fail) stop the launch -- one line per bad node, naming it, each
device and fact. Warnings are printed and the launch goes on.

local: the one machine the simulated nodes share, probed once. ssh: every host of the plan, through
the doctor's SSH target (verified host keys). With --spares (local, ssh) every slot of the pool is
checked, the spares too (local: the tools once per simulated node slot, in its environment:
LAUNCH_NODE_SLOT), and the recovery policy picks the slots the run starts on
(launchers.resilience.recovery.preflight_start): a bad node is quarantined and a good spare takes
its place; the run stops as above only when too few slots are good. slurm: not here -- the nodes are
only known once the job runs, so each node task runs the same check on its node before its agent
starts and waits for every node's verdict (launchers.backends.slurm.node); a bad node ends the job
FAILED, naming it, before any agent starts (with --spares: quarantined, a spare of the job runs).
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from typing import Any

from .. import layout, ports
from ..errors import LaunchError
from ..gpuhealth.verdict import bad_line, node_findings, summary, warnings
from ..ledgers import nodeledger, siteledger
from ..resilience import recovery
from ..resilience.restarts import plan_on
from ..torchrun import NODE_SLOT_ENV
from .targets import NodeRun, run_local, run_local_slots, run_ssh

TIMEOUT, TOOL_TIMEOUT = 60.0, 20.0


def _base(spec, nnodes: int) -> dict:
    token = secrets.token_hex(8)
    return {
        "token": token,
        "root": layout.runs_root(None),
        "cwd": os.getcwd(),
        "nnodes": nnodes,
        "port": ports.derive_port("launch-preflight:" + token),
        "timeout": TIMEOUT,
        "collective": False,
        "mb": 1,
        "gpu": True,
        "tool_timeout": TOOL_TIMEOUT,
    }


def probe(spec, plan) -> list[NodeRun]:
    """The nodes' answers; none on Slurm (its node tasks check themselves when the job runs)."""
    if spec.backend == "local":
        return run_local(spec.python, _base(spec, 1), TIMEOUT + 120)
    if spec.backend == "ssh":
        return run_ssh(
            plan.rhosts, plan.settings, spec.python, _base(spec, len(plan.rhosts)), TIMEOUT
        )
    return []


def verdict(
    run: NodeRun, gpus_per_node: int | None, out=sys.stderr, what: str = "node"
) -> str | None:
    """The line naming a node (what: node or slot) with a fault or whose probe did not run; warnings
    to `out`."""
    label = f"{what} {run.node} [{run.host}]"
    if run.result is None:
        return f"{label}: the GPU preflight could not run there ({run.error})"
    found = node_findings(run.result, label, gpus_per_node)
    for w in warnings(found):
        print(f"launch: preflight gpu: warning: {w}", file=out)
    return bad_line(found, label)


def bad_nodes(runs: list[NodeRun], gpus_per_node: int | None, out=sys.stderr) -> dict[int, str]:
    """Node (a slot with --spares) -> the line naming its fault (or that its probe did not run);
    warnings to `out`."""
    return {run.node: line for run in runs if (line := verdict(run, gpus_per_node, out))}


def _gpus(spec, plan) -> int | None:
    # the GPU count matters with nccl
    return spec.gpus_per_node if plan.dist_backend == "nccl" else None
    #                                        (auto: each node counts its own GPUs before the
    #                                        program, nodebackend)


def check(spec, plan) -> None:
    """Raise LaunchError (nothing started) when a node shows a fault."""
    runs = probe(spec, plan)
    bad = bad_nodes(runs, _gpus(spec, plan))
    if bad:
        site_strikes(spec, plan, runs, bad, dict(enumerate(plan.hosts or [])), False)
        raise LaunchError(summary(list(bad.values()), len(runs)) + "\n" + "\n".join(bad.values()))


def gate(backend, plan, pool: recovery.Pool) -> tuple[Any, dict[str, Any] | None]:
    """--preflight gpu: with --spares where the launcher owns restarts (local, ssh) start_pool(),
    else check(): (the plan the run starts on, what record() keeps)."""
    if plan.spec.spares and backend.owns_restarts:
        return start_pool(backend, plan, pool)
    check(plan.spec, plan)
    return plan, None


def probe_slots(backend, plan, slots: list[int]) -> tuple[list[NodeRun], dict[int, str]]:
    """Every slot of the pool (--spares), at once; NodeRun.node is the slot. local: the GPU tools
    once per simulated node slot, in its environment; ssh: the probe on each slot's host (a plan on
    those slots). -> (the runs, each slot's host as run.yaml names it; local: none)."""
    spec = plan.spec
    if spec.backend == "local":
        return run_local_slots(
            spec.python,
            _base(spec, 1),
            slots,
            lambda s: dict(os.environ, **{NODE_SLOT_ENV: str(s)}),
            TIMEOUT + 120,
        ), {}
    wide = backend.plan(spec, plan.run_id, attempt=plan.attempt, slots=slots)
    runs = run_ssh(wide.rhosts, wide.settings, spec.python, _base(spec, len(slots)), TIMEOUT)
    for run, slot in zip(runs, slots):
        run.node = slot
    return runs, dict(zip(slots, wide.hosts or []))


def start_pool(backend, plan, pool: recovery.Pool) -> tuple[Any, dict[str, Any]]:
    """--preflight gpu with --spares: every slot of `pool` checked; the policy
    (recovery.preflight_start) picks the slots the run starts on -> (the plan on them, the backend's
    own preflight run again when they changed; the verdict for record()). LaunchError, nothing
    started, when too few slots are good."""
    spec, slots = plan.spec, list(pool.active + pool.spares)
    runs, hosts = probe_slots(backend, plan, slots)
    bad = {run.node: line for run in runs if (line := verdict(run, _gpus(spec, plan), what="slot"))}
    decision = recovery.preflight_start(
        pool, bad, (spec.min_nodes, spec.max_nodes) if spec.min_nodes else None
    )
    site_strikes(spec, plan, runs, bad, hosts, decision.action != "stop")
    if decision.action == "stop":
        lines = [bad[s] for s in sorted(bad)]
        raise LaunchError(f"{summary(lines, len(runs))} ({decision.why})\n" + "\n".join(lines))
    if list(decision.pool.active) != list(plan.slots):
        plan = plan_on(backend, spec, plan.run_id, plan.attempt, decision.pool)
        backend.preflight(plan)
    for line in bad.values():
        print(f"launch: preflight gpu: {line}", file=sys.stderr)
    if bad:
        print(f"launch: preflight gpu: {decision.action} -- {decision.why}", file=sys.stderr)
    return plan, {"decision": decision, "bad": bad, "decided": time.time()}


def site_strikes(
    spec, plan, runs: list[NodeRun], bad: dict[int, str], hosts: dict[int, str], quarantined: bool
) -> None:
    """--preflight gpu's bad nodes (bad: node or slot -> its line; hosts: their hosts) into the
    site's node ledger (--node-ledger) at once: a strike on each host, kind gpu (weight 2:
    quarantined there) -- lost when its probe did not run (weight 1) -- with the line as its
    evidence, the run id and attempt it was checked for. Local nodes have no hosts: nothing."""
    if not spec.node_ledger or spec.backend == "local":
        return
    now, user, lim = time.time(), siteledger.user_name(), siteledger.LIMITS
    new: dict[str, list[dict[str, Any]]] = {}
    unprobed = {run.node for run in runs if run.result is None}
    for k, line in sorted(bad.items()):
        if host := siteledger.host_name(hosts.get(k)):
            new.setdefault(host, []).append(
                {
                    "time": now,
                    "run": siteledger.clean(plan.run_id, lim["run"]),
                    "user": user,
                    "attempt": plan.attempt,
                    "kind": "lost" if k in unprobed else "gpu",
                    "quarantined": quarantined,
                    "reason": siteledger.clean(f"--preflight gpu: {line}", lim["reason"]),
                }
            )
    siteledger.record(spec.node_ledger, new, now)


def record(run_dir: str, spec, attempt: int, found: dict[str, Any] | None) -> None:
    """start_pool's verdict into the run's node ledger (nodes.json) once the run dir exists; nothing
    when every slot passed."""
    if found and found["bad"]:
        nodeledger.preflight(
            run_dir,
            nodeledger.read(run_dir),
            attempt,
            found["decision"],
            found["bad"],
            spec.quarantine_after,
            found["decided"],
        )
