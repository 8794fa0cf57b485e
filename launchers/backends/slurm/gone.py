"""A Slurm run whose run dir is removed while its job runs (`rm -rf`; issue 21 item 6): its records
cannot be kept, so the job ends, as `launch local` and `launch ssh` end (launchers.layout.Presence,
errors.RunDirGone).

On Slurm no launcher is there to notice: each node task watches the run dir it started with (watch),
stops its own node at once when it is gone (no grace: anything a program wrote would recreate half a
run dir), writes nothing more, and node 0 cancels the job (cancel_own: `scancel` of its own job id,
of its own step inside an allocation) so Slurm does not keep running it. The batch side's teardown
and `launch slurm --wait` / `launch wait` see the same and say it in one line. Stdlib only (and cmd,
the runner of Slurm's commands).
"""

from __future__ import annotations

import subprocess
import time
from typing import Callable

from . import cmd

POLL_S = 0.5  # how often a node task looks at its run dir


def watch(
    gone: Callable[[], bool],
    ended: Callable[[], bool],
    interval: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Until the node's agent has ended (False) or the run dir is gone (True), looking every
    `interval` s."""
    while not ended():
        if gone():
            return True
        sleep(interval)
    return False


def own_job(job_id: str, step_id: str, in_allocation: bool) -> str:
    """What node 0 cancels: its batch job, or inside an allocation only the step this run started
    (never the user's allocation)."""
    return f"{job_id}.{step_id}" if in_allocation else job_id


def cancel_own(
    job_id: str,
    step_id: str,
    in_allocation: bool,
    run: Callable[..., subprocess.CompletedProcess] = cmd.run,
) -> str | None:
    """`scancel` of own_job(); None once asked, else scancel's reason (printed by the caller, never
    raised: the node has already stopped its part)."""
    if not job_id:
        return "no SLURM_JOB_ID"
    try:
        p = run(["scancel", own_job(job_id, step_id, in_allocation)], timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    return (
        None
        if p.returncode == 0
        else (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    )
