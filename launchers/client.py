"""The Python API: `from launchers import JobSpec, submit, Run, runs` (docs/API.md).

A layer over the CLI's verbs (launchers.api): the same checks and errors (LaunchError, a ValueError,
instead of exit code 2; TypeError for a wrong type), the same run dir and status. `submit` and
`Run.resume` never block: the launcher runs detached (launchers.detach) and they return once the run
is started.
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence, overload

from . import api, detach, layout
from .credentials.secretenv import handover
from .errors import LaunchError, LaunchWarning, TimedOut, brief
from .records.rundir import list_runs
from .request import JobSpec, SlurmOptions
from .runhandle import Run, RunStatus, api_notes, bool_arg
from .runjson import DryRun
from .spec import RunSpec as RecordedSpec

__all__ = [
    "JobSpec",
    "SlurmOptions",
    "Run",
    "RunStatus",
    "DryRun",
    "Sweep",
    "submit",
    "submit_sweep",
    "runs",
    "LaunchError",
    "LaunchWarning",
]


@dataclass(frozen=True)
class ClusterRun:
    """A run that lives on a cluster (submit(spec, cluster=NAME)): `path` is its run dir there;
    status(), wait() and cancel() go through the login node, as `launch status|wait|cancel RUN
    --cluster NAME` do."""

    cluster: str
    path: str
    run_id: str
    job_ids: tuple[str, ...] = ()

    def status(self) -> RunStatus:
        """The run's status as the login node's launch reads it."""
        from .ssh.clusterrun import ask, last_object

        code, text = ask("status", [self.path, "--json"], self.cluster)
        return RunStatus.from_dict(
            last_object(
                text, f"cluster {self.cluster}: launch status {self.path} (exit code {code})"
            )
        )

    def wait(self, timeout: float | None = None) -> RunStatus:
        """Until the run ends; its final status. TimeoutError after `timeout` seconds (`launch
        wait`'s 124)."""
        from .ssh.clusterrun import ask

        args = [self.path] + (["--timeout", f"{timeout:g}"] if timeout is not None else [])
        if ask("wait", args, self.cluster)[0] == TimedOut.exit_code:
            raise TimeoutError(
                f"run {self.path!r} on cluster {self.cluster} did not end within {timeout:g} s"
            )
        return self.status()

    def cancel(self) -> None:
        """Stop the run (`launch cancel RUN --cluster NAME`)."""
        from .ssh.clusterrun import ask

        code, _ = ask("cancel", [self.path], self.cluster)
        if code != 0:
            raise LaunchError(f"cluster {self.cluster}: launch cancel {self.path} exited {code}")


@overload
def submit(
    spec: JobSpec | RecordedSpec, dry_run: Literal[False] = False, cluster: None = None
) -> Run: ...


@overload
def submit(
    spec: JobSpec | RecordedSpec, dry_run: Literal[True], cluster: str | None = None
) -> DryRun: ...


@overload
def submit(spec: JobSpec, dry_run: Literal[False] = False, *, cluster: str) -> ClusterRun: ...


def submit(
    spec: JobSpec | RecordedSpec, dry_run: bool = False, cluster: str | None = None
) -> Run | DryRun | ClusterRun:
    """Start (local, SSH) or submit (Slurm) the job; returns its Run once started, without waiting
    for the end. dry_run=True starts nothing and returns a DryRun: `str(dry)` is what `launch
    BACKEND --dry-run` prints, `dry.run_dir` the run dir it would use (spec.resolve().run_dir),
    `dry.commands` each node's command. cluster=NAME (a Slurm JobSpec): submitted through that
    cluster's login node, as `launch slurm --cluster NAME` does; returns a ClusterRun (its run dir
    on the cluster; status, wait, cancel through the login node)."""
    if not isinstance(spec, (JobSpec, RecordedSpec)):
        raise TypeError(
            f"submit takes a launchers.JobSpec, got {type(spec).__name__} {brief(spec)}"
        )
    if cluster is not None:
        from .ssh import clusterrun

        if not isinstance(spec, JobSpec):
            raise TypeError(
                f"submit with cluster= takes a launchers.JobSpec, got {type(spec).__name__}"
            )
        with api_notes(spec.backend):
            got = clusterrun.submit(spec, cluster, bool_arg("dry_run", dry_run))
        return (
            got
            if isinstance(got, DryRun)
            else ClusterRun(
                cluster, got["run_dir"], got.get("run_id") or "", tuple(got.get("job_ids") or ())
            )
        )
    resolved = spec.resolve() if isinstance(spec, JobSpec) else spec
    if bool_arg("dry_run", dry_run):
        out, plans = io.StringIO(), []
        with api_notes(resolved.backend):
            api.submit(resolved, dry_run=True, out=out, plans=plans)
        return DryRun.of(out.getvalue(), plans)
    with api_notes(resolved.backend):
        detach.start(
            {"verb": "submit", "spec": resolved.to_dict()},
            resolved.run_dir,
            handover(resolved, os.environ),
        )
    return Run(resolved.run_dir)


@dataclass(frozen=True)
class Sweep:
    """A sweep (`launch BACKEND --sweep`): its dir and one run dir per combination, in order. Local
    and SSH runs start one after another (a run dir exists once its turn came); Slurm's are one job
    array."""

    path: str
    run_dirs: tuple[str, ...]

    def runs(self) -> list[Run]:
        """The runs started so far."""
        return [Run(d) for d in self.run_dirs if layout.is_run_dir(d)]

    def wait(self, timeout: float | None = None, interval: float = 1.0) -> list[RunStatus]:
        """Until every run ended; their final statuses in order. TimeoutError after `timeout`
        seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for d in self.run_dirs:
            while not layout.is_run_dir(d):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(
                        f"sweep {self.path!r}: run {d!r} not started after {timeout} s"
                    )
                time.sleep(interval)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            out.append(Run(d).wait(timeout=left, interval=interval))
        return out


def submit_sweep(
    spec: JobSpec, axes: Mapping[str, Sequence[Any]], dry_run: bool = False
) -> Sweep | DryRun:
    """`launch BACKEND --sweep KEY=V1,V2 ...` (`launchers.sweep` is the module of sweep records):
    one run per combination of `axes` ({"lr": [1e-3, 3e-4]}: `--lr V` appended to the program's
    args), under one sweep dir (the spec's run dir). Returns once the first run started (Slurm: the
    array queued); dry_run=True: a DryRun of every run's plan."""
    from .sweeprun import plan_sweep
    from .sweeprun import submit_sweep as sweep_verb

    if not isinstance(spec, JobSpec):
        raise TypeError(
            f"submit_sweep takes a launchers.JobSpec, got {type(spec).__name__} {brief(spec)}"
        )
    if not isinstance(axes, Mapping) or not axes:
        raise TypeError(
            "submit_sweep axes must be a non-empty mapping of name to values, got "
            f"{type(axes).__name__}"
        )
    items = [f"{k}={','.join(map(str, v))}" for k, v in axes.items()]
    resolved = spec.resolve()
    specs, _, _ = plan_sweep(resolved, items)
    if bool_arg("dry_run", dry_run):
        out = io.StringIO()
        with api_notes(resolved.backend):
            sweep_verb(resolved, items, dry_run=True, out=out)
        return DryRun(out.getvalue(), resolved.run_dir)
    with api_notes(resolved.backend):
        detach.start(
            {"verb": "sweep", "spec": resolved.to_dict(), "items": items},
            specs[0].run_dir,
            handover(resolved, os.environ),
        )
    return Sweep(resolved.run_dir, tuple(s.run_dir for s in specs))


def runs(root: str | os.PathLike | None = None) -> list[Run]:
    """`launch list`: the runs under the runs root (default $LAUNCH_RUNS_ROOT or ./runs), newest
    first; unreadable run dirs are left out."""
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(
            f"runs root must be a str or a path, got {type(root).__name__} {brief(root)}"
        )
    out = []
    for rd in list_runs(None if root is None else os.fspath(root)):
        try:
            out.append(Run(rd.path))
        except (LaunchError, OSError):
            continue
    return out
