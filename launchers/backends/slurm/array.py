"""A --sweep on Slurm: every run of the sweep is one task of one job array (`#SBATCH --array=0-N%P`).

Each run is a normal run dir under the sweep dir, planned, created and recorded as a single submission's
(status.json, run.yaml, slurm/spec-a0.json, slurm/jobs); only the script is shared: the sweep dir's
array script (submitit's array layout, its files in <sweep dir>/slurm/) runs
`task <sweep dir> --array` on every node, and the node task takes run number SLURM_ARRAY_TASK_ID of the
sweep record. Until node 0 of a task records its own job id, a run's job is `<array job>_<k>`, which
squeue, scontrol, scancel and sacct all accept; so status, logs, cancel and resume work per run.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import sys
from typing import Callable, TextIO

from ... import __version__, extcache, layout, manifest, snapshot, sweep
from ...errors import LaunchError
from ...rundir import RunDir, new_run_id
from ...spec import JobSpec
from ..base import Plan
from .backend import SlurmBackend, SubmitFailed, submit_script
from .nodespec import write_node_spec
from .render import header_for, render_sbatch
from .testonly import answer


def array_script(first: JobSpec, sweep_dir: str, runs: int, max_parallel: int | None) -> str:
    """The array's sbatch script: the first run's shape and options, the sweep dir, one task per run."""
    return render_sbatch(first.replace(run_dir=sweep_dir), base_attempt=0,
                         header=header_for(sys.argv[1:], __version__), array=(runs, max_parallel or runs))


def render_dry_run(script: str, plans: list[Plan], rec: dict) -> str:
    out = [f"# sweep dir: {rec['sweep_dir']} ({len(plans)} runs, one Slurm job array; task k = run k)",
           "# ---- sbatch script (the job array) ----", script.rstrip("\n"), "# ---- end of sbatch script ----"]
    for plan, run in zip(plans, rec["runs"]):
        out += ["", f"# ==== run {run['index']}: {shlex.join(run['args'])} ====",
                dataclasses.replace(plan, script=None).render().rstrip("\n")]
    return "\n".join(out) + "\n"


def submit_array(specs: list[JobSpec], rec: dict, max_parallel: int | None, dry_run: bool = False,
                 out: TextIO = sys.stdout, prepare: Callable[[JobSpec, str], None] | None = None) -> int:
    """Plan every run, then (not a dry-run) create the sweep dir and each run dir, and submit one job array."""
    backend, sweep_dir = SlurmBackend(), rec["sweep_dir"]
    plans = [backend.plan(s, new_run_id(s), attempt=0) for s in specs]
    script = array_script(plans[0].spec, sweep_dir, len(plans), max_parallel)
    if dry_run:
        out.write(render_dry_run(script, plans, rec) + answer(script))
        return 0
    backend.preflight(dataclasses.replace(plans[0], script=script))    # sbatch --test-only of the array
    snapshot.commit(plans[0].spec)                                     # --snapshot: every run's (one) snapshot
    extcache.make(plans[0].spec)                                       # their torch extensions' directory
    rds = create_runs(plans, rec, prepare)
    try:
        job = submit_script(plans[0].spec.replace(run_dir=sweep_dir), script, sweep_dir, 0)
    except SubmitFailed as e:
        shutil.rmtree(sweep_dir, ignore_errors=True)        # nothing ran: leave nothing behind
        raise LaunchError(f"sbatch refused the job array: {e}") from None
    for k, rd in enumerate(rds):
        with open(layout.path(rd.path, "slurm_jobs"), "a", encoding="utf-8") as f:
            f.write(f"0 {job}_{k}\n")
        rd.update_status(slurm_job_id=f"{job}_{k}")
    sweep.write_record(sweep_dir, dict(rec, slurm_array_job=job))
    print(f"slurm array job {job} queued: {len(rds)} runs (tasks 0-{len(rds) - 1}); sweep dir {sweep_dir}",
          flush=True)
    return follow_all(backend, rds) if plans[0].spec.opts.get("wait") else 0


def create_runs(plans: list[Plan], rec: dict, prepare: Callable[[JobSpec, str], None] | None) -> list[RunDir]:
    """The sweep dir, its record and one PENDING run dir per plan; on any failure none of them stays."""
    sweep_dir = rec["sweep_dir"]
    try:
        os.makedirs(sweep_dir)
    except OSError as e:
        raise LaunchError(f"sweep dir {sweep_dir!r} cannot be created ({e.strerror}); give another --run-dir") from None
    try:
        sweep.write_record(sweep_dir, rec)
        rds = []
        for plan in plans:
            rd = RunDir.create(plan.spec, plan.run_id, plan.record())
            manifest.write_launcher(rd.path, plan.spec, plan)
            rd.update_status(state="PENDING", attempt=0, nodes={}, first_failure=None, reason=None)
            write_node_spec(rd, plan.spec, plan.run_id, 0)
            if prepare is not None:
                prepare(plan.spec, plan.dist_backend)
            rds.append(rd)
        return rds
    except BaseException:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        raise


def follow_all(backend: SlurmBackend, rds: list[RunDir]) -> int:
    """--wait: follow each run in turn (the others keep running); 0 only if every run completed."""
    codes = []
    for rd in rds:
        print(f"launch: following {rd.path}", file=sys.stderr, flush=True)
        codes.append(backend.follow(rd))
        if codes[-1] == 130:
            return 130
    done = [backend.refresh(rd).get("state") for rd in rds]
    print(f"launch: sweep {os.path.dirname(rds[0].path)}: " + ", ".join(
        f"{done.count(s)} {s}" for s in sorted(set(done))), file=sys.stderr, flush=True)
    return 0 if all(s == "COMPLETED" for s in done) else 1
