"""What scripts read (issue 36): `--json` of the verbs that start, resume, wait for or cancel a run
(one JSON object on stdout, the human lines on stderr), `launch list`'s rows with ISO-8601 times
beside the human ages, and a dry run as an object (DryRun: its text, the run dir it would use, each
node's command).
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import io
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import layout, sweep
from .errors import TimedOut
from .records import rundircheck, runindex
from .records.rundir import RunDir
from .records.rundir import list_runs as _list


def iso(t: float | None) -> str | None:
    """Epoch seconds -> `2026-12-06T05:00:00Z` (UTC, whole seconds); None stays None."""
    if t is None:
        return None
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_stamp(stamp: Any) -> str | None:
    """run.yaml's local-time stamp (`2026-12-06T06:00:00.123`, rundir.now) -> ISO-8601 UTC; None if
    not one."""
    try:
        return iso(time.mktime(time.strptime(str(stamp).split(".")[0], "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        return None


@dataclass(frozen=True)
class DryRun:
    """What a dry run would do (`submit(spec, dry_run=True)`, `launch ... --dry-run --json`); str()
    is the text `--dry-run` prints."""

    text: str
    run_dir: str
    # node rank -> its command line (a Slurm job: its srun)
    commands: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # node rank -> host where the backend knows them

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "run_dir": self.run_dir,
            "commands": list(self.commands),
            "hosts": list(self.hosts),
            "text": self.text,
        }

    @classmethod
    def of(cls, text: str, plans: list[Any]) -> "DryRun":
        plan = plans[-1] if plans else None
        rec = plan.record() if plan is not None else {}
        return cls(
            text,
            plan.spec.run_dir if plan is not None else "",
            list(rec.get("commands") or []),
            list(rec.get("hosts") or []),
        )


def run_record(path: str, exit_code: int | None = None) -> dict[str, Any]:
    """A run as a script reads it: run dir, run id, backend, state (as recorded), Slurm job ids, ISO
    times; a sweep dir: its runs; a path holding no run (nothing was made): state None."""
    code = {} if exit_code is None else {"exit_code": exit_code}
    if sweep.is_sweep_dir(path) and not layout.is_run_dir(path):
        return {
            "sweep_dir": os.path.abspath(path),
            "runs": [run_record(d) for d in sweep.member_dirs(path)],
            **code,
        }
    data, _ = layout.load_run_yaml(path)
    if not data:
        return {
            "run_dir": os.path.abspath(path),
            "run_id": None,
            "state": None,
            "job_ids": [],
            **code,
        }
    rd = RunDir(path)
    st, attempts = rd.read_status(), data.get("attempts") or []
    return {
        "run_dir": rd.path,
        "run_id": data.get("run_id"),
        "backend": (data.get("spec") or {}).get("backend"),
        "state": st.get("state"),
        "reason": st.get("reason"),
        "attempt": st.get("attempt", 0),
        "job_ids": runindex.job_ids(rd.path),
        "started": iso_stamp(attempts[0].get("started")) if attempts else None,
        "attempt_started": iso_stamp(attempts[-1].get("started")) if attempts else None,
        **code,
    }


@contextlib.contextmanager
def stdout_to_stderr(on: bool) -> Iterator[None]:
    """With --json every line a verb prints for people goes to stderr: stdout carries the one JSON
    object."""
    if not on:
        yield
        return
    sys.stdout.flush()
    with contextlib.redirect_stdout(sys.stderr):
        yield


def call(as_json: bool, fn: Callable[[], int], path: Callable[[], str]) -> int:
    """fn() (a verb: its exit code), then with as_json the run's record (path(): its run dir) on
    stdout."""
    with stdout_to_stderr(as_json):
        code = fn()
    if as_json:
        emit(run_record(path(), code))
    return code


def scripted(as_json: bool, dry_run: bool, run_dir: str, verb: Callable[..., int]) -> int:
    """A verb that starts a run, verb(dry_run=..., [out=, plans=]) -> its exit code: with --json one
    object on stdout (run_record, or a dry run's DryRun.to_dict()), every other line on stderr."""
    if as_json and dry_run:
        buf, plans = io.StringIO(), []
        # api.submit, api.resume: the plan too
        takes = "plans" in inspect.signature(verb).parameters
        with stdout_to_stderr(True):
            code = verb(dry_run=True, out=buf, **({"plans": plans} if takes else {}))
        emit(
            DryRun.of(buf.getvalue(), plans).to_dict()
            if plans
            else {"dry_run": True, "run_dir": run_dir, "text": buf.getvalue()}
        )
        return code
    return call(as_json, lambda: verb(dry_run=dry_run), lambda: run_dir)


def waited(as_json: bool, path: str, wait: Callable[[], int]) -> int:
    """`launch wait`: with --json the run's record when it ended or the timeout ran out (exit_code
    124, timed_out: true; its one line on stderr as without --json)."""
    if not as_json:
        return wait()
    try:
        return call(True, wait, lambda: path)
    except TimedOut as e:
        print(f"launch: error: {e}", file=sys.stderr, flush=True)
        emit(dict(run_record(path, e.exit_code), timed_out=True))
        return e.exit_code


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def list_rows(root: str | None = None) -> list[dict[str, Any]]:
    """`launch list`'s rows; a run dir whose run.yaml or status.json cannot be read is a row too,
    state UNREADABLE with the reason (never shown as PENDING, never left out). `age` (human) and
    `modified` (ISO) are of run.yaml's last change, `started` of the run's first attempt."""
    rows = []
    for rd in _list(root):
        data, why = layout.load_run_yaml(rd.path)
        problem = f"run.yaml {why}" if why else None
        if not problem and (why := rundircheck.json_problem(rd.status_path)):
            problem = f"status.json {why}"
        spec = (data or {}).get("spec") or {}
        # else from the runs index: its path
        inside = os.path.dirname(rd.path) == layout.runs_root(root)
        try:
            mtime = os.path.getmtime(rd.run_yaml_path)
        except OSError:  # gone since it was listed
            continue
        attempts = (data or {}).get("attempts") or [{}]
        rows.append(
            {
                "name": os.path.basename(rd.path) if inside else rd.path,
                "backend": spec.get("backend", "?"),
                "shape": f"{spec['nodes']}x{spec['gpus_per_node']}" if spec else "?",
                "state": "UNREADABLE" if problem else rd.read_status().get("state", "?"),
                "age": age(time.time() - mtime),
                "modified": iso(mtime),
                "started": iso_stamp(attempts[0].get("started")),
                "path": rd.path,
                **({"reason": problem} if problem else {}),
            }
        )
    # a sweep's runs together, each row with its sweep
    return sweep.group_rows(rows, layout.runs_root(root))


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
