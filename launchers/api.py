"""The launcher's verbs, used by the CLI: submit = start(plan()), resume, cancel, status, wait
(status and wait: launchers.runstatus, handed out here; the backend a spec names:
launchers.backendof).

One flow for every backend: spec -> NCCL env resolved and validated -> backend.plan -> (dry-run
prints it) -> run dir created -> backend.start. Local and SSH attempts are looped by
launchers.resilience.restarts (the launcher owns restarts: the recovery policy decides each).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from . import layout, pipeline
from .backendof import get_backend
from .errors import LaunchError
from .ledgers import nodeledger
from .records import rundircheck, runindex
from .records.rundir import TERMINAL, RunDir, new_run_id
from .resilience.restarts import end_line, plan_on, pool_of, run_attempts  # noqa: F401  (api.end_line: runhandle, tests)
from .runstatus import format_status, status, wait, wait_status  # noqa: F401  (their home: runstatus; used from here)

# what only submit and resume need is imported there: `launch status` starts in half the time
if TYPE_CHECKING:
    from .backends.base import Backend
    from .spec import RunSpec


def submit(
    spec: RunSpec, dry_run: bool = False, out: TextIO = sys.stdout, plans: list | None = None
) -> int:
    """Start the job; its exit code. A dry run writes what would run to `out` (and its plan to
    `plans`)."""
    return pipeline.run(Submit(), spec, dry_run, out, plans)


class Submit:
    """submit's verb in the pipeline: attempt 0 of a new run, in a run dir created for it."""

    backend: Backend
    run_id: str

    def plan(self, spec: RunSpec) -> list:
        self.backend, self.run_id = get_backend(spec.backend), new_run_id(spec)
        # a backend may settle the shape (ssh: hosts)
        return [self.backend.plan(spec, self.run_id, attempt=0)]

    def dry_text(self, plans: list) -> str:
        return pipeline.what_would_run(plans[0])

    def preflight(self, plans: list) -> tuple[list, dict[str, Any] | None]:
        plan, found = pipeline.preflight(self.backend, plans[0], pool_of(plans[0].spec, None))
        return [plan], found

    def open(self, plans: list, record: pipeline.Record) -> list[RunDir]:
        rd = RunDir.create(plans[0].spec, self.run_id, plans[0].record())
        record(rd, plans[0])
        return [rd]

    def start(self, rds: list[RunDir], plans: list) -> int:
        print(f"launch: run dir {rds[0].path}", file=sys.stderr)
        return attempts(self.backend, plans[0], rds[0])


def attempts(backend, plan, rd: RunDir) -> int:
    """restarts.run_attempts; then the run's in-memory checkpoints go from its nodes
    (--memory-checkpoint: Backend.forget_memory; each rank of a completed run removes its own files,
    on every backend)."""
    try:
        return run_attempts(backend, plan.spec, rd, plan, plan.spec.max_restarts)
    finally:
        backend.end_run(plan)
        if plan.spec.memory_checkpoint:
            backend.forget_memory(plan)


def resume(
    path: str,
    changes: dict[str, Any],
    program_args: tuple[str, ...] | None = None,
    dry_run: bool = False,
    out: TextIO = sys.stdout,
    adopt: bool = False,
    requeued: str | None = None,
    plans: list | None = None,
) -> int:
    """A new attempt of the recorded spec (optionally a new shape or new program args), run where
    the run dir is now: a moved run dir resumes into itself; a copy is refused unless adopted (a new
    run id). The run's snapshot is kept unless changes["snapshot"] says otherwise (True: a new one
    of its tree; False: none). requeued: the attempt's reason when Slurm requeued the user's job
    that runs it (continue_requeued: nothing of the run's earlier attempts is alive, no busy check).
    path: a run dir, a run name or a Slurm job id (resolve)."""
    verb = Resume(RunDir.open(runindex.resolve(path)), adopt, requeued)
    return pipeline.run(verb, verb.spec_of(changes, program_args), dry_run, out, plans)


class Resume:
    """resume's verb in the pipeline: the next attempt of a recorded run, claimed in its run dir."""

    def __init__(self, rd: RunDir, adopt: bool, requeued: str | None) -> None:
        from . import trust
        from .credentials.secretenv import refuse_missing

        # another's run dir names a program and --notify (issue 35)
        if why := trust.record_refusal(rd.path):
            raise LaunchError(why)
        self.rd, self.adopt, self.requeued, self.data = rd, adopt, requeued, rd.read_run_yaml()
        # a secret is never `***` to the program
        refuse_missing(self.data["spec"], os.environ, rd.path)
        self.backend, original = get_backend(self.data["spec"]["backend"]), copy_of(rd, self.data)
        if bool(original) != adopt:
            raise LaunchError(
                f"run dir {rd.path!r} is a copy of {original!r} (run id {self.data['run_id']}); "
                f"`launch resume --adopt {rd.path}` resumes the copy as a run of its own (a new "
                "run id)"
                if original
                else f"--adopt is only for a copy of another run dir; {rd.path!r} is not "
                "one: resume it without"
            )
        if not adopt and not requeued:  # an adopted copy's recorded state is the original's
            _refuse_busy(self.backend, rd)

    def spec_of(self, changes: dict[str, Any], program_args: tuple[str, ...] | None) -> RunSpec:
        """The recorded spec with the changes asked for, run where the run dir is now."""
        from .frozen import snapshot

        # N: fixed
        changes = dict(
            changes, **({"min_nodes": 0, "max_nodes": 0} if changes.get("nodes") else {})
        )
        # a run that had none: beside it
        store = snapshot.store_for(self.rd.path, os.path.dirname(self.rd.path))
        spec = snapshot.for_resume(self.rd.spec(), changes.pop("snapshot", None), store)
        spec = spec.replace(
            run_dir=self.rd.path, **{k: v for k, v in changes.items() if v is not None}
        )
        if program_args is not None:
            spec = spec.replace(program_args=_strip_program(spec.program, tuple(program_args)))
        return spec

    def plan(self, spec: RunSpec) -> list:
        # nothing is written through a symlink out of the run dir
        rundircheck.check_own_dirs(self.rd.path)
        self.run_id = new_run_id(spec) if self.adopt else self.data["run_id"]
        # quarantined: left out; MIN:MAX back
        self.pool = pool_of(spec, nodeledger.read(self.rd.path), resume=True)
        return [plan_on(self.backend, spec, self.run_id, len(self.data["attempts"]), self.pool)]

    def dry_text(self, plans: list) -> str:
        return pipeline.what_would_run(plans[0])

    def preflight(self, plans: list) -> tuple[list, dict[str, Any] | None]:
        plan, found = pipeline.preflight(self.backend, plans[0], self.pool)
        return [plan], found

    def open(self, plans: list, record: pipeline.Record) -> list[RunDir]:
        rd, data, plan = self.rd, self.data, plans[0]
        if self.adopt:
            rd.write_run_yaml(
                dict(
                    data,
                    run_id=self.run_id,
                    adopted_from={"run_id": data["run_id"], "run_dir": data["spec"]["run_dir"]},
                )
            )
        # moved or adopted: `launch list` finds it where it is now
        if data["spec"]["run_dir"] != rd.path:
            runindex.note(rd.path)
        rd.claim_attempt(
            plan.spec,
            dict(plan.record(), by=self.requeued or "launch resume"),
            plan.attempt,
            (lambda st: None)
            if self.adopt or self.requeued
            else (lambda st: _busy_line(self.backend, rd, st)),
        )  # under the lock
        record(rd, plan)
        return [rd]

    def start(self, rds: list[RunDir], plans: list) -> int:
        return attempts(self.backend, plans[0], rds[0])


def requeued(backend: str, run_dir: str | None):
    """Inside the user's Slurm allocation after Slurm requeued the job: the verdict to continue the
    existing `--run-dir` (launchers.backends.slurm.inalloc), else None (the usual launch, and its
    refusal)."""
    if backend != "slurm" or not run_dir:
        return None
    from .backends.slurm.inalloc import requeued_run

    return requeued_run(run_dir)


def continue_requeued(spec: RunSpec, dry_run: bool = False, out: TextIO = sys.stdout) -> int:
    """The run in spec.run_dir continues after Slurm requeued the user's job: `launch resume` of the
    recorded spec (one line says so), unless the command line given again differs from it (one line
    naming it)."""
    from .backends.slurm.env import SlurmEnv
    from .backends.slurm.inalloc import continuing_line, verdict
    from .resilience.restarts import resume_point

    rd, env = RunDir.open(spec.run_dir), SlurmEnv.read()
    v = verdict(env, rd.read_status(), rd.read_run_yaml(), spec.to_dict(), rd.path)
    if v.action != "continue":
        raise LaunchError(
            v.line or f"run dir {rd.path!r} already exists; use `launch resume {rd.path}` ({v.why})"
        )
    print(continuing_line(v, env, rd.path, resume_point(rd)), file=sys.stderr, flush=True)
    return resume(rd.path, {}, dry_run=dry_run, out=out, requeued=v.why)


def _busy_line(backend: Backend, rd: RunDir, st: dict[str, Any]) -> str | None:
    from .backends.base import busy_line

    why = backend.busy(st)
    return busy_line(rd.path, why) if why else None


def _refuse_busy(backend: Backend, rd: RunDir) -> None:
    """A first look, before planning: the backend's full view (Slurm asks the scheduler, a local
    run's processes are looked for); resume() checks status.json again under the lock as it adds its
    attempt."""
    st = rd.read_status()
    why = backend.busy(st)
    if not why and backend.active(rd):
        state = backend.refresh(rd).get("state")
        why = (
            f"still {state}"
            if state not in TERMINAL
            else f"{state} with processes of it still alive"
        )
    if why:
        from .backends.base import busy_line

        raise LaunchError(busy_line(rd.path, why))


def copy_of(rd: RunDir, data: dict[str, Any]) -> str | None:
    """The run dir this one is a copy of: the location run.yaml records, when that is another
    directory holding a run of the same run id (None: it is where it was made, or it was moved)."""
    recorded = data["spec"]["run_dir"]
    try:
        if (
            os.path.samefile(recorded, rd.path)
            or RunDir(recorded).read_run_yaml()["run_id"] != data["run_id"]
        ):
            return None
    except (OSError, LaunchError):  # gone or not a run dir any more: moved, not copied
        return None
    return recorded


def _strip_program(program: tuple[str, ...], words: tuple[str, ...]) -> tuple[str, ...]:
    """New args after `--` may repeat the recorded program (`-m mod ...` or `train.py ...`); drop it
    then."""
    if words[: len(program)] == program:
        return words[len(program) :]
    if len(program) == 1 and words and os.path.abspath(words[0]) == program[0]:
        return words[1:]
    return words


def cancel(path: str) -> str | None:
    """Stop the run; None once stopped. A run that already ended is left as it is (nothing written):
    its state is returned (COMPLETED, FAILED, CANCELLED: launchers.stops.ENDINGS)."""
    from . import sweep, trust

    path = runindex.resolve(path)
    # a sweep: each of its runs not yet ended
    if sweep.is_sweep_dir(path) and not layout.is_run_dir(path):
        for d in sweep.member_dirs(path):
            if status(d)["state"] not in TERMINAL:
                cancel(d)
        return None
    rd = RunDir.open(path)
    data = rd.read_run_yaml()
    original, backend = copy_of(rd, data), get_backend(data["spec"]["backend"])
    st = rd.read_status() if original else backend.refresh(rd)
    if original:  # its run id (processes) is the original's: an ended one has nothing to stop
        if st.get("state") not in TERMINAL:
            raise LaunchError(
                f"run dir {rd.path!r} is a copy of {original!r} and runs nothing; `launch cancel "
                f"{original}` stops the original"
            )
        return st["state"]
    # nothing starting, running or left over (a dead launcher's: swept)
    if (
        st.get("state") in TERMINAL
        and st.get("surviving_pids") is None
        and not backend.busy(st)
        and not backend.active(rd)
    ):
        return st["state"]
    ssh = data["spec"]["backend"] == "ssh" and trust.ssh_refusal(
        rd.path, data["spec"].get("options") or {}
    )
    slurm = None
    if (
        data["spec"]["backend"] == "slurm"
        and not st.get("in_allocation")
        and st.get("slurm_job_id")
    ):
        from .backends.slurm.status import job_files  # the one owner of `scontrol show job`

        slurm = trust.slurm_refusal(rd.path, st["slurm_job_id"], job_files)
    if why := trust.cancel_refusal(rd.path, data["run_id"], st) or ssh or slurm:
        # a copied or crafted run dir proves nothing (issue 35, docs/SECURITY.md)
        raise LaunchError(why)
    backend.cancel(rd)
    return None


def log_tail(path: str, rank: int | None = None, out: TextIO | None = None, raw: bool = False):
    """`launch logs`: a LogTail over the run's rank logs (one rank's, unprefixed); a rank without a
    log is refused, naming the world size and the ranks that have one."""
    from .follow import follower

    rd = RunDir.open(runindex.resolve(path), read_only=True)
    ranks = sorted({r for _, r, _ in rd.rank_logs()})
    if rank is not None and rank not in ranks:
        spec = rd.spec()
        raise LaunchError(
            f"--rank {rank} has no log in {rd.path} (world size {spec.world_size}: {spec.nodes} "
            f"nodes x {spec.gpus_per_node}); accepted: {', '.join(map(str, ranks)) or 'none yet'}"
        )
    return follower(rd.path, rank=rank, out=out, prefix=rank is None, reader=True, raw=raw)


def list_runs(root: str | None = None) -> list[dict[str, Any]]:
    """`launch list`'s rows (launchers.runjson.list_rows: the human age and ISO-8601 times)."""
    from .runjson import list_rows

    return list_rows(root)
