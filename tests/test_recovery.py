"""Recovery without a human (issue 23): the one policy (launchers.resilience.recovery) as a table,
the options, the node ledger and its `launch status` block from a hand-made run dir, the SSH plan's
hosts per pool, the recovery timeline (launchers.resilience.timeline) and its status lines from a
hand-made run dir, and one real run of a lemon node on local (and one on the SSH test hosts, marked
ssh): slot 1 crashes at the same step in every attempt, is quarantined after 2 strikes, a spare
takes its place and the run ends with the uninterrupted run's weights; each restart's timeline is
recorded, every phase in order. --nodes MIN:MAX: the policy's shrink and grow-back rows, the pool
and plan of a shrunk run (pure), and one real local run that shrinks from 2 nodes to 1 and
completes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCH, ROOT, once, read_json, require_cluster, run_launch
from launchers import api, layout, procs, warmfork
from launchers.errors import LaunchError
from launchers.ledgers import ledgerfile, nodeledger, siteledger
from launchers.records.rundir import RunDir
from launchers.resilience import recovery, recoveryopts, restarts, slurmpolicy, timeline
from launchers.resilience.recovery import Failure, Pool
from launchers.spec import RunSpec

P = Pool
sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))
from common import fault_row  # noqa: E402  (the fault suite's rows: RELIABILITY.md's recovery timelines)
from common import read_json as read_json_or_none  # noqa: E402  (None when missing or not whole yet)


@contextlib.contextmanager
def recovery_row(backend: str, fault: str, run_dir: str, user_sees: str, bitexact: bool = True):
    """The fault suite's row of a recovery test (`make reliability`), with its recovery timelines;
    bitexact: the body asserts the uninterrupted run's param_sha256 (a shrink: the loss within its
    bound instead)."""
    with fault_row(backend, fault, user_sees=user_sees) as row:
        try:
            yield row
        finally:
            st = read_json_or_none(Path(run_dir, "status.json")) or {}
            rec = st.get("recovery") or []
            ff = (read_json_or_none(Path(run_dir, "nodes.json")) or {}).get("decisions") or []
            row.update(
                exit_code=0 if st.get("state") == "COMPLETED" else 1,
                timeline=rec,
                first_failure="; ".join(d["why"] for d in ff) or None,
                recovery_s=max(
                    (e.get("detection_to_first_step_s") or 0 for e in rec), default=None
                ),
            )
        row["resume_equal"] = True if bitexact else None


# id: (failure: (slot, kind) or None, pool, strikes before, quarantine_after, restarts left)
#  -> (action, the next pool, what the why says)
POLICY = {
    "killed-worker-is-one-strike": (
        ((1, "rank"), P((0, 1), (2,)), {}, 2, 3),
        ("restart", P((0, 1), (2,)), "strike 1 of 2: restart on the same slots"),
    ),
    "lemon-second-strike-quarantined": (
        ((1, "rank"), P((0, 1), (2,)), {1: 1}, 2, 3),
        ("replace", P((0, 2), (), (1,)), "quarantined; replaced by spare slot 2"),
    ),
    "lemon-no-spare-stops": (
        ((1, "rank"), P((0, 1)), {1: 1}, 2, 3),
        ("stop", P((0, 1), (), (1,)), "quarantined, and no spare left"),
    ),
    "agent-died-replaced-benched": (
        ((1, "agent"), P((0, 1), (2,)), {}, 2, 3),
        ("replace", P((0, 2), (1,)), "its agent died, strike 1 of 2: replaced by spare"),
    ),
    "node0-lost-survivor-is-node0": (
        ((0, "lost"), P((0, 1), (2, 3)), {}, 2, 3),
        ("replace", P((1, 2), (3, 0)), "slot 0: lost"),
    ),
    "hang-replaced": (
        ((1, "hang"), P((0, 1), (2,)), {}, 2, 3),
        ("replace", P((0, 2), (1,)), "hung"),
    ),
    "lost-no-spare-restarts": (
        ((1, "lost"), P((0, 1)), {}, 2, 3),
        ("restart", P((0, 1)), "restart on the same slots (no spare left)"),
    ),
    "budget-spent-stops": (
        ((1, "rank"), P((0, 1), (2,)), {}, 2, 0),
        ("stop", P((0, 1), (2,)), "no restart left"),
    ),
    "replace-without-budget-stops": (
        ((1, "rank"), P((0, 1), (2,)), {1: 1}, 2, 0),
        ("stop", P((0, 2), (), (1,)), "no restart left"),
    ),
    "quarantine-after-1": (
        ((0, "rank"), P((0, 1), (2,)), {}, 1, 3),
        ("replace", P((1, 2), (), (0,)), "strike 1 of 1"),
    ),
    "quarantine-after-3-second-strike": (
        ((1, "rank"), P((0, 1), (2,)), {1: 1}, 3, 3),
        ("restart", P((0, 1), (2,)), "strike 2 of 3"),
    ),
    "benched-slot-back-then-quarantined": (
        ((1, "agent"), P((0, 1), (2,)), {1: 1}, 2, 3),
        ("replace", P((0, 2), (), (1,)), "quarantined"),
    ),
    "no-node-named": (
        (None, P((0, 1), (2,)), {}, 2, 3),
        ("restart", P((0, 1), (2,)), "no node named"),
    ),
    "gpu-check-failed-quarantined-at-once": (
        ((1, "gpu"), P((0, 1), (2,)), {}, 2, 3),
        (
            "replace",
            P((0, 2), (), (1,)),
            "failed the GPU check, strike 1 of 2: quarantined; replaced by spare slot 2",
        ),
    ),
    # --nodes MIN:MAX (the 6th item: (MIN, MAX)): shrink to the survivors, never below MIN; grow
    # back to MAX
    "range-lemon-no-spare-shrinks": (
        ((1, "rank"), P((0, 1)), {1: 1}, 2, 3, (1, 2)),
        ("shrink", P((0,), (), (1,)), "quarantined, and no spare left: shrink to 1 node"),
    ),
    "range-node0-lost-shrinks-survivor-is-node0": (
        ((0, "lost"), P((0, 1, 2)), {}, 2, 3, (2, 3)),
        ("shrink", P((1, 2), (0,)), "no spare left: shrink to 2 nodes"),
    ),
    "range-spare-first-then-shrink-never": (
        ((1, "hang"), P((0, 1), (2,)), {}, 2, 3, (1, 2)),
        ("replace", P((0, 2), (1,)), "replaced by spare slot 2"),
    ),
    "range-at-min-quarantine-stops": (
        ((1, "rank"), P((0, 1)), {1: 1}, 2, 3, (2, 3)),
        ("stop", P((0, 1), (), (1,)), "quarantined, and no spare left"),
    ),
    "range-at-min-lost-restarts": (
        ((1, "lost"), P((0, 1)), {}, 2, 3, (2, 3)),
        ("restart", P((0, 1)), "restart on the same slots (no spare left)"),
    ),
    "range-grows-back-at-a-restart": (
        ((0, "rank"), P((0,), (1,)), {}, 2, 3, (1, 2)),
        ("grow", P((0, 1)), "restart on the same slots; slot 1 back: 2 nodes"),
    ),
    "range-grows-back-no-node-named": (
        (None, P((0,), (1, 3)), {}, 2, 3, (1, 3)),
        ("grow", P((0, 1, 3)), "slots 1, 3 back: 3 nodes"),
    ),
    "range-quarantined-never-back": (
        ((0, "rank"), P((0,), (), (1,)), {}, 2, 3, (1, 2)),
        ("restart", P((0,), (), (1,)), "restart on the same slots"),
    ),
    "range-replace-then-grow-benched-stays-out": (
        ((0, "lost"), P((0,), (1, 2)), {}, 2, 3, (1, 3)),
        ("replace", P((1, 2), (0,)), "replaced by spare slot 1; slot 2 back"),
    ),
    "range-shrink-without-budget-stops": (
        ((1, "lost"), P((0, 1)), {}, 2, 0, (1, 2)),
        ("stop", P((0,), (1,)), "shrink to 1 node (--nodes 1:2); but no restart"),
    ),
}


@pytest.mark.parametrize("case", POLICY, ids=list(POLICY))
def test_policy_table(case):
    (fail, pool, strikes, after, left, *bounds), (action, nxt, why) = POLICY[case]
    d = recovery.failure_decision(
        Failure(*fail) if fail else None, pool, strikes, after, left, *bounds
    )
    assert (d.action, d.pool) == (action, nxt) and why in d.why, d
    if fail:
        # the failing slot, one strike more
        assert d.strikes[fail[0]] == strikes.get(fail[0], 0) + 1
        assert (fail[0] in d.quarantined) == (
            strikes.get(fail[0], 0) + 1 >= after or fail[1] in recovery.AT_ONCE
        )
    assert "\n" not in d.why


# --preflight gpu with --spares: (pool, bad slots, MIN) -> (action, the pool the run starts on)
PREFLIGHT = {
    "all-good": ((P((0, 1), (2,)), (), 0), ("start", P((0, 1), (2,)))),
    "bad-active-node": ((P((0, 1), (2,)), (1,), 0), ("replace", P((0, 2), (), (1,)))),
    "bad-node-0": ((P((0, 1), (2,)), (0,), 0), ("replace", P((1, 2), (), (0,)))),
    "bad-spare": ((P((0, 1), (2, 3)), (2,), 0), ("start", P((0, 1), (3,), (2,)))),
    "too-many-bad": ((P((0, 1), (2,)), (0, 2), 0), ("stop", P((0, 1), (2,), (0, 2)))),
    "resumed-pool-keeps-its-order": (
        (P((2, 0), (3,), (1,)), (2,), 0),
        ("replace", P((0, 3), (), (1, 2))),
    ),
    "range-shrinks-to-min": ((P((0, 1), (2,)), (0, 2), 1), ("shrink", P((1,), (), (0, 2)))),
    "range-below-min-stops": (
        (P((0, 1), (2,)), (0, 1, 2), 1),
        ("stop", P((0, 1), (2,), (0, 1, 2))),
    ),
}


@pytest.mark.parametrize("case", PREFLIGHT, ids=list(PREFLIGHT))
def test_preflight_policy_table(case):
    """recovery.preflight_start: every bad slot quarantined at once (one strike, kind gpu); the good
    slots in the pool's order make the nodes (node 0 the first good one), then the spares; too few:
    stop."""
    (pool, bad, low), (action, start) = PREFLIGHT[case]
    d = recovery.preflight_start(
        pool,
        {s: f"slot {s} [h]: mlx5_0 port 1: State Down" for s in bad},
        (low, 2) if low else None,
    )
    assert (d.action, d.pool) == (action, start), d
    assert d.quarantined == bad and d.strikes == {s: 1 for s in bad} and "\n" not in d.why
    if action == "stop":
        assert d.why == f"{3 - len(bad)} good slot(s) of 3, " + (
            f"--nodes {low}:2 needs {low}" if low else "--nodes 2 needs 2"
        ), d.why
    else:
        assert all(f"slot {s}: failed the GPU check" in d.why for s in bad), d.why


def test_preflight_ledger_and_status_block(tmp_path):
    """The preflight's decision as the launcher records it before attempt 0: slot 0 quarantined with
    its line, the pool the run starts on, the decision taken by the policy (person: no); not a
    restart in the timeline; a later failure's decisions go on from its pool."""
    spec = RunSpec(
        backend="local",
        nodes=2,
        gpus_per_node=1,
        program=("x.py",),
        program_args=(),
        run_dir=str(tmp_path / "run"),
        name="x",
        spares=1,
        max_restarts=2,
    )
    rd = RunDir.create(spec, "x-1", {"hosts": []})
    line = "slot 0 [h]: mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand)"
    d = recovery.preflight_start(nodeledger.pool_for(None, 2, 1), {0: line})
    led = nodeledger.preflight(rd.path, None, 0, d, {0: line}, 2, 1.0e9)
    assert nodeledger.read(rd.path) == json.loads(json.dumps(led))
    assert led["slots"]["0"]["quarantined"] and led["slots"]["0"]["strikes"] == 1
    assert led["slots"]["0"]["attempts"] == [
        {
            "attempt": 0,
            "preflight": True,
            "exit": None,
            "kind": "gpu",
            "failure": f"--preflight gpu: {line}",
            "strike": True,
        }
    ]
    assert nodeledger.pool_for(led, 2, 1) == Pool((1, 2), (), (0,))
    assert timeline.restarts(rd.path) == []
    block = api.format_status(api.status(rd.path))
    block = block[block.index("nodes:") :].splitlines()[:3]
    assert block == [
        "nodes:      slots active 1, 2; spares none; quarantined 0 (at 2 strikes)",
        f"            slot 0: 1 strike, quarantined (attempt 0: --preflight gpu: {line})",
        "            before attempt 0 (--preflight gpu; person: no): replace -- slot 0: failed "
        "the GPU check: quarantined; the run starts on slots 1, 2",
    ]


def produced_failures() -> list[tuple[dict, str]]:
    """First failures as each place that observes one makes it, with the kind the policy must see:
    the pure producers called (firstfail over rank records and node failures, hang.verdict,
    slurm.requeue.lost_node), the node failures as the backends' watch loops build them (local: a
    paused agent; SSH: silence, a lost connection, a node that never finished, an agent's exit;
    Slurm: the node task's record of a failed GPU check, typed by errors.NodeFault)."""
    from launchers.backends.slurm.requeue import lost_node
    from launchers.diagnosis import firstfail
    from launchers.hang.verdict import hang_failure

    hang = {
        "attempt": 0,
        "stalled_ranks": [1],
        "since": 5.0,
        "ranks": {"1": {"node": 1, "class": "stalled", "why": "process stopped (state T)"}},
    }

    def node(**kw):
        return firstfail.first_failure([], [dict({"node": 1, "time": 2.0}, **kw)])

    return [
        (firstfail.first_failure([{"rank": 1, "node": 1, "exit_code": 1, "time": 1.0}]), "rank"),
        (
            firstfail.first_failure(
                [
                    {
                        "rank": 1,
                        "node": 1,
                        "signal": "SIGKILL",
                        "reason": "out of memory",
                        "time": 1.0,
                    }
                ]
            ),
            "rank",
        ),
        (
            firstfail.first_failure(
                [
                    {
                        "rank": 1,
                        "node": 1,
                        "exit_code": 1,
                        "time": 1.0,
                        "kind": "gpus",
                        "reason": "node 1 has 0 of the 2 GPUs its ranks need",
                    }
                ]
            ),
            "gpus",
        ),
        (hang_failure(hang), "hang"),
        (lost_node([1], {1: {"host": "lnode2"}}), "lost"),
        (node(reason="lost: paused for 12 s (its agent is stopped: SIGSTOP)", kind="lost"), "lost"),
        (node(reason="lost: silent for 30 s (network cut or host hung)", kind="lost"), "lost"),
        (node(reason="connection lost (host h2: reset)", kind="lost"), "lost"),
        (node(reason="did not finish", kind="lost"), "lost"),
        (node(signal="SIGKILL"), "agent"),
        (node(exit_code=1, reason="node exited 1", kind="agent"), "agent"),
        (
            node(
                exit_code=1,
                reason="--preflight gpu: 1 bad node(s) of 2, nothing started: node 1 [h]: x",
                kind="gpu",
            ),
            "gpu",
        ),
    ]


def test_first_failure_kinds_and_slots():
    assert [recovery.kind_of(ff) for ff, _ in produced_failures()] == [
        k for _, k in produced_failures()
    ]
    pool = Pool((1, 2), (0,))
    # slot 1, no end
    assert recovery.failure_of({"rank": 3, "node": 0}, pool, "x") == Failure(1, "rank", "x", "")
    assert (
        recovery.failure_of({"rank": 3, "node": 1, "exit_code": 1, "exception": "E: 7"}, pool).sign
        == "exit 1"
    )
    assert (
        recovery.failure_of({"rank": 3, "node": 1, "signal": "SIGSEGV"}, pool).sign
        == "signal SIGSEGV"
    )
    assert recovery.failure_of({"rank": None, "node": 2}, pool) is None  # not a node of the attempt
    assert recovery.failure_of(None, pool) is None


def test_decisions_never_read_a_reasons_words():
    """Issue 34: every reason and exception reworded (reversed, another failure's words swapped in),
    the kind, the decision, the quarantine and the next pool stay the same."""
    pool = Pool((0, 1), (2,))
    words = [
        "hang: x",
        "lost: y",
        "connection lost",
        "did not finish",
        "--preflight gpu: z",
        "out of memory",
        "",
    ]
    for ff, kind in produced_failures():
        # the attempt before: another slot, same sign
        past = (recovery.Past(4, 0, recovery.sign_of(ff), True),)
        before = recovery.failure_decision(
            recovery.failure_of(ff, pool, "w"), pool, {1: 1}, 2, 3, past=past
        )
        for i, text in enumerate(words + [str(ff.get("reason"))[::-1]]):
            reworded = dict(ff, **{k: text for k in ("reason", "exception") if k in ff})
            assert recovery.kind_of(reworded) == kind, (ff, text)
            after = recovery.failure_decision(
                recovery.failure_of(reworded, pool, "w"), pool, {1: 1}, 2, 3, past=past
            )
            assert (after.action, after.pool, after.quarantined, after.strikes) == (
                before.action,
                before.pool,
                before.quarantined,
                before.strikes,
            ), (ff, text)


STEP_ENDS = [  # (facts, the decision)
    (dict(failed=True, usr2=True), "requeue"),  # a submitted job's USR2
    (dict(failed=False, usr2=True), "record"),  # ... after every node ended 0
    # never requeued
    (dict(failed=True, usr2=True, in_allocation=True, signals=("SIGUSR2",)), "preempted"),
    (dict(failed=True, in_allocation=True, signals=("SIGTERM",)), "preempted"),
    # launch's own stop
    (dict(failed=True, in_allocation=True, cancelled=True, signals=("SIGTERM",)), "record"),
    (dict(failed=True, in_job=True), "recover"),  # the steps loop: the policy decides
    (dict(failed=True, in_job=True, cancelled=True), "record"),  # launch cancel: no restart
    (dict(failed=False, in_job=True), "record"),
    (dict(failed=True), "record"),
]
MINE = dict(
    in_allocation=True,
    job_id="7",
    restart_count=1,
    attempts=2,
    started_in_allocation=True,
    started_by="7",
    recorded_restart=0,
    state="PREEMPTED",
)
CONTINUES = [  # (facts changed from MINE, the rule that refuses; "": continue)
    ({}, ""),
    (dict(recorded_restart=None, state="CANCELLED"), ""),
    (dict(in_allocation=False), "allocation"),
    (dict(attempts=0), "run dir"),
    (dict(started_by="8"), "job"),
    (dict(started_in_allocation=False), "job"),
    (dict(restart_count=0), "requeue"),
    (dict(recorded_restart=1), "restart"),
    (dict(state="COMPLETED"), "completed"),
    (dict(cancel_requested=True), "cancelled"),
    (dict(differs="--nodes: recorded 2, given 1"), "differs"),
    (dict(restart_count=0, differs="x"), "requeue"),
]  # the first rule that refuses says why


def test_requeue_continue_and_step_end_decisions_from_facts():
    """Issue 34: Slurm's decisions are the policy's (launchers.resilience.slurmpolicy), each from
    the typed facts the backend gathers: a step's end, requeue or fail, continue a requeued job's
    run dir or refuse."""
    assert [slurmpolicy.step_end_decision(slurmpolicy.StepEnd(**f)) for f, _ in STEP_ENDS] == [
        d for _, d in STEP_ENDS
    ]
    assert slurmpolicy.requeue_decision(slurmpolicy.Requeue(0, 2)) == slurmpolicy.RequeueDecision(
        "requeue", "SIGUSR2 (preemption or time limit): requeued (1 of 2)"
    )
    assert slurmpolicy.requeue_decision(slurmpolicy.Requeue(2, 2)) == slurmpolicy.RequeueDecision(
        "fail",
        "stopped by SIGUSR2 (preemption or time limit) after 2 requeues; --max-requeues 2 is "
        "used up",
    )
    # --max-requeues 0
    assert slurmpolicy.requeue_decision(slurmpolicy.Requeue(0, 0)).action == "fail"
    for change, rule in CONTINUES:
        d = slurmpolicy.continue_decision(slurmpolicy.Requeued(**dict(MINE, **change)))
        assert (d.action, d.rule) == ("refuse" if rule else "continue", rule), change
        assert (d.attempt, d.restart, d.why) == (
            (2, 1, "requeued by Slurm (restart 1)") if not rule else (None, 0, d.why)
        ), change


def test_requeued_job_decisions_never_read_words(tmp_path):
    """Issue 34: every text a Slurm decision's facts come with reworded -- status.json's reason, the
    difference the command line makes, the nodes' errors -- and the decisions stay the same (pure;
    the facts as launchers.backends.slurm.inalloc gathers them)."""
    from launchers.backends.slurm import inalloc
    from launchers.backends.slurm.env import SlurmEnv

    env = SlurmEnv.read({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1", "SLURM_NNODES": "2"})
    data = {"attempts": [{}, {}], "spec": {"backend": "slurm", "program": "/w/t.py", "nodes": 2}}
    for st in (
        {"in_allocation": True, "slurm_job_id": "7", "slurm_restart": 0, "state": "PREEMPTED"},
        {"in_allocation": True, "slurm_job_id": "7", "slurm_restart": 1, "state": "FAILED"},
    ):
        before = slurmpolicy.continue_decision(inalloc.requeued_facts(env, st, data))
        for words in (
            "requeued by Slurm (restart 9)",
            "the run is COMPLETED",
            "stopped by launch cancel",
            "",
        ):
            after = slurmpolicy.continue_decision(
                inalloc.requeued_facts(env, dict(st, reason=words), data)
            )
            assert (after.action, after.rule, after.attempt) == (
                before.action,
                before.rule,
                before.attempt,
            )
            differs = slurmpolicy.continue_decision(
                inalloc.requeued_facts(env, st, data, words[::-1] or "x")
            )
            assert (differs.action, differs.rule) == ("refuse", before.rule or "differs")
    for f, d in STEP_ENDS:
        # which signal: not read
        assert (
            slurmpolicy.step_end_decision(
                slurmpolicy.StepEnd(
                    **dict(f, signals=tuple("SIGKILL" for _ in f.get("signals", ())))
                )
            )
            == d
        )


def failing(tmp_path, ffs, nodes=2, spares=2, left=4, after=2):
    """The policy and the node ledger over attempts that each fail with ffs(attempt, pool) (a first
    failure; node k ran on pool.active[k]), as restarts.restart_decision runs them, until a stop or
    the ffs run out -> (each decision's (action, its attempt's active slots, quarantined after it,
    why), the ledger)."""
    led, pool, seen = None, nodeledger.pool_for(None, nodes, spares), []
    for attempt in range(left + 1):
        ff = ffs(attempt, pool)
        fail = recovery.failure_of(
            ff, pool, f"rank {ff['rank']} on node {ff['node']}: attempt {attempt}"
        )
        d = recovery.failure_decision(
            fail, pool, nodeledger.strikes(led), after, left - attempt, None, nodeledger.past(led)
        )
        led = nodeledger.record(
            str(tmp_path), led, attempt, pool, fail, {"0": 143, "1": 1}, d, after
        )
        seen.append((d.action, pool.active, d.pool.quarantined, d.why))
        pool = d.pool
        if d.action == "stop":
            break
    return seen, led


# a bug of the program on rank 1 (node 1): other words each attempt
def rank1_raises(attempt, pool):
    return {
        "rank": 1,
        "node": 1,
        "exit_code": 1,
        "exception": ["ValueError: bad", "KeyError: 'lr'"][attempt % 2],
    }


def test_a_failure_on_every_node_is_the_programs_and_stops_after_the_budget(tmp_path):
    """Issue 37 item 5: the same rank failure (typed: its exit code or signal, never its words) in
    consecutive attempts on a second slot is the program's: no strike, the slot it alone quarantined
    back among the spares, restarts while the budget lasts, then one line that says so -- not every
    spare quarantined in turn; no host's strike in the site's ledger. Another failure on a slot
    stays a node's."""
    seen, led = failing(tmp_path, rank1_raises)
    assert [s[:3] for s in seen] == [
        ("restart", (0, 1), ()),
        ("replace", (0, 1), (1,)),
        ("restart", (0, 2), ()),
        ("restart", (0, 2), ()),
        ("stop", (0, 2), ()),
    ]
    bug = (
        "looks like a bug in the program: the same failure (exit 1) in {} attempts in a row, on "
        "slots 1, 2: it follows the ranks, not a node; no strike"
    )
    assert seen[2][3] == bug.format(3) + "; slot 1 out of quarantine"
    assert seen[4][3] == bug.format(5) + "; but no restart left (--max-restarts)"
    assert nodeledger.strikes(led) == {0: 0, 1: 0, 2: 0} and led["pool"]["spares"] == [3, 1], led
    assert nodeledger.program_signs(led) == {"exit 1"} and nodeledger.lines(led) == [], led
    attempts = [{"hosts": ["h1", "h2" if a < 2 else "h3"]} for a in range(5)]
    assert siteledger.run_strikes(led, attempts, "bug-1", "bob", time.time()) == {}
    other = recovery.Failure(2, "rank", "x", "exit 3")  # another exit code: the node's strike
    d = recovery.failure_decision(
        other, Pool((0, 2), (3, 1)), {2: 1}, 2, 3, None, nodeledger.past(led)
    )
    assert (d.action, d.quarantined, d.pool.active) == ("replace", (2,), (0, 3)), d


def test_without_a_spare_the_nodes_rotate_to_tell_a_bug_from_a_lemon(tmp_path):
    """The gap a fixed rank's bug left with no spare: it failed on the same node every attempt and
    struck it until quarantined. Now a rank's failure with no spare restarts on the nodes rotated: a
    bug of rank 1 then fails on slot 0 -- it follows the rank: the program's, slot 1's strike
    lifted, nothing quarantined; a lemon slot 1 fails again as node 0 -- it stays on the slot:
    quarantined at its second strike, as before."""
    seen, led = failing(tmp_path, rank1_raises, spares=0, left=3)
    assert [s[:3] for s in seen] == [
        ("restart", (0, 1), ()),
        ("restart", (1, 0), ()),
        ("restart", (1, 0), ()),
        ("stop", (1, 0), ()),
    ]
    assert "strike 1 of 2: no spare: restart with the nodes rotated" in seen[0][3]
    assert seen[3][3].startswith(
        "looks like a bug in the program: the same failure (exit 1) in 4 attempts in a "
        "row, on slots 0, 1"
    ), seen
    assert seen[3][3].endswith("; no strike; but no restart left (--max-restarts)"), seen
    assert nodeledger.strikes(led) == {0: 0, 1: 0} and not led["pool"]["quarantined"], led

    def lemon(attempt, pool):  # slot 1 fails whichever node (and rank) it runs
        return {"rank": pool.active.index(1), "node": pool.active.index(1), "exit_code": 1}

    (tmp_path / "lemon").mkdir()
    seen, led = failing(tmp_path / "lemon", lemon, spares=0, left=3)
    assert [s[:3] for s in seen] == [("restart", (0, 1), ()), ("stop", (1, 0), (1,))], seen
    assert seen[1][3] == "slot 1: a rank failed, strike 2 of 2: quarantined, and no spare left", (
        seen
    )


def test_only_consecutive_attempts_make_a_repeat():
    """The program's only when the same failure came in the attempts right before: one on another
    slot with another failure in between, or with an attempt missing, is a strike as before."""
    P_ = recovery.Past
    fail, pool = Failure(1, "rank", "x", "exit 1"), Pool((0, 1), (2,))
    # another failure in between
    for past in [
        (P_(0, 0, "exit 1", True), P_(1, 0, "signal SIGKILL", True)),
        # attempt 1 missing: only slot 1's
        (P_(0, 0, "exit 1", True), P_(2, 1, "exit 1", True)),
        (P_(0, 0, "", True),),
    ]:  # no sign (a lost node)
        assert recovery.failure_decision(fail, pool, {}, 2, 3, past=past).strikes[1] == 1, past
    d = recovery.failure_decision(
        fail, pool, {}, 2, 3, past=(P_(0, 1, "exit 1", True), P_(1, 0, "exit 1", True))
    )
    assert (d.action, d.strikes, d.program) == ("restart", {1: 0, 0: 0}, (0, 1)), d


def test_the_hourly_budget_stops_a_restart_storm():
    """--max-restarts-per-hour N: the restarts the ledger decided in the last 3600 s (stops and the
    preflight's not counted) -- N of them: the next decision is a stop, its why naming the budget
    after what it would have done; 0: no hourly limit. The option is read with the others
    (recoveryopts.options)."""
    now = 10_000.0
    led = {
        "decisions": [
            {"action": "restart", "decided": now - 4000},
            {"action": "replace", "decided": now - 3000},
            {"action": "stop", "decided": now - 20},
            {"action": "replace", "preflight": True, "decided": now - 10},
            {"action": "restart", "decided": now - 5},
            {"action": "shrink"},
        ]
    }
    assert (
        nodeledger.restarts_within(led, now) == 2
        and nodeledger.restarts_within(led, now, 5000) == 3
    )
    fail, pool = Failure(1, "rank", "x", "exit 1"), Pool((0, 1), (2,))
    assert recovery.failure_decision(fail, pool, {}, 2, 9, hour=(1, 2)).action == "restart"
    # 0: no hourly limit
    assert recovery.failure_decision(fail, pool, {}, 2, 9, hour=(7, 0)).action == "restart"
    d = recovery.failure_decision(fail, pool, {1: 1}, 2, 9, hour=(2, 2))
    assert (d.action, d.quarantined) == ("stop", (1,)) and d.why == (
        "slot 1: a rank failed, strike 2 of 2: quarantined; replaced by spare slot 2; but 2 "
        "restarts in the last hour (--max-restarts-per-hour 2)"
    ), d

    def said(k):
        return "--" + k.replace("_", "-")

    assert (
        recoveryopts.options("local", {"max_restarts_per_hour": "3"}.get, said)[
            "max_restarts_per_hour"
        ]
        == 3
    )
    with pytest.raises(LaunchError, match="--max-restarts-per-hour '-1' is out of range"):
        recoveryopts.options("local", {"max_restarts_per_hour": "-1"}.get, said)


def test_restarts_from_the_same_checkpoint_back_off(tmp_path):
    """Issue 37 item 5: a run that makes progress never waits; the third restart in a row from one
    checkpoint waits 1 s, then 2, 4 ... up to 30 s; a new checkpoint starts the count again."""
    decisions, waits = [{"attempt": 0, "preflight": True, "action": "replace"}], []
    for point in [
        "scratch",
        "step-2",
        "step-2",
        "step-2",
        "step-2",
        "step-2",
        *["step-2"] * 6,
        "step-4",
    ]:
        decisions.append({"attempt": len(waits), "action": "restart", "from": point})
        waits.append(restarts.backoff_s(decisions))
    assert waits == [0, 0, 0, 1, 2, 4, 8, 16, 30, 30, 30, 30, 0], waits
    assert (
        restarts.backoff_said(0) == ""
        and restarts.backoff_said(2.0) == "; in 2 s (backoff: the same checkpoint again)"
    )


def test_decide_returns_what_it_recorded(tmp_path):
    """restarts.restart_decision resolves the resume point once and hands back the decision, that
    point (the ledger's `from`) and the ledger's decisions as written: the restart line and
    backoff_s use them, nodes.json is not read back."""
    spec = RunSpec(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=("x.py",),
        program_args=(),
        run_dir=str(tmp_path / "run"),
        name="x",
        max_restarts=2,
    )
    rd = RunDir.create(spec, "x-1", {"hosts": []})
    ff = {"rank": 0, "node": 0, "exit_code": 1, "time": 5.0}
    done = [restarts.restart_decision(spec, rd, k, ff, 2 - k, 6.0, {"0": 1}) for k in range(2)]
    assert [(d.decision.action, d.resume) for d in done] == [
        ("restart", "scratch"),
        ("stop", "scratch"),
    ], done
    assert (
        done[-1].decisions == tuple(nodeledger.read(rd.path)["decisions"])
        and len(done[-1].decisions) == 2
    )
    assert [d["from"] for d in done[-1].decisions] == ["scratch", "scratch"]


def opts(spares=0, after=2, restarts=0, nodes=1, low=0, high=0):
    return {
        "nodes": nodes,
        "min_nodes": low,
        "max_nodes": high,
        "spares": spares,
        "quarantine_after": after,
        "max_restarts": restarts,
        "max_restarts_per_hour": 0,
    }


OPTIONS = [
    ("local", {}, opts()),
    ("local", {"spares": "2"}, opts(2, restarts=3)),
    ("local", {"spares": "1", "max_restarts": "5", "quarantine_after": "3"}, opts(1, 3, 5)),
    ("local", {"spares": "1", "max_restarts": "0"}, opts(1)),
    ("ssh", {"spares": "0", "max_restarts": "2"}, opts(restarts=2)),
    ("local", {"spares": "-1"}, "--spares '-1' is out of range; give an integer 0-65536"),
    ("local", {"quarantine_after": "0"}, "--quarantine-after '0' is out of range"),
    ("ssh", {"spares": "1"}, opts(1, restarts=2)),
    ("slurm", {"spares": "2"}, opts(2, restarts=3)),  # in the allocation
    # MIN:MAX: starts on MAX
    ("local", {"nodes": "1:2"}, opts(restarts=2, nodes=2, low=1, high=2)),
    ("ssh", {"nodes": "2:4", "spares": "1"}, opts(1, restarts=4, nodes=4, low=2, high=4)),
    ("local", {"nodes": "2:2"}, opts(nodes=2)),  # no range: fixed
    ("local", {"nodes": 3}, opts(nodes=3)),  # the API: an int
    ("local", {"nodes": "1:3", "max_restarts": "1"}, opts(restarts=1, nodes=3, low=1, high=3)),
    ("local", {"nodes": "3:2"}, "--nodes '3:2' is not accepted: MIN 3 is more than MAX 2"),
    ("local", {"nodes": "1:x"}, "--nodes '1:x' is not accepted; give N or MIN:MAX"),
    # the loop over steps
    ("slurm", {"nodes": "1:2"}, opts(restarts=2, nodes=2, low=1, high=2)),
]


@pytest.mark.parametrize("backend,given,expected", OPTIONS)
def test_options(backend, given, expected):
    def pick(key, default=None):
        return given.get(key, default)

    def said(key):
        return "--" + key.replace("_", "-")

    if isinstance(expected, str):
        with pytest.raises(LaunchError) as e:
            recoveryopts.options(backend, pick, said)
        assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    else:
        assert recoveryopts.options(backend, pick, said) == expected


def test_ledger_and_status_block(tmp_path):
    """Two failed attempts of a lemon (slot 1) as the launcher records them; `launch status` shows
    the block."""
    spec = RunSpec(
        backend="local",
        nodes=2,
        gpus_per_node=1,
        program=("x.py",),
        program_args=(),
        run_dir=str(tmp_path / "run"),
        name="x",
        spares=1,
        max_restarts=2,
    )
    rd = RunDir.create(spec, "x-1", {"hosts": []})
    assert nodeledger.read(rd.path) is None and "slots active" not in api.format_status(
        api.status(rd.path)
    )
    led, pool = None, nodeledger.pool_for(None, 2, 1)
    assert pool == Pool((0, 1), (2,))
    for attempt in (0, 1):
        ff = {"rank": 1, "node": 1, "exit_code": 1, "signal": None}
        fail = recovery.failure_of(ff, pool, "rank 1 on node 1, exit code 1")
        d = recovery.failure_decision(fail, pool, nodeledger.strikes(led), 2, 2 - attempt)
        led = nodeledger.record(rd.path, led, attempt, pool, fail, {"0": 143, "1": 1}, d, 2)
        assert nodeledger.read(rd.path) == json.loads(json.dumps(led))
        pool = nodeledger.pool_for(nodeledger.read(rd.path), 2, 1)
        led = nodeledger.read(rd.path)
    assert pool == Pool((0, 2), (), (1,)) and nodeledger.strikes(led) == {0: 0, 1: 2}
    assert led["slots"]["1"]["quarantined"] and not led["slots"]["0"]["quarantined"]
    assert [a["failure"] for a in led["slots"]["0"]["attempts"]] == ["stopped with the run"] * 2
    # a resume on fewer nodes: still out
    assert nodeledger.pool_for(led, 1, 1) == Pool((0,), (2,), (1,))
    text = api.format_status(api.status(rd.path))
    block = text[text.index("nodes:") :].splitlines()[:4]
    assert block == [
        "nodes:      slots active 0, 2; spares none; quarantined 1 (at 2 strikes)",
        "            slot 1: 2 strikes, quarantined (attempt 0: rank 1 on node 1, exit code 1; "
        "attempt 1: rank 1 on node 1, exit code 1)",
        "            attempt 0: restart -- slot 1: a rank failed, strike 1 of 2: restart on the "
        "same slots",
        "            attempt 1: replace -- slot 1: a rank failed, strike 2 of 2: quarantined; "
        "replaced by spare slot 2",
    ]


PROGRAM = [
    "-m",
    "workloads.convnet",
    "--dataset",
    "digits",
    "--seed",
    "7",
    "--batch-size",
    "8",
    "--no-tensorboard",
    "--max-steps",
    "8",
    "--checkpoint-every",
    "2",
]
# the shrink's program: long enough to learn (the loss falls from 2.3 to 0.5), checkpoints at 12 and
# 24
SHRINK = [
    "-m",
    "workloads.convnet",
    "--dataset",
    "digits",
    "--seed",
    "7",
    "--batch-size",
    "16",
    "--no-tensorboard",
    "--max-steps",
    "36",
    "--checkpoint-every",
    "12",
    "--log-every",
    "4",
]


@pytest.fixture(scope="module")
def reference_sha(request):
    """The uninterrupted run of world size 2 (local, 1 node x 2): the param_sha256 every recovered
    run must end with (made once per make test run: the local, SSH and Slurm rows on several workers
    share it)."""

    def make(d):
        ref = run_launch(
            "local",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--run-dir",
            "runs/ref",
            "--",
            *PROGRAM,
            cwd=d,
        )
        assert ref.returncode == 0, ref.stderr[-3000:]
        return read_json(Path(d, "runs/ref/final.json"))["param_sha256"]

    return once(request, "recovery-ref", make)


@pytest.fixture(scope="module")
def shrink_reference(request) -> Path:
    """The uninterrupted 2-node run of SHRINK (local, 2 nodes x 1): its run dir (made once per make
    test run)."""

    def make(d):
        ref = run_launch(
            "local",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--run-dir",
            "runs/ref",
            "--",
            *SHRINK,
            cwd=d,
        )
        assert ref.returncode == 0, ref.stderr[-3000:]
        return str(Path(d, "runs/ref"))

    return Path(once(request, "recovery-shrink-ref", make))


def losses(run_dir, attempt=None) -> dict[int, float]:
    """metrics.jsonl's training loss per logged step (of one attempt, or the last one logging
    it)."""
    rows = [
        json.loads(ln)
        for ln in Path(run_dir, "metrics.jsonl").read_text().splitlines()
        if ln.strip()
    ]
    return {
        r["step"]: r["loss"]
        for r in rows
        if r.get("kind") != "eval" and attempt in (None, r["attempt"])
    }


def gone(run_id: str, within: float = 10) -> list[int]:
    """The run's processes still alive after up to `within` s (exits take a moment to be reaped)."""
    deadline = time.monotonic() + within
    while (left := procs.tagged_pids(run_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def no_zygote_left(run_id: str, slots: int) -> None:
    """--warm-spares: no zygote of the run's slots still runs (the root namespace sees the SSH
    hosts' processes too) and no socket of theirs is left (tagged_pids does not see them: a zygote
    carries no run tag)."""
    socks = [warmfork.socket_path(run_id, s) for s in range(slots)]
    deadline = time.monotonic() + 10
    while (
        left := [
            q
            for q in map(int, filter(str.isdigit, os.listdir("/proc")))
            if any(procs.cmdline_has(q, s.encode()) for s in socks)
        ]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left and not any(map(os.path.exists, socks)), (left, socks)


def check_lemon(run_dir: str, reference_sha: str) -> dict:
    """A lemon run's outcome on any backend: COMPLETED in attempt 2; slot 1 quarantined after 2
    strikes (restart, then replace); its rank crashed in attempts 0 and 1 only (attempt 2's node 1
    is the spare); no process of the run left; the uninterrupted run's weights. Returns run.yaml."""
    run = yaml.safe_load(Path(run_dir, "run.yaml").read_text())
    st = read_json(Path(run_dir, "status.json"))
    assert st["state"] == "COMPLETED" and st["attempt"] == 2
    led = read_json(Path(run_dir, "nodes.json"))
    assert led["pool"] == {"active": [0, 2], "spares": [], "quarantined": [1]}
    assert (led["slots"]["1"]["strikes"], led["slots"]["1"]["quarantined"]) == (2, True)
    assert [d["action"] for d in led["decisions"]] == ["restart", "replace"]
    assert (
        Path(run_dir, "logs/node1/rank1.log").read_text().count("fault injection: rank 1 exits")
        == 2
    )
    rec = st["recovery"]  # the timeline, as the launcher recorded it (figures not asserted)
    assert [(e["attempt"], e["decision"], e["person"]) for e in rec] == [
        (1, "restart", "no"),
        (2, "replace", "no"),
    ]
    for e in rec:  # every phase present, in order; detection to first step recorded
        times = [p["time"] for p in e["phases"]]
        assert [p["name"] for p in e["phases"]] == [name for _, name in timeline.PHASES]
        assert None not in times and times == sorted(times), e
        assert e["detection_to_first_step_s"] is not None, e
    assert gone(run["run_id"]) == []
    fin = read_json(Path(run_dir, "final.json"))
    assert (fin["step"], fin["world_size"], fin["param_sha256"]) == (8, 2, reference_sha)
    return run


@pytest.mark.slow
def test_lemon_node_is_quarantined_and_a_spare_finishes_bit_exact(workdir, reference_sha):
    """Slot 1's rank crashes at step 5 in every attempt: attempt 0 fails (strike 1: restart on the
    same slots), attempt 1 fails (strike 2: quarantined, spare slot 2 takes its place), attempt 2
    completes on slots 0 and 2 from checkpoints/latest with the weights of an uninterrupted run of
    the same world size; no person, no process left."""
    with recovery_row(
        "local",
        "lemon node (crashes at step 5 in every attempt), --spares 1",
        "runs/lemon",
        "restart, then quarantined and replaced by the spare; COMPLETED, exit 0, no command typed",
    ):
        p = run_launch(
            "local",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--spares",
            "1",
            "--run-dir",
            "runs/lemon",
            "--",
            *PROGRAM,
            "--crash-at-step",
            "5",
            "--crash-slot",
            "1",
        )
        assert p.returncode == 0, p.stderr[-3000:]
        run = check_lemon("runs/lemon", reference_sha)
    assert [a["slots"] for a in run["attempts"]] == [[0, 1], [0, 1], [0, 2]]
    out = run_launch("status", "runs/lemon", check=True).stdout
    assert (
        "slot 1: 2 strikes, quarantined" in out
        and "recovery:   attempt 1 (restart after attempt 0's failure; "
        "person: no; detection to first step: "
        in out
    ), out


@pytest.mark.slow
def test_no_spare_left_shrinks_to_min_and_completes(workdir, shrink_reference):
    """--nodes 1:2 --spares 0: slot 1's rank crashes at step 14 in every attempt; attempt 0 fails
    (strike 1: restart on both slots, rotated: slot 1 is node 0), attempt 1 fails (strike 2:
    quarantined, no spare left: shrink to 1 node), attempt 2 runs on slot 0 alone (world size 1)
    from checkpoints/latest (step 12, resharded by DCP: RNG re-seeded) and completes at step 36.
    Before the crash the losses are the uninterrupted 2-node run's, bit for bit. After the shrink
    each rank keeps its --batch-size, so the global batch halves (16 samples, not 32) and single
    steps are noisy (measured: up to 2x the reference's loss at one step); the trajectory is
    compared where it is stable: the first loss after the shrink is far below a fresh start's (the
    checkpoint carried), the mean loss of steps 16-36 within 30% of the reference's (measured 12%),
    the final test loss within 30% (measured 11%) and the accuracy within 0.08 (measured 0.033). No
    process of the run left."""
    with recovery_row(
        "local",
        "no spare left, --nodes 1:2 (a lemon at step 14)",
        "runs/shrink",
        "restart, then quarantined and shrunk to 1 node; COMPLETED, loss within the bound",
        bitexact=False,
    ):
        p = run_launch(
            "local",
            "--nodes",
            "1:2",
            "--gpus-per-node",
            "1",
            "--spares",
            "0",
            "--run-dir",
            "runs/shrink",
            "--",
            *SHRINK,
            "--crash-at-step",
            "14",
            "--crash-slot",
            "1",
        )
        assert p.returncode == 0, p.stderr[-3000:]
        check_shrink("runs/shrink", shrink_reference)


def check_shrink(run_dir: str, shrink_reference: Path) -> dict:
    """A shrink run's outcome on any backend (the local test's docstring says what and why); returns
    run.yaml."""
    run, st = (
        yaml.safe_load(Path(run_dir, "run.yaml").read_text()),
        read_json(Path(run_dir, "status.json")),
    )
    assert st["state"] == "COMPLETED" and st["attempt"] == 2
    # rotated
    assert [(a["slots"], a.get("nodes")) for a in run["attempts"]][1:] == [([1, 0], 2), ([0], 1)]
    led = read_json(Path(run_dir, "nodes.json"))
    assert led["pool"] == {"active": [0], "spares": [], "quarantined": [1]}
    assert (led["slots"]["1"]["strikes"], led["slots"]["1"]["quarantined"]) == (2, True)
    assert [d["action"] for d in led["decisions"]] == ["restart", "shrink"]
    fin, ref_fin = (
        read_json(Path(run_dir, "final.json")),
        read_json(shrink_reference / "final.json"),
    )
    assert (fin["step"], fin["world_size"]) == (36, 1)
    log0 = Path(run_dir, "logs/node0/rank0.log").read_text()
    assert (
        "resumed from step-00000012 (step 12" in log0 and "saved with world size 2, now 1" in log0
    )
    ref, before, after = losses(shrink_reference), losses(run_dir, 0), losses(run_dir, 2)
    assert before == {s: ref[s] for s in (4, 8, 12)} and sorted(after) == [16, 20, 24, 28, 32, 36]
    assert after[16] < 0.8 * ref[4], (after, ref)
    mean, ref_mean = sum(after.values()) / 6, sum(ref[s] for s in after) / 6
    assert abs(mean - ref_mean) <= 0.3 * ref_mean, (after, ref)
    assert abs(fin["test_loss"] - ref_fin["test_loss"]) <= 0.3 * ref_fin["test_loss"], (
        fin,
        ref_fin,
    )
    assert abs(fin["accuracy"] - ref_fin["accuracy"]) <= 0.08, (fin, ref_fin)
    assert gone(run["run_id"]) == []
    out = run_launch("status", run_dir, check=True).stdout
    # status names a node's host
    host = "" if run["spec"]["backend"] == "local" else r" \([\w.-]+\)"
    assert "shape 1x1 (--nodes 1:2)" in out and re.search(
        rf"attempt 1: shrink -- slot 1{host}: a rank failed, strike "
        r"2 of 2: quarantined, and no spare left: shrink to 1 node "
        r"\(--nodes 1:2\)",
        out,
    ), out
    return run


def test_ssh_plan_runs_on_the_pools_hosts(tmp_path, monkeypatch):
    """SSH spares: slot k is the k-th host; an attempt's plan runs node k on the host of
    pool.active[k], node 0 (the master, MASTER_ADDR) on active[0]'s: node 0's host lost -> the first
    survivor is the master; a quarantined host is never in a plan again. Pure: no network."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ssh_config").write_text(
        "".join(f"Host h{k}\n  HostName 10.9.0.{k}\n" for k in range(1, 5))
    )
    spec = RunSpec(
        backend="ssh",
        nodes=2,
        gpus_per_node=1,
        program=("-m", "workloads.convnet"),
        program_args=(),
        run_dir=str(tmp_path / "run"),
        name="x",
        spares=2,
        max_restarts=3,
        explicit=("nodes",),
        options=(("hosts", "h1,h2,h3,h4"), ("ssh_config", str(tmp_path / "ssh_config"))),
    )
    backend = api.get_backend("ssh")
    first = nodeledger.pool_for(None, 2, 2)
    lost = recovery.failure_decision(Failure(0, "lost"), first, {}, 2, 3).pool  # node 0's host gone
    # slot 2's second strike
    lemon = recovery.failure_decision(Failure(2, "rank"), lost, {2: 1}, 2, 2).pool
    assert (first, lost, lemon) == (
        Pool((0, 1), (2, 3)),
        Pool((1, 2), (3, 0)),
        Pool((1, 3), (0,), (2,)),
    )
    rows = []
    for attempt, pool in enumerate((first, lost, lemon)):
        plan = backend.plan(spec, "x-1", attempt, slots=list(pool.active))
        envs = [nc.env_dict for nc in plan.nodes]
        rows.append(
            (
                plan.hosts,
                plan.master_addr,
                [e["MASTER_ADDR"] for e in envs],
                [e["LAUNCH_NODE_SLOT"] for e in envs],
                plan.record()["slots"],
            )
        )
    assert rows == [
        (["h1", "h2"], "10.9.0.1", ["10.9.0.1"] * 2, ["0", "1"], [0, 1]),
        (["h2", "h3"], "10.9.0.2", ["10.9.0.2"] * 2, ["1", "2"], [1, 2]),
        (["h2", "h4"], "10.9.0.2", ["10.9.0.2"] * 2, ["1", "3"], [1, 3]),
    ]
    default = backend.plan(spec, "x-1", 0)  # no pool: the first hosts
    assert (
        default.hosts == ["h1", "h2"]
        and "# node 1 on " in default.render()
        and "(slot 1):" in default.render()
    )
    assert "# spares:  2 idle node slot(s)" in default.render()
    with pytest.raises(LaunchError) as e:  # a pool slot past the hosts (a hostfile shortened)
        backend.plan(spec, "x-1", 1, slots=[0, 4])
    assert "node slot 4 has no host: the pool has 4 hosts" in str(e.value)


def test_range_pool_and_plan_follow_the_pool(tmp_path, monkeypatch):
    """--nodes MIN:MAX: the ledger's shrunk pool is the run's (MIN to MAX active slots), `launch
    resume` takes idle slots back up to MAX, and an attempt's plan has as many nodes as the pool has
    active slots (NNODES, WORLD_SIZE, node 0 on the first survivor); on SSH slot k stays the k-th of
    MAX + spares hosts. Pure."""
    monkeypatch.chdir(tmp_path)
    spec = RunSpec(
        backend="local",
        nodes=3,
        gpus_per_node=1,
        program=("x.py",),
        program_args=(),
        run_dir=str(tmp_path / "run"),
        name="x",
        min_nodes=1,
        max_nodes=3,
        max_restarts=3,
    )
    led = {"pool": {"active": [2], "spares": [1], "quarantined": [0]}}
    assert restarts.pool_of(spec, led) == Pool((2,), (1,), (0,))  # shrunk: kept as it is
    assert restarts.pool_of(spec, led, resume=True) == Pool((2, 1), (), (0,))  # idle slot 1 back
    # a resume with fewer nodes
    wide = {"pool": {"active": [0, 1, 2, 3], "spares": [], "quarantined": [0]}}
    assert restarts.pool_of(spec, wide) == Pool((1, 2, 3), (), (0,))  # up to MAX, never slot 0
    plan = restarts.plan_on(api.get_backend("local"), spec, "x-1", 2, Pool((2, 1), (), (0,)))
    envs = [nc.env_dict for nc in plan.nodes]
    assert (plan.spec.nodes, plan.spec.world_size, plan.slots) == (2, 2, [2, 1])
    assert [(e["NNODES"], e["NODE_RANK"], e["LAUNCH_NODE_SLOT"]) for e in envs] == [
        ("2", "0", "2"),
        ("2", "1", "1"),
    ]
    assert (
        "# nodes:   2 of 1:3: with no spare left" in plan.render()
        and "# node 0 (slot 2):" in plan.render()
    )
    (tmp_path / "ssh_config").write_text(
        "".join(f"Host h{k}\n  HostName 10.9.0.{k}\n" for k in range(1, 5))
    )
    ssh = spec.replace(
        backend="ssh",
        explicit=("nodes",),
        options=(("hosts", "h1,h2,h3,h4"), ("ssh_config", str(tmp_path / "ssh_config"))),
    )
    plan = restarts.plan_on(api.get_backend("ssh"), ssh, "x-1", 2, Pool((2,), (1,), (0,)))
    assert (plan.hosts, plan.master_addr, plan.spec.nodes, plan.nodes[0].env_dict["NNODES"]) == (
        ["h3"],
        "10.9.0.3",
        1,
        "1",
    )


SSH_STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))


def require_ssh() -> str:
    """The SSH test hosts are up (a test fails, never skips, without them); their script's path."""
    script = str(ROOT / "clusters" / "ssh-hosts.sh")
    st = subprocess.run([script, "status"], capture_output=True, text=True, timeout=60)
    require_cluster(
        "the SSH test hosts sshhost1..4",
        st.returncode == 0 and (SSH_STATE / "known_hosts").exists(),
        "make ssh-up",
    )
    return script


def start_on_ssh_with_a_spare(run_dir: str) -> subprocess.Popen:
    """`launch ssh` of PROGRAM (a 1 s step delay) on sshhost1,2 with sshhost3 the spare, in the
    background."""
    return subprocess.Popen(
        [
            LAUNCH,
            "ssh",
            "--hosts",
            "sshhost1,sshhost2,sshhost3",
            "--ssh-config",
            str(SSH_STATE / "ssh_config"),
            "--known-hosts",
            str(SSH_STATE / "known_hosts"),
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--spares",
            "1",
            "--run-dir",
            run_dir,
            "--",
            *PROGRAM,
            "--step-delay",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def launch_on_ssh(hosts: str, *args: str):
    """`launch ssh` on the test hosts named (one rank each), waiting for the end."""
    return run_launch(
        "ssh",
        "--hosts",
        hosts,
        "--ssh-config",
        str(SSH_STATE / "ssh_config"),
        "--known-hosts",
        str(SSH_STATE / "known_hosts"),
        "--gpus-per-node",
        "1",
        *args,
        timeout=600,
    )


@pytest.mark.ssh
def test_ssh_lemon_host_is_quarantined_and_a_spare_host_finishes_bit_exact(workdir, reference_sha):
    """The lemon on SSH: 3 test hosts, --nodes 2 --spares 1; slot 1 (sshhost2) crashes at step 5 in
    every attempt, is quarantined after 2 strikes, and the spare host sshhost3 finishes with
    sshhost1, bit-exact with the uninterrupted run; nothing of the run is left on any host (the root
    namespace sees every host's processes)."""
    require_ssh()
    with recovery_row(
        "ssh",
        "lemon host (crashes at step 5 in every attempt), --spares 1",
        "runs/lemon",
        "restart, then quarantined, the spare host in; COMPLETED, exit 0, no command typed",
    ):
        p = launch_on_ssh(
            "sshhost1,sshhost2,sshhost3",
            "--nodes",
            "2",
            "--spares",
            "1",
            "--run-dir",
            "runs/lemon",
            "--node-ledger",
            "site.json",
            "--warm-spares",
            "--",
            *PROGRAM,
            "--crash-at-step",
            "5",
            "--crash-slot",
            "1",
        )
        assert p.returncode == 0, p.stderr[-3000:]
        run = check_lemon("runs/lemon", reference_sha)
    # issue 37 item 2: attempts 1 and 2 forked from the hosts' zygotes; the spare host's served
    # attempt 2
    assert [read_json(f"runs/lemon/status/rank{r}.json").get("warm") for r in (0, 1)] == [
        True,
        True,
    ]
    no_zygote_left(run["run_id"], 3)
    assert [(a["hosts"], a["slots"]) for a in run["attempts"]] == [
        (["sshhost1", "sshhost2"], [0, 1])
    ] * 2 + [(["sshhost1", "sshhost3"], [0, 2])]
    # issue 37: the lemon's host is quarantined in the site's node ledger, and the next run leaves
    # it out
    assert siteledger.quarantined(ledgerfile.load(os.path.abspath("site.json"))[0]) == [
        "sshhost2"
    ], p.stderr[-2000:]
    dry = launch_on_ssh(
        "sshhost1,sshhost2,sshhost3",
        "--nodes",
        "2",
        "--node-ledger",
        "site.json",
        "--dry-run",
        "--",
        *PROGRAM,
    )
    assert "quarantined, not used: sshhost2" in dry.stdout and "@sshhost2" not in dry.stdout, (
        dry.stdout
    )


@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.exclusive
def test_ssh_node0_host_killed_a_spare_host_takes_over_bit_exact(workdir, reference_sha):
    """Node 0's host (the master) killed outright mid-run (ssh-hosts.sh kill-host: sshd and every
    process of the host SIGKILLed): the launcher names it lost, the survivor sshhost2 is the new
    node 0 with the spare sshhost3, from checkpoints/latest, bit-exact, no command typed; nothing of
    the run left on any host."""
    script = require_ssh()
    with recovery_row(
        "ssh",
        "node 0's host killed (sshd and its processes), --spares 1",
        "runs/n0",
        "the survivor is node 0 with the spare host; COMPLETED, exit 0, no command typed",
    ) as row:
        p = start_on_ssh_with_a_spare("runs/n0")
        killed = False
        try:
            deadline = time.monotonic() + 240
            while (read_json_or_none("runs/n0/progress/rank0.json") or {}).get("step", 0) < 3:
                assert time.monotonic() < deadline and p.poll() is None, (
                    "attempt 0 never reached step 3"
                )
                time.sleep(0.5)
            subprocess.run([script, "kill-host", "1"], check=True, capture_output=True, timeout=60)
            killed = True
            out, err = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
            if killed:
                subprocess.run([script, "revive-host", "1"], capture_output=True, timeout=120)
        assert p.returncode == 0, err[-3000:]
        run = yaml.safe_load(Path("runs/n0/run.yaml").read_text())
        assert [a["hosts"] for a in run["attempts"]] == [
            ["sshhost1", "sshhost2"],
            ["sshhost2", "sshhost3"],
        ]
        led = read_json("runs/n0/nodes.json")
        assert [d["action"] for d in led["decisions"]] == ["replace"] and "slot 0" in led[
            "decisions"
        ][0]["why"], led
        assert read_json("runs/n0/final.json")["param_sha256"] == reference_sha
        row["orphans"] = len(gone(run["run_id"]))


def restored_and_fenced(
    run_dir: str, run: dict, row: dict, reference_sha: str, before: dict[str, bytes]
) -> None:
    """The end every cut-and-SIGSTOPped row shares, once the paused node is back: one replace
    decision for slot 1, the uninterrupted run's weights, nothing of the run left once the woken
    processes end (their SSH session is gone, or Slurm ends the job's steps there: up to 90 s), and
    nothing the restored node wrote taken."""
    led = read_json(Path(run_dir, "nodes.json"))
    assert [d["action"] for d in led["decisions"]] == ["replace"] and "slot 1" in led["decisions"][
        0
    ]["why"], led
    assert read_json(Path(run_dir, "final.json"))["param_sha256"] == reference_sha
    row["orphans"] = len(gone(run["run_id"], within=90))
    assert row["orphans"] == 0
    # a figure: whether the woken rank wrote before its
    row["fenced_write_seen"] = woke_and_fenced(run_dir)
    #                                 session (SSH) or slurmd (Slurm) ended it is a race, not a rule
    assert frozen_records(run_dir) == before


def woke_and_fenced(run_dir: str) -> bool:
    """The paused node's rank 1 of attempt 0 woke and a write of it was refused
    (launchers.records.fence's line in its log). Seen when it ran alone; in a full run its session's
    end can kill it first (a race): recorded, not asserted. The sweeps take only their own attempt's
    processes, so nothing of ours kills it before it wakes."""
    log = Path(run_dir, "logs/node1/rank1.log")
    return log.is_file() and "from attempt 0 refused (the run is at attempt 1)" in log.read_text(
        errors="replace"
    )


def frozen_records(run_dir: str) -> dict[str, bytes]:
    """What a zombie must not change: the records, heartbeats, checkpoints, the ledger and the final
    weights."""
    root = Path(run_dir)
    files = [
        f
        for d in ("status", "progress", "checkpoints")
        for f in (root / d).rglob("*")
        if f.is_file()
    ]
    files += [
        root / n
        for n in ("status.json", "nodes.json", "final.json", "run.yaml")
        if (root / n).exists()
    ]
    return {str(f.relative_to(root)): f.read_bytes() for f in files}


@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.exclusive
def test_ssh_host_cut_and_sigstopped_then_restored_a_spare_finishes_nothing_it_writes_is_taken(
    workdir, reference_sha
):
    """A host cut from the network with its processes SIGSTOPped (a partitioned, paused node): the
    launcher names it lost once it is silent, the spare host takes its place from checkpoints/latest
    (bit-exact); then the host comes back (link up, SIGCONT): its woken rank and agent write nothing
    that is taken (fenced: the run's records, heartbeats, checkpoints, ledger and weights unchanged)
    and nothing of the run is left anywhere."""
    script = require_ssh()
    with recovery_row(
        "ssh",
        "host cut and SIGSTOPped, then restored, --spares 1",
        "runs/cut",
        "the spare host in; COMPLETED; the restored host's writes fenced; no command typed",
    ) as row:
        p = start_on_ssh_with_a_spare("runs/cut")
        stopped: list[int] = []
        try:
            deadline = time.monotonic() + 240
            while (read_json_or_none("runs/cut/progress/rank1.json") or {}).get("step", 0) < 3:
                assert time.monotonic() < deadline and p.poll() is None, (
                    "attempt 0 never reached step 3"
                )
                time.sleep(0.5)
            subprocess.run([script, "cut-host", "2"], check=True, capture_output=True, timeout=60)
            stopped = [
                int(x)
                for x in subprocess.run(
                    ["ip", "netns", "pids", "lssh2"], capture_output=True, text=True
                ).stdout.split()
            ]
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 19)  # SIGSTOP: the host is paused too
            out, err = p.communicate(timeout=400)
            assert p.returncode == 0, err[-3000:]
            before = frozen_records("runs/cut")
        finally:
            if p.poll() is None:
                p.kill()
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 18)  # SIGCONT: it wakes where it was
            if stopped:
                subprocess.run([script, "revive-host", "2"], capture_output=True, timeout=120)
        run = yaml.safe_load(Path("runs/cut/run.yaml").read_text())
        assert [a["hosts"] for a in run["attempts"]] == [
            ["sshhost1", "sshhost2"],
            ["sshhost1", "sshhost3"],
        ]
        restored_and_fenced("runs/cut", run, row, reference_sha, before)


@pytest.mark.ssh
@pytest.mark.slow
def test_ssh_no_spare_left_shrinks_to_min_and_completes(workdir, shrink_reference):
    """The shrink on SSH: sshhost1 and sshhost2, --nodes 1:2 --spares 0; slot 1 (sshhost2) crashes
    at step 14 in every attempt: restart (on the hosts rotated), then quarantined with no spare
    left: attempt 2 runs on sshhost1 alone, resharded from step 12, and completes within the local
    test's bounds."""
    require_ssh()
    with recovery_row(
        "ssh",
        "no spare left, --nodes 1:2 (a lemon host at step 14)",
        "runs/shrink",
        "restart, then quarantined and shrunk to 1 host; COMPLETED, loss within the bound",
        bitexact=False,
    ):
        p = launch_on_ssh(
            "sshhost1,sshhost2",
            "--nodes",
            "1:2",
            "--spares",
            "0",
            "--run-dir",
            "runs/shrink",
            "--",
            *SHRINK,
            "--crash-at-step",
            "14",
            "--crash-slot",
            "1",
        )
        assert p.returncode == 0, p.stderr[-3000:]
        run = check_shrink("runs/shrink", shrink_reference)
        assert [a["hosts"] for a in run["attempts"]] == [
            ["sshhost1", "sshhost2"],
            ["sshhost2", "sshhost1"],
            # attempt 1 rotated: sshhost2 is node 0
            ["sshhost1"],
        ]


@pytest.mark.slurm
def test_slurm_no_spare_left_shrinks_to_min_and_completes(workdir, shrink_reference):
    """The shrink on Slurm: --nodes 1:2 and no spare is a 2-node allocation (--no-kill) whose
    attempts are srun steps of the batch step's loop (launchers.backends.slurm.steps); slot 1
    crashes at step 14 in every attempt: a restart on both nodes (rotated), then quarantined with no
    spare left: attempt 2 is a step on the one node left, resharded from step 12, and completes
    within the local test's bounds -- all in one Slurm job."""
    require_slurm()
    with recovery_row(
        "slurm",
        "no spare left, --nodes 1:2 (a lemon node at step 14)",
        "runs/shrink",
        "restart, then quarantined and shrunk to 1 node in the same job; COMPLETED, loss within "
        "the bound",
        bitexact=False,
    ):
        run_launch(
            "slurm",
            "--nodes",
            "1:2",
            "--gpus-per-node",
            "1",
            "--time",
            "10",
            "--run-dir",
            "runs/shrink",
            "--",
            *SHRINK,
            "--crash-at-step",
            "14",
            "--crash-slot",
            "1",
            check=True,
        )
        p = run_launch("wait", "runs/shrink", timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        run = check_shrink("runs/shrink", shrink_reference)
        hosts = [a["hosts"] for a in run["attempts"]]
        # rotated
        assert len(hosts[0]) == 2 and hosts[1] == hosts[0][::-1] and hosts[2] == hosts[0][:1], hosts
        assert len({a["slurm_job_id"] for a in run["attempts"]}) == 1, run["attempts"]


def require_slurm() -> str:
    """The dev Slurm cluster is up (a test fails, never skips, without it); its script's path."""
    cluster = str(ROOT / "slurm" / "dev-cluster.sh")
    up = subprocess.run([cluster, "status"], capture_output=True, text=True)
    require_cluster("the dev Slurm cluster", up.returncode == 0, "make slurm-up")
    return cluster


def submit_with_a_spare(run_dir: str, *program: str, flags: tuple[str, ...] = ()):
    """`launch slurm` of 2 nodes x 1 and one spare (returns once submitted: `launch wait` follows
    it)."""
    return run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--spares",
        "1",
        "--time",
        "10",
        "--run-dir",
        run_dir,
        *flags,
        "--",
        *program,
        check=True,
    )


@pytest.mark.slurm
def test_slurm_lemon_node_is_quarantined_and_a_spare_of_the_same_job_finishes_bit_exact(
    workdir, reference_sha
):
    """The lemon on Slurm: --nodes 2 --spares 1 asks for 3 nodes (--no-kill); each attempt is an
    srun step on 2 of them, run by the batch step's loop (launchers.backends.slurm.steps). Slot 1
    crashes at step 5 in every attempt: a restart on the same nodes, then quarantined after 2
    strikes and the spare node takes its place -- all in one Slurm job (no requeue, no new
    submission); bit-exact with the uninterrupted run."""
    require_slurm()
    with recovery_row(
        "slurm",
        "lemon node (crashes at step 5 in every attempt), --spares 1",
        "runs/lemon",
        "REQUEUED twice in one job (restart, then the spare); COMPLETED, exit 0",
    ):
        submit_with_a_spare(
            "runs/lemon",
            *PROGRAM,
            "--crash-at-step",
            "5",
            "--crash-slot",
            "1",
            flags=("--node-ledger", "site.json"),
        )
        p = run_launch("wait", "runs/lemon", timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        run = check_lemon("runs/lemon", reference_sha)
    jobs = [a.get("slurm_job_id") for a in run["attempts"]]
    assert len(set(jobs)) == 1 and jobs[0], jobs
    hosts = [a["hosts"] for a in run["attempts"]]
    assert hosts[0] == hosts[1] and hosts[2][0] == hosts[0][0] and hosts[2][1] not in hosts[0], (
        hosts
    )
    # issue 37: the batch step recorded the lemon's node in the site's node ledger; the next job
    # excludes it
    assert siteledger.quarantined(ledgerfile.load(os.path.abspath("site.json"))[0]) == [hosts[0][1]]
    dry = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--node-ledger",
        "site.json",
        "--dry-run",
        "--",
        *PROGRAM,
        check=True,
    )
    assert f"#SBATCH --exclude={hosts[0][1]}\n" in dry.stdout
    assert [a.get("by") for a in run["attempts"]][1:] == [timeline.BY_POLICY] * 2


@pytest.mark.slurm
def test_slurm_single_killed_worker_is_restarted_on_the_same_nodes_not_quarantined(
    workdir, reference_sha
):
    """One rank crashes once (attempt 0 only): a strike, not a quarantine; attempt 1 runs on the
    same nodes of the same Slurm job and finishes bit-exact; the spare stays idle."""
    require_slurm()
    with recovery_row(
        "slurm",
        "single killed worker, --spares 1",
        "runs/w",
        "REQUEUED once, restarted on the same nodes (a strike, no quarantine); COMPLETED, exit 0",
    ) as row:
        submit_with_a_spare("runs/w", *PROGRAM, "--crash-at-step", "5", "--crash-rank", "1")
        p = run_launch("wait", "runs/w", timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        run = yaml.safe_load(Path("runs/w/run.yaml").read_text())
        assert (
            len(run["attempts"]) == 2 and run["attempts"][0]["hosts"] == run["attempts"][1]["hosts"]
        ), run["attempts"]
        assert len({a["slurm_job_id"] for a in run["attempts"]}) == 1
        led = read_json("runs/w/nodes.json")
        assert [d["action"] for d in led["decisions"]] == ["restart"] and led["pool"][
            "quarantined"
        ] == [], led
        assert read_json("runs/w/final.json")["param_sha256"] == reference_sha
        row["orphans"] = len(gone(run["run_id"]))


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.exclusive
def test_slurm_node0_host_killed_a_spare_of_the_same_job_takes_over_bit_exact(
    workdir, reference_sha
):
    """Node 0 of the step (the rendezvous host) killed outright (dev-cluster.sh kill-node: slurmd
    and every process of its namespace SIGKILLed): the step ends once Slurm gives the node up
    (SlurmdTimeout), the node that recorded no exit is the one lost (not the survivor whose ranks
    failed on losing their master), the spare takes its place and the survivor is the new node 0 --
    attempt 1 in the same Slurm job, bit-exact, no command typed."""
    cluster = require_slurm()
    with recovery_row(
        "slurm",
        "node 0's host killed (slurmd and its processes), --spares 1",
        "runs/n0",
        "REQUEUED after SlurmdTimeout, the survivor is node 0 with the spare, same job; COMPLETED",
    ) as row:
        submit_with_a_spare("runs/n0", *PROGRAM, "--step-delay", "1")
        dead = None
        try:
            deadline = time.monotonic() + 240
            while (read_json_or_none("runs/n0/progress/rank0.json") or {}).get("step", 0) < 3:
                assert time.monotonic() < deadline, "attempt 0 never reached step 3"
                time.sleep(0.5)
            dead = read_json("runs/n0/status/node0.json")["host"]
            subprocess.run(
                [cluster, "kill-node", dead.removeprefix("lnode")], check=True, capture_output=True
            )
            p = run_launch("wait", "runs/n0", timeout=300)
        finally:
            if dead:
                # slurmd back (ReturnToService=2)
                subprocess.run([cluster, "up"], capture_output=True)
                for state in ("down", "resume"):
                    subprocess.run(
                        ["scontrol", "update", f"nodename={dead}", f"state={state}", "reason=test"],
                        capture_output=True,
                    )
        assert p.returncode == 0, p.stderr[-3000:]
        run = yaml.safe_load(Path("runs/n0/run.yaml").read_text())
        a0, a1 = run["attempts"][0], run["attempts"][-1]
        assert len(run["attempts"]) == 2 and a0["slurm_job_id"] == a1["slurm_job_id"], run[
            "attempts"
        ]
        assert (
            a0["hosts"][0] == dead and dead not in a1["hosts"] and a1["hosts"][0] == a0["hosts"][1]
        ), run["attempts"]
        led = read_json("runs/n0/nodes.json")
        assert [d["action"] for d in led["decisions"]] == ["replace"] and "lost" in led[
            "decisions"
        ][0]["why"], led
        assert read_json("runs/n0/status.json")["state"] == "COMPLETED"
        assert read_json("runs/n0/final.json")["param_sha256"] == reference_sha
        row["orphans"] = len(gone(run["run_id"]))


def netns_pids(ns: str) -> list[int]:
    return [
        int(x)
        for x in subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True
        ).stdout.split()
    ]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.exclusive
def test_slurm_node_cut_and_sigstopped_then_restored_a_spare_finishes_nothing_it_writes_is_taken(
    workdir, reference_sha
):
    """Node 1 of the step cut from the network (its veth down) with every process of its namespace
    SIGSTOPped -- slurmd, slurmstepd, the node task, the agent, the rank: a partitioned, paused
    node. Slurm gives it up (SlurmdTimeout), the batch step's loop replaces it with the spare of the
    same job from checkpoints/latest (bit-exact); then the node comes back (link up, SIGCONT): what
    its woken processes write is not taken (the run's records, heartbeats, checkpoints, ledger and
    weights unchanged) and nothing of the run is left."""
    cluster = require_slurm()
    with recovery_row(
        "slurm",
        "node cut and SIGSTOPped, then restored, --spares 1",
        "runs/cut",
        "REQUEUED in the same job, the spare in; COMPLETED; the restored node's writes fenced",
    ) as row:
        submit_with_a_spare("runs/cut", *PROGRAM, "--step-delay", "1")
        cut, stopped, p = None, [], None
        try:
            deadline = time.monotonic() + 240
            while (read_json_or_none("runs/cut/progress/rank1.json") or {}).get("step", 0) < 3:
                assert time.monotonic() < deadline, "attempt 0 never reached step 3"
                time.sleep(0.5)
            cut = read_json("runs/cut/status/node1.json")["host"]  # lnodeK: its veth is lsimvK
            subprocess.run(
                ["ip", "link", "set", "lsimv" + cut.removeprefix("lnode"), "down"], check=True
            )
            stopped = netns_pids(cut)
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 19)  # SIGSTOP: the node is paused too
            p = run_launch("wait", "runs/cut", timeout=400)
            assert p.returncode == 0, p.stderr[-3000:]
            before = frozen_records("runs/cut")
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 18)  # SIGCONT: it wakes where it was
            if cut:
                subprocess.run(
                    ["ip", "link", "set", "lsimv" + cut.removeprefix("lnode"), "up"],
                    capture_output=True,
                )
                # slurmd as it was (ReturnToService=2)
                subprocess.run([cluster, "up"], capture_output=True)
                for state in ("down", "resume"):
                    subprocess.run(
                        ["scontrol", "update", f"nodename={cut}", f"state={state}", "reason=test"],
                        capture_output=True,
                    )
        run = yaml.safe_load(Path("runs/cut/run.yaml").read_text())
        a0, a1 = run["attempts"][0], run["attempts"][-1]
        assert len(run["attempts"]) == 2 and a0["slurm_job_id"] == a1["slurm_job_id"], run[
            "attempts"
        ]
        assert (
            a0["hosts"][1] == cut and a1["hosts"][0] == a0["hosts"][0] and cut not in a1["hosts"]
        ), run["attempts"]
        restored_and_fenced("runs/cut", run, row, reference_sha, before)


T0 = 1764900000.0  # a fixed fault time (whole seconds: the stamps' milliseconds are exact)


def hand_made_restarts(tmp_path) -> RunDir:
    """A run dir as two restarts leave it: attempt 1 started by the policy after attempt 0's failure
    (its heartbeat already replaced: only status.json's recorded timeline has its first step),
    attempt 2 by `launch resume` after attempt 1's (stopped: no restart left); the rank wrappers'
    headers, rank 0's `resumed from` line in attempt 1 only, attempt 2's heartbeats."""
    spec = RunSpec(
        backend="local",
        nodes=2,
        gpus_per_node=1,
        program=("x.py",),
        program_args=(),
        run_dir=str(tmp_path / "run"),
        name="x",
        spares=1,
        max_restarts=1,
    )
    rd = RunDir.create(spec, "x-1", {"hosts": []})
    rd.add_attempt(spec, {"hosts": [], "by": "policy"})
    rd.add_attempt(spec, {"hosts": [], "by": "launch resume"})
    led, pool = None, nodeledger.pool_for(None, 2, 1)
    for attempt, fault in ((0, T0), (1, T0 + 20)):
        fail = recovery.failure_of(
            {"rank": 1, "node": 1, "exit_code": 1}, pool, "rank 1 on node 1, exit code 1"
        )
        d = recovery.failure_decision(fail, pool, nodeledger.strikes(led), 2, 1 - attempt)
        led = nodeledger.record(
            rd.path,
            led,
            attempt,
            pool,
            fail,
            {"0": 143, "1": 1},
            d,
            2,
            {"fault": fault, "detected": fault + 0.5, "decided": fault + 0.625},
        )
    head = "===== launch attempt {a} | rank {r} of 2 | node {r} | {t} =====\n"
    for r, log in (
        (0, ["resumed from step-00000004 (step 4, epoch 0, load 0.010s, at {t})\n"]),
        (1, []),
    ):
        text = head.format(a=0, r=r, t=layout.stamp(T0 - 30)) + "step\n"
        text += head.format(a=1, r=r, t=layout.stamp(T0 + 2 + r / 2)) + "".join(
            x.format(t=layout.stamp(T0 + 4.5)) for x in log
        )
        text += head.format(a=2, r=r, t=layout.stamp(T0 + 22 + r / 4)) + "step\n"
        Path(rd.path, f"logs/node{r}").mkdir(parents=True, exist_ok=True)
        Path(rd.path, f"logs/node{r}/rank{r}.log").write_text(text)
        Path(rd.path, "progress").mkdir(exist_ok=True)
        Path(rd.path, f"progress/rank{r}.json").write_text(
            json.dumps({"rank": r, "attempt": 2, "step": 9, "time": T0 + 30, "first": T0 + 25 + r})
        )
    rd.update_status(recovery=[timeline.entry(1, "restart", False, {"first_step": T0 + 5.25})])
    return rd


def test_timeline_phases_and_status_lines(tmp_path):
    rd = hand_made_restarts(tmp_path)
    got = timeline.restarts(rd.path, rd.read_status()["recovery"])
    assert [(e["attempt"], e["decision"], e["person"]) for e in got] == [
        (1, "restart", "no"),
        (2, "stop", "yes"),
    ]
    assert [[p["since_fault_s"] for p in e["phases"]] for e in got] == [
        [0.0, 0.5, 0.625, 2.5, 4.5, 5.25],
        [0.0, 0.5, 0.625, 2.25, None, 5.0],
    ]
    assert [e["detection_to_first_step_s"] for e in got] == [4.75, 4.5]
    assert [p["at"] for p in got[0]["phases"]][:2] == [layout.stamp(T0), layout.stamp(T0 + 0.5)]
    restarts.record_timeline(rd)  # what the launcher writes as an attempt ends
    assert RunDir(rd.path).read_status()["recovery"] == got
    text = api.format_status(api.status(rd.path))
    block = text[text.index("recovery:") :].splitlines()[:8]

    def at(s):
        return layout.stamp(T0 + s)

    assert block == [
        "recovery:   attempt 1 (restart after attempt 0's failure; person: no; detection to "
        "first step: 4.75 s)",
        f"              fault              {at(0)}  +0.00 s",
        f"              detected           {at(0.5)}  +0.50 s",
        f"              decided            {at(0.625)}  +0.62 s",
        f"              new world formed   {at(2.5)}  +2.50 s",
        f"              checkpoint loaded  {at(4.5)}  +4.50 s",
        f"              first step         {at(5.25)}  +5.25 s",
        "            attempt 2 (stop after attempt 1's failure; person: yes; detection to first "
        "step: 4.50 s)",
    ]
    assert "              checkpoint loaded  -" in text.splitlines()
    assert (
        timeline.parse_stamp(layout.stamp(T0 + 0.125)) == T0 + 0.125
        and timeline.parse_stamp("soon") is None
    )


def test_a_slurm_requeue_excludes_quarantined_hosts_and_numbers_its_slots_anew(tmp_path):
    """--spares on Slurm, requeued (USR2): the hosts the quarantined slots ran on (the ledger's
    attempts -> run.yaml's hosts) are what the requeue excludes; the new allocation's ledger starts
    with fresh slots, the old kept aside."""
    pool = nodeledger.pool_for(None, 2, 1)
    led = None
    for attempt in (0, 1):
        fail = recovery.failure_of(
            {"rank": 1, "node": 1, "exit_code": 1}, pool, "rank 1 on node 1, exit code 1"
        )
        d = recovery.failure_decision(fail, pool, nodeledger.strikes(led), 2, 3)
        led = nodeledger.record(str(tmp_path), led, attempt, pool, fail, {"0": 143, "1": 1}, d, 2)
    attempts = [
        {"hosts": ["lnode2", "lnode3"]},
        {"hosts": ["lnode2", "lnode3"]},
        {"hosts": ["lnode2", "lnode4"]},
    ]
    assert led["pool"]["quarantined"] == [1] and nodeledger.quarantined_hosts(led, attempts) == [
        "lnode3"
    ]
    assert nodeledger.quarantined_hosts(None, attempts) == []
    nodeledger.new_allocation(str(tmp_path), led, Pool.fresh(2, 1))
    after = nodeledger.read(str(tmp_path))
    assert (
        after["pool"] == {"active": [0, 1], "spares": [2], "quarantined": []}
        and after["slots"] == {}
    )
    assert after["earlier"][0]["slots"]["1"]["quarantined"] and len(after["decisions"]) == 2
    assert nodeledger.strikes(after) == {}
