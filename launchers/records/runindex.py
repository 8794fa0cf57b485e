"""The runs index: run dirs made outside the runs root (`--run-dir` elsewhere, a profile's
runs_root), so that `launch list` finds them too.

One small append-only file in the user's state directory: $LAUNCH_STATE_DIR, else
$XDG_STATE_HOME/launchers, else ~/.local/state/launchers; one JSON line per run dir ({"path",
"created"}). Appends and the pruning of run dirs that are gone (an atomic replace) take an flock on
a lock file beside it, so no entry is lost. The index is a convenience: failing to write it never
fails a run. Stdlib + launchers.layout only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from typing import Iterator

from .. import layout, sweep
from ..frozen.statcache import state_dir

INDEX = "runs.jsonl"


def index_path() -> str:
    return os.path.join(state_dir(), INDEX)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The index's lock (a file beside it: pruning replaces the index file itself)."""
    os.makedirs(state_dir(), exist_ok=True)
    with open(os.path.join(state_dir(), ".runs.lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def note(run_dir: str, root: str | None = None) -> bool:
    """Record a new run dir made outside the runs root (`launch list` reads the root itself, a
    sweep's runs inside it included); True if it was recorded. An index that cannot be written is
    skipped (the run is not affected)."""
    run_dir, base = os.path.abspath(run_dir), layout.runs_root(root)
    if run_dir.startswith(base.rstrip(os.sep) + os.sep):
        return False
    line = json.dumps({"path": run_dir, "created": time.time()}) + "\n"
    try:
        with _locked(), open(index_path(), "a", encoding="utf-8") as f:
            f.write(line)
        return True
    except OSError:
        return False


def _read() -> dict[str, str]:
    """Indexed run dir -> its line (the first for a path; torn or foreign lines are skipped, never
    fatal)."""
    try:
        with open(index_path(), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        try:
            p = json.loads(line)["path"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(p, str):
            out.setdefault(p, line)
    return out


def paths() -> list[str]:
    """The indexed run dirs that are still run dirs; entries whose run dir is gone are pruned from
    the file."""
    listed = _read()
    alive = [p for p in listed if layout.is_run_dir(p)]
    if len(alive) < len(listed):
        try:
            with _locked():  # read again under the lock: an append since is kept
                keep = [ln for p, ln in _read().items() if layout.is_run_dir(p)]
                layout.atomic_write(index_path(), "".join(ln + "\n" for ln in keep), durable=False)
        except OSError:
            pass
    return alive


def run_dirs(base: str) -> list[str]:
    """The run dirs under the runs root `base` (a sweep's runs too) and those in the index, newest
    first."""
    found = [os.path.join(base, name) for name in (os.listdir(base) if os.path.isdir(base) else ())]
    # a sweep's runs
    found += [d for p in found if sweep.is_sweep_dir(p) for d in sweep.member_dirs(p)]
    runs = [p for p in dict.fromkeys(found + paths()) if layout.is_run_dir(p)]
    return sorted(
        runs, key=lambda p: os.path.getmtime(os.path.join(p, layout.RUN_YAML)), reverse=True
    )


def job_ids(run_dir: str) -> list[str]:
    """The Slurm job ids a run dir was submitted as (slurm/jobs: "<attempt> <job id>" per
    submission), oldest first."""
    try:
        with open(layout.path(run_dir, "slurm_jobs"), encoding="utf-8", errors="replace") as f:
            return [w[1] for w in (line.split() for line in f) if len(w) == 2]
    except OSError:
        return []


def resolve(ref: str, root: str | None = None) -> str:
    """RUN as a verb takes it -> a run dir: a path (a run dir or a sweep dir, as given), else a run
    name under the runs root or in the index (what `launch list` shows: a run dir's or a sweep's
    name), else a Slurm job id one run dir was submitted as (its slurm/jobs). Two or more runs
    answering to it: a LaunchError listing them; a word that is no path and no run's name nor job
    id: a LaunchError saying what was looked for. A path that holds no run: `ref` as given (the
    verb's own message says what is wrong with it)."""
    from ..errors import LaunchError

    ref = os.fspath(ref)
    base = layout.runs_root(root)
    if not ref or ref in (".", "..") or layout.is_run_dir(ref) or sweep.is_sweep_dir(ref):
        return ref
    # `launch list`'s name of a sweep's run (<sweep>/<run>), else the path as given
    if os.sep in ref:
        inside = os.path.join(base, ref)
        return (
            inside
            if not os.path.isabs(ref) and not os.path.exists(ref) and layout.is_run_dir(inside)
            else ref
        )
    dirs = run_dirs(base)
    named = [p for p in dict.fromkeys([*dirs, *_sweeps(base)]) if os.path.basename(p) == ref]
    by_job = (
        [p for p in dirs if ref in job_ids(p)]
        + [
            p
            for p in _sweeps(base)
            if str(
                (layout.read_json(os.path.join(p, sweep.SWEEP_FILE)) or {}).get("slurm_array_job")
            )
            == ref
        ]
        if ref.replace("_", "").isdigit()
        else []
    )
    found = list(dict.fromkeys(named + by_job))
    if len(found) > 1:
        raise LaunchError(
            f"run {ref!r} is ambiguous: {len(found)} runs answer to it; give one path: "
            + ", ".join(found)
        )
    if found or os.path.lexists(ref):
        return found[0] if found else ref
    raise LaunchError(
        f"{ref!r} is not a run dir, nor the name of a run under {base} or in the runs index, nor "
        "a Slurm job id of one; accepted: a run dir's path, a name `launch list` shows, a Slurm "
        "job id"
    )


def _sweeps(base: str) -> list[str]:
    return [
        os.path.join(base, n)
        for n in (os.listdir(base) if os.path.isdir(base) else ())
        if sweep.is_sweep_dir(os.path.join(base, n))
    ]
