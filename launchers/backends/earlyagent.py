"""The agents of the local backend and of Slurm's nodes, started early
(launchers.nodeside.agentgate): `launch local` starts each node's agent python as it starts
(prestart(), from launchers.entry, before click and the rest are imported), in the environment the
node will have as far as it is known then; it imports torch (about a second) while the launcher
parses, plans, checks the nodes' python and writes the run dir, instead of after all of that. At the
plan (EarlyAgents.open) a gate that cannot take the node's python and environment (they differ in
what the interpreter or torch read as they start: procenv.same_start) is ended and one started in
the node's own instead. At the node's start (take) the gate is handed the node's command and its
agent log and becomes that agent (a gate whose preload failed execs the command: a cold start, in
the log). The process the launcher watches is that one (its pid, its exit status). A Slurm node's
task starts its node's gate as it starts (prestart_node) and hands it the agent's command once it
has met its peers (prestarted).

Nothing runs before the go: a launch refused after all (a bad flag, the preflight's check, a run
dir that exists, Ctrl-C) closes the gates, and each ends at once; a launcher killed outright closes
them too (its end of the pipe). A node whose command is not `python -m torch.distributed.run ...`
(a container's, --warm-spares'), or a gate that has ended, starts cold as before. Light: entry
imports it first."""

from __future__ import annotations

import os
import sys
import time
import weakref

from ..nodeside.procenv import ROOM, padding, same_start

MODULE = "launchers.nodeside.agentgate"
# what it becomes; on its command line too, where the sweeps and `launch cancel` look for an agent
# (launchers.procs.AGENT)
AGENT = "torch.distributed.run"
MAX_EARLY = 8  # nodes started early from the flags; more: the rest once planned
# a node's go waits at most this long for node 0's store (a cold agent's torch import, on a slow
# shared file system, can take that long)
LISTEN_WAIT_S = 30.0
PRESTARTED: list[Gate] = []  # started by entry, not taken by a plan yet
LIVE: weakref.WeakSet[Gate] = weakref.WeakSet()  # every gate not given its go nor closed


class Spawned:
    """A process started by os.posix_spawn, with what the backends use of subprocess.Popen (pid,
    returncode, poll, wait, kill): entry starts the gates before anything is imported, and
    subprocess's imports alone cost ~10 ms there. Safe across threads as Popen is (a Slurm node task
    waits for its agent while its watches poll it): one reaper at a time; a poll while another
    thread waits says "running"."""

    def __init__(self, pid: int) -> None:
        import _thread

        self.pid, self.returncode, self.lock = pid, None, _thread.allocate_lock()

    def _reap(self, flags: int) -> None:
        try:
            done, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere: its status is lost (Popen's answer)
            done, status = self.pid, 0
        if done:
            self.returncode = os.waitstatus_to_exitcode(status)

    def poll(self) -> int | None:
        if self.returncode is None and self.lock.acquire(False):
            try:
                if self.returncode is None:
                    self._reap(os.WNOHANG)
            finally:
                self.lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            with self.lock:
                if self.returncode is None:
                    self._reap(0)
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                from subprocess import TimeoutExpired

                raise TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.005)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, 9)  # SIGKILL (the signal module: ~2 ms more at entry)


class Gate:
    """One node's agent python at its gate: the process, the write end of its pipe. Its stdout and
    stderr: /dev/null until the go; its session: its own (as procs.start_session's)."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.python, self.env = python, env
        r, self.w = os.pipe()
        try:
            pid = os.posix_spawnp(
                python,
                [python, "-m", MODULE, AGENT],
                {**env, ROOM: padding(env)},
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, r, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                ],
                setsid=True,
            )
        except BaseException:
            os.close(self.w)
            raise
        finally:
            os.close(r)
        self.proc = Spawned(pid)
        LIVE.add(self)
        # a gate dropped without a go (a launch refused in a process that goes on): EOF there
        self.eof = weakref.finalize(self, os.close, self.w)

    def go(self, argv, env: dict[str, str], log_path: str) -> Spawned | None:
        """The node's agent, its output on log_path; None when the gate ended (a cold start)."""
        if self.proc.poll() is None:
            import json

            line = json.dumps({"argv": list(argv), "env": env, "log": log_path}) + "\n"
            try:
                with open(self.w, "wb", closefd=False) as f:
                    f.write(line.encode())
                self.eof()
                LIVE.discard(self)
                return self.proc
            except OSError:  # EPIPE: it ended meanwhile
                pass
        self.close()
        return None

    def close(self) -> None:
        """Ended, having started nothing: EOF at its gate (and SIGKILL: it may be in an import)."""
        LIVE.discard(self)
        self.eof()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """A node's environment as far as it is known before the plan: the launcher's, less the NCCL_*
    variables (a node gets only the job's: launchers.torchrun.node_environ), with the two the node
    command always sets for the interpreter and torch (launchers.torchrun.node_command)."""
    env = {k: v for k, v in environ.items() if not k.startswith("NCCL_")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def prestart(argv: list[str]) -> None:
    """`launch local ...` (argv: the command line, not parsed yet): a gate per node it names
    (--nodes N, at most MAX_EARLY; 1 without it), in the launcher's python."""
    if not enabled():
        return
    opts = argv[: argv.index("--")] if "--" in argv else argv
    nodes = "1"
    for k, a in enumerate(opts):
        if a == "--nodes" and k + 1 < len(opts):
            nodes = opts[k + 1]
        elif a.startswith("--nodes="):
            nodes = a.split("=", 1)[1]
    n = int(nodes.split(":")[-1]) if nodes.replace(":", "").isdigit() else 1
    env = start_env(os.environ)
    try:
        for _ in range(min(max(n, 1), MAX_EARLY)):
            PRESTARTED.append(Gate(sys.executable, env))
    except OSError:
        discard()


def prestart_node(argv: list[str]) -> None:
    """A Slurm node's task (`python -m launchers.backends.slurm.task task|run ...`, argv its
    arguments): one gate, in this python, started before the task imports the rest and meets its
    peers (~0.1-0.3 s on the way to its agent); prestarted() at its agent's start."""
    if argv[:1] in (["task"], ["run"]) and enabled():
        try:
            PRESTARTED.append(Gate(sys.executable, start_env(os.environ)))
        except OSError:
            pass


def prestarted(argv, env: dict[str, str]) -> Gate | None:
    """The gate prestart_node() started, when it can become argv run with env (its go() is the
    node's agent); else None, the gate ended (a cold start)."""
    gate = PRESTARTED.pop(0) if PRESTARTED else None
    discard()
    if gate is not None and not (gated(argv) and takes(gate, argv[0], env)):
        gate.close()
        return None
    return gate


def await_master(env: dict[str, str], stopped) -> None:
    """Before the go of a node other than 0: until node 0's agent's store listens
    (MASTER_ADDR:MASTER_PORT), LISTEN_WAIT_S or stopped(). A gate's torch is imported already, so
    its agent would reach the store before node 0's agent opened it, and torch's TCPStore client
    then backs off for ~0.5-0.7 s (measured, torch 2.13). A connection closed unused costs the store
    nothing. Past the deadline the agent starts anyway (its own timeout and errors, as a cold
    one's)."""
    import socket

    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    deadline = time.monotonic() + LISTEN_WAIT_S
    while addr and port.isdigit() and time.monotonic() < deadline and not stopped():
        try:
            with socket.create_connection((addr, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(0.01)


def enabled() -> bool:
    """LAUNCH_EARLY_AGENTS=0: every agent starts cold, once its node starts."""
    return os.environ.get("LAUNCH_EARLY_AGENTS") != "0"


def discard() -> None:
    """The gates started early that no plan took."""
    while PRESTARTED:
        PRESTARTED.pop().close()


def end_all() -> None:
    """Entry, as the launcher ends: every gate that was not given its go (a launch stopped or
    refused between its plan and its nodes' start: Ctrl-C, a run dir that exists) is ended."""
    discard()
    for gate in list(LIVE):
        gate.close()


def takes(gate: Gate, python: str, env: dict[str, str] | os._Environ) -> bool:
    """Whether a gate started early can become a node's agent run by python with env (the gate's own
    check at its go: launchers.nodeside.agentgate.warm)."""
    return gate.python == python and same_start(gate.env, env)


def gated(argv) -> bool:
    return tuple(argv[1:3]) == ("-m", AGENT)


class EarlyAgents:
    """A plan's gates, by node rank."""

    def __init__(self) -> None:
        self.gates: dict[int, Gate] = {}
        self.first: Spawned | None = None  # node 0's agent, once taken

    def open(self, plan, environ: dict[str, str] | os._Environ) -> None:
        """A gate for each node of the plan that runs torchrun itself: one started early when it can
        take the node's environment (else those are ended), else one started now in the node's
        environment (environ: the launcher's, what the nodes' is made from)."""
        from ..torchrun import node_environ

        self.close()
        try:
            for nc in plan.nodes:
                if not gated(nc.argv) or not enabled():
                    continue
                env = node_environ(environ, nc)
                if PRESTARTED and not takes(PRESTARTED[0], nc.argv[0], env):
                    discard()
                self.gates[nc.node_rank] = (
                    PRESTARTED.pop(0) if PRESTARTED else Gate(nc.argv[0], env)
                )
        except OSError:  # no gate then: every node starts cold
            self.close()
        discard()

    def take(self, node_rank: int, argv, env: dict[str, str], log_path: str, stopped=None):
        """The node's agent from its gate (argv with env, its output on log_path); None without
        one. A node other than 0 waits for node 0's store first (await_master; node 0's agent
        taken first), unless stopped() or node 0's agent ended."""
        gate = self.gates.pop(node_rank, None)
        if gate is None:
            return None
        if node_rank > 0:
            first = self.first
            await_master(
                env,
                lambda: (
                    bool(stopped and stopped()) or (first is not None and first.poll() is not None)
                ),
            )
        agent = gate.go(argv, env, log_path)
        if node_rank == 0:
            self.first = agent
        return agent

    def close(self) -> None:
        while self.gates:
            self.gates.popitem()[1].close()
