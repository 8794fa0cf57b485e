"""Recovery without a human (issue 23): the one policy that decides what follows a failed attempt --
restart, replace a slot by a spare, shrink, grow or stop -- for every backend that owns its restarts
(launchers.resilience.restarts carries it out). Pure (stdlib only): the node ledger's facts, the
first failure and the pool in; a Decision with a one-line why out (--nodes, --spares,
--quarantine-after and the restart budget: launchers.resilience.recoveryopts; Slurm's own decisions,
a step's end and a requeue: launchers.resilience.slurmpolicy).

A slot is one node of the pool (a simulated node, an SSH host, a node of the Slurm allocation). The
first failure (status.json) gives its slot one strike. A failure *points at the node* when its agent
or host died, it went silent or hung, or its slot has `quarantine_after` strikes (a lemon); one
failing rank is one strike.

A restart storm stops (issue 37 item 5): the same rank failure (its `sign`: typed facts, the exit
code or signal, never its words) in consecutive attempts on two slots or more follows the ranks: the
program's, no strike (those it made lifted), restarts until the budget -- --max-restarts,
--max-restarts-per-hour -- is spent, then one line: `looks like a bug in the program`. With no
spare, a rank's failure restarts on the nodes rotated, to tell.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from .slotpool import Pool, grow, swap

# kind -> (it points at the node by itself, what the ledger says)
KINDS: dict[str, tuple[bool, str]] = {
    "rank": (False, "a rank failed"),
    "agent": (True, "its agent died"),
    "lost": (True, "lost (host gone or silent)"),
    "hang": (True, "hung"),
    # a hardware fault the check will find again: quarantined at once
    "gpu": (True, "failed the GPU check"),
    # --dist-backend auto found it short (launchers.nodebackend)
    "gpus": (True, "lacks the GPUs its ranks need"),
}
AT_ONCE = ("gpu", "gpus")  # kinds that quarantine their slot at the first strike


@dataclass(frozen=True)
class Failure:
    """The failure that stopped an attempt, on its slot."""

    slot: int
    kind: str  # a key of KINDS
    what: str = ""  # how it is said (launchers.diagnosis.firstfail.describe)
    sign: str = ""  # a rank's own failure without where it happened (sign_of); "" for the others


@dataclass(frozen=True)
class Past:  # a failed attempt before this one, as the node ledger keeps it (nodeledger.past)
    attempt: int
    slot: int
    sign: str = ""
    strike: bool = False  # it gave its slot a strike


@dataclass(frozen=True)
class Decision:
    action: str  # restart | replace | shrink | grow | stop
    pool: Pool  # the slots of the next attempt (stop: the pool as it ends)
    why: str  # one line
    strikes: dict[int, int] = field(default_factory=dict)  # every slot's strikes after this failure
    quarantined: tuple[int, ...] = ()  # slots quarantined by this decision
    # the earlier attempts whose failure this one repeats: the program's (no strike)
    program: tuple[int, ...] = ()


def kind_of(ff: dict[str, Any] | None) -> str:
    """A first failure (status.json) -> its kind, typed where it was observed (never read from its
    reason's words): a hang (hang.verdict), a lost node (the backends' watch loops,
    slurm.requeue.lost_node), a failed GPU check (slurm.gpugate), a node short of GPUs
    (nodebackend); untyped: a rank's own failure, else its agent's."""
    if (ff or {}).get("kind") in KINDS:
        return ff["kind"]
    return "rank" if (ff or {}).get("rank") is not None else "agent"


def sign_of(ff: dict[str, Any] | None) -> str:
    """A rank's own failure as the program made it, wherever it ran, from typed facts only: `exit
    1`, `signal SIGSEGV` (never its words); "" for a failure of another kind or without an end."""
    if kind_of(ff) != "rank" or (not ff.get("signal") and ff.get("exit_code") is None):
        return ""
    return f"signal {ff['signal']}" if ff.get("signal") else f"exit {ff['exit_code']}"


def failure_of(ff: dict[str, Any] | None, pool: Pool, what: str = "") -> Failure | None:
    """The first failure of an attempt on its slot (node rank k ran on pool.active[k]); None when it
    names no node of the pool (nothing recorded a failure)."""
    node = (ff or {}).get("node")
    if not isinstance(node, int) or not 0 <= node < len(pool.active):
        return None
    return Failure(pool.active[node], kind_of(ff), what, sign_of(ff))


def failure_decision(
    failure: Failure | None,
    pool: Pool,
    strikes: dict[int, int],
    quarantine_after: int,
    restarts_left: int,
    bounds: tuple[int, int] | None = None,
    past: Sequence[Past] = (),
    hour: tuple[int, int] = (0, 0),
) -> Decision:
    """What follows a failed attempt (what_follows), within the budget: restarts_left
    (--max-restarts) and hour (the restarts decided in the last hour, --max-restarts-per-hour; 0: no
    such limit) -- one spent: stop, the why naming it. past: the failed attempts before this one
    (the ledger's, in attempt order)."""
    d = what_follows(failure, pool, dict(strikes), quarantine_after, restarts_left, bounds, past)
    if d.action != "stop" and 0 < hour[1] <= hour[0]:
        return replace(
            d,
            action="stop",
            why=(
                f"{d.why}; but {hour[0]} restart{'s' if hour[0] != 1 else ''} in the "
                f"last hour (--max-restarts-per-hour {hour[1]})"
            ),
        )
    return d


def what_follows(
    failure: Failure | None,
    pool: Pool,
    strikes: dict[int, int],
    quarantine_after: int,
    restarts_left: int,
    bounds: tuple[int, int] | None,
    past: Sequence[Past],
) -> Decision:
    """The failing slot gets a strike; at `quarantine_after` it is quarantined. A quarantined slot,
    or one its failure points at, is replaced by the first spare (last; the survivors keep their
    order); no spare: a shrink to the survivors while at least MIN (bounds: --nodes MIN:MAX), else a
    quarantine stops the run and another failure restarts (a rank's: on the nodes rotated, to tell
    whether it follows its rank). A restart below MAX takes idle slots back (grow). No restart left:
    stop. The failure of the attempts right before on another slot (repeats): the program's
    (program)."""
    low, high = bounds or (len(pool.active), len(pool.active))
    if failure is None:
        return _restart_or_stop(
            pool, strikes, restarts_left, (), "no node named by the failure", high=high
        )
    same = repeats(past, failure.sign)
    if any(p.slot != failure.slot for p in same):
        return program(failure, pool, strikes, same, restarts_left, high)
    slot = failure.slot
    strikes[slot] = strikes.get(slot, 0) + 1
    struck = f"slot {slot}: {KINDS[failure.kind][1]}, strike {strikes[slot]} of {quarantine_after}"
    if strikes[slot] >= quarantine_after or failure.kind in AT_ONCE:
        return _quarantine(pool, slot, strikes, restarts_left, struck, (low, high))
    return _struck(pool, slot, KINDS[failure.kind][0], strikes, restarts_left, struck, (low, high))


def _shrink(pool: Pool, bounds: tuple[int, int]) -> str:
    """How a shrink by one node is said: `shrink to N nodes (--nodes MIN:MAX)`."""
    fewer = len(pool.active) - 1
    return f"shrink to {fewer} node{'s' if fewer != 1 else ''} (--nodes {bounds[0]}:{bounds[1]})"


def _quarantine(
    pool: Pool,
    slot: int,
    strikes: dict[int, int],
    restarts_left: int,
    struck: str,
    bounds: tuple[int, int],
) -> Decision:
    """The struck slot quarantined: replaced by the first spare; no spare: a shrink while at least
    MIN, else stop."""
    (low, high), fewer = bounds, len(pool.active) - 1
    pool = replace(pool, quarantined=tuple(sorted({*pool.quarantined, slot})))
    if not pool.spares and fewer < low:
        return Decision("stop", pool, f"{struck}: quarantined, and no spare left", strikes, (slot,))
    if not pool.spares:
        return _restart_or_stop(
            swap(pool, slot),
            strikes,
            restarts_left,
            (slot,),
            f"{struck}: quarantined, and no spare left: {_shrink(pool, bounds)}",
            "shrink",
            high,
            (slot,),
        )
    return _restart_or_stop(
        swap(pool, slot),
        strikes,
        restarts_left,
        (slot,),
        f"{struck}: quarantined; replaced by spare slot {pool.spares[0]}",
        "replace",
        high,
    )


def _struck(
    pool: Pool,
    slot: int,
    points: bool,
    strikes: dict[int, int],
    restarts_left: int,
    struck: str,
    bounds: tuple[int, int],
) -> Decision:
    """A strike below the quarantine: a failure that points at the node benches its slot (replaced
    by the first spare, else a shrink while at least MIN); a rank's failure with no spare restarts
    on the nodes rotated; else a restart on the same slots."""
    (low, high), fewer = bounds, len(pool.active) - 1
    if points and pool.spares:
        return _restart_or_stop(
            swap(pool, slot, bench=True),
            strikes,
            restarts_left,
            (),
            f"{struck}: replaced by spare slot {pool.spares[0]}",
            "replace",
            high,
            (slot,),
        )
    if points and fewer >= low:
        return _restart_or_stop(
            swap(pool, slot, bench=True),
            strikes,
            restarts_left,
            (),
            f"{struck}: no spare left: {_shrink(pool, bounds)}",
            "shrink",
            high,
            (slot,),
        )
    # else a rank's bug strikes it again
    if not points and not pool.spares and fewer and restarts_left > 0:
        return _restart_or_stop(
            replace(pool, active=pool.active[1:] + pool.active[:1]),
            strikes,
            restarts_left,
            (),
            f"{struck}: no spare: restart with the nodes rotated (does it follow its rank?)",
            high=high,
        )
    why = f"{struck}: restart on the same slots" + (" (no spare left)" if points else "")
    return _restart_or_stop(pool, strikes, restarts_left, (), why, high=high)


def repeats(past: Sequence[Past], sign: str) -> tuple[Past, ...]:
    """The failures of the attempts right before this one (past, in attempt order) with its sign, in
    consecutive attempts up to the last one; () without a sign or when the last failure was
    another."""
    same: list[Past] = []
    for p in reversed(past if sign else ()):
        if p.sign != sign or (same and p.attempt != same[-1].attempt - 1):
            break
        same.append(p)
    return tuple(reversed(same))


def program(
    failure: Failure,
    pool: Pool,
    strikes: dict[int, int],
    same: tuple[Past, ...],
    restarts_left: int,
    high: int,
) -> Decision:
    """The same rank failure in consecutive attempts on two slots or more: the program's. No strike;
    those it made lifted (a slot it alone quarantined back among the spares); a restart while the
    budget lasts, then a stop."""
    made = {k: sum(1 for p in same if p.slot == k and p.strike) for k in {p.slot for p in same}}
    lifted = tuple(k for k in pool.quarantined if 0 < strikes.get(k, 0) <= made.get(k, 0))
    strikes.update({k: max(0, strikes.get(k, 0) - n) for k, n in made.items()})
    pool = replace(
        pool,
        spares=pool.spares + lifted,
        quarantined=tuple(k for k in pool.quarantined if k not in lifted),
    )
    why = (
        f"looks like a bug in the program: the same failure ({failure.sign}) in {len(same) + 1} "
        f"attempts in a row, on slots {_slots(tuple(sorted({failure.slot, *made})))}: it follows "
        "the ranks, not a node; no strike"
        + (
            f"; slot{'s' if len(lifted) > 1 else ''} {_slots(lifted)} out of quarantine"
            if lifted
            else ""
        )
    )
    return replace(
        _restart_or_stop(pool, strikes, restarts_left, (), why, high=high),
        program=tuple(p.attempt for p in same),
    )


def preflight_start(
    pool: Pool, bad: dict[int, str], bounds: tuple[int, int] | None = None
) -> Decision:
    """The pool a run starts on after `--preflight gpu` checked every slot of `pool` (the active
    ones and the spares) and found faults on the slots of `bad` (slot -> its one line): each bad
    slot is quarantined at once (kind "gpu", AT_ONCE); the good slots, active ones first and then
    the spares, each in its order, make the nodes (node 0 the first good one) and the spares. Fewer
    good slots than the active ones: the run shrinks to them while they are at least MIN (bounds:
    --nodes MIN:MAX; None: no shrink), else it stops. action: start (no active slot was bad),
    replace, shrink or stop; strikes: 1 for each bad slot."""
    n, said = len(pool.active), KINDS["gpu"][1]
    low, high = bounds or (0, n)
    good = [s for s in pool.active + pool.spares if s not in bad]
    gone = tuple(sorted({*pool.quarantined, *bad}))
    strikes = {s: 1 for s in bad}
    named = "; ".join(f"slot {s}: {said}" for s in sorted(bad))
    size = n if len(good) >= n else len(good) if low and len(good) >= low else 0
    if not size:
        need = f"--nodes {low}:{high}" if low else f"--nodes {n}"
        return Decision(
            "stop",
            replace(pool, quarantined=gone),
            f"{len(good)} good slot(s) of "
            f"{len(pool.active + pool.spares)}, {need} needs {low or n}",
            strikes,
            tuple(sorted(bad)),
        )
    start = Pool(tuple(good[:size]), tuple(good[size:]), gone)
    action = "start" if start.active == pool.active else "replace" if size == n else "shrink"
    said = {
        "start": "never used",
        "replace": f"the run starts on slots {_slots(start.active)}",
        "shrink": f"the run starts on slots {_slots(start.active)} (shrunk: --nodes {low}:{high})",
    }[action]
    why = f"{named}: quarantined; {said}" if bad else "every slot passed"
    return Decision(action, start, why, strikes, tuple(sorted(bad)))


def _slots(slots: tuple[int, ...]) -> str:
    return ", ".join(map(str, slots))


def _restart_or_stop(
    pool: Pool,
    strikes: dict[int, int],
    restarts_left: int,
    quarantined: tuple[int, ...],
    why: str,
    action: str = "restart",
    high: int = 0,
    benched: tuple[int, ...] = (),
) -> Decision:
    grown = grow(pool, high, benched)
    if grown != pool:
        back = grown.active[len(pool.active) :]
        why += (
            f"; slot{'s' if len(back) > 1 else ''} {', '.join(map(str, back))} back: "
            f"{len(grown.active)} nodes"
        )
        pool, action = grown, "grow" if action == "restart" else action
    if restarts_left <= 0:
        return Decision(
            "stop", pool, f"{why}; but no restart left (--max-restarts)", strikes, quarantined
        )
    return Decision(action, pool, why, strikes, quarantined)
