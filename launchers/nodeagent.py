"""The host side of `launch ssh` (stdlib only; runs with the job's python on every host).

  python -m launchers.remote run --node K --pid-file P -- <torchrun argv...>
      Run by sshd on a pty, with the node's environment (LAUNCH_RUN_ID, LAUNCH_RUN_DIR,
      NODE_RANK...). Starts the torchrun agent in its own session, output to logs/node<K>/agent.log,
      writes the pid file, streams this node's agent and rank logs to stdout ("[nK rR] line"), runs
      this node's hang monitor (LAUNCH_HANG_TIMEOUT), and on SIGHUP (the launcher's connection
      dropped), SIGINT or SIGTERM stops the node (stop_node). An agent that ended otherwise (by
      itself, killed, or by the launcher's `kill`): "AGENT_ENDED <time>" to the launcher (the node's
      end time), then the ranks it left are stopped. Exits with the agent's exit code (128 + N for
      signal N).
  python -m launchers.remote kill RUN_ID --node K [--pid-file P] [--signal SIGINT|SIGTERM|SIGKILL]
  [--wait S]
      The launcher's stop (failure, Ctrl-C, `launch cancel`): one signal to the node's agent (from
      the pid file, only if that pid is still ours), which passes it on once to each rank; up to S
      seconds for the node to end (the programs' stop grace); then SIGKILL to every process whose
      environment holds LAUNCH_RUN_ID=RUN_ID and NODE_RANK=K (the sweep). Prints one JSON line
      {host, before, forced, after}.
Processes are found by their exact environment tag in /proc, never by a name pattern.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import stat
import sys
import threading
import time

from . import layout, procs, trust
from .follow import LogTail, node_logs
from .procs import is_rank_wrapper
from .stops import wait_s

STOP_WAIT_S = 45.0  # the default stop grace (30 s) + the agent's margin + slack
# `run` prints this line every HEARTBEAT_S to the launcher (never shown)
HEARTBEAT = "@@launch-alive@@"
HEARTBEAT_S = 1.0
AGENT_ENDED = "@@launch-agent-ended@@"  # `run` prints "AGENT_ENDED <time>" (never shown)


def reach_line(python: str, cwd: str, arg: dict) -> str:
    """The shell line of the SSH preflight's reachability check (launchers.nodeside.reach) on a
    host: run as a module in the job's working directory, where the host check
    (launchers.node.nodecheck) found launchers importable."""
    words = [python, "-m", "launchers.nodeside.reach", json.dumps(arg)]
    return f"cd {shlex.quote(cwd)} 2>/dev/null; " + " ".join(shlex.quote(w) for w in words)


def node_pids(
    run_id: str, node: int, attempt: int | None = None, run_dir: str | None = None
) -> list[int]:
    """Live pids whose environment holds LAUNCH_RUN_ID=run_id and NODE_RANK=node (not ours);
    attempt: of that attempt only (LAUNCH_ATTEMPT) -- an end-of-attempt sweep never takes another
    attempt's processes (on the dev clusters the hosts share one pid namespace: a paused node's node
    1 is not the spare's node 1)."""
    need = {f"{procs.TAG}={run_id}".encode(), f"NODE_RANK={node}".encode()}
    if attempt is not None:
        need.add(f"LAUNCH_ATTEMPT={attempt}".encode())
    out = []
    for pid in procs.tagged_pids(run_id):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if need <= set(f.read().split(b"\0")):
                    out.append(pid)
        except OSError:
            continue
    # run_dir: `launch cancel`'s, never another run dir's pids
    mine = [p for p in out if p != os.getpid()]
    return [p for p in mine if not trust.owner_elsewhere(p, run_id, run_dir)] if run_dir else mine


def read_pidfile(path: str | None) -> dict:
    try:
        with open(path or "", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def stop_node(
    run_id: str,
    node: int,
    pid_file: str | None = None,
    sig: int = signal.SIGTERM,
    wait_s: float = STOP_WAIT_S,
    agent_pid: int | None = None,
    attempt: int | None = None,
    run_dir: str | None = None,
) -> dict:
    """One `sig` to the node's agent (it passes the stop on once to each rank wrapper, which gives
    its program the stop grace), wait up to wait_s for the node's processes to end, then SIGKILL
    what is left (the sweep); attempt: that attempt's processes only (node_pids)."""
    rec = read_pidfile(pid_file)
    if (
        agent_pid is None
        and rec.get("agent")
        and procs.start_ticks(rec["agent"]) == rec.get("agent_start")
    ):
        agent_pid = rec["agent"]
    before = node_pids(run_id, node, attempt, run_dir)
    # the pid file of a run dir others may write: proven first
    if run_dir and agent_pid not in before:
        agent_pid = None
    asked = []  # who got the stop; nobody: leftovers (a daemon the program forked)
    if agent_pid and sig != signal.SIGKILL:
        asked = [agent_pid]
        procs.kill(agent_pid, sig)
    elif sig != signal.SIGKILL:  # no agent left: the rank wrappers pass it on (once) themselves
        asked = [pid for pid in before if is_rank_wrapper(pid)]
        for pid in asked:
            procs.kill(pid, sig)
    deadline = time.monotonic() + (wait_s if asked else 0)  # are swept at once
    while (
        any(is_rank_wrapper(p) for p in node_pids(run_id, node, attempt, run_dir))
        and time.monotonic() < deadline
    ):
        # the grace is the programs': an agent with no wrapper left (torchrun's exit
        time.sleep(0.05)
    # barrier) gets a 2 s settle, not the whole grace
    settle = min(deadline, time.monotonic() + 2.0)
    while node_pids(run_id, node, attempt, run_dir) and time.monotonic() < settle:
        time.sleep(0.05)
    forced = node_pids(run_id, node, attempt, run_dir)
    for pid in forced:
        procs.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 3
    while node_pids(run_id, node, attempt, run_dir) and time.monotonic() < end:
        time.sleep(0.05)
    return {
        "host": socket.gethostname(),
        "before": before,
        "forced": forced,
        "after": node_pids(run_id, node, attempt, run_dir),
    }


def stop_wait() -> float:
    """How long a stopped node may take (launchers.stops.wait_s) with this node's --stop-grace."""
    return wait_s(float(os.environ.get("LAUNCH_STOP_GRACE") or 30))


class _Shared:
    """stdout shared by the log tail and the heartbeat: whole writes, one at a time."""

    def __init__(self, out) -> None:
        self.out, self.lock = out, threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            self.out.write(text)
            self.out.flush()

    def flush(self) -> None:
        pass


def _say(out: _Shared, line: str) -> bool:
    """One line to the launcher; False when the pty is gone (the launcher is, too)."""
    try:
        out.write(line)
        return True
    except (OSError, ValueError):
        return False


def _heartbeat(out: _Shared) -> threading.Event:
    """HEARTBEAT every HEARTBEAT_S until the event is set: the launcher's sign that this host and
    its agent are alive (a cut network or a hung host goes silent; TCP keepalive would take minutes
    to notice)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            if not _say(out, HEARTBEAT + "\n"):
                return

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()
    return stop


def env_file(run_id: str, attempt: int, node: int) -> str:
    """Where the launcher puts a node's secrets (0600, over SFTP) for `run --env-file` to read and
    delete."""
    return f"/tmp/.launch-{run_id}-a{attempt}-node{node}.env"


def read_env_file(path: str) -> dict[str, str]:
    """The node's secrets (JSON name -> value), the file deleted at once; only a private regular
    file of ours, never through a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.unlink(path)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise SystemExit(
                f"launch: env file {path} is not a private (0600) file of this user; not used"
            )
        with os.fdopen(fd, encoding="utf-8") as f:
            fd = -1
            return {str(k): str(v) for k, v in json.load(f).items()}
    finally:
        if fd >= 0:
            os.close(fd)


def run(node: int, pid_file: str, argv: list[str], stream: bool = True) -> int:
    os.umask(os.umask(0) | 0o002)  # never world-writable, whatever the host's login umask
    run_id = os.environ[procs.TAG]
    run_dir = os.environ["LAUNCH_RUN_DIR"]
    attempt = (
        int(os.environ["LAUNCH_ATTEMPT"])
        if os.environ.get("LAUNCH_ATTEMPT", "").isdigit()
        else None
    )
    log = layout.own_path(run_dir, "agent_log", node=node)  # never through a symlink
    os.makedirs(os.path.dirname(log), exist_ok=True)
    got: list[int] = []
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, _f: got.append(signum))
    tail = LogTail(node_logs(run_dir, node), out=_Shared(sys.stdout))
    tail.skip_existing()
    with open(log, "a", encoding="utf-8") as f:
        f.write(
            layout.agent_header(os.environ.get("LAUNCH_ATTEMPT", "?"), node, socket.gethostname())
        )
    agent = procs.start_session(argv, dict(os.environ), log)
    write_pid_file(pid_file, agent.pid, run_id, node)
    monitor = None
    if os.environ.get("LAUNCH_HANG_TIMEOUT"):  # this host's half of hang detection (launchers.hang)
        from .hang.watch import NodeMonitor

        monitor = NodeMonitor(run_dir, run_id, attempt or 0, nodes=[node])
        monitor.start()
    beating = _heartbeat(tail.out) if stream else None
    try:
        code = watch(agent, got, tail if stream else None, run_id, node, attempt)
    finally:
        if beating:
            beating.set()
        if monitor:
            monitor.stopped.set()
        with contextlib.suppress(OSError):
            os.unlink(pid_file)
    if stream:
        with contextlib.suppress(OSError):
            tail.poll(final=True)
    return code if code >= 0 else 128 - code


def watch(
    agent, got: list[int], tail: LogTail | None, run_id: str, node: int, attempt: int | None
) -> int | None:
    """Until the agent ends or a stop signal is got (streaming the node's logs to `tail`): the
    agent's exit code, or 128 + the signal after the node was stopped with it. An agent that ended
    by itself: its end is said (AGENT_ENDED, the node's failure time) and workers it orphaned are
    stopped."""
    while agent.poll() is None and not got:
        if tail:
            tail.poll()
        time.sleep(0.1)
    code, seen = agent.poll(), time.time()
    if got:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the pty may be gone: never die half-way
        stop_node(
            run_id,
            node,
            sig=signal.SIGTERM if got[0] == signal.SIGHUP else got[0],
            wait_s=stop_wait(),
            agent_pid=agent.pid,
        )
        agent.wait()
        return 128 + got[0]
    if tail:  # when: the node's failure time (its session ends only after the stop of its orphans)
        _say(tail.out, f"{AGENT_ENDED} {seen:.3f}\n")
    if node_pids(run_id, node, attempt):  # workers orphaned by an agent that died hard
        stop_node(run_id, node, wait_s=stop_wait(), attempt=attempt)
    return code


def write_pid_file(pid_file: str, agent: int, run_id: str, node: int) -> None:
    """The pid file `launch cancel` and the stops read: this wrapper's and its agent's pids with
    their start ticks (a pid reused since is not theirs), written atomically."""
    rec = {
        "wrapper": os.getpid(),
        "wrapper_start": procs.start_ticks(os.getpid()),
        "agent": agent,
        "agent_start": procs.start_ticks(agent),
        "run_id": run_id,
        "node": node,
    }
    tmp = f"{pid_file}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rec, f)
    os.replace(tmp, pid_file)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launchers.remote")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--node", type=int, required=True)
    r.add_argument("--pid-file", required=True)
    r.add_argument("--no-stream", action="store_true")
    r.add_argument("--env-file", default=None)
    r.add_argument("argv", nargs=argparse.REMAINDER)
    k = sub.add_parser("kill")
    k.add_argument("run_id")
    k.add_argument("--node", type=int, required=True)
    k.add_argument("--pid-file", default=None)
    k.add_argument("--signal", default="SIGTERM", choices=("SIGINT", "SIGTERM", "SIGKILL"))
    k.add_argument("--wait", type=float, default=STOP_WAIT_S)
    k.add_argument("--run-dir", default=None)  # `launch cancel`: only that run dir's processes
    a = p.parse_args(argv)
    if a.cmd == "run":
        cmd = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        if not cmd:
            p.error("run needs the agent command after --")
        if a.env_file:
            os.environ.update(read_env_file(a.env_file))
        return run(a.node, a.pid_file, cmd, stream=not a.no_stream)
    print(
        json.dumps(
            stop_node(
                a.run_id, a.node, a.pid_file, signal.Signals[a.signal], a.wait, run_dir=a.run_dir
            )
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
