"""Per-rank wrapper that torchrun starts: `python -m launchers.rankexec -- <program> <args...>`.

It appends the rank's stdout/stderr to <run dir>/logs/node<K>/rank<R>.log after a header line naming the
attempt, runs the program as a child (which dies with the wrapper: PR_SET_PDEATHSIG), forwards the
signals a scheduler or the agent sends, and records how the rank ended in status/rank<R>.json.
Stdlib only: it costs a few milliseconds per rank.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from . import layout

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def _die_with_parent() -> None:
    import ctypes        # in the forked child only
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _spawn(argv: list[str], fd: int) -> int:
    """fork + exec of `python -u <argv>` with stdout/stderr on fd, stdin from /dev/null, dying with this
    wrapper. Plain fork/exec rather than subprocess: the wrapper sits on every rank's start-up path, and
    this keeps its imports to os/signal/sys/time (json only once the program has ended)."""
    pid = os.fork()
    if pid:
        return pid
    try:                                   # the child: nothing here may return into the wrapper's code
        _die_with_parent()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        for s in FORWARDED:                 # exec resets caught signals to their defaults; be explicit anyway
            signal.signal(s, signal.SIG_DFL)
        os.execv(sys.executable, [sys.executable, "-u", *argv])
    except BaseException as e:  # noqa: BLE001
        os.write(2, f"launch rankexec: cannot start {sys.executable}: {e}\n".encode())
    os._exit(127)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -m launchers.rankexec -- <program> [args...]", file=sys.stderr)
        return 2
    env = os.environ
    rank, node = int(env.get("RANK", "0")), int(env.get("NODE_RANK", "0"))
    attempt = int(env.get("LAUNCH_ATTEMPT", "0"))
    run_dir = env.get("LAUNCH_RUN_DIR") or os.getcwd()
    log = layout.path(run_dir, "rank_log", node=node, rank=rank)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    header = (f"===== launch attempt {attempt} | rank {rank} of {env.get('WORLD_SIZE', '?')} | node {node} | "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")
    os.write(fd, header.encode())

    # Handlers go in before the child exists: a signal that comes while it starts is passed on after.
    child: list[int] = []
    pending: list[int] = []

    def forward(signum, _frame):
        if not child:
            pending.append(signum)
            return
        try:
            os.kill(child[0], signum)
        except ProcessLookupError:
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    pid = _spawn(argv, fd)
    child.append(pid)
    os.close(fd)
    for signum in pending:
        os.kill(pid, signum)
    _, status = os.waitpid(pid, 0)        # retried across the forwarding handler (PEP 475)
    code = os.waitstatus_to_exitcode(status)
    from .rundir import RunDir, exit_fields      # only now: nothing but os/signal/sys/time before the program
    RunDir(run_dir).write_rank_record(dict(rank=rank, node=node, attempt=attempt, time=time.time(), pid=pid,
                                           **exit_fields(code)))
    if code < 0:  # die the same way, so torchrun reports the signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
