"""`launch BACKEND ... --sweep KEY=V1,V2 [--sweep ...]`: one normal run per combination under one
sweep dir.

Slurm (outside an allocation): one job array (launchers.backends.slurm.array), --max-parallel tasks
at once. Local, SSH and inside a Slurm allocation: the runs one after another, each exactly `launch
BACKEND` with its own run dir (api.submit); an interrupted run ends the sweep. The expansion and
naming are launchers.sweep.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shlex
import sys
import time
from typing import Iterable, TextIO

from . import api, pipeline, sweep
from .errors import LaunchError
from .options.specvalues import positive_int
from .spec import RunSpec


def plan_sweep(spec: RunSpec, items: Iterable[str]) -> tuple[list[RunSpec], dict, int | None]:
    """The runs' specs (spec.run_dir is the sweep dir), the sweep record and --max-parallel."""
    axes = sweep.parse_axes(items)
    combos = sweep.expand(axes)
    opts = spec.opts
    par = opts.pop("max_parallel", None)
    par = positive_int("--max-parallel", par, maximum=sweep.MAX_RUNS) if par is not None else None
    base = spec.replace(options=tuple(sorted(opts.items())))
    rec = sweep.record(
        spec.run_dir,
        spec.backend,
        axes,
        combos,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        program=[*spec.program, *spec.program_args],
    )
    specs = [
        base.replace(run_dir=d, program_args=(*base.program_args, *c.args))
        for c, d in zip(combos, sweep.run_dirs(spec.run_dir, combos))
    ]
    return specs, rec, par


def submit_sweep(
    spec: RunSpec, items: Iterable[str], dry_run: bool = False, out: TextIO = sys.stdout
) -> int:
    specs, rec, par = plan_sweep(spec, items)
    if spec.backend == "slurm":
        from .backends.slurm.env import SlurmEnv

        if not SlurmEnv.read().in_allocation:
            return pipeline.run(Array(specs, rec, par), specs[0], dry_run, out)
    if par is not None:
        raise LaunchError(
            f"--max-parallel {par} applies to a Slurm job array; inside an allocation the runs of "
            "a sweep go one after another: leave --max-parallel out"
        )
    return one_after_another(specs, rec, dry_run, out)


class Array:
    """A sweep on Slurm as the pipeline's verb: the first run's spec settled once for all (one
    snapshot, one extension dir), a plan per run and one script, sbatch --test-only of the array,
    every run dir created together (none stays if one fails), one sbatch
    (launchers.backends.slurm.array)."""

    def __init__(self, specs: list[RunSpec], rec: dict, max_parallel: int | None) -> None:
        self.specs, self.rec, self.max_parallel = specs, rec, max_parallel

    def plan(self, base: RunSpec) -> list:
        from .backends.slurm.array import plan_array

        specs = [base.replace(run_dir=s.run_dir, program_args=s.program_args) for s in self.specs]
        self.backend, plans, self.script = plan_array(specs, self.rec, self.max_parallel)
        return plans

    def dry_text(self, plans: list) -> str:
        from .backends.slurm.array import render_dry_run

        return (
            pipeline.launch_lines(plans[0].spec)
            + render_dry_run(self.script, plans, self.rec)
            + pipeline.test_only(self.script)
        )

    def preflight(self, plans: list) -> tuple[list, None]:
        # sbatch --test-only
        self.backend.preflight(dataclasses.replace(plans[0], script=self.script))
        return plans, None

    def open(self, plans: list, record: pipeline.Record) -> list:
        from .backends.slurm.array import create_runs

        return create_runs(plans, self.rec, record)

    def start(self, rds: list, plans: list) -> int:
        from .backends.slurm.array import submit_array

        return submit_array(self.backend, plans, rds, self.script, self.rec)


def one_after_another(specs: list[RunSpec], rec: dict, dry_run: bool, out: TextIO) -> int:
    """Each run as its own `launch BACKEND`; every run is planned (checked) before the first
    starts."""
    runs = rec["runs"]
    for s, run in zip(specs, runs):
        buf = out if dry_run else io.StringIO()
        if dry_run:
            out.write(f"# ==== run {run['index']} of {len(runs)}: {shlex.join(run['args'])} ====\n")
        api.submit(s, dry_run=True, out=buf)
    if dry_run:
        return 0
    try:
        os.makedirs(rec["sweep_dir"])
    except OSError as e:
        raise LaunchError(
            f"sweep dir {rec['sweep_dir']!r} cannot be created ({e.strerror}); give another "
            "--run-dir"
        ) from None
    sweep.write_record(rec["sweep_dir"], rec)
    codes = []
    for s, run in zip(specs, runs):
        print(
            f"launch: sweep run {run['index'] + 1} of {len(runs)}: {shlex.join(run['args'])}",
            file=sys.stderr,
            flush=True,
        )
        codes.append(api.submit(s))
        if codes[-1] in (130, 143):  # interrupted / terminated: the sweep stops here
            break
    ok = sum(c == 0 for c in codes)
    print(
        f"launch: sweep {rec['sweep_dir']}: {ok} of {len(runs)} runs succeeded"
        + (f", {len(runs) - len(codes)} not started" if len(codes) < len(runs) else ""),
        file=sys.stderr,
    )
    return 0 if ok == len(runs) else (codes[-1] if codes[-1] in (130, 143) else 1)
