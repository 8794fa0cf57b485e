"""The attempts of a run whose launcher owns its restarts (local, SSH): after a failed one the
recovery policy decides (launchers.resilience.recovery: restart on the same node slots, replace one
by a spare, shrink to the survivors or grow back to MAX with --nodes MIN:MAX, or stop), the node
ledger keeps it with the times of the fault, its detection and the decision
(launchers.ledgers.nodeledger), and the next attempt runs on the pool's slots from
checkpoints/latest, a new attempt of the same run (run.yaml `by: policy`). As each attempt ends,
status.json gets the recovery timeline of every restart so far (launchers.resilience.timeline).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..diagnosis.firstfail import describe as describe_failure
from ..errors import LaunchError
from ..ledgers import nodeledger, siteledger
from ..records.rundir import TERMINAL, RunDir
from . import recovery, timeline

if TYPE_CHECKING:
    from ..spec import RunSpec

Backend = Any  # launchers.backends.base.Backend (a layer above: the backends use this module too)


def run_attempts(backend: Backend, spec: RunSpec, rd: RunDir, plan, restarts_left: int) -> int:
    """Start the plan's attempt and, while the launcher owns restarts and an attempt failed, what
    the policy decides (attempt_loop); the end line once the run ended. Returns the last attempt's
    exit code."""
    left, plans, ended = [restarts_left], {plan.attempt: plan}, []

    def run(attempt: int) -> tuple[int, Decided | None]:
        backend.warm_up(plans[attempt])  # --warm-spares: the pool's zygotes, once (Backend.warm_up)
        decided: list[Decided] = []
        if backend.owns_restarts:  # decided as the attempt's end is written (RunDir.on_failure)
            rd.on_failure = lambda ff, nodes: decide(
                spec, rd, attempt, ff, nodes, left, decided, ended
            )
        try:
            code = backend.start(plans[attempt], rd)
        finally:
            rd.on_failure = None
        if not backend.owns_restarts or code != 1:
            return code, None
        if not decided:  # a failure recorded another way: FAILED is already written
            decide(
                spec, rd, attempt, rd.read_status().get("first_failure"), None, left, decided, ended
            )
        return code, decided[-1]

    def restart(attempt: int, decided: Decided) -> int:
        nxt = len(rd.read_run_yaml()["attempts"])
        plans[nxt] = plan_on(backend, spec, rd.run_id, nxt, decided.decision.pool)
        # its nodes: the pool's
        rd.add_attempt(plans[nxt].spec, dict(plans[nxt].record(), by=timeline.BY_POLICY))
        return nxt

    code = attempt_loop(rd, plan.attempt, run, restart)
    # Slurm's batch step records its own (backends.slurm.steps)
    if backend.owns_restarts and not ended:
        record_site(spec, rd)
    # the verdict, also when a full disk kept it from status.json
    st = rd.unrecorded or rd.read_status()
    if backend.owns_restarts or st.get("state") in TERMINAL:
        print(end_line(st), file=sys.stderr, flush=True)
    return code


def decide(
    spec: RunSpec,
    rd: RunDir,
    attempt: int,
    ff: dict[str, Any] | None,
    nodes: dict[str, Any] | None,
    left: list[int],
    decided: list[Decided],
    ended: list[None],
) -> str | None:
    """run_attempts' policy on a failed attempt (the launcher saw it end now), appended to
    `decided`; the line why it restarts (one restart of `left` used), or None: the run ends, its
    strikes in the site ledger (`ended`) before its FAILED is written."""
    decided.append(restart_decision(spec, rd, attempt, ff, left[0], time.time(), nodes))
    d = decided[-1]
    if d.decision.action == "stop":
        if spec.max_restarts:
            print(
                f"launch: attempt {attempt} failed ({describe_failure(ff)}); not restarted: "
                f"{d.decision.why}",
                file=sys.stderr,
            )
        ended.append(record_site(spec, rd))
        return None
    left[0] -= 1
    why = (
        f"attempt {attempt} failed ({describe_failure(ff)}); {d.decision.why}; restarting from "
        f"{d.resume} ({left[0]} restarts left){backoff_said(backoff_s(d.decisions))}"
    )
    print(f"launch: {why}", file=sys.stderr)
    return why


def attempt_loop(
    rd: RunDir,
    attempt: int,
    run: Callable[[int], tuple[int, Decided | None]],
    restart: Callable[[int, Decided], int],
) -> int:
    """The one loop over a run's attempts, the launcher's (run_attempts: local, SSH) and Slurm's
    in-job steps (backends.slurm.steps): run(attempt) runs the attempt and, when it failed, has the
    policy decide (restart_decision) and says it -> (its exit code, the decision; None: nothing to
    decide). No decision or a stop ends the run with that code; else the restart is carried out: the
    recovery timeline recorded, the backoff waited, restart(attempt, decided) records the next
    attempt on the decision's pool -> its number."""
    while True:
        code, decided = run(attempt)
        # a first attempt that decided nothing has no restart to time
        if decided is not None or attempt:
            record_timeline(rd)  # before the next attempt's heartbeats replace this one's
        if decided is None or decided.decision.action == "stop":
            return code
        time.sleep(backoff_s(decided.decisions))
        attempt = restart(attempt, decided)


def record_site(spec: RunSpec, rd: RunDir) -> None:
    """At the run's end: its strikes, on the hosts they were on, into the site's node ledger
    (--node-ledger)."""
    if spec.node_ledger:
        with contextlib.suppress(OSError, LaunchError):  # a removed run dir: nothing to record
            siteledger.record_run(
                spec.node_ledger, rd.path, rd.run_id, rd.read_run_yaml().get("attempts") or []
            )


def record_end(
    spec: RunSpec,
    rd: RunDir,
    attempt: int,
    hosts: list[str] | None,
    ff: dict[str, Any] | None,
    nodes: dict[str, Any],
) -> None:
    """A failed attempt of a run with no loop over attempts (a plain Slurm job: its batch side's
    finalize, as RunDir.on_failure, before FAILED is written): with --node-ledger, its first failure
    decided by the one policy with no restart left (restart_decision: a stop, written into
    nodes.json as local and SSH write it; the program's failure is no node's strike), then the run's
    strikes into the site ledger (record_site). Once per attempt: a finalize run again decides
    nothing twice. hosts: the attempt's nodes, recorded when node 0 named none (it failed before it
    could: --preflight gpu)."""
    if not spec.node_ledger:
        return
    led = nodeledger.read(rd.path)
    if not any(
        d.get("attempt") == attempt and not d.get("preflight")
        for d in (led or {}).get("decisions") or []
    ):
        had = ((rd.read_run_yaml().get("attempts") or [])[attempt:] or [{}])[0].get("hosts") or [
            None
        ]
        # none, or the plan's `SLURM_NODEID=0 ...`
        if hosts and not all(map(siteledger.host_name, had)):
            rd.update_attempt(attempt, {"hosts": hosts}, {})
        restart_decision(spec, rd, attempt, ff, 0, time.time(), nodes or {})
    record_site(spec, rd)


def record_timeline(rd: RunDir) -> None:
    """status.json's `recovery`: every restart's timeline as the run dir tells it now, merged into
    what was recorded (an attempt's heartbeats are gone once the next one runs); nothing written
    without a restart."""
    try:
        recorded = rd.read_status().get("recovery")
        now = timeline.restarts(rd.path, recorded)
        if now and now != recorded:
            rd.update_status(recovery=now)
    except OSError as e:  # a full disk, a removed run dir: said, the run goes on
        print(f"launch: recovery timeline not recorded ({e.strerror or e})", file=sys.stderr)


@dataclass(frozen=True)
class Decided:
    """restart_decision's answer: the policy's decision, the checkpoint the next attempt resumes
    from (the decision's `from`, resolved once) and the ledger's decisions as nodes.json now holds
    them (what backoff_s counts)."""

    decision: recovery.Decision
    resume: str
    decisions: tuple[dict[str, Any], ...]


def restart_decision(
    spec: RunSpec,
    rd: RunDir,
    attempt: int,
    ff: dict[str, Any] | None,
    restarts_left: int,
    detected: float | None = None,
    nodes: dict[str, Any] | None = None,
) -> Decided:
    """The policy's decision on a failed attempt, written into the node ledger with the times of the
    fault, its detection and the decision (a full disk: said, not fatal). nodes: each node's exit
    (default: status.json's)."""
    led = nodeledger.read(rd.path)
    pool = pool_of(spec, led)
    failure, now = recovery.failure_of(ff, pool, describe_failure(ff)), time.time()
    decision = recovery.failure_decision(
        failure,
        pool,
        nodeledger.strikes(led),
        spec.quarantine_after,
        restarts_left,
        (spec.min_nodes, spec.max_nodes) if spec.min_nodes else None,
        nodeledger.past(led),
        (nodeledger.restarts_within(led, now), spec.max_restarts_per_hour),
    )
    resume = resume_point(rd)
    times = {"fault": (ff or {}).get("time"), "detected": detected, "decided": now, "from": resume}
    try:
        led = nodeledger.record(
            rd.path,
            led,
            attempt,
            pool,
            failure,
            nodes or rd.read_status().get("nodes") or {},
            decision,
            spec.quarantine_after,
            times,
        )
    except OSError as e:  # the ledger keeps the decisions before this one
        print(f"launch: node ledger not written ({e.strerror or e})", file=sys.stderr)
    return Decided(decision, resume, tuple((led or {}).get("decisions") or ()))


# restarts from one checkpoint without a wait (a run that makes progress never waits)
BACKOFF_FREE = 2
BACKOFF_MAX_S = 30.0


def backoff_s(ledger_decisions: Sequence[dict[str, Any]]) -> float:
    """The wait before the restart just decided (the last of the ledger's decisions:
    Decided.decisions): none for the first BACKOFF_FREE restarts in a row from the same checkpoint
    (the decisions' `from`), then 1, 2, 4 ... s up to BACKOFF_MAX_S: a fault that comes back before
    any progress does not hammer the nodes and the storage with starts."""
    decisions = [d for d in ledger_decisions if not d.get("preflight")]
    run = 0
    for d in reversed(decisions):
        if (
            d.get("from") is None
            or d.get("from") != decisions[-1].get("from")
            or d.get("action") == "stop"
        ):
            break
        run += 1
    return 0.0 if run <= BACKOFF_FREE else min(2.0 ** (run - BACKOFF_FREE - 1), BACKOFF_MAX_S)


def backoff_said(wait: float) -> str:
    return f"; in {wait:g} s (backoff: the same checkpoint again)" if wait else ""


def pool_of(spec: RunSpec, led: dict[str, Any] | None, resume: bool = False) -> recovery.Pool:
    """The pool of the run's last attempt (the ledger's; quarantined slots left out); resume:
    `launch resume`'s, where a run of --nodes MIN:MAX takes its idle slots back, up to MAX."""
    pool = nodeledger.pool_for(led, spec.max_nodes or spec.nodes, spec.spares, spec.min_nodes)
    return recovery.grow(pool, spec.max_nodes) if resume and spec.min_nodes else pool


def plan_on(backend: Backend, spec: RunSpec, run_id: str, attempt: int, pool: recovery.Pool):
    """An attempt's plan (Backend.plan, every backend); with --spares or --nodes MIN:MAX (or nodes
    the policy rotated) it gets the pool's active slots, in node order (Slurm's steps loop places
    them itself); with MIN:MAX the world is that many nodes (NNODES, WORLD_SIZE; the workloads
    reshard)."""
    if spec.min_nodes:
        spec = spec.replace(nodes=len(pool.active))
    slots = (
        list(pool.active)
        if spec.spares or spec.min_nodes or list(pool.active) != sorted(pool.active)
        else None
    )
    return backend.plan(spec, run_id, attempt=attempt, slots=slots)


def resume_point(rd: RunDir) -> str:
    """What the next attempt resumes from: `latest`, or the checkpoint it falls back to (sizes
    checked)."""
    from ..ckptptr import resolve

    res = resolve(rd.checkpoint_dir, hashes=False)
    if res.error:
        return f"no complete checkpoint ({res.error})"
    if res.skipped:
        return f"{res.name or 'scratch'} (damaged: {', '.join(s.name for s in res.skipped)})"
    return res.name or "scratch"


def end_line(st: dict[str, Any]) -> str:
    """`launch: run COMPLETED | FAILED (rank 2 on node 1, exit code 3[: RuntimeError: boom]) |
    CANCELLED (by launch cancel | Ctrl-C)`: the one line every backend ends with, the state named as
    status.json names it (launchers.stops)."""
    state, reason = st.get("state"), st.get("reason") or ""
    if state == "FAILED":
        what = (
            describe_failure(st["first_failure"])
            if st.get("first_failure")
            else reason or "no rank recorded a failure"
        )
        return f"launch: run FAILED ({what})"
    if state == "CANCELLED":
        return f"launch: run CANCELLED ({reason or 'stopped'})"
    return f"launch: run {state}"
