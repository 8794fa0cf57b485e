"""Start tagged process groups; find and end everything that carries a run id.

Every process the launcher starts gets LAUNCH_RUN_ID=<run id> in its environment, and torchrun passes the
environment on to its workers (which it starts in new sessions). Cleanup therefore goes by session and
then sweeps /proc for that exact tag, never by a name pattern that could hit another run.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Iterable

TAG = "LAUNCH_RUN_ID"


def start_session(argv: list[str] | tuple[str, ...], env: dict[str, str], log_path: str,
                  cwd: str | None = None) -> subprocess.Popen:
    """Start argv in a new session (its own process group), output appended to log_path."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)


def tagged_pids(run_id: str) -> list[int]:
    """Pids of live processes (of any user we can read) whose environment has LAUNCH_RUN_ID=run_id."""
    needle = f"{TAG}={run_id}".encode()
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    if not _is_zombie(int(entry)):
                        out.append(int(entry))
        except OSError:
            continue
    return out


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def start_ticks(pid: int) -> int | None:
    """The process start time (clock ticks since boot): with the pid it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def self_record() -> dict:
    """This process as a liveness record: {pid, host, start} (the start time makes a reused pid harmless)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": start_ticks(os.getpid())}


def record_alive(rec: dict) -> bool:
    """Whether the process a self_record() names is still running (only answerable on its own host)."""
    pid = rec.get("pid")
    return bool(pid) and rec.get("host") == socket.gethostname() and alive(pid) \
        and start_ticks(pid) == rec.get("start")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def signal_groups(pgids: Iterable[int], sig: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_run(run_id: str, procs: Iterable[subprocess.Popen] = (), grace: float = 5.0) -> list[int]:
    """SIGTERM the agents' groups and every tagged process, SIGKILL what remains after `grace` seconds.

    Returns the pids that had to be killed with SIGKILL.
    """
    procs = list(procs)
    groups = {p.pid for p in procs if p.poll() is None}
    signal_groups(groups, signal.SIGTERM)
    for pid in tagged_pids(run_id):
        kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()
        if not tagged_pids(run_id) and all(p.poll() is not None for p in procs):
            return []
        time.sleep(0.05)
    signal_groups(groups, signal.SIGKILL)
    killed = tagged_pids(run_id)
    for pid in killed:
        kill(pid, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return killed


def kill(pid: int, sig: int) -> None:
    """Send sig to pid; a process already gone (or not ours) is not an error."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
