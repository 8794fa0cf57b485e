"""The end of an attempt on Slurm (node 0 after a USR2, and the batch side after srun).

When USR2 was seen (preemption or the --signal warning before the time limit), node 0 of a submitted
job waits for every node's record, then requeues the job with `scontrol requeue` (the next run is
attempt +1 and resumes from checkpoints/latest) -- or marks the run FAILED once --max-requeues is
used up. In the user's own allocation the launcher records such a stop PREEMPTED and requeues
nothing (launchers.backends.slurm.inalloc). After srun the batch side records the attempt's result
through RunDir.record_outcome (the rule every backend uses), unless node 0 already decided. Stdlib
only.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any, Callable

from ...hang.verdict import hang_failure
from ...records.rundir import RunDir
from ...resilience.slurmpolicy import Requeue, StepEnd, requeue_decision, step_end_decision
from ...spec import RunSpec
from . import cmd
from .env import NodelistError, SlurmEnv
from .inalloc import preempted_reason
from .memory import forget_job
from .nodespec import NodeSpec, load_node_spec
from .render import step_loop

PEERS_WAIT_S = 30.0  # node 0 waits this long for every node's record before requeueing
DECIDED = ("REQUEUED", "FAILED", "CANCELLED", "COMPLETED")
SELF_CANCEL_WAIT_S = 30.0  # the batch script waits this long for its own scancel to end it


def node_codes(recs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return {str(k): r.get("exit_code") for k, r in sorted(recs.items())}


def after_stop(
    rd: RunDir, spec: RunSpec, attempt: int, restart: int, job_id: str, max_requeues: int
) -> None:
    """Node 0 of a submitted job after a USR2: wait for every node's record, then requeue (or give
    up). Never in the user's own allocation: Slurm or the user requeues their job
    (launchers.backends.slurm.inalloc)."""
    deadline = time.monotonic() + PEERS_WAIT_S
    while time.monotonic() < deadline:
        recs = rd.node_records(spec.nodes, attempt)
        if len(recs) == spec.nodes and all(r.get("state") == "EXITED" for r in recs.values()):
            break
        time.sleep(0.2)
    nodes = node_codes(rd.node_records(spec.nodes, attempt))
    if len(nodes) == spec.nodes and all(c == 0 for c in nodes.values()):
        # the signal came after the job had finished: nothing to requeue (finalize records it)
        return
    requeue_or_fail(rd, attempt, restart, job_id, max_requeues, nodes, step_loop(spec))


def requeue_or_fail(
    rd: RunDir,
    attempt: int,
    restart: int,
    job_id: str,
    max_requeues: int,
    nodes: dict[str, Any],
    steps: bool = False,
) -> None:
    """After a USR2 stopped the attempt: `scontrol requeue`, or FAILED once the requeues are used up
    (slurmpolicy.requeue_decision). A run of the loop over steps (--spares, --nodes MIN:MAX) has its
    quarantined slots' hosts excluded from the next allocation first (ExcNodeList)."""
    if steps:
        exclude_quarantined(rd, job_id)
    decided = requeue_decision(Requeue(restart, max_requeues))
    with rd.lock():
        if decided.action == "fail":
            rd.update_status(state="FAILED", attempt=attempt, nodes=nodes, reason=decided.why)
            return
        rd.update_status(state="REQUEUED", attempt=attempt, nodes=nodes, reason=decided.why)
        # the requeue ends this job: its SIGTERM must not kill the command that asked for it
        p = cmd.run(["scontrol", "requeue", job_id], timeout=60, shielded=True)
        if p.returncode != 0:
            msg = (p.stderr or p.stdout).strip().splitlines()
            rd.update_status(
                state="FAILED",
                reason=f"scontrol requeue {job_id} failed: {msg[0] if msg else p.returncode}",
            )


def exclude_quarantined(rd: RunDir, job_id: str) -> None:
    """`scontrol update JobId=J ExcNodeList=...`: the quarantined hosts (the node ledger) never in
    the requeued job's next allocation; a refusal is said in the job's log, the requeue goes on."""
    from ...ledgers.nodeledger import quarantined_hosts, read

    hosts = quarantined_hosts(read(rd.path), rd.read_run_yaml().get("attempts") or [])
    if hosts:
        p = cmd.run(
            ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(hosts)}"], timeout=60
        )
        said = (
            "excluded"
            if p.returncode == 0
            else f"not excluded ({(p.stderr or p.stdout).strip()[:200]})"
        )
        print(
            f"launch: quarantined host(s) {', '.join(hosts)} {said} from job {job_id}'s next "
            "allocation",
            file=sys.stderr,
            flush=True,
        )


def finalize(
    run_dir: str,
    base_attempt: int,
    in_allocation: bool = False,
    srun_status: int | None = None,
    attempt: int | None = None,
    on_failure: Callable[[dict | None, dict], str | None] | None = None,
    nodes_run: int | None = None,
    stopped_by: str | None = None,
) -> int:
    """After srun: per-node exit codes and first failure into status.json, unless node 0 already
    decided (REQUEUED, FAILED after a stop). A USR2 that ended the step before node 0 could act on
    it (e.g. during start-up: srun status 128+12) is requeued from here. Returns 0 only if every
    node (so every rank) succeeded. attempt: the step's own (the loop over attempts,
    launchers.backends.slurm.steps), else the base attempt plus Slurm's restarts. on_failure(first
    failure, nodes): a failed attempt (not a stop) that another follows in the same job -- the line
    why, written as REQUEUED instead of FAILED (never FAILED meanwhile). nodes_run: the step's node
    count when the loop ran it on fewer than --nodes (a shrunk run, MIN:MAX). In the user's
    allocation: stopped_by, the signal the launcher itself got (CANCELLED by it); steps stopped by
    Slurm's signal while the launcher was not (a preemption's notice, the --signal warning) are
    PREEMPTED. Which end it is: slurmpolicy.step_end_decision, on the facts gathered here."""
    rd, env = RunDir(run_dir), SlurmEnv.read()
    ns = load_node_spec(rd, base_attempt)
    restart = 0 if in_allocation else env.restart_count
    attempt = base_attempt + restart if attempt is None else attempt
    n = nodes_run or ns.spec.nodes
    recs = rd.node_records(n, attempt)
    nodes = node_codes(recs)
    with rd.lock():
        st = rd.read_status()
        if st.get("attempt") == attempt and st.get("state") in DECIDED:
            return 0 if st["state"] == "COMPLETED" else 1
        missing = [k for k in range(n) if recs.get(k, {}).get("state") != "EXITED"]
        cancelled = "SIGTERM" if st.get("cancel_requested") else stopped_by  # a cancel, no failure
        signals = sorted({s for r in recs.values() for s in r.get("stop_signals", ())})
        end = step_end(
            st, recs, nodes, missing, srun_status, in_allocation, cancelled, signals, on_failure
        )
        if end in ("requeue", "preempted"):
            stopped_end(end, rd, ns, env.job_id, attempt, restart, nodes, signals)
            return 1
        failures, reason = node_failures(recs, missing)
        if end == "recover" and recovered(
            rd, st, attempt, nodes, recs, missing, failures, on_failure
        ):
            return 1
        if on_failure is None:  # a plain run's: the node ledgers before FAILED
            rd.on_failure = plain_end(ns, rd, env, attempt, n, in_allocation)
        code = rd.record_outcome(
            attempt,
            nodes,
            node_failures=failures,
            reason=None if cancelled else reason,
            stopped_by=cancelled,
            stopped_at=st.get("cancel_at"),
        )
    if cancelled and not in_allocation:
        forget_job(ns.spec, ns.run_id, env)  # --memory-checkpoint: before the scancel ends us
        end_as_cancelled(env.job_id)
    return 0 if code == 0 else 1


def step_end(
    st: dict[str, Any],
    recs: dict[int, dict[str, Any]],
    nodes: dict[str, Any],
    missing: list[int],
    srun_status: int | None,
    in_allocation: bool,
    cancelled: str | None,
    signals: list[str],
    on_failure: Callable | None,
) -> str:
    """The step's end (slurmpolicy.step_end_decision) on its facts: a failure (a node failed or
    recorded no exit), a USR2 (srun's status 128+12 unless a cancel was asked, or a node's stop
    signals), a cancel, the signals, and whether another attempt follows a failure in the same job
    (on_failure given)."""
    usr2 = (
        not st.get("cancel_requested")
        and srun_status == 128 + signal.SIGUSR2
        or any("SIGUSR2" in r.get("stop_signals", ()) for r in recs.values())
    )
    failed = bool(missing) or any(c != 0 for c in nodes.values())
    return step_end_decision(
        StepEnd(
            failed, usr2, in_allocation, bool(cancelled), tuple(signals), on_failure is not None
        )
    )


def stopped_end(
    end: str,
    rd: RunDir,
    ns: NodeSpec,
    job_id: str,
    attempt: int,
    restart: int,
    nodes: dict[str, Any],
    signals: list[str],
) -> None:
    """A step stopped by Slurm's signal: requeued (or FAILED once the requeues are used up), or
    PREEMPTED in the user's own allocation."""
    if end == "requeue":
        requeue_or_fail(rd, attempt, restart, job_id, ns.max_requeues, nodes, step_loop(ns.spec))
        return
    rd.update_status(
        state="PREEMPTED",
        attempt=attempt,
        nodes=nodes,
        first_failure=None,
        stopped_by=signals[0],
        reason=preempted_reason(signals, job_id, rd.path),
    )


def node_failures(
    recs: dict[int, dict[str, Any]], missing: list[int]
) -> tuple[list[dict[str, Any]], str | None]:
    """The nodes that exited non-zero (else those that recorded no exit) as failures, and the line
    naming the nodes that recorded no exit (None when every node did)."""
    failures = [
        {
            "node": k,
            "exit_code": r.get("exit_code"),
            "signal": r.get("signal"),
            "time": r.get("time"),
            "host": r.get("host"),
            "reason": r.get("error"),
            "kind": r.get("kind"),
        }
        for k, r in sorted(recs.items())
        if r.get("state") == "EXITED" and r.get("exit_code") != 0
    ]
    reason = f"node(s) {', '.join(map(str, missing))} recorded no exit" if missing else None
    if missing and not failures:
        failures = [{"node": k, "time": time.time(), "reason": reason} for k in missing]
    return failures, reason


def recovered(
    rd: RunDir,
    st: dict[str, Any],
    attempt: int,
    nodes: dict[str, Any],
    recs: dict[int, dict[str, Any]],
    missing: list[int],
    failures: list[dict[str, Any]],
    on_failure: Callable,
) -> bool:
    """A failed attempt another follows in the same job (the loop over steps): its first failure
    (the attempt's hang, a lost node, else the rule's), handed to on_failure; REQUEUED with its line
    why when it gives one."""
    hang = st.get("hang") or {}
    ff = (
        hang_failure(hang)
        if hang.get("attempt") == attempt and hang.get("stalled_ranks")
        else lost_node(missing, recs, down_hosts) or rd.decide_first_failure(attempt, failures)
    )
    why = on_failure(ff, nodes)
    if why:
        rd.update_status(
            state="REQUEUED", attempt=attempt, nodes=nodes, first_failure=ff, reason=why
        )
    return bool(why)


def plain_end(
    ns: NodeSpec, rd: RunDir, env: SlurmEnv, attempt: int, n: int, in_allocation: bool
) -> Callable:
    """A plain run's RunDir.on_failure: its failed attempt into the node ledgers (record_end); None:
    FAILED."""
    return lambda ff, nodes: record_end(
        ns.spec, rd, attempt, job_hosts(env, n, in_allocation), ff, nodes
    )


def record_end(
    spec: RunSpec,
    rd: RunDir,
    attempt: int,
    hosts: list[str] | None,
    ff: dict[str, Any] | None,
    nodes: dict[str, Any],
) -> None:
    """A plain run's failed attempt (no loop over steps) into nodes.json and the site's node ledger,
    once, before its FAILED is written (launchers.resilience.restarts.record_end); imported here,
    off the node task's start-up path."""
    if spec.node_ledger:
        from ...resilience.restarts import record_end as record

        record(spec, rd, attempt, hosts, ff, nodes)


def job_hosts(env: SlurmEnv, n: int, in_allocation: bool = False) -> list[str] | None:
    """The job's nodes in node order (SLURM_NODEID k: its k-th host); None when its nodelist is not
    read (or in the user's own allocation)."""
    if in_allocation:
        return None
    try:
        return env.hostnames()[:n]
    except NodelistError:
        return None


def lost_node(
    missing: list[int],
    recs: dict[int, dict[str, Any]],
    unresponsive: Callable[[list[str]], set[str]] | None = None,
) -> dict[str, Any] | None:
    """A node of the step that recorded no exit while the step ended: its host died or its task was
    killed hard (a node's task records how it ended, also a failure to start). It is the cause: the
    other nodes' ranks failed on losing it (their peer, or their master when it was node 0). When
    several recorded no exit -- a node partitioned or paused leaves its peers blocked in a
    collective, and Slurm kills them with the step -- the one whose host Slurm names not responding
    or down (unresponsive(hosts): down_hosts) is the lost one."""
    if not missing:
        return None
    k = missing[0]
    hosts = {j: (recs.get(j) or {}).get("host") for j in missing}
    if len(missing) > 1 and unresponsive is not None:
        gone = unresponsive([h for h in hosts.values() if h])
        k = next((j for j in missing if hosts[j] in gone), k)
    host = hosts[k]
    return {
        "node": k,
        "rank": None,
        "exit_code": None,
        "signal": None,
        "time": None,
        "host": host,
        "kind": "lost",
        "reason": (
            f"lost: node {k}{f' ({host})' if host else ''} recorded no exit "
            "(its host died or its task was killed)"
        ),
    }


def down_hosts(hosts: list[str]) -> set[str]:
    """Of these Slurm nodes, those sinfo shows not responding (a state ending in '*') or
    down/failed; none when sinfo does not answer."""
    if not hosts:
        return set()
    try:
        p = cmd.run(["sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N %t"], timeout=30)
    except (OSError, subprocess.SubprocessError):
        return set()
    return (
        {
            w[0]
            for w in (ln.split() for ln in p.stdout.splitlines())
            if len(w) == 2 and (w[1].endswith("*") or w[1].startswith(("down", "fail")))
        }
        if p.returncode == 0
        else set()
    )


def end_as_cancelled(job_id: str) -> None:
    """`launch cancel` stopped the steps gracefully (`scancel --signal`, which spares the batch
    script): the job itself is cancelled too, so Slurm's accounting (sacct, scontrol) names it
    CANCELLED like the run, not FAILED 1:0 from this script's exit. A plain scancel of our own job
    ends this script (the run is recorded first)."""
    p = cmd.run(["scancel", job_id], timeout=60)
    if p.returncode == 0:
        # Slurm's SIGTERM/SIGKILL to the batch step arrives meanwhile
        time.sleep(SELF_CANCEL_WAIT_S)
