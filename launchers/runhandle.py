"""A run as the Python API sees it (launchers.client, docs/API.md): Run (one run dir: status, wait,
logs, cancel, resume) and RunStatus (`launch status --json` as a value); api_notes turns what the
CLI's code prints into the API's warnings and log lines, and its LaunchErrors into the API's words;
the API's argument type checks."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, overload

from . import api, detach, layout
from .errors import LaunchError, LaunchWarning, brief
from .records import runindex
from .records.rundir import TERMINAL, RunDir
from .request import api_words
from .spec import RunSpec as RecordedSpec
from .spec import positive_int

log = logging.getLogger("launchers")


@dataclass(frozen=True)
class RunStatus:
    """A run's status as `launch status --json` gives it; `data` holds every field of that."""

    state: str  # PENDING RUNNING COMPLETED FAILED CANCELLED PREEMPTED REQUEUED
    attempt: int  # the current attempt (0 = the first)
    attempts: int  # attempts recorded in run.yaml
    reason: str | None  # why it ended so (a cancel, a hang, a dead launcher)
    nodes: dict[str, int | None]  # node -> exit code of this attempt's nodes that ended
    first_failure: dict[str, Any] | None  # node, rank, exit_code, signal, time of the first failure
    last_step: int | None  # the newest step any rank reported
    latest_checkpoint: str | None  # checkpoints/latest
    slurm_job_id: str | None
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, st: dict[str, Any]) -> "RunStatus":
        return cls(
            state=st["state"],
            attempt=st.get("attempt", 0),
            attempts=st.get("attempts", 0),
            reason=st.get("reason"),
            nodes=dict(st.get("nodes") or {}),
            first_failure=st.get("first_failure"),
            last_step=st.get("last_step"),
            latest_checkpoint=st.get("latest_checkpoint"),
            slurm_job_id=st.get("slurm_job_id"),
            data=st,
        )

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
            raise TypeError(
                f"Run path must be a str or a path, got {type(path).__name__} {brief(path)}"
            )
        # a path, a run name or a Slurm job id (runindex.resolve); its verbs open it again: resume,
        # cancel refuse
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
        """<run dir>/launcher.log: what a launcher started by this API printed (restarts, the end
        line)."""
        return layout.path(self.path, "launcher_log")

    def status(self, ranks: bool = False) -> RunStatus:
        """`launch status`: refreshed from the scheduler (Slurm) or the launcher's liveness."""
        return RunStatus.from_dict(api.status(self.path, ranks=bool_arg("ranks", ranks)))

    def wait(self, timeout: float | None = None, interval: float = 1.0) -> RunStatus:
        """Until the run ends; its final status (check .ok / .state). TimeoutError after `timeout`
        seconds."""
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float))
        ):
            raise TypeError(
                f"wait timeout must be a number of seconds or None, got {type(timeout).__name__}"
            )
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"wait timeout {timeout!r} is not accepted; give seconds >= 0 or None")
        return RunStatus.from_dict(api.wait_status(self.path, interval, timeout))

    @overload
    def logs(self, rank: int | None = None, follow: Literal[False] = False) -> str: ...

    @overload
    def logs(self, rank: int | None = None, follow: Literal[True] = ...) -> Iterator[str]: ...

    def logs(self, rank: int | None = None, follow: bool = False) -> str | Iterator[str]:
        """`launch logs`: every rank's lines prefixed "[nK rR] ", or one rank's as written.
        follow=False: what is there now (a str); follow=True: an iterator of lines (no newline) that
        ends when the run ends."""
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise TypeError(
                f"logs rank must be an int or None, got {type(rank).__name__} {brief(rank)}"
            )
        buf = io.StringIO()
        tail = api.log_tail(self.path, rank, out=buf)
        if not bool_arg("follow", follow):
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
        """`launch cancel`: stop the run on every node; returns once it is stopped (status
        CANCELLED). A run that already ended is left as it is (nothing written)."""
        api.cancel(self.path)

    def resume(
        self,
        *,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        max_restarts: int | None = None,
        program_args: tuple[str, ...] | list[str] | None = None,
        adopt: bool = False,
        snapshot: bool | None = None,
    ) -> "Run":
        """`launch resume`: a new attempt (optionally a new shape or new program args), continuing
        from checkpoints/latest. Returns once it is started, like submit. Refused while the run is
        active, and for a copy of another run dir unless adopt (`--adopt`: it becomes a run of its
        own, with a new run id). snapshot: None keeps the run's snapshot, True takes a new one of
        its tree, False runs from the tree."""
        for name, v in (("adopt", adopt), ("snapshot", snapshot)):
            if not isinstance(v, bool) and not (name == "snapshot" and v is None):
                raise TypeError(f"resume {name} must be a bool, got {type(v).__name__} {brief(v)}")
        changes = {
            k: count_arg(k, v, 0 if k == "max_restarts" else 1)
            for k, v in (
                ("nodes", nodes),
                ("gpus_per_node", gpus_per_node),
                ("max_restarts", max_restarts),
            )
        }
        changes["snapshot"] = snapshot
        args = None if program_args is None else list(words_arg(program_args))
        with api_notes(self.backend):
            detach.start(
                {
                    "verb": "resume",
                    "path": self.path,
                    "changes": changes,
                    "program_args": args,
                    "adopt": adopt,
                },
                self.path,
            )
        return self


@contextlib.contextmanager
def api_notes(backend: str) -> Iterator[None]:
    """What the CLI's code prints on stderr, in the API's ways: a `launch: WARNING` line ->
    warnings.warn (LaunchWarning), any other line -> logging (logger "launchers", INFO); a
    LaunchError in the API's words (JobSpec fields, not flags)."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            yield
    except LaunchError as e:
        raise type(e)(api_words(str(e), backend)) from None
    finally:
        for line in buf.getvalue().splitlines():
            if "WARNING" in line or "warning:" in line:
                warnings.warn(
                    api_words(line.removeprefix("launch: "), backend), LaunchWarning, stacklevel=4
                )
            elif line.strip():
                log.info(api_words(line.removeprefix("launch: "), backend))


def bool_arg(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {brief(value)}")
    return value


def count_arg(name: str, value: Any, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"resume {name} must be an int or None, got {type(value).__name__} {brief(value)}"
        )
    return positive_int(f"Run.resume {name}", value, minimum)


def words_arg(words: Any) -> tuple[str, ...]:
    if (
        isinstance(words, (str, bytes))
        or not isinstance(words, (tuple, list))
        or not all(isinstance(w, str) for w in words)
    ):
        raise TypeError(
            f"resume program_args must be a tuple or list of str, got {type(words).__name__} "
            f"{brief(words)}"
        )
    return tuple(words)
