"""A run started inside the user's own Slurm allocation, across Slurm's requeue of that job (issue
23).

The user's sbatch script runs `launch slurm --run-dir X -- train.py` in its allocation (SLURM_JOB_ID
set: the backend's in-allocation path). When Slurm requeues the job -- a preemption with
PreemptMode=REQUEUE, a node failure with the script's `#SBATCH --requeue`, `scontrol requeue` -- the
script runs again, the same job id, SLURM_RESTART_COUNT one higher, and gives the same `--run-dir X`
again.

Continue or refuse (the policy: launchers.resilience.slurmpolicy.continue_decision on the facts
requeued_facts gathers; differs, verdict: pure). The run continues -- a new attempt past every
attempt in run.yaml, resumed from checkpoints/latest exactly as `launch resume` would
(launchers.api.resume, the one owner: the recorded spec, its snapshot, the node ledger's pool) --
only when all of these hold:
  * inside an allocation, and X is a run dir of the slurm backend;
  * status.json says it was started in an allocation (in_allocation) by THIS job (slurm_job_id =
    SLURM_JOB_ID:
    Slurm keeps the id across a requeue);
  * this is a requeue (SLURM_RESTART_COUNT > 0) and a later run of the job than the one that
    recorded it (status.json's slurm_restart below SLURM_RESTART_COUNT): Slurm ended every process
    of that earlier run
    before it ran the job again, so nothing of the run is alive and no busy check is needed;
  * the run is not COMPLETED, nor stopped by `launch cancel` (the user's word on the run);
  * the command line given again matches the recorded spec in what makes the run (program, program
    args, --nodes, --gpus-per-node): the recorded spec is what runs, so a difference is refused in
    one line naming it (an edited script meant a new run: another --run-dir; a new shape of this
    run: `launch resume --nodes`).
Otherwise nothing changes: an existing run dir is refused in the usual one line (launchers.layout).

Preemption inside the user's allocation (requeue.finalize, in_allocation): the steps' stop signal
from Slurm -- SIGTERM to the steps (a preemption's notice), SIGUSR2 (the --signal warning,
PreemptParameters=send_user_signal) -- makes the programs checkpoint and stop; the attempt is
recorded PREEMPTED (never FAILED, never COMPLETED unless every node ended 0). The launcher never
runs `scontrol requeue` on the user's job: the job is theirs, and whether it comes back is their
choice (`#SBATCH --requeue`) and the cluster's (PreemptMode=REQUEUE) -- a requeue the user did not
ask for would rerun the whole script, their other steps included. While Slurm preempts the job
(scontrol shows its PreemptTime) the launcher holds the batch script until Slurm ends it
(hold_for_requeue): a script that ended first would leave nothing to requeue. When the launcher
itself gets the SIGTERM -- Slurm ending the whole job: a requeue without grace time, NODE_FAIL,
scancel, the time limit; it cannot tell which -- the attempt is CANCELLED by it, as every backend
records a stop; a requeue continues it all the same. A PREEMPTED run whose job left the queue
without a requeue becomes CANCELLED at the next `launch status` (settle_preempted), so `launch wait`
ends and `launch resume` is accepted.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Mapping

from ...resilience.slurmpolicy import ContinueDecision, Requeued, continue_decision
from .env import SlurmEnv

# what a requeued run must give again as it was recorded (run.yaml spec), with the option naming it
SAME = (
    ("program", "program"),
    ("program_args", "program args"),
    ("nodes", "--nodes"),
    ("gpus_per_node", "--gpus-per-node"),
)
HOLD_MARGIN_S = 60.0  # past the preempted job's end time: Slurm's KillWait, the requeue itself


Verdict = ContinueDecision  # slurmpolicy.continue_decision's answer


def requeued_facts(
    env: SlurmEnv,
    status: Mapping[str, Any] | None,
    run_yaml: Mapping[str, Any] | None,
    differs: str | None = None,
) -> Requeued:
    """What this job (env) and the run dir (status.json, run.yaml) say, for
    slurmpolicy.continue_decision."""
    st, data = status or {}, run_yaml or {}
    slurm_run = bool(data.get("attempts")) and (data.get("spec") or {}).get("backend") == "slurm"
    recorded = st.get("slurm_restart")
    return Requeued(
        env.in_allocation,
        env.job_id,
        env.restart_count,
        attempts=len(data["attempts"]) if slurm_run else 0,
        started_in_allocation=bool(st.get("in_allocation")),
        started_by=str(st.get("slurm_job_id") or ""),
        recorded_restart=recorded if isinstance(recorded, int) else None,
        state=st.get("state"),
        cancel_requested=bool(st.get("cancel_requested")),
        differs=differs,
    )


def differs(recorded: Mapping[str, Any], given: Mapping[str, Any]) -> str | None:
    """The first of program, program args, --nodes, --gpus-per-node that the command line given
    again changes from the recorded spec: 'what: recorded R, given G'; None when they match."""
    for key, what in SAME:
        a, b = recorded.get(key), given.get(key)
        a, b = (
            (list(a), list(b))
            if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))
            else (a, b)
        )
        if a != b:
            return f"{what}: recorded {show(a)}, given {show(b)}"
    return None


def show(value: Any) -> str:
    return " ".join(map(str, value)) or "(none)" if isinstance(value, list) else str(value)


def verdict(
    env: SlurmEnv,
    status: Mapping[str, Any] | None,
    run_yaml: Mapping[str, Any] | None,
    given: Mapping[str, Any],
    run_dir: str,
) -> Verdict:
    """slurmpolicy.continue_decision on this job, the run dir and the command line given again (a
    spec's dict) against the recorded spec; a refusal for a difference has its own line."""
    diff = differs((run_yaml or {}).get("spec") or {}, given)
    v = continue_decision(requeued_facts(env, status, run_yaml, diff))
    if v.rule != "differs":
        return v
    return replace(
        v,
        line=(
            f"run dir {run_dir!r} of Slurm job {env.job_id} is not continued after its requeue: "
            f"the command line differs from the recorded run ({diff}); accepted: the recorded "
            "one (run.yaml), or another --run-dir"
        ),
    )


def continuing_line(v: Verdict, env: SlurmEnv, run_dir: str, resume_from: str) -> str:
    """The one line a continued run prints."""
    return (
        f"launch: Slurm job {env.job_id} was requeued (restart {v.restart}): run {run_dir} "
        f"continues as attempt {v.attempt}, from {resume_from}"
    )


def requeued_run(run_dir: str | None, environ: Mapping[str, str] | None = None) -> Verdict | None:
    """The verdict on `--run-dir` inside an allocation when that run dir exists and may continue
    (slurmpolicy.continue_decision says continue); None otherwise (nothing to continue: the usual
    path and its refusal)."""
    import os

    from ... import layout

    env = SlurmEnv.read(environ)
    if not run_dir or not env.in_allocation or not layout.is_run_dir(os.path.abspath(run_dir)):
        return None
    path = os.path.abspath(run_dir)
    data, why = layout.load_run_yaml(path)
    status = layout.read_json(layout.path(path, "status"))
    v = continue_decision(requeued_facts(env, status, None if why else data))
    return v if v.action == "continue" else None


# ------------------------------------------------------------------------------------- a preemption


def preempted_reason(signals: list[str], job_id: str, run_dir: str) -> str:
    """A PREEMPTED attempt's reason (status.json)."""
    sig = "/".join(signals) or "a stop signal"
    return (
        f"stopped by {sig} from Slurm inside job {job_id} (a preemption, or the time limit's "
        "warning): checkpointed; a requeue of the job continues the run (#SBATCH --requeue, "
        f"PreemptMode=REQUEUE), else `launch resume {run_dir}`"
    )


def settle_preempted(
    rd, st: dict[str, Any], states_of: Callable[[], list[str] | None]
) -> dict[str, Any]:
    """`launch status` of a PREEMPTED run in the user's allocation: it waits for Slurm's requeue of
    the job while squeue lists the job live (states_of(): its states; None, or no squeue: no answer,
    nothing changes); once the job has left the queue without a requeue, nothing continues it:
    CANCELLED (the stop it was), saying so."""
    from .status import LIVE

    if st.get("state") != "PREEMPTED":
        return st
    try:
        states = states_of()
    except (OSError, subprocess.SubprocessError):
        return st
    if states is None or any(s in LIVE for s in states):
        return st
    with rd.lock():
        cur = rd.read_status()
        if cur.get("state") != "PREEMPTED" or cur.get("attempt") != st.get("attempt"):
            return cur
        return rd.update_status(
            state="CANCELLED",
            reason=(
                f"{cur.get('reason')}; Slurm job {cur.get('slurm_job_id')} ended without a requeue"
            ),
        )


def hold_for_requeue(job_id: str, sleep=time.sleep) -> None:
    """While Slurm preempts the job (PreemptTime set), keep the batch script until Slurm ends it at
    the end of the grace time and requeues it (it kills this process meanwhile); bounded by the
    job's end time plus a margin. Without a preemption (the time limit's warning, a USR2 by hand)
    nothing is held."""
    from .status import parse_end_time, parse_preempt_time, show_job

    rc, out = show_job(job_id, timeout=30)
    if rc != 0 or parse_preempt_time(out) is None:  # no answer, or no preemption: nothing to hold
        return
    now = time.time()
    end = parse_end_time(out) or now
    print(
        f"launch: Slurm job {job_id} is being preempted (PreemptTime {parse_preempt_time(out)}): "
        "waiting for Slurm to end and requeue it",
        file=sys.stderr,
        flush=True,
    )
    sleep(max(0.0, end - now) + HOLD_MARGIN_S)
