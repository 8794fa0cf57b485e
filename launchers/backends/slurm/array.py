"""A --sweep on Slurm: every run of the sweep is one task of one job array (`#SBATCH
--array=0-N%P`).

Each run is a normal run dir under the sweep dir, planned, created and recorded as a single
submission's (status.json, run.yaml, slurm/spec-a0.json, slurm/jobs); only the script is shared: the
sweep dir's array script (submitit's array layout, its files in <sweep dir>/slurm/) runs `task
<sweep dir> --array` on every node, and the node task takes run number SLURM_ARRAY_TASK_ID of the
sweep record. Until node 0 of a task records its own job id, a run's job is `<array job>_<k>`, which
squeue, scontrol, scancel and sacct all accept; so status, logs, cancel and resume work per run.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import sys
from typing import Callable

from ... import __version__, layout, sweep
from ...errors import LaunchError
from ...records.rundir import RunDir, new_run_id
from ...spec import RunSpec
from ..base import Plan
from .backend import SlurmBackend
from .nodespec import write_node_spec
from .render import header_for, render_sbatch
from .submit import SubmitFailed, submit_script


def array_script(first: RunSpec, sweep_dir: str, runs: int, max_parallel: int | None) -> str:
    """The array's sbatch script: the first run's shape and options, the sweep dir, one task per
    run."""
    return render_sbatch(
        first.replace(run_dir=sweep_dir),
        base_attempt=0,
        header=header_for(sys.argv[1:], __version__),
        array=(runs, max_parallel or runs),
    )


def render_dry_run(script: str, plans: list[Plan], rec: dict) -> str:
    out = [
        f"# sweep dir: {rec['sweep_dir']} ({len(plans)} runs, one Slurm job array; task k = run k)",
        "# ---- sbatch script (the job array) ----",
        script.rstrip("\n"),
        "# ---- end of sbatch script ----",
    ]
    for plan, run in zip(plans, rec["runs"]):
        out += [
            "",
            f"# ==== run {run['index']}: {shlex.join(run['args'])} ====",
            dataclasses.replace(plan, script=None).render().rstrip("\n"),
        ]
    return "\n".join(out) + "\n"


def plan_array(
    specs: list[RunSpec], rec: dict, max_parallel: int | None
) -> tuple[SlurmBackend, list[Plan], str]:
    """Every run's plan and the array's script (the pipeline's plan stage of a sweep on Slurm)."""
    backend = SlurmBackend()
    plans = [backend.plan(s, new_run_id(s), attempt=0) for s in specs]
    return backend, plans, array_script(plans[0].spec, rec["sweep_dir"], len(plans), max_parallel)


def create_runs(
    plans: list[Plan], rec: dict, record: Callable[[RunDir, Plan], None]
) -> list[RunDir]:
    """The sweep dir, its record and one PENDING run dir per plan, each recorded as the pipeline
    records a run (record); on any failure none of them stays."""
    sweep_dir = rec["sweep_dir"]
    try:
        os.makedirs(sweep_dir)
    except OSError as e:
        raise LaunchError(
            f"sweep dir {sweep_dir!r} cannot be created ({e.strerror}); give another --run-dir"
        ) from None
    try:
        sweep.write_record(sweep_dir, rec)
        rds = []
        for plan in plans:
            rd = RunDir.create(plan.spec, plan.run_id, plan.record())
            record(rd, plan)
            rd.update_status(state="PENDING", attempt=0, nodes={}, first_failure=None, reason=None)
            write_node_spec(rd, plan.spec, plan.run_id, 0)
            rds.append(rd)
        return rds
    except BaseException:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        raise


def submit_array(
    backend: SlurmBackend, plans: list[Plan], rds: list[RunDir], script: str, rec: dict
) -> int:
    """One sbatch of the array for the created run dirs; each run records its task's job id
    (`<job>_<k>`)."""
    sweep_dir = rec["sweep_dir"]
    try:
        job = submit_script(plans[0].spec.replace(run_dir=sweep_dir), script, sweep_dir, 0)
    except SubmitFailed as e:
        shutil.rmtree(sweep_dir, ignore_errors=True)  # nothing ran: leave nothing behind
        raise LaunchError(f"sbatch refused the job array: {e}") from None
    for k, rd in enumerate(rds):
        with open(layout.path(rd.path, "slurm_jobs"), "a", encoding="utf-8") as f:
            f.write(f"0 {job}_{k}\n")
        rd.update_status(slurm_job_id=f"{job}_{k}")
    sweep.write_record(sweep_dir, dict(rec, slurm_array_job=job))
    print(
        f"slurm array job {job} queued: {len(rds)} runs (tasks 0-{len(rds) - 1}); sweep dir "
        f"{sweep_dir}",
        flush=True,
    )
    return follow_all(backend, rds) if plans[0].spec.opts.get("wait") else 0


def follow_all(backend: SlurmBackend, rds: list[RunDir]) -> int:
    """--wait: follow each run in turn (the others keep running); 0 only if every run completed."""
    codes = []
    for rd in rds:
        print(f"launch: following {rd.path}", file=sys.stderr, flush=True)
        codes.append(backend.follow(rd))
        if codes[-1] == 130:
            return 130
    done = [backend.refresh(rd).get("state") for rd in rds]
    print(
        f"launch: sweep {os.path.dirname(rds[0].path)}: "
        + ", ".join(f"{done.count(s)} {s}" for s in sorted(set(done))),
        file=sys.stderr,
        flush=True,
    )
    return 0 if all(s == "COMPLETED" for s in done) else 1
