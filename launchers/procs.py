"""Start tagged process groups; find and end everything that carries a run id.

Every process the launcher starts gets LAUNCH_RUN_ID=<run id> in its environment, and torchrun
passes the environment on to its workers (which it starts in new sessions). Cleanup therefore goes
by session and then sweeps /proc for that exact tag, never by a name pattern that could hit another
run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Any, Callable, Iterable

TAG = "LAUNCH_RUN_ID"
AGENT = b"torch.distributed.run"  # in a torchrun agent's command line


def start_session(
    argv: list[str] | tuple[str, ...], env: dict[str, str], log_path: str, cwd: str | None = None
) -> subprocess.Popen:
    """Start argv in a new session (its own process group), output appended to log_path."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )


def tagged_pids(run_id: str) -> list[int]:
    """Pids of live processes (of any user we can read) whose environment has
    LAUNCH_RUN_ID=run_id."""
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


def _state(pid: int) -> bytes | None:
    """The process state letter (/proc/PID/stat: R, S, D, T stopped, t traced, Z zombie...); None
    when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _is_zombie(pid: int) -> bool:
    return _state(pid) in (None, b"Z")


def stopped(pid: int) -> bool:
    """Whether pid is stopped by a signal (state T: SIGSTOP, SIGTSTP), not a debugger's stop (t) nor
    gone."""
    return _state(pid) == b"T"


def start_ticks(pid: int) -> int | None:
    """The process start time (clock ticks since boot): with the pid it names one process for
    good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def exit_fields(code: int | None) -> dict[str, Any]:
    """A process's exit as the records keep it: exit_code for a normal exit, signal for a killed
    one."""
    if code is None:
        return {"exit_code": None, "signal": None}
    return {
        "exit_code": code if code >= 0 else None,
        "signal": signal.Signals(-code).name if code < 0 else None,
    }


def self_record() -> dict:
    """This process as a liveness record: {pid, host, start} (the start time makes a reused pid
    harmless)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": start_ticks(os.getpid())}


def record_alive(rec: dict) -> bool:
    """Whether the process a self_record() names is still running (only answerable on its own
    host)."""
    pid = rec.get("pid")
    return (
        bool(pid)
        and rec.get("host") == socket.gethostname()
        and alive(pid)
        and start_ticks(pid) == rec.get("start")
    )


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


def agent_pids(run_id: str) -> list[int]:
    """The torchrun agents of a run on this machine (found by tag and command line)."""
    return [pid for pid in tagged_pids(run_id) if cmdline_has(pid, AGENT)]


def stop_run(
    run_id: str,
    agents: Iterable[int],
    sig: int = signal.SIGTERM,
    wait_s: float = 0.0,
    urgent: Callable[[], bool] = lambda: False,
) -> list[int]:
    """Stop a run the way programs expect: one `sig` to each agent pid (it passes it once to each
    rank wrapper, which passes it once to its program and gives it the stop grace), wait up to
    wait_s for the rank wrappers to end (an agent ended by a second signal leaves its programs in
    their grace: they keep it), unless urgent() says otherwise (a second Ctrl-C), then SIGKILL
    whatever still carries the run's tag after a short settle -- the sweep is the last resort, never
    a first signal. An agent left with no rank wrapper has no program to give a grace to: torchrun's
    exit barrier (its ranks ended, a peer node failed) ignores the signal for 300 s; it is swept
    after the settle, not after the whole grace. Returns the pids that had to be killed."""
    agents = list(agents)
    # a wrapper whose agent died gets it directly
    for pid in agents + rank_wrappers(run_id, orphaned=True):
        kill(pid, sig)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not urgent() and rank_wrappers(run_id):
        time.sleep(0.05)
    # wrappers writing their records
    settle = time.monotonic() + (2.0 if wait_s and not urgent() else 0.0)
    while tagged_pids(run_id) and time.monotonic() < settle and not urgent():
        time.sleep(0.05)
    killed = tagged_pids(run_id)
    for pid in killed:
        kill(pid, signal.SIGKILL)
    return killed


def cmdline_has(pid: int, word: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return word in f.read()
    except OSError:
        return False


def is_rank_wrapper(pid: int) -> bool:
    """A rank wrapper (`python -m launchers.rankexec -- ...`), not the torchrun agent whose command
    line names it as its entry point (it did count as one: the hang sampler then took a wrapper for
    its rank's program)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"launchers.rankexec" in argv and AGENT not in argv


def rank_wrappers(run_id: str, orphaned: bool = False) -> list[int]:
    """The live rank wrappers (launchers.rankexec) of a run on this machine; orphaned: those whose
    torchrun agent is gone (their parent is another process now)."""
    found = [p for p in tagged_pids(run_id) if is_rank_wrapper(p)]
    return [p for p in found if not is_agent(_parent(p))] if orphaned else found


def is_agent(pid: int) -> bool:
    """A torchrun agent: started cold (its command line), or forked warm (--warm-spares:
    launchers.warmfork)."""
    return cmdline_has(pid, AGENT) or forked_as(pid) == "agent"


def forked_as(pid: int) -> str | None:
    """agent | program for a process forked from a node's zygote (--warm-spares), else None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    # launchers.warmfork.FORKED_ENV: first in such a process's environment
    key = b"LAUNCH_WARM_FORKED="
    return head[len(key) :].split(b"\0", 1)[0].decode() if head.startswith(key) else None


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def kill(pid: int, sig: int) -> None:
    """Send sig to pid; a process already gone (or not ours) is not an error."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
