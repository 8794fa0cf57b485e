"""Recovery without a human (issue 23): the one policy that decides what follows a failed attempt -- restart,
replace a slot by a spare, shrink, grow or stop -- for every backend that owns its restarts (launchers.restarts
carries it out). Pure (stdlib only): the node ledger's facts, the first failure and the pool in; a Decision with
a one-line why out. --nodes, --spares, --quarantine-after and the restart budget are read here too.

A slot is one node of the pool (a simulated node, an SSH host, a node of the Slurm allocation). The first failure
(status.json) gives its slot one strike. A failure *points at the node* when its agent or host died, it went
silent or hung, or its slot has `quarantine_after` strikes (a lemon); one failing rank is one strike.

A restart storm stops (issue 37 item 5): the same rank failure (its `sign`: typed facts, the exit code or signal,
never its words) in consecutive attempts on two slots or more follows the ranks: the program's, no strike (those
it made lifted), restarts until the budget -- --max-restarts, --max-restarts-per-hour -- is spent, then one line:
`looks like a bug in the program`. With no spare, a rank's failure restarts on the nodes rotated, to tell.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from .errors import LaunchError, brief
from .values import parse_int

MAX_SPARES = MAX_NODES = 65536         # --spares; --nodes, the hosts of a hostfile
QUARANTINE_AFTER = 2                   # --quarantine-after's default
SPARES_ON = ("local", "ssh", "slurm")  # the backends that carry out a replacement by a spare
RANGES_ON = ("local", "ssh", "slurm")  # ... and a shrink (--nodes MIN:MAX)

# kind -> (it points at the node by itself, what the ledger says)
KINDS: dict[str, tuple[bool, str]] = {
    "rank": (False, "a rank failed"),
    "agent": (True, "its agent died"),
    "lost": (True, "lost (host gone or silent)"),
    "hang": (True, "hung"),
    "gpu": (True, "failed the GPU check"),      # a hardware fault the check will find again: quarantined at once
    "gpus": (True, "lacks the GPUs its ranks need"),    # --dist-backend auto found it short (launchers.nodebackend)
}
AT_ONCE = ("gpu", "gpus")                     # kinds that quarantine their slot at the first strike


def options(backend: str, pick: Callable[..., Any], said: Callable[[str], str]) -> dict[str, Any]:
    """--nodes, --spares, --quarantine-after and the restart budget (--max-restarts; --max-restarts-per-hour, 0:
    no hourly limit), from the flags over the profile (spec.build_spec's pick/said). --spares K or --nodes
    MIN:MAX without --max-restarts allow K + MAX - MIN + 1 restarts; a --max-restarts given wins."""
    low, nodes = node_range(said("nodes"), pick("nodes", 1))
    spares = parse_int(said("spares"), pick("spares", 0), 0, MAX_SPARES)
    after = parse_int(said("quarantine_after"), pick("quarantine_after", QUARANTINE_AFTER), 1, MAX_SPARES)
    on = ", ".join("launch " + b for b in SPARES_ON)
    if spares and backend not in SPARES_ON:
        raise LaunchError(f"{said('spares')} {spares} is not yet on this backend ({backend}); accepted: 0 here, "
                          f"or spares with {on}")
    if low < nodes and backend not in RANGES_ON:
        raise LaunchError(f"{said('nodes')} {low}:{nodes} (a range) is not yet on this backend ({backend}); "
                          f"accepted: a number of nodes here, or MIN:MAX with "
                          + ", ".join("launch " + b for b in RANGES_ON))
    given, extra = pick("max_restarts"), spares + nodes - low
    restarts = parse_int(said("max_restarts"), given, 0) if given is not None else (extra + 1 if extra else 0)
    ranged = (low, nodes) if low < nodes else (0, 0)
    per_hour = parse_int(said("max_restarts_per_hour"), pick("max_restarts_per_hour", 0), 0)
    return {"nodes": nodes, "min_nodes": ranged[0], "max_nodes": ranged[1], "spares": spares,
            "quarantine_after": after, "max_restarts": restarts, "max_restarts_per_hour": per_hour}


def node_range(what: str, value: Any) -> tuple[int, int]:
    """--nodes N (an int, its text) or MIN:MAX (a run that may shrink to MIN nodes and grow back to MAX) ->
    (MIN, MAX); N is (N, N)."""
    if not isinstance(value, str) or ":" not in value:
        n = parse_int(what, value, 1, MAX_NODES)
        return n, n
    accepted = f"N or MIN:MAX, integers 1-{MAX_NODES} in plain decimal digits, MIN <= MAX (e.g. 2 or 1:2)"
    try:
        low, high = (parse_int(what, v, 1, MAX_NODES) for v in value.split(":", 1))
    except LaunchError:
        raise LaunchError(f"{what} {brief(value)} is not accepted; give {accepted}") from None
    if low > high:
        raise LaunchError(f"{what} {brief(value)} is not accepted: MIN {low} is more than MAX {high}; give {accepted}")
    return low, high


@dataclass(frozen=True)
class Pool:
    """The node slots of a run: `active` in node-rank order (active[0] is node 0, the rendezvous host), idle
    spares in the order they are taken, quarantined ones never used again in the run."""
    active: tuple[int, ...]
    spares: tuple[int, ...] = ()
    quarantined: tuple[int, ...] = ()

    @classmethod
    def fresh(cls, nodes: int, spares: int, quarantined: tuple[int, ...] = (), known: tuple[int, ...] = (),
              least: int = 0) -> "Pool":
        """Slots 0..nodes+spares-1 (and those `known` already) less the quarantined ones: the first `nodes`
        active, the rest spares (a pool short of slots after quarantines -- fewer than `least`, default `nodes`
        -- takes the lowest slots, quarantined or not: nothing else is there)."""
        slots = sorted({*range(nodes + spares), *known})
        free = [s for s in slots if s not in quarantined]
        if len(free) < (least or nodes):
            free = slots
        return cls(tuple(free[:nodes]), tuple(free[nodes:]), tuple(sorted(quarantined)))

    def to_dict(self) -> dict[str, list[int]]:
        return {"active": list(self.active), "spares": list(self.spares), "quarantined": list(self.quarantined)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Pool":
        return cls(*(tuple(int(s) for s in d.get(k) or ()) for k in ("active", "spares", "quarantined")))


@dataclass(frozen=True)
class Failure:
    """The failure that stopped an attempt, on its slot."""
    slot: int
    kind: str                       # a key of KINDS
    what: str = ""                  # how it is said (launchers.firstfail.describe)
    sign: str = ""                  # a rank's own failure without where it happened (sign_of); "" for the others


@dataclass(frozen=True)
class Past:                         # a failed attempt before this one, as the node ledger keeps it (nodeledger.past)
    attempt: int
    slot: int
    sign: str = ""
    strike: bool = False            # it gave its slot a strike


@dataclass(frozen=True)
class Decision:
    action: str                     # restart | replace | shrink | grow | stop
    pool: Pool                      # the slots of the next attempt (stop: the pool as it ends)
    why: str                        # one line
    strikes: dict[int, int] = field(default_factory=dict)     # every slot's strikes after this failure
    quarantined: tuple[int, ...] = ()                         # slots quarantined by this decision
    program: tuple[int, ...] = ()   # the earlier attempts whose failure this one repeats: the program's (no strike)


def kind_of(ff: dict[str, Any] | None) -> str:
    """A first failure (status.json) -> its kind, typed where it was observed (never read from its reason's
    words): a hang (hang.verdict), a lost node (the backends' watch loops, slurm.requeue.lost_node), a failed GPU
    check (slurm.gpugate), a node short of GPUs (nodebackend); untyped: a rank's own failure, else its agent's."""
    if (ff or {}).get("kind") in KINDS:
        return ff["kind"]
    return "rank" if (ff or {}).get("rank") is not None else "agent"


def sign_of(ff: dict[str, Any] | None) -> str:
    """A rank's own failure as the program made it, wherever it ran, from typed facts only: `exit 1`, `signal
    SIGSEGV` (never its words); "" for a failure of another kind or without an end."""
    if kind_of(ff) != "rank" or (not ff.get("signal") and ff.get("exit_code") is None):
        return ""
    return f"signal {ff['signal']}" if ff.get("signal") else f"exit {ff['exit_code']}"


def failure_of(ff: dict[str, Any] | None, pool: Pool, what: str = "") -> Failure | None:
    """The first failure of an attempt on its slot (node rank k ran on pool.active[k]); None when it names no
    node of the pool (nothing recorded a failure)."""
    node = (ff or {}).get("node")
    if not isinstance(node, int) or not 0 <= node < len(pool.active):
        return None
    return Failure(pool.active[node], kind_of(ff), what, sign_of(ff))


def decide(failure: Failure | None, pool: Pool, strikes: dict[int, int], quarantine_after: int,
           restarts_left: int, bounds: tuple[int, int] | None = None, past: Sequence[Past] = (),
           hour: tuple[int, int] = (0, 0)) -> Decision:
    """What follows a failed attempt (what_follows), within the budget: restarts_left (--max-restarts) and hour
    (the restarts decided in the last hour, --max-restarts-per-hour; 0: no such limit) -- one spent: stop, the
    why naming it. past: the failed attempts before this one (the ledger's, in attempt order)."""
    d = what_follows(failure, pool, dict(strikes), quarantine_after, restarts_left, bounds, past)
    if d.action != "stop" and 0 < hour[1] <= hour[0]:
        return replace(d, action="stop", why=f"{d.why}; but {hour[0]} restart{'s' if hour[0] != 1 else ''} in the "
                       f"last hour (--max-restarts-per-hour {hour[1]})")
    return d


def what_follows(failure: Failure | None, pool: Pool, strikes: dict[int, int], quarantine_after: int,
                 restarts_left: int, bounds: tuple[int, int] | None, past: Sequence[Past]) -> Decision:
    """The failing slot gets a strike; at `quarantine_after` it is quarantined. A quarantined slot, or one its
    failure points at, is replaced by the first spare (last; the survivors keep their order); no spare: a shrink
    to the survivors while at least MIN (bounds: --nodes MIN:MAX), else a quarantine stops the run and another
    failure restarts (a rank's: on the nodes rotated, to tell whether it follows its rank). A restart below MAX
    takes idle slots back (grow). No restart left: stop. The failure of the attempts right before on another slot
    (repeats): the program's (program)."""
    low, high = bounds or (len(pool.active), len(pool.active))
    if failure is None:
        return _restart_or_stop(pool, strikes, restarts_left, (), "no node named by the failure", high=high)
    same = repeats(past, failure.sign)
    if any(p.slot != failure.slot for p in same):
        return program(failure, pool, strikes, same, restarts_left, high)
    slot = failure.slot
    strikes[slot] = strikes.get(slot, 0) + 1
    n = strikes[slot]
    points, said = KINDS[failure.kind]
    struck = f"slot {slot}: {said}, strike {n} of {quarantine_after}"
    fewer = len(pool.active) - 1
    shrink = f"shrink to {fewer} node{'s' if fewer != 1 else ''} (--nodes {low}:{high})"
    if n >= quarantine_after or failure.kind in AT_ONCE:
        pool = replace(pool, quarantined=tuple(sorted({*pool.quarantined, slot})))
        if not pool.spares and fewer < low:
            return Decision("stop", pool, f"{struck}: quarantined, and no spare left", strikes, (slot,))
        if not pool.spares:
            return _restart_or_stop(_swap(pool, slot), strikes, restarts_left, (slot,),
                                    f"{struck}: quarantined, and no spare left: {shrink}", "shrink", high, (slot,))
        return _restart_or_stop(_swap(pool, slot), strikes, restarts_left, (slot,),
                                f"{struck}: quarantined; replaced by spare slot {pool.spares[0]}", "replace", high)
    if points and pool.spares:
        return _restart_or_stop(_swap(pool, slot, bench=True), strikes, restarts_left, (),
                                f"{struck}: replaced by spare slot {pool.spares[0]}", "replace", high, (slot,))
    if points and fewer >= low:
        return _restart_or_stop(_swap(pool, slot, bench=True), strikes, restarts_left, (),
                                f"{struck}: no spare left: {shrink}", "shrink", high, (slot,))
    if not points and not pool.spares and fewer and restarts_left > 0:    # else a rank's bug strikes it again
        return _restart_or_stop(replace(pool, active=pool.active[1:] + pool.active[:1]), strikes, restarts_left, (),
                                f"{struck}: no spare: restart with the nodes rotated (does it follow its rank?)",
                                high=high)
    why = f"{struck}: restart on the same slots" + (" (no spare left)" if points else "")
    return _restart_or_stop(pool, strikes, restarts_left, (), why, high=high)


def repeats(past: Sequence[Past], sign: str) -> tuple[Past, ...]:
    """The failures of the attempts right before this one (past, in attempt order) with its sign, in consecutive
    attempts up to the last one; () without a sign or when the last failure was another."""
    same: list[Past] = []
    for p in reversed(past if sign else ()):
        if p.sign != sign or (same and p.attempt != same[-1].attempt - 1):
            break
        same.append(p)
    return tuple(reversed(same))


def program(failure: Failure, pool: Pool, strikes: dict[int, int], same: tuple[Past, ...], restarts_left: int,
            high: int) -> Decision:
    """The same rank failure in consecutive attempts on two slots or more: the program's. No strike; those it made
    lifted (a slot it alone quarantined back among the spares); a restart while the budget lasts, then a stop."""
    made = {k: sum(1 for p in same if p.slot == k and p.strike) for k in {p.slot for p in same}}
    lifted = tuple(k for k in pool.quarantined if 0 < strikes.get(k, 0) <= made.get(k, 0))
    strikes.update({k: max(0, strikes.get(k, 0) - n) for k, n in made.items()})
    pool = replace(pool, spares=pool.spares + lifted, quarantined=tuple(k for k in pool.quarantined if k not in lifted))
    why = (f"looks like a bug in the program: the same failure ({failure.sign}) in {len(same) + 1} attempts in a "
           f"row, on slots {_slots(tuple(sorted({failure.slot, *made})))}: it follows the ranks, not a node; no strike"
           + (f"; slot{'s' if len(lifted) > 1 else ''} {_slots(lifted)} out of quarantine" if lifted else ""))
    return replace(_restart_or_stop(pool, strikes, restarts_left, (), why, high=high),
                   program=tuple(p.attempt for p in same))


def preflight_start(pool: Pool, bad: dict[int, str], bounds: tuple[int, int] | None = None) -> Decision:
    """The pool a run starts on after `--preflight gpu` checked every slot of `pool` (the active ones and the
    spares) and found faults on the slots of `bad` (slot -> its one line): each bad slot is quarantined at once
    (kind "gpu", AT_ONCE); the good slots, active ones first and then the spares, each in its order, make the
    nodes (node 0 the first good one) and the spares. Fewer good slots than the active ones: the run shrinks to
    them while they are at least MIN (bounds: --nodes MIN:MAX; None: no shrink), else it stops. action: start (no
    active slot was bad), replace, shrink or stop; strikes: 1 for each bad slot."""
    n, said = len(pool.active), KINDS["gpu"][1]
    low, high = bounds or (0, n)
    good = [s for s in pool.active + pool.spares if s not in bad]
    gone = tuple(sorted({*pool.quarantined, *bad}))
    strikes = {s: 1 for s in bad}
    named = "; ".join(f"slot {s}: {said}" for s in sorted(bad))
    size = n if len(good) >= n else len(good) if low and len(good) >= low else 0
    if not size:
        need = f"--nodes {low}:{high}" if low else f"--nodes {n}"
        return Decision("stop", replace(pool, quarantined=gone), f"{len(good)} good slot(s) of "
                        f"{len(pool.active + pool.spares)}, {need} needs {low or n}", strikes, tuple(sorted(bad)))
    start = Pool(tuple(good[:size]), tuple(good[size:]), gone)
    action = "start" if start.active == pool.active else "replace" if size == n else "shrink"
    said = {"start": "never used", "replace": f"the run starts on slots {_slots(start.active)}",
            "shrink": f"the run starts on slots {_slots(start.active)} (shrunk: --nodes {low}:{high})"}[action]
    why = f"{named}: quarantined; {said}" if bad else "every slot passed"
    return Decision(action, start, why, strikes, tuple(sorted(bad)))


def _slots(slots: tuple[int, ...]) -> str:
    return ", ".join(map(str, slots))


def _restart_or_stop(pool: Pool, strikes: dict[int, int], restarts_left: int, quarantined: tuple[int, ...],
                     why: str, action: str = "restart", high: int = 0, benched: tuple[int, ...] = ()) -> Decision:
    grown = grow(pool, high, benched)
    if grown != pool:
        back = grown.active[len(pool.active):]
        why += f"; slot{'s' if len(back) > 1 else ''} {', '.join(map(str, back))} back: {len(grown.active)} nodes"
        pool, action = grown, "grow" if action == "restart" else action
    if restarts_left <= 0:
        return Decision("stop", pool, f"{why}; but no restart left (--max-restarts)", strikes, quarantined)
    return Decision(action, pool, why, strikes, quarantined)


def grow(pool: Pool, high: int, benched: tuple[int, ...] = ()) -> Pool:
    """The pool with idle spares (never quarantined) taken back into the active ones, last, up to `high` nodes
    (--nodes MIN:MAX: a shrunk run grows back to MAX at a restart); `benched`: slots that stay out (benched
    by this very decision)."""
    back = tuple(s for s in pool.spares if s not in benched)[:max(0, high - len(pool.active))]
    return replace(pool, active=pool.active + back, spares=tuple(s for s in pool.spares if s not in back))


def _swap(pool: Pool, slot: int, bench: bool = False) -> Pool:
    """The pool with `slot` out of the active ones and the first spare in, last (none left: one node fewer).
    bench: the slot is not quarantined, it goes to the back of the spares (a later replacement may take it
    again)."""
    active = tuple(s for s in pool.active if s != slot) + pool.spares[:1]
    spares = pool.spares[1:] + ((slot,) if bench else ())
    return replace(pool, active=active, spares=spares)


# ---------------------------------------------------------------- Slurm: a step's end, a requeue, a requeued job
# The backend (slurm.requeue, .inalloc, .steps) gathers the facts (its records, SLURM_*, scontrol) and carries
# the decision out; the decision is made here, on typed facts only.
@dataclass(frozen=True)
class StepEnd:
    """What the batch side of a Slurm job saw as a step ended (requeue.finalize)."""
    failed: bool                    # a node recorded no exit, or an exit other than 0
    usr2: bool = False              # Slurm's SIGUSR2 stopped it (a preemption, the time limit's warning)
    in_allocation: bool = False     # the user's own allocation
    cancelled: bool = False         # launch cancel, or the launcher's own stop signal
    signals: tuple[str, ...] = ()   # the stop signals the nodes recorded
    in_job: bool = False            # the steps loop: another attempt may follow in this job


STEP_ENDS = ("requeue", "preempted", "recover", "record")


def step_end_decision(f: StepEnd) -> str:
    """requeue: a submitted job stopped by USR2 (requeue_decision: requeue or fail) | preempted: a step of the
    user's allocation stopped by Slurm's signal (recorded PREEMPTED, nothing requeued) | recover: a failed step of
    the steps loop (decide: restart, replace, shrink, grow or stop) | record: the attempt's outcome as every
    backend records it (RunDir.record_outcome)."""
    if f.usr2 and not f.in_allocation and f.failed:
        return "requeue"
    if f.in_allocation and not f.cancelled and f.failed and f.signals:
        return "preempted"
    if f.in_job and not f.cancelled and f.failed:
        return "recover"
    return "record"


@dataclass(frozen=True)
class Requeue:
    """After SIGUSR2 stopped a submitted job's attempt: what Slurm's requeues of the job allow."""
    restart: int                    # the job's requeues so far (SLURM_RESTART_COUNT)
    max_requeues: int               # --max-requeues


@dataclass(frozen=True)
class RequeueDecision:
    action: str                     # requeue | fail
    why: str                        # status.json's reason


def requeue_decision(f: Requeue) -> RequeueDecision:
    """`scontrol requeue` while --max-requeues allows, else FAILED."""
    if f.restart >= f.max_requeues:
        return RequeueDecision("fail", f"stopped by SIGUSR2 (preemption or time limit) after {f.restart} requeues; "
                               f"--max-requeues {f.max_requeues} is used up")
    return RequeueDecision("requeue", f"SIGUSR2 (preemption or time limit): requeued ({f.restart + 1} of "
                           f"{f.max_requeues})")


@dataclass(frozen=True)
class Requeued:
    """A run dir given again inside the user's allocation, as this job and its run dir say (slurm.inalloc)."""
    in_allocation: bool             # SLURM_JOB_ID is set
    job_id: str                     # this job's
    restart_count: int              # SLURM_RESTART_COUNT
    attempts: int = 0               # run.yaml's attempts (0: none, or not a run dir of the slurm backend)
    started_in_allocation: bool = False     # status.json's in_allocation
    started_by: str = ""            # status.json's slurm_job_id
    recorded_restart: int | None = None     # status.json's slurm_restart
    state: str | None = None        # status.json's state
    cancel_requested: bool = False  # launch cancel stopped it
    differs: str | None = None      # what the command line given again changes of the recorded spec (None: nothing)


@dataclass(frozen=True)
class ContinueDecision:
    action: str            # "continue" or "refuse"
    why: str               # continue: the new attempt's reason; refuse: why not (the user sees the usual line)
    attempt: int | None = None
    restart: int = 0
    line: str | None = None   # a refusal of its own (the spec differs); None: the usual "already exists" line
    rule: str = ""            # refuse: the rule that refused (a key of CONTINUE_RULES)


CONTINUE_RULES = ("allocation", "run dir", "job", "requeue", "restart", "completed", "cancelled", "differs")


def continue_decision(f: Requeued) -> ContinueDecision:
    """Continue the run dir's run after Slurm requeued this job, or refuse (the rules: launchers.backends.slurm.inalloc)."""
    refuse = zip(CONTINUE_RULES, [
        (not f.in_allocation, "not inside an allocation"),
        (not f.attempts, "not a run dir of the slurm backend"),
        (not f.started_in_allocation or f.started_by != f.job_id,
         f"started by another job ({f.started_by or 'not in an allocation'})"),
        (f.restart_count <= 0, "not a requeue (SLURM_RESTART_COUNT 0)"),
        (f.recorded_restart is not None and f.recorded_restart >= f.restart_count,
         f"started by this run of the job (restart {f.recorded_restart})"),
        (f.state == "COMPLETED", "the run is COMPLETED"),
        (f.cancel_requested, "stopped by launch cancel"),
        (f.differs is not None, f"the command line differs ({f.differs})")])
    rule, why = next(((r, w) for r, (bad, w) in refuse if bad), ("", ""))
    if rule:
        return ContinueDecision("refuse", why, rule=rule)
    return ContinueDecision("continue", f"requeued by Slurm (restart {f.restart_count})", attempt=f.attempts,
                            restart=f.restart_count)
