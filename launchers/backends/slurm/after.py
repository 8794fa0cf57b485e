"""--after RUN_DIR|JOBID[:afterok|afterany|afternotok]: sbatch --dependency on another run or job.

The plan resolves a run dir (a Slurm run, or a sweep submitted as a job array) to its job id from
its own records (no Slurm call: the dry-run works anywhere); the preflight asks Slurm that the job
exists and that the dependency can still be met. A resumed attempt drops the dependency (its parent
is long done).
"""

from __future__ import annotations

import os

from ... import layout, sweep
from ...errors import LaunchError, brief
from ...records.rundir import RunDir
from ...spec import RunSpec
from . import status as slurm_status
from .options import AFTER_ACCEPTED, JOB_ID, dependency, split_after


def with_options(spec: RunSpec, **changes: object) -> RunSpec:
    """The spec with some backend options set (None = removed)."""
    opts = {**spec.opts, **changes}
    return spec.replace(options=tuple(sorted((k, v) for k, v in opts.items() if v is not None)))


def resolve_after(spec: RunSpec, attempt: int) -> RunSpec:
    """--after with a run dir -> the same with that run's Slurm job id; a resumed attempt has no
    --after."""
    after = spec.opts.get("after")
    if after is None:
        return spec
    if attempt > 0:
        return with_options(spec, after=None)
    target, kind = split_after(after)
    if JOB_ID.match(target):
        return spec
    return with_options(spec, after=f"{job_of(target, after)}:{kind}")


def job_of(target: str, given: str) -> str:
    """The Slurm job id of a run dir (its last submission) or of a sweep dir (its job array)."""
    path = os.path.abspath(target)
    if sweep.is_sweep_dir(path) and not layout.is_run_dir(path):
        job = sweep.read_record(path).get("slurm_array_job")
        if not job:
            raise LaunchError(
                f"--after {brief(given)}: the sweep {brief(path)} was not submitted as a Slurm job "
                f"array; accepted: {AFTER_ACCEPTED}"
            )
        return str(job)
    if not layout.is_run_dir(path):
        raise LaunchError(
            f"--after {brief(given)} is neither a run dir nor a Slurm job id; accepted: "
            f"{AFTER_ACCEPTED}"
        )
    rd = RunDir.open(path)
    backend = rd.read_run_yaml()["spec"]["backend"]
    job = str(rd.read_status().get("slurm_job_id") or "")
    if backend != "slurm" or not JOB_ID.match(job):
        what = f"a {backend} run" if backend != "slurm" else "a Slurm run that was never submitted"
        raise LaunchError(
            f"--after {brief(given)}: {brief(path)} is {what}, not a submitted Slurm run; "
            f"accepted: {AFTER_ACCEPTED}"
        )
    return job


NEVER = {
    "afterok": lambda s: s != "COMPLETED",
    "afternotok": lambda s: s == "COMPLETED",
    "afterany": lambda s: False,
}


def check_parent(spec: RunSpec) -> None:
    """Before submitting: the job --after names exists, and an ended one can still satisfy the
    dependency."""
    dep = dependency(spec)
    if dep is None:
        return
    kind, job_id = dep.split(":", 1)
    given = spec.opts["after"]
    job = slurm_status.ask_slurm(job_id)
    if job.state == "GONE":
        raise LaunchError(
            f"--after {brief(given)}: Slurm job {job_id} does not exist (not in squeue, scontrol "
            f"or sacct -c); accepted: {AFTER_ACCEPTED} of a queued, running or recently ended job"
        )
    if job.state == "UNKNOWN" or job.live:
        return
    if NEVER[kind](job.state):
        raise LaunchError(
            f"--after {brief(given)}: Slurm job {job_id} already ended {job.state}, so {kind} "
            "would never start this job; accepted: a dependency type its end satisfies"
        )
    if job.source == "sacct":
        raise LaunchError(
            f"--after {brief(given)}: Slurm job {job_id} ended {job.state} and Slurm no longer "
            "holds it (sbatch refuses such a dependency); nothing to wait for: submit without "
            "--after"
        )
