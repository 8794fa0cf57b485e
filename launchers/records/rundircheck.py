"""A run dir as data others may write (issue 35), checked before launch trusts it: open_inside()
opens a file to read one component at a time (never through a symlink, never blocking on a FIFO),
last_step() reads metrics.jsonl that way; check_own_dirs() finds a symlink where an attempt is about
to write; json_problem()/status_problem() say why status.json cannot be read (not JSON, NaN, too
deep, a field of another type); newer_version() refuses a run.yaml a newer launchers wrote (`launch
status`/`logs` may still read it). The paths are launchers.layout's.
"""

from __future__ import annotations

import errno
import json
import os
import stat

from ..errors import LaunchError, brief
from ..layout import FILES, load_json, no_symlink, path


def open_inside(run_dir: str, target: str) -> int:
    """A read-only fd of the regular file `target` under run_dir, opened one component at a time
    with O_NOFOLLOW (no symlink anywhere below run_dir), O_NONBLOCK (a FIFO never blocks) and
    fstat'ed (a FIFO, device or directory refused): what a reader (`launch logs`) opens of a run dir
    others may write (issue 35). A LaunchError names what is refused."""
    parts = os.path.relpath(target, run_dir).split(os.sep)
    if parts[0] == os.pardir or os.path.isabs(parts[0]):
        raise LaunchError(
            f"{brief(target)} is outside the run dir {brief(run_dir)}; accepted: a path inside it"
        )
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nfd = os.open(
                    part,
                    os.O_RDONLY | os.O_NOFOLLOW | (os.O_NONBLOCK if last else os.O_DIRECTORY),
                    dir_fd=fd,
                )
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise LaunchError(
                    f"{os.path.join(*parts[: i + 1])!r} in the run dir {brief(run_dir)} is a "
                    "symbolic link; accepted: plain files and directories (a reader never "
                    "follows one)"
                ) from None
            os.close(fd)
            fd = nfd
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LaunchError(
                f"{os.path.relpath(target, run_dir)!r} in the run dir {brief(run_dir)} is not a "
                "regular file (a FIFO, device or directory); accepted: a plain file"
            )
        out, fd = fd, -1
        return out
    finally:
        if fd >= 0:
            os.close(fd)


def last_step(run_dir: str) -> int | None:
    """The step of the last line of metrics.jsonl (read from its end), None without one."""
    try:  # a regular file inside the run dir only (a FIFO never blocks a reader: issue 35)
        with os.fdopen(open_inside(run_dir, path(run_dir, "metrics")), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read(4096).decode("utf-8", "replace").strip().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else None
    except (OSError, ValueError, KeyError, IndexError, TypeError, LaunchError):
        return None


# appended or rewritten by the agents and ranks
WRITTEN_IN_PLACE = ("rank_log", "rank_record", "progress")


def check_own_dirs(run_dir: str) -> None:
    """Before an attempt writes: no name of the layout's top level (FILES) is a symlink, nor
    anything in the directories written in place (rank logs, records, heartbeats); a LaunchError
    names the first one."""
    for top in sorted({f.split("/")[0] for f in FILES.values()}):
        no_symlink(run_dir, os.path.join(run_dir, top))
    for what in WRITTEN_IN_PLACE:
        # never follows a link
        for d, dirs, files in os.walk(os.path.join(run_dir, FILES[what].split("/")[0])):
            for name in sorted(dirs + files):
                no_symlink(run_dir, os.path.join(d, name))


STATUS_TYPES = {
    "state": str,
    "attempt": int,
    "nodes": dict,
    "launcher": dict,
    "starting": dict,
    "reason": str,
    "first_failure": dict,
    "hang": dict,
    "surviving_pids": list,
    "updated": (int, float, str),
}


def status_problem(data: dict) -> str | None:
    """Why status.json's fields cannot be read (a field launch reads of another type), else None."""
    for key, kind in STATUS_TYPES.items():
        v = data.get(key)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            return f"has {key} of type {type(v).__name__}"
    if not all(str(k).isdigit() for k in data.get("nodes") or {}):
        return "has nodes that are not node numbers"
    return None


def json_problem(file: str) -> str | None:
    """Why a JSON record (status.json) is not usable, a short phrase; None when it is a JSON
    object."""
    try:
        with open(file, encoding="utf-8") as f:
            data = load_json(f)
    except FileNotFoundError:
        return "is missing"
    except IsADirectoryError:
        return "is a directory"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    except ValueError as e:
        return "is not valid JSON: " + (
            str(e) if "deep" in str(e) or "launch" in str(e) else "truncated or garbled"
        )
    return (
        status_problem(data)
        if isinstance(data, dict)
        else f"is not a JSON object (got {type(data).__name__})"
    )


def newer_version(data: dict, mine: str, path: str, read_only: bool) -> str | None:
    """The launchers version that wrote this run.yaml when it is newer than `mine` (None otherwise):
    such a run dir is refused, unless it is only read (`launch status`, `launch logs`: then the
    version is returned)."""
    versions = data.get("versions")
    theirs = versions.get("launchers") if isinstance(versions, dict) else None
    if not isinstance(theirs, str) or not _version_key(theirs) > _version_key(mine):
        return None
    if not read_only:
        raise LaunchError(
            f"{path!r} was written by launchers {brief(theirs)}, newer than this launch ({mine}); "
            f"use launchers {brief(theirs)} or newer for it (`launch status` and `launch logs` can "
            "read it)"
        )
    return theirs


def _version_key(version: str) -> tuple[int, ...]:
    """'1.2.3' -> (1, 2, 3); a part that is not digits ends the key ('0.2.0rc1' -> (0, 2))."""
    key = []
    for part in version.split("."):
        if not part.isascii() or not part.isdigit():
            break
        key.append(int(part))
    return tuple(key)
