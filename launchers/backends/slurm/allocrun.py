"""A run in the user's own Slurm allocation, from the launcher (SLURM_JOB_ID set: nothing is
submitted): one srun step runs the node task on the allocated nodes while this process follows the
output, then records the end itself; a preempted run waits for Slurm's requeue of the job
(launchers.backends.slurm.inalloc)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from ... import layout
from ...errors import RunDirGone
from ...records.rundir import RunDir
from ...stops import exit_code
from ..base import Plan
from .env import SlurmEnv
from .render import srun_argv


def run_in_allocation(plan: Plan, rd: RunDir) -> int:
    """The run in the current allocation (SlurmBackend.start there): srun's node tasks followed
    until they end (a SIGINT/SIGTERM to this launcher stops srun: CANCELLED), the end recorded
    (requeue.finalize), a preemption held until Slurm requeues the job; the run's exit code."""
    from ...follow import follow_in_thread
    from .inalloc import hold_for_requeue
    from .requeue import finalize

    env = SlurmEnv.read()
    rd.mark_running(
        plan.attempt, slurm_job_id=env.job_id, in_allocation=True, slurm_restart=env.restart_count
    )
    argv = srun_argv(plan.spec, run_id=plan.run_id, job_id=env.job_id, base_attempt=plan.attempt)
    os.makedirs(layout.path(rd.path, "slurm"), exist_ok=True)
    print(
        f"slurm job {env.job_id}: running in the current allocation; run dir {rd.path}", flush=True
    )
    interrupted: list[int] = []
    here = layout.Presence(rd.path)
    srun = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def stop(signum, _frame):
        interrupted.append(signum)
        with contextlib.suppress(ProcessLookupError):
            srun.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    thread, done = follow_in_thread(rd.path)
    try:
        srun.wait()
    finally:
        done.set()
        thread.join(timeout=5)
        for s, h in old.items():
            signal.signal(s, h)
    if here.gone():  # node 0 cancelled the step (launchers.backends.slurm.gone): nothing recorded
        raise RunDirGone(here.gone_line())
    # CANCELLED by it (launchers.stops)
    by = signal.Signals(interrupted[0]).name if interrupted else None
    finalize(rd.path, plan.attempt, in_allocation=True, stopped_by=by)
    st = rd.unrecorded or rd.read_status()
    if st.get("state") == "PREEMPTED":  # Slurm requeues the job, never this launcher (.inalloc)
        print(f"launch: {st.get('reason')}", file=sys.stderr, flush=True)
        hold_for_requeue(env.job_id)
    return exit_code(st)
