"""Slurm's decisions of the recovery policy (issue 34): a step's end (step_end_decision: requeue,
preempted, recover or record), a requeue of a submitted job (requeue_decision: requeue or fail) and
a run dir given again in a job Slurm requeued (continue_decision: continue or refuse). The backend
(slurm.requeue, .inalloc, .steps) gathers the facts (its records, SLURM_*, scontrol) and carries the
decision out; the decision is made here, on typed facts only. Pure (stdlib only); what follows a
failed attempt of the steps loop is launchers.resilience.recovery's failure_decision().
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepEnd:
    """What the batch side of a Slurm job saw as a step ended (requeue.finalize)."""

    failed: bool  # a node recorded no exit, or an exit other than 0
    usr2: bool = False  # Slurm's SIGUSR2 stopped it (a preemption, the time limit's warning)
    in_allocation: bool = False  # the user's own allocation
    cancelled: bool = False  # launch cancel, or the launcher's own stop signal
    signals: tuple[str, ...] = ()  # the stop signals the nodes recorded
    in_job: bool = False  # the steps loop: another attempt may follow in this job


STEP_ENDS = ("requeue", "preempted", "recover", "record")


def step_end_decision(f: StepEnd) -> str:
    """requeue: a submitted job stopped by USR2 (requeue_decision: requeue or fail) | preempted: a
    step of the user's allocation stopped by Slurm's signal (recorded PREEMPTED, nothing requeued) |
    recover: a failed step of the steps loop (decide: restart, replace, shrink, grow or stop) |
    record: the attempt's outcome as every backend records it (RunDir.record_outcome)."""
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

    restart: int  # the job's requeues so far (SLURM_RESTART_COUNT)
    max_requeues: int  # --max-requeues


@dataclass(frozen=True)
class RequeueDecision:
    action: str  # requeue | fail
    why: str  # status.json's reason


def requeue_decision(f: Requeue) -> RequeueDecision:
    """`scontrol requeue` while --max-requeues allows, else FAILED."""
    if f.restart >= f.max_requeues:
        return RequeueDecision(
            "fail",
            f"stopped by SIGUSR2 (preemption or time limit) after {f.restart} requeues; "
            f"--max-requeues {f.max_requeues} is used up",
        )
    return RequeueDecision(
        "requeue",
        f"SIGUSR2 (preemption or time limit): requeued ({f.restart + 1} of {f.max_requeues})",
    )


@dataclass(frozen=True)
class Requeued:
    """A run dir given again inside the user's allocation, as this job and its run dir say
    (slurm.inalloc)."""

    in_allocation: bool  # SLURM_JOB_ID is set
    job_id: str  # this job's
    restart_count: int  # SLURM_RESTART_COUNT
    attempts: int = 0  # run.yaml's attempts (0: none, or not a run dir of the slurm backend)
    started_in_allocation: bool = False  # status.json's in_allocation
    started_by: str = ""  # status.json's slurm_job_id
    recorded_restart: int | None = None  # status.json's slurm_restart
    state: str | None = None  # status.json's state
    cancel_requested: bool = False  # launch cancel stopped it
    # what the command line given again changes of the recorded spec (None: nothing)
    differs: str | None = None


@dataclass(frozen=True)
class ContinueDecision:
    action: str  # "continue" or "refuse"
    why: str  # continue: the new attempt's reason; refuse: why not (the user sees the usual line)
    attempt: int | None = None
    restart: int = 0
    # a refusal of its own (the spec differs); None: the usual "already exists" line
    line: str | None = None
    rule: str = ""  # refuse: the rule that refused (a key of CONTINUE_RULES)


CONTINUE_RULES = (
    "allocation",
    "run dir",
    "job",
    "requeue",
    "restart",
    "completed",
    "cancelled",
    "differs",
)


def continue_decision(f: Requeued) -> ContinueDecision:
    """Continue the run dir's run after Slurm requeued this job, or refuse (the rules:
    launchers.backends.slurm.inalloc)."""
    refuse = zip(
        CONTINUE_RULES,
        [
            (not f.in_allocation, "not inside an allocation"),
            (not f.attempts, "not a run dir of the slurm backend"),
            (
                not f.started_in_allocation or f.started_by != f.job_id,
                f"started by another job ({f.started_by or 'not in an allocation'})",
            ),
            (f.restart_count <= 0, "not a requeue (SLURM_RESTART_COUNT 0)"),
            (
                f.recorded_restart is not None and f.recorded_restart >= f.restart_count,
                f"started by this run of the job (restart {f.recorded_restart})",
            ),
            (f.state == "COMPLETED", "the run is COMPLETED"),
            (f.cancel_requested, "stopped by launch cancel"),
            (f.differs is not None, f"the command line differs ({f.differs})"),
        ],
    )
    rule, why = next(((r, w) for r, (bad, w) in refuse if bad), ("", ""))
    if rule:
        return ContinueDecision("refuse", why, rule=rule)
    return ContinueDecision(
        "continue",
        f"requeued by Slurm (restart {f.restart_count})",
        attempt=f.attempts,
        restart=f.restart_count,
    )
