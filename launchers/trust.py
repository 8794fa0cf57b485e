"""What `launch cancel` may act on when a run dir proves nothing by itself (issue 35;
docs/SECURITY.md).

A run dir on shared storage can be copied or written by hand by someone else: its run id, the
launcher pid and start time in status.json and the SSH files run.yaml names are claims, not proof.
Before cancel signals or
connects:
- the launcher pid of status.json is signalled only when that process holds the run's own
  status/.lock open (hold(): the launcher keeps a handle for its life; /proc/PID/fd is readable only
  by its owner or root, and the file's inode binds it to this very run dir: a copy has another);
- processes are swept by the run id only when no live process of that id belongs to another run dir
  (its LAUNCH_RUN_DIR names another directory holding a run of that id: the original, and this one a
  copy or a fake);
- the SSH files the run recorded (--ssh-config, --identity, --known-hosts, --hostfile) are used only
  when they are the invoking user's own (owned by them or root, not writable by others) and outside
  the run dir.
Layer 1: stdlib, layout and procs.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Callable

from . import layout, procs, sweep

# run dir -> the open handle this launcher keeps (the proof it is the launcher)
_held: dict[str, Any] = {}
SSH_FILES = ("ssh_config", "identity", "known_hosts", "hostfile")


def hold(run_dir: str) -> None:
    """This process runs the run at run_dir: keep its status/.lock open for its life (not inherited:
    O_CLOEXEC)."""
    if run_dir not in _held:
        _held[run_dir] = open(layout.own_path(run_dir, "lock"), "a")


def holds(pid: int, run_dir: str) -> bool:
    """Whether process pid has this run dir's status/.lock open (what only its launcher does)."""
    want = layout.file_ident(layout.path(run_dir, "lock"))
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    return want is not None and any(layout.file_ident(f"/proc/{pid}/fd/{fd}") == want for fd in fds)


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return {}


def owner_elsewhere(pid: int, run_id: str, run_dir: str) -> str | None:
    """The other run dir process pid (carrying run_id) belongs to: its LAUNCH_RUN_DIR is another
    directory holding a run of that id; else None. A LAUNCH_RUN_DIR that is not a directory here (a
    container's own path, an SSH host's staging dir) proves nothing."""
    where = _environ(pid).get(b"LAUNCH_RUN_DIR", b"").decode(errors="replace")
    if where and os.path.isdir(where) and layout.file_ident(where) != layout.file_ident(run_dir):
        data, _ = layout.load_run_yaml(where)
        if isinstance(data, dict) and data.get("run_id") == run_id:
            return where
    return None


def run_pids(run_id: str, run_dir: str) -> list[int]:
    """The live processes of this run dir's run id that belong to no other run dir
    (procs.tagged_pids)."""
    return [pid for pid in procs.tagged_pids(run_id) if not owner_elsewhere(pid, run_id, run_dir)]


def other_owner(run_id: str, run_dir: str) -> str | None:
    """The other run dir whose live processes carry run_id, else None (owner_elsewhere)."""
    return next(
        filter(None, (owner_elsewhere(pid, run_id, run_dir) for pid in procs.tagged_pids(run_id))),
        None,
    )


def cancel_refusal(run_dir: str, run_id: str, st: dict[str, Any]) -> str | None:
    """The one line refusing `launch cancel run_dir`, or None when what it would signal is this
    run's."""
    if other := other_owner(run_id, run_dir):
        return (
            f"run dir {run_dir!r} names run id {run_id!r} of the live run in {other!r}; cancel "
            f"stops only its own processes: `launch cancel {other}` stops that run"
        )
    rec = st.get("launcher") or {}
    if isinstance(rec, dict) and procs.record_alive(rec) and not holds(rec["pid"], run_dir):
        return (
            f"status.json of {run_dir!r} names pid {rec['pid']}, which is not this run's "
            "launcher (it does not hold the run's status/.lock); cancel signals only processes "
            "it can prove are the run's"
        )
    return None


def ssh_refusal(run_dir: str, opts: dict[str, Any]) -> str | None:
    """The one line refusing to connect with an SSH file run.yaml recorded, or None when each is the
    user's own."""
    root = os.path.realpath(run_dir) + os.sep
    for key in SSH_FILES:
        f = opts.get(key)
        if not f:
            continue
        flag = "--" + key.replace("_", "-")
        try:
            st = os.stat(f)
        except OSError:
            continue  # connecting with it fails on its own line
        why = (
            "it is inside the run dir"
            if os.path.realpath(f).startswith(root)
            else f"it is owned by uid {st.st_uid}"
            if st.st_uid not in (os.getuid(), 0)
            else "others can write it"
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            else None
        )
        if why:
            return (
                f"cancel does not connect with {flag} {f} recorded in run.yaml ({why}); "
                "accepted: a file of your own that only you can write: stop the run's hosts "
                "yourself or fix the file"
            )
    return None


def record_refusal(run_dir: str) -> str | None:
    """The one line refusing to run what a run dir names (`launch resume`) when its records are not
    the user's own: run.yaml, status.json or the directory owned by another user, or writable by
    everyone; else None. (A group-writable one is accepted: the user's umask shares it with their
    group.)"""
    for p in (run_dir, layout.path(run_dir, "run_yaml"), layout.path(run_dir, "status")):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        why = (
            f"is owned by uid {st.st_uid}, not you"
            if st.st_uid != os.getuid()
            else "is writable by everyone"
            if st.st_mode & stat.S_IWOTH and not stat.S_ISLNK(st.st_mode)
            else None
        )
        if why:
            return (
                f"{p!r} {why}: resume would run what it names as you; accepted: a run dir of "
                "your own (copy it, check it, and `launch resume --adopt` the copy)"
            )
    return None


JOB_ID = re.compile(r"^[0-9]{1,12}(_[0-9]{1,9})?$")


def slurm_refusal(
    run_dir: str, job_id: Any, files_of: Callable[[str], list[str] | None]
) -> str | None:
    """The one line refusing to scancel the job status.json names unless Slurm says it is this run's
    (its output or batch script inside the run dir, or inside the sweep dir holding it); None when
    it is, or when Slurm no longer knows it (nothing to cancel). files_of(job): the files Slurm
    names for the job, None when it does not answer or know it
    (launchers.backends.slurm.status.job_files: `scontrol show job`'s one owner)."""
    job = str(job_id)
    if not JOB_ID.match(job):
        return (
            f"status.json of {run_dir!r} names Slurm job {job!r}; accepted: a job id "
            "(digits); nothing scancelled"
        )
    files = files_of(job)
    if files is None:
        return None  # scancel then says what is wrong with Slurm
    parent = os.path.dirname(os.path.realpath(run_dir))
    roots = [os.path.realpath(run_dir)] + ([parent] if sweep.is_sweep_dir(parent) else [])
    found = [os.path.realpath(v) for v in files if v.startswith("/")]
    if any(f.startswith(r + os.sep) for f in found for r in roots):
        return None
    return (
        f"status.json of {run_dir!r} names Slurm job {job}, whose output and script are not in "
        f"this run dir (another run's job); cancel scancels only its own: `scancel {job}` if it "
        "is yours to stop"
    )
