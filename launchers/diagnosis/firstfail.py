"""The first failure of an attempt, decided from its records: pure functions over the rank wrappers'
exit records (RunDir.rank_exits, earliest first) and the failures of nodes that left none;
RunDir.record_outcome writes what they decide into status.json `first_failure`.

A rank whose wrapper had given it a stop before it ended (its record's `stopped_by`:
launchers.rankexec) did not fail on its own, however it ended -- killed after the grace, by a
sweep's SIGKILL, an exception in its cleanup: what made the stop (another rank's failure, its own
node's, a hang, a lost host, a cancel) is never named after it. Such a record is no failure here,
and its node is still a candidate through the node's own failure."""

from __future__ import annotations

from typing import Any

from ..node.rankcause import peer_lost
from ..resilience.recovery import AT_ONCE

FAILURE_KEYS = ("node", "rank", "exit_code", "signal", "time")
# what a rank's wrapper found out (launchers.node.rankcause; kind: a
CAUSE_KEYS = ("exception", "reason", "kind")
#                                                 typed failure, e.g. "gpus" from
#                                                 launchers.nodebackend), kept when set


def of_rank(rec: dict[str, Any]) -> dict[str, Any]:
    """A failing rank record as a first failure: where, how it ended and, when known, why."""
    ff = {k: rec.get(k) for k in FAILURE_KEYS}
    ff.update({k: rec[k] for k in CAUSE_KEYS if rec.get(k)})
    return ff


def failed(rec: dict[str, Any]) -> bool:
    """Whether a rank record is a failure of the rank's own: a failing end that no stop it was given
    caused."""
    return rec.get("exit_code") != 0 and not rec.get("stopped_by")


def earliest(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest failing rank record (records earliest first; failed()), as a first failure."""
    for rec in recs:
        if failed(rec):
            return of_rank(rec)
    return None


def first_failure(
    recs: list[dict[str, Any]],
    node_failures: list[dict[str, Any]] = (),
    hosts: list[str] | None = None,
) -> dict[str, Any] | None:
    """The earliest in time among the first failing rank record (failed(): a rank that ended on a
    stop is none) and `node_failures` ({node, exit_code, signal, time, reason[, host]}) of nodes
    that left no failing rank record; named with its host where known.

    A rank that failed on losing a peer (rankcause.peer_lost) failed second: a rank that failed on
    its own (any other failure) goes first whatever the records' times -- the survivor's error can
    be written milliseconds before the crashed rank's own record (seen under load: rank 1 crashed,
    rank 0's "Connection closed by peer" stamped 3 ms earlier); else a node killed by a signal whose
    ranks died with it (no record at all) goes first whenever its failure was seen -- a container
    runtime's client (podman) reports its agent's death only after tearing the container down, later
    than the peer's record of it."""
    failing = [r for r in recs if failed(r)]
    ranked = {r.get("node") for r in failing}
    if failing and peer_lost(failing[0].get("exception")):
        # own failures first
        failing = [r for r in failing if not peer_lost(r.get("exception"))] + failing
    cands = [of_rank(r) for r in failing[:1]]
    nodes = [
        dict(
            {k: nf.get(k) for k in FAILURE_KEYS},
            rank=None,
            **{k: nf[k] for k in ("host", "reason", "kind") if nf.get(k)},
        )
        for nf in node_failures
        if nf.get("node") not in ranked
    ]
    if cands and peer_lost(cands[0].get("exception")):
        heard = {r.get("node") for r in recs}
        killed = [nf for nf in nodes if nf.get("signal") and nf.get("node") not in heard]
        cands, nodes = (killed, []) if killed else (cands, nodes)
    cands += nodes
    if not cands:
        return None
    ff = min(cands, key=lambda r: r.get("time") or 0.0)
    if hosts and ff.get("node") is not None and "host" not in ff and ff["node"] < len(hosts):
        ff["host"] = hosts[ff["node"]]
    return ff


def describe(ff: dict[str, Any] | None) -> str:
    """`rank 1 on node 1, exit code 1: RuntimeError: boom` (a rank's exception line, or its reason,
    e.g. out of memory, when its wrapper found one); a hang or a lost host: its reason in place of
    an exit code."""
    if not ff:
        return "no rank recorded a failure"
    where = (
        f"rank {ff['rank']} on node {ff['node']}"
        if ff.get("rank") is not None
        else f"node {ff.get('node')}"
    )
    return f"{where}, {how(ff) or 'no exit code'}"


def how(ff: dict[str, Any], node_code: int | None = None) -> str | None:
    """How the failure ended and why: `exit code 1: RuntimeError: boom`, `signal SIGKILL: out of
    memory ...`; a node's failure without a rank record: its reason (a hang, a lost host), else its
    exit code when given -- with its reason for a fault of the hardware (recovery.AT_ONCE: a failed
    GPU check's line naming the node and fact)."""
    code = (
        f"signal {ff['signal']}"
        if ff.get("signal")
        else f"exit code {ff['exit_code']}"
        if ff.get("exit_code") is not None
        else None
    )
    why = ff.get("exception") or (
        ff.get("reason") if ff.get("rank") is not None or ff.get("kind") in AT_ONCE else None
    )
    if code and why:
        return f"{code}: {why}"
    return code or ff.get("reason") or (f"exit code {node_code}" if node_code is not None else None)


def node_failed(ff: dict[str, Any], node_code: int | None = None) -> str:
    """What a node's `failed` line says of the first failure on it: `rank 1, exit code 1:
    RuntimeError: boom`, or the node's own reason (`connection lost (...)`) or exit code."""
    what = how(ff, node_code) or "no exit code"
    return f"rank {ff['rank']}, {what}" if ff.get("rank") is not None else what


def killed_after_grace(recs: list[dict[str, Any]]) -> str | None:
    """`ranks 0, 1 did not stop within 3 s; killed`, or None when no rank was killed after the stop
    grace."""
    killed = sorted((r for r in recs if r.get("killed_after_grace")), key=lambda r: r["rank"])
    if not killed:
        return None
    ranks = ", ".join(str(r["rank"]) for r in killed)
    return (
        f"rank{'s' if len(killed) > 1 else ''} {ranks} did not stop within "
        f"{killed[0]['killed_after_grace']:g} s; killed"
    )
