"""The one submission pipeline: every launch passes through the same named stages, in this order.

    settle     the job's env resolved (launchers.jobenv), its snapshot hashed (snapshot.take), its
               torch extension dir named (extcache.settle)
    plan       the verb's plans: one per run (backend.plan / restarts.plan_on; a Slurm job array:
               one per task)
    --dry-run  the pipeline stops here and prints what would run (what_would_run, or the verb's own
               text)
    preflight  the backend's checks (sbatch --test-only, SSH reach ...) and --preflight gpu
    commit     the snapshot written and the extension dir made: once per launch
    open       the run dir(s): created (submit, each run of an array) or the next attempt claimed
               (resume)
    record     per run dir: --preflight gpu's findings, the launcher's manifest part, NCCL's dump
               dirs
    start      the backend starts the nodes: restarts.run_attempts, or sbatch of the array

A verb (api.Submit, api.Resume, sweeprun.Array) says only how it plans, opens and starts; a per-run
concern (snapshot, extension cache, preflight, manifest, NCCL dirs) is a stage here, written once.
Submit, resume (a requeued job's too), every run of a sweep done one after another, a Slurm job
array, `--after` (an sbatch option of the plan) and `--cluster` (the login node's own launch) all go
through run().
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol, TextIO

from . import layout
from .errors import LaunchError
from .frozen import extcache, snapshot
from .records import manifest

if TYPE_CHECKING:
    from .backends.base import Plan
    from .records.rundir import RunDir
    from .spec import RunSpec

STAGES = ("settle", "plan", "preflight", "commit", "open", "record", "start")
Record = Callable[["RunDir", "Plan"], None]


class Verb(Protocol):
    def plan(self, spec: RunSpec) -> list[Plan]: ...
    def dry_text(self, plans: list[Plan]) -> str: ...
    def preflight(self, plans: list[Plan]) -> tuple[list[Plan], dict[str, Any] | None]: ...
    def open(self, plans: list[Plan], record: Record) -> list[RunDir]: ...
    def start(self, rds: list[RunDir], plans: list[Plan]) -> int: ...


def run(
    verb: Verb,
    spec: RunSpec,
    dry_run: bool = False,
    out: TextIO = sys.stdout,
    plans: list | None = None,
) -> int:
    """The stages in order (the module's doc); the launch's exit code. A dry run writes what would
    run to `out` (and its plans to `plans`) and starts nothing."""
    planned = verb.plan(settle(spec))
    if dry_run:
        (plans if plans is not None else []).extend(planned)
        out.write(verb.dry_text(planned))
        return 0
    preload("yaml")  # run.yaml's writer (open), imported while the preflight waits on its checks
    # the manifest's git fields too (a resume may keep those it recorded)
    if planned[0].attempt == 0:
        manifest.prefetch_git(planned[0].spec.snapshot_from or os.getcwd())
    planned, found = verb.preflight(planned)
    commit(planned[0].spec)
    from .backends.base import synced_together

    rds: list[RunDir] = []
    try:
        # the run dirs' files: on disk before anything starts, in one flush's wait
        with synced_together():
            rds = verb.open(planned, lambda rd, plan: record(rd, plan, found))
    except LaunchError:  # the flush failed (once open returned): a new run dir is left to no one
        # (nothing ran in it); a resumed one keeps everything its job wrote
        if planned[0].attempt == 0:
            for rd in rds:
                shutil.rmtree(rd.path, ignore_errors=True)
        raise
    return verb.start(rds, planned)


def preload(name: str) -> None:
    """Import `name` in a thread. The preflight mostly waits (a child python, a host's or Slurm's
    answer), so an import the later stages need costs the start path nothing there (a later import
    waits on Python's import lock for this one); a failure stays the later import's to say."""
    if name in sys.modules:
        return

    def run() -> None:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001
            pass

    threading.Thread(target=run, daemon=True, name="launch-preload").start()


def settle(spec: RunSpec) -> RunSpec:
    from .jobenv import resolve_job_env

    # --snapshot: named; written later
    return extcache.settle(snapshot.take(resolve_job_env(spec, sys.stderr)))


def what_would_run(plan: Plan) -> str:
    """A dry-run's text for one run: what the snapshot holds, the extension dir, the plan, Slurm's
    answer."""
    spec = plan.spec
    script = plan.script if spec.backend == "slurm" else None
    return launch_lines(spec) + plan.render() + test_only(script)


def launch_lines(spec: RunSpec) -> str:
    """The dry-run's lines of the launch itself: what the snapshot holds and the extension dir."""
    return snapshot.dry_run_line(spec) + extcache.dry_run_line(spec)


def test_only(script: str | None) -> str:
    """A Slurm dry-run ends with Slurm's own answer to its script (sbatch --test-only: nothing
    submitted)."""
    if script is None:
        return ""
    from .backends.slurm.testonly import answer

    return answer(script)


def preflight(backend: Any, plan: Plan, pool: Any) -> tuple[Plan, dict[str, Any] | None]:
    """The backend's own checks, then --preflight gpu (launchers.doctor.preflight.gate; --spares:
    every slot of `pool`): the plan that passed (a gate may replace a node) and what the gate
    found."""
    backend.preflight(plan)
    if "gpu" not in plan.spec.preflight:
        return plan, None
    from .doctor.preflight import gate

    return gate(backend, plan, pool)


def commit(spec: RunSpec) -> None:
    snapshot.commit(spec)  # --snapshot: written (once; every run of an array shares it)
    extcache.make(spec)  # the torch extensions' directory


def record(rd: RunDir, plan: Plan, found: dict[str, Any] | None) -> None:
    """What a run dir records of its launch once it exists: the GPU gate's findings, the launcher's
    manifest part, and the directories NCCL writes its dumps into (it does not create them)."""
    spec = plan.spec
    if found:
        from .doctor.preflight import record as gpu_record

        gpu_record(rd.path, spec, plan.attempt, found)
    manifest.write_launcher(rd.path, spec, plan)
    if plan.dist_backend == "nccl":
        os.makedirs(layout.path(spec.run_dir, "nccl"), exist_ok=True)  # the flight recorder's dumps
    if not spec.nccl_env:
        return
    from nccl_tuning.apply import required_dirs

    for d in required_dirs(dict(spec.nccl_env)):
        if os.path.abspath(d).startswith(spec.run_dir + os.sep):
            os.makedirs(d, exist_ok=True)
