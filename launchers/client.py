"""The Python API: `from launchers import JobSpec, submit, Run, runs` (docs/API.md).

A layer over the CLI's verbs (launchers.api): the same checks and errors (LaunchError, a ValueError, instead of
exit code 2; TypeError for a wrong type), the same run dir and status. `submit` and `Run.resume` never block:
the launcher runs detached (launchers.detach) and they return once the run is started.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Mapping, Sequence, overload

from . import api, detach, layout, runindex
from .errors import LaunchError, LaunchWarning, TimedOut, brief
from .request import JobSpec, SlurmOptions, api_words
from .rundir import TERMINAL, RunDir, list_runs
from .runjson import DryRun
from .secretenv import handover
from .spec import RunSpec as RecordedSpec
from .spec import positive_int

__all__ = ["JobSpec", "SlurmOptions", "Run", "RunStatus", "DryRun", "Sweep", "submit", "submit_sweep", "runs",
           "LaunchError", "LaunchWarning"]
log = logging.getLogger("launchers")


@dataclass(frozen=True)
class RunStatus:
    """A run's status as `launch status --json` gives it; `data` holds every field of that."""
    state: str                                  # PENDING RUNNING COMPLETED FAILED CANCELLED PREEMPTED REQUEUED
    attempt: int                                # the current attempt (0 = the first)
    attempts: int                               # attempts recorded in run.yaml
    reason: str | None                          # why it ended so (a cancel, a hang, a dead launcher)
    nodes: dict[str, int | None]                # node -> exit code of this attempt's nodes that ended
    first_failure: dict[str, Any] | None        # node, rank, exit_code, signal, time of the first failure
    last_step: int | None                       # the newest step any rank reported
    latest_checkpoint: str | None               # checkpoints/latest
    slurm_job_id: str | None
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, st: dict[str, Any]) -> "RunStatus":
        return cls(state=st["state"], attempt=st.get("attempt", 0), attempts=st.get("attempts", 0),
                   reason=st.get("reason"), nodes=dict(st.get("nodes") or {}), first_failure=st.get("first_failure"),
                   last_step=st.get("last_step"), latest_checkpoint=st.get("latest_checkpoint"),
                   slurm_job_id=st.get("slurm_job_id"), data=st)

    @property
    def done(self) -> bool:
        """The run has ended (COMPLETED, FAILED or CANCELLED)."""
        return self.state in TERMINAL

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"

    @property
    def end_line(self) -> str:
        """The CLI's end line, e.g. `launch: run FAILED (rank 2 on node 1, exit code 3)`."""
        return api.end_line(self.data)

    def __str__(self) -> str:
        return api.format_status(self.data)


class Run:
    """One run directory (made by `launch` or by submit). `Run(path)` opens an existing one."""

    def __init__(self, path: str | os.PathLike):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Run path must be a str or a path, got {type(path).__name__} {brief(path)}")
        # a path, a run name or a Slurm job id (runindex.resolve); its verbs open it again: resume, cancel refuse
        rd = RunDir.open(runindex.resolve(os.fspath(path)), read_only=True)
        data = rd.read_run_yaml()
        self.path: str = rd.path
        self.run_id: str = data["run_id"]
        self.backend: str = data["spec"]["backend"]

    def __repr__(self) -> str:
        return f"Run({self.path!r}, backend={self.backend!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and (self.path, self.run_id) == (other.path, other.run_id)

    def __hash__(self) -> int:
        return hash((self.path, self.run_id))

    @property
    def spec(self) -> RecordedSpec:
        """The spec as recorded in run.yaml (the last attempt's shape)."""
        return RunDir(self.path).spec()

    @property
    def launcher_log(self) -> str:
        """<run dir>/launcher.log: what a launcher started by this API printed (restarts, the end line)."""
        return layout.path(self.path, "launcher_log")

    def status(self, ranks: bool = False) -> RunStatus:
        """`launch status`: refreshed from the scheduler (Slurm) or the launcher's liveness."""
        return RunStatus.from_dict(api.status(self.path, ranks=_flag("ranks", ranks)))

    def wait(self, timeout: float | None = None, interval: float = 1.0) -> RunStatus:
        """Until the run ends; its final status (check .ok / .state). TimeoutError after `timeout` seconds."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
            raise TypeError(f"wait timeout must be a number of seconds or None, got {type(timeout).__name__}")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"wait timeout {timeout!r} is not accepted; give seconds >= 0 or None")
        return RunStatus.from_dict(api.wait_status(self.path, interval, timeout))

    @overload
    def logs(self, rank: int | None = None, follow: Literal[False] = False) -> str: ...

    @overload
    def logs(self, rank: int | None = None, follow: Literal[True] = ...) -> Iterator[str]: ...

    def logs(self, rank: int | None = None, follow: bool = False) -> str | Iterator[str]:
        """`launch logs`: every rank's lines prefixed "[nK rR] ", or one rank's as written. follow=False: what
        is there now (a str); follow=True: an iterator of lines (no newline) that ends when the run ends."""
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise TypeError(f"logs rank must be an int or None, got {type(rank).__name__} {brief(rank)}")
        buf = io.StringIO()
        tail = api.log_tail(self.path, rank, out=buf)
        if not _flag("follow", follow):
            tail.poll(final=True)
            return buf.getvalue()
        return self._follow(tail, buf)

    def _follow(self, tail, buf: io.StringIO) -> Iterator[str]:
        while True:
            finished = self.status().done
            tail.poll(final=finished)
            text = buf.getvalue()
            buf.seek(0)
            buf.truncate()
            yield from text.splitlines()
            if finished:
                return
            time.sleep(0.3)

    def cancel(self) -> None:
        """`launch cancel`: stop the run on every node; returns once it is stopped (status CANCELLED). A run that
        already ended is left as it is (nothing written)."""
        api.cancel(self.path)

    def resume(self, *, nodes: int | None = None, gpus_per_node: int | None = None,
               max_restarts: int | None = None, program_args: tuple[str, ...] | list[str] | None = None,
               adopt: bool = False, snapshot: bool | None = None) -> "Run":
        """`launch resume`: a new attempt (optionally a new shape or new program args), continuing from
        checkpoints/latest. Returns once it is started, like submit. Refused while the run is active, and for a
        copy of another run dir unless adopt (`--adopt`: it becomes a run of its own, with a new run id).
        snapshot: None keeps the run's snapshot, True takes a new one of its tree, False runs from the tree."""
        for name, v in (("adopt", adopt), ("snapshot", snapshot)):
            if not isinstance(v, bool) and not (name == "snapshot" and v is None):
                raise TypeError(f"resume {name} must be a bool, got {type(v).__name__} {brief(v)}")
        changes = {k: _count(k, v, 0 if k == "max_restarts" else 1)
                   for k, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("max_restarts", max_restarts))}
        changes["snapshot"] = snapshot
        args = None if program_args is None else list(_args(program_args))
        with _notes(self.backend):
            detach.start({"verb": "resume", "path": self.path, "changes": changes, "program_args": args,
                          "adopt": adopt}, self.path)
        return self


@dataclass(frozen=True)
class ClusterRun:
    """A run that lives on a cluster (submit(spec, cluster=NAME)): `path` is its run dir there; status(), wait()
    and cancel() go through the login node, as `launch status|wait|cancel RUN --cluster NAME` do."""
    cluster: str
    path: str
    run_id: str
    job_ids: tuple[str, ...] = ()

    def status(self) -> RunStatus:
        """The run's status as the login node's launch reads it."""
        from .clusterrun import ask, last_object
        code, text = ask("status", [self.path, "--json"], self.cluster)
        return RunStatus.from_dict(last_object(text, f"cluster {self.cluster}: launch status {self.path} "
                                                     f"(exit code {code})"))

    def wait(self, timeout: float | None = None) -> RunStatus:
        """Until the run ends; its final status. TimeoutError after `timeout` seconds (`launch wait`'s 124)."""
        from .clusterrun import ask
        args = [self.path] + (["--timeout", f"{timeout:g}"] if timeout is not None else [])
        if ask("wait", args, self.cluster)[0] == TimedOut.exit_code:
            raise TimeoutError(f"run {self.path!r} on cluster {self.cluster} did not end within {timeout:g} s")
        return self.status()

    def cancel(self) -> None:
        """Stop the run (`launch cancel RUN --cluster NAME`)."""
        from .clusterrun import ask
        code, _ = ask("cancel", [self.path], self.cluster)
        if code != 0:
            raise LaunchError(f"cluster {self.cluster}: launch cancel {self.path} exited {code}")


@overload
def submit(spec: JobSpec | RecordedSpec, dry_run: Literal[False] = False, cluster: None = None) -> Run: ...


@overload
def submit(spec: JobSpec | RecordedSpec, dry_run: Literal[True], cluster: str | None = None) -> DryRun: ...


@overload
def submit(spec: JobSpec, dry_run: Literal[False] = False, *, cluster: str) -> ClusterRun: ...


def submit(spec: JobSpec | RecordedSpec, dry_run: bool = False, cluster: str | None = None
           ) -> Run | DryRun | ClusterRun:
    """Start (local, SSH) or submit (Slurm) the job; returns its Run once started, without waiting for the end.
    dry_run=True starts nothing and returns a DryRun: `str(dry)` is what `launch BACKEND --dry-run` prints,
    `dry.run_dir` the run dir it would use (spec.resolve().run_dir), `dry.commands` each node's command.
    cluster=NAME (a Slurm JobSpec): submitted through that cluster's login node, as `launch slurm --cluster NAME`
    does; returns a ClusterRun (its run dir on the cluster; status, wait, cancel through the login node)."""
    if not isinstance(spec, (JobSpec, RecordedSpec)):
        raise TypeError(f"submit takes a launchers.JobSpec, got {type(spec).__name__} {brief(spec)}")
    if cluster is not None:
        from . import clusterrun
        if not isinstance(spec, JobSpec):
            raise TypeError(f"submit with cluster= takes a launchers.JobSpec, got {type(spec).__name__}")
        with _notes(spec.backend):
            got = clusterrun.submit(spec, cluster, _flag("dry_run", dry_run))
        return got if isinstance(got, DryRun) else ClusterRun(cluster, got["run_dir"], got.get("run_id") or "",
                                                              tuple(got.get("job_ids") or ()))
    resolved = spec.resolve() if isinstance(spec, JobSpec) else spec
    if _flag("dry_run", dry_run):
        out, plans = io.StringIO(), []
        with _notes(resolved.backend):
            api.submit(resolved, dry_run=True, out=out, plans=plans)
        return DryRun.of(out.getvalue(), plans)
    with _notes(resolved.backend):
        detach.start({"verb": "submit", "spec": resolved.to_dict()}, resolved.run_dir, handover(resolved, os.environ))
    return Run(resolved.run_dir)


@dataclass(frozen=True)
class Sweep:
    """A sweep (`launch BACKEND --sweep`): its dir and one run dir per combination, in order. Local and SSH runs
    start one after another (a run dir exists once its turn came); Slurm's are one job array."""
    path: str
    run_dirs: tuple[str, ...]

    def runs(self) -> list[Run]:
        """The runs started so far."""
        return [Run(d) for d in self.run_dirs if layout.is_run_dir(d)]

    def wait(self, timeout: float | None = None, interval: float = 1.0) -> list[RunStatus]:
        """Until every run ended; their final statuses in order. TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for d in self.run_dirs:
            while not layout.is_run_dir(d):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"sweep {self.path!r}: run {d!r} not started after {timeout} s")
                time.sleep(interval)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            out.append(Run(d).wait(timeout=left, interval=interval))
        return out


def submit_sweep(spec: JobSpec, axes: Mapping[str, Sequence[Any]], dry_run: bool = False) -> Sweep | DryRun:
    """`launch BACKEND --sweep KEY=V1,V2 ...` (`launchers.sweep` is the module of sweep records): one run per
    combination of `axes` ({"lr": [1e-3, 3e-4]}: `--lr V` appended to the program's args), under one sweep dir
    (the spec's run dir). Returns once the first run started (Slurm: the array queued); dry_run=True: a DryRun
    of every run's plan."""
    from .sweeprun import plan_sweep
    from .sweeprun import submit_sweep as sweep_verb
    if not isinstance(spec, JobSpec):
        raise TypeError(f"submit_sweep takes a launchers.JobSpec, got {type(spec).__name__} {brief(spec)}")
    if not isinstance(axes, Mapping) or not axes:
        raise TypeError(f"submit_sweep axes must be a non-empty mapping of name to values, got {type(axes).__name__}")
    items = [f"{k}={','.join(map(str, v))}" for k, v in axes.items()]
    resolved = spec.resolve()
    specs, _, _ = plan_sweep(resolved, items)
    if _flag("dry_run", dry_run):
        out = io.StringIO()
        with _notes(resolved.backend):
            sweep_verb(resolved, items, dry_run=True, out=out)
        return DryRun(out.getvalue(), resolved.run_dir)
    with _notes(resolved.backend):
        detach.start({"verb": "sweep", "spec": resolved.to_dict(), "items": items}, specs[0].run_dir,
                     handover(resolved, os.environ))
    return Sweep(resolved.run_dir, tuple(s.run_dir for s in specs))


@contextlib.contextmanager
def _notes(backend: str) -> Iterator[None]:
    """What the CLI's code prints on stderr, in the API's ways: a `launch: WARNING` line -> warnings.warn
    (LaunchWarning), any other line -> logging (logger "launchers", INFO); a LaunchError in the API's words
    (JobSpec fields, not flags)."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            yield
    except LaunchError as e:
        raise type(e)(api_words(str(e), backend)) from None
    finally:
        for line in buf.getvalue().splitlines():
            if "WARNING" in line or "warning:" in line:
                warnings.warn(api_words(line.removeprefix("launch: "), backend), LaunchWarning, stacklevel=4)
            elif line.strip():
                log.info(api_words(line.removeprefix("launch: "), backend))


def runs(root: str | os.PathLike | None = None) -> list[Run]:
    """`launch list`: the runs under the runs root (default $LAUNCH_RUNS_ROOT or ./runs), newest first;
    unreadable run dirs are left out."""
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"runs root must be a str or a path, got {type(root).__name__} {brief(root)}")
    out = []
    for rd in list_runs(None if root is None else os.fspath(root)):
        try:
            out.append(Run(rd.path))
        except (LaunchError, OSError):
            continue
    return out


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {brief(value)}")
    return value


def _count(name: str, value: Any, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"resume {name} must be an int or None, got {type(value).__name__} {brief(value)}")
    return positive_int(f"Run.resume {name}", value, minimum)


def _args(words: Any) -> tuple[str, ...]:
    if isinstance(words, (str, bytes)) or not isinstance(words, (tuple, list)) \
            or not all(isinstance(w, str) for w in words):
        raise TypeError(f"resume program_args must be a tuple or list of str, got {type(words).__name__} "
                        f"{brief(words)}")
    return tuple(words)
