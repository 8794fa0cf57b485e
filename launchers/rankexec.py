"""Per-rank wrapper that torchrun starts: `python -m launchers.rankexec -- <program> <args...>`.

It appends the rank's stdout/stderr to <run dir>/logs/node<K>/rank<R>.log after a header line naming the
attempt, runs the program as a child (which dies with the wrapper: PR_SET_PDEATHSIG), forwards the
signals a scheduler or the agent sends, and records how the rank ended in status/rank<R>.json.
Stdlib only: it costs a few milliseconds per rank.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


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
    log_dir = os.path.join(run_dir, "logs", f"node{node}")
    os.makedirs(log_dir, exist_ok=True)
    fd = os.open(os.path.join(log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    header = (f"===== launch attempt {attempt} | rank {rank} of {env.get('WORLD_SIZE', '?')} | node {node} | "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")
    os.write(fd, header.encode())

    # Handlers go in before the child exists: a signal that comes while it starts is passed on after.
    child: subprocess.Popen | None = None
    pending: list[int] = []

    def forward(signum, _frame):
        if child is None:
            pending.append(signum)
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    child = subprocess.Popen([sys.executable, "-u", *argv], stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                             preexec_fn=_die_with_parent)
    os.close(fd)
    for signum in pending:
        child.send_signal(signum)
    code = child.wait()
    record = {"rank": rank, "node": node, "attempt": attempt, "time": time.time(),
              "exit_code": code if code >= 0 else None, "signal": signal.Signals(-code).name if code < 0 else None,
              "pid": child.pid}
    status_dir = os.path.join(run_dir, "status")
    os.makedirs(status_dir, exist_ok=True)
    path = os.path.join(status_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    if code < 0:  # die the same way, so torchrun reports the signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
