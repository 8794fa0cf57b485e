"""N simulated nodes on this machine: one torchrun agent per node, each in its own session, all
joined through 127.0.0.1:<port> with the exact per-node command a cluster node would run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from .. import procs, warmfork
from ..containers import container, imagepull
from ..cpubind import node_plan
from ..errors import LaunchError, RunDirGone
from ..follow import follow_in_thread
from ..frozen import extcache
from ..hang.watch import LauncherWatch, describe, end_hung
from ..layout import Presence
from ..node import memstore, nodecheck
from ..nodeagent import node_pids
from ..ports import choose_port
from ..records.rundir import TERMINAL, RunDir, exit_fields
from ..spec import RunSpec
from ..stops import stop_decision, wait_s
from ..torchrun import node_environ
from .base import Backend, Interrupts, Plan, node_commands, node_exit, remove_containers
from .earlyagent import EarlyAgents

MASTER = "127.0.0.1"
# lost: a node whose agent is stopped this long while another's runs (ssh: sshwatch.LOST_S)
PAUSED_S = 10.0


class Zygotes:
    """--warm-spares here: a zygote (launchers.nodeside.zygote) per node slot of the pool, spares
    included, started beside the run's first attempt and ended with the run (its stdin closed: a
    launcher killed outright ends them too); a slot whose zygote is not ready (or gone) starts cold
    (launchers.warmfork). Its environment: the first node's, less the run's tag (a sweep never
    takes it) and the secrets (a forked process gets its own environment)."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}

    def ensure(self, plan: Plan) -> None:
        spec, nc = plan.spec, plan.nodes[0]
        drop = {procs.TAG, *nc.secret_env()}
        env = {k: v for k, v in node_environ(os.environ, nc).items() if k not in drop}
        for s in sorted(
            {*range(max(spec.max_nodes or 0, spec.nodes) + spec.spares), *(plan.slots or ())}
        ):
            if s not in self.procs or self.procs[s].poll() is not None:
                self.procs[s] = subprocess.Popen(
                    [
                        spec.python,
                        "-m",
                        "launchers.nodeside.zygote",
                        warmfork.socket_path(plan.run_id, s),
                        str(s),
                    ],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )

    def ready(self, plan: Plan, slot: int) -> bool:
        """Slot's zygote listens, or will not (it ended)."""
        p = self.procs.get(slot)
        return (
            p is None
            or p.poll() is not None
            or os.path.exists(warmfork.socket_path(plan.run_id, slot))
        )

    def close(self) -> None:
        for p in self.procs.values():
            p.stdin.close()
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


class LocalBackend(Backend):
    name = "local"
    zygote_kind = Zygotes  # --warm-spares
    stream = True  # print prefixed rank output while the job runs

    def __init__(self) -> None:
        self.early = EarlyAgents()  # the agents started at the plan (launchers.backends.earlyagent)

    def plan(
        self, spec: RunSpec, run_id: str, attempt: int, slots: list[int] | None = None
    ) -> Plan:
        """slots: the simulated node each node rank runs on (default 0..nodes-1; --spares: the
        pool's active slots, launchers.resilience.recovery); the rendezvous is node 0's, here
        127.0.0.1 whichever slot that is."""
        port = choose_port(run_id, spec.master_port, MASTER)
        dist = spec.dist_backend
        slots = list(slots) if slots is not None else list(range(spec.nodes))
        # every node runs here: one plan for all their ranks (LAUNCH_CPU_BIND_SLOT gives each node
        # its slots)
        sets = (
            node_plan(spec.cpu_bind, spec.world_size, os.environ) if spec.cpu_bind != "none" else []
        )
        return Plan(
            spec=spec,
            run_id=run_id,
            attempt=attempt,
            master_addr=MASTER,
            master_port=port,
            dist_backend=dist,
            nodes=node_commands(
                spec, run_id, attempt, MASTER, port, dist, one_machine=True, slots=slots
            ),
            cpu_sets=sets,
            slots=slots,
        )

    def preflight(self, plan: Plan) -> None:
        """The nodes' python, once (they all run here, in one environment): torch and launchers
        importable, the program found -- the check an SSH host runs (launchers.node.nodecheck); one
        line naming the nodes and python. Then the job's image on this machine's runtime, pulled
        when missing (launchers.containers.imagepull): its digest goes into the plan (the manifest
        records it). Each node's agent is at its gate from here on (launchers.backends.earlyagent:
        its torch import runs meanwhile); a refused launch ends it."""
        spec, host = plan.spec, socket.gethostname()
        self.early.open(plan, os.environ)
        try:
            errors = nodecheck.run_here(
                spec.python,
                node_environ(os.environ, plan.nodes[0]),
                os.getcwd(),
                spec.program,
                container.host_check(spec),
            )
            if errors:
                raise LaunchError(f"{nodecheck.where(spec.nodes)}: {'; '.join(errors)}")
            plan.image_digests = imagepull.ensure_here(
                spec, nodecheck.where(spec.nodes, host), host
            )
        except BaseException:
            self.early.close()
            raise

    def start(self, plan: Plan, rd: RunDir) -> int:
        attempt, spec = plan.attempt, plan.spec
        rd.mark_running(attempt)
        agents: list[subprocess.Popen] = []
        paused, swept = Paused(agents), []  # swept: the pids the launcher's own stop had to kill
        watch = (
            LauncherWatch(
                rd,
                plan.run_id,
                attempt,
                spec.hang_timeout,
                spec.nodes,
                spec.world_size,
                monitor_here=True,
            )
            if spec.hang_timeout
            else None
        )
        thread, stop = follow_in_thread(rd.path) if self.stream else (None, None)
        here = Presence(rd.path)
        with Interrupts() as intr:
            try:
                agents += [self._start_node(nc, rd, attempt, intr) for nc in plan.nodes]
                exited_at: dict[int, float] = {}  # node -> when its agent's exit was first seen
                tells = [t for t in (extcache.Teller(spec, attempt), plan.teller()) if t]
                codes, why = self._watch(agents, intr, watch, exited_at, here, tells, paused)
                if intr.got or why or any(c not in (0, None) for c in codes):
                    codes, swept = stop_the_rest(plan, rd, agents, paused, why, intr)
            finally:
                self.early.close()
                if watch:
                    watch.close()
                if stop is not None:
                    stop.set()
                    thread.join(timeout=5)
        # a daemon the job double-forked outlives the agents: it ends too
        left = procs.stop_run(plan.run_id, [])
        remove_containers(spec, plan.run_id, range(spec.nodes))
        if left:
            print(
                f"launch: killed {len(left)} process(es) the job left running (pids "
                f"{', '.join(map(str, left))})",
                file=sys.stderr,
                flush=True,
            )
        if here.gone():  # nothing recorded: a record would recreate half a run dir
            raise RunDirGone(here.gone_line())
        # podman's 128 + N: its agent's signal N
        codes = [container.agent_code(spec, c) for c in codes]
        lost_memory(plan, codes, paused.lost, {k for k, a in enumerate(agents) if a.pid in swept})
        failures = node_failures(codes, exited_at, paused.lost)
        return rd.record_outcome(
            attempt,
            {str(k): node_exit(c) for k, c in enumerate(codes)},
            node_failures=failures,
            stopped_by=signal.Signals(intr.signal).name if intr.got else None,
            stopped_at=intr.at,
        )

    def _start_node(self, nc, rd: RunDir, attempt: int, intr) -> subprocess.Popen:
        """Node nc's agent: from its gate (launchers.backends.earlyagent), else started cold."""
        log = rd.start_agent_log(nc.node_rank, attempt, nc.shell())
        env = node_environ(os.environ, nc)
        agent = self.early.take(nc.node_rank, nc.argv, env, log, lambda: intr.got)
        return agent or procs.start_session(nc.argv, env, log)

    @staticmethod
    def _watch(
        agents: list[subprocess.Popen],
        intr: Interrupts,
        watch: LauncherWatch | None,
        exited_at: dict[int, float],
        here: Presence,
        tells=(),
        paused: Paused | None = None,
    ) -> tuple[list, str | None]:
        """Wait until every agent exits, one fails, a hang is decided, a node is paused (lost), the
        run dir is removed or we are interrupted: (codes, None | "hung" | "lost" | "gone");
        exited_at gets the time each agent's exit was seen (the first failure is the earliest in
        time)."""
        while not intr.got:
            codes = [a.poll() for a in agents]
            for k, c in enumerate(codes):
                if c is not None:
                    exited_at.setdefault(k, time.time())
            if any(c not in (0, None) for c in codes) or all(c is not None for c in codes):
                return codes, None
            if here.gone():
                return codes, "gone"
            if watch and (verdict := watch.poll()):
                print(f"launch: {describe(verdict)}", file=sys.stderr, flush=True)
                return codes, "hung"
            if paused and (lost := paused.check(time.monotonic())):
                for k, (_, why) in sorted(lost.items()):
                    print(
                        f"launch: node {k} is {why}; stopping the other nodes",
                        file=sys.stderr,
                        flush=True,
                    )
                return codes, "lost"
            # a torch extension build under way (launchers.frozen.extcache), the nodes'
            for tell in tells:
                tell()  # --dist-backend auto verdict (launchers.nodebackend): said
            time.sleep(0.05)
        return [a.poll() for a in agents], None

    def active(self, rd: RunDir) -> bool:
        return rd.launcher_alive() or bool(procs.tagged_pids(rd.run_id))

    def cancel(self, rd: RunDir) -> None:
        """SIGTERM to the launcher, which stops its run gracefully and records it; without a live
        launcher the same stop is done from here (one SIGTERM to each agent, the grace, then the
        sweep)."""
        st = rd.update_status(cancel_requested=True, cancel_at=time.time())
        grace = rd.spec().stop_grace
        if rd.launcher_alive(st):
            pid = st["launcher"]["pid"]
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + wait_s(grace) + 15
            while procs.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        stop = stop_decision("cancel", grace)
        procs.stop_run(rd.run_id, procs.agent_pids(rd.run_id), stop.signal, stop.wait_s)
        remove_containers(rd.spec(), rd.run_id, range(rd.spec().nodes))
        with rd.lock():
            if rd.read_status().get("state") not in TERMINAL:
                rd.update_status(state="CANCELLED", reason="by launch cancel", first_failure=None)

    def forget_memory(self, plan: Plan) -> None:
        memstore.forget_run(plan.run_id)


class Paused:
    """A paused simulated node: its torchrun agent stopped (state T: SIGSTOP) for PAUSED_S while
    another node's agent runs -- here what an SSH host gone silent is there
    (launchers.ssh.sshwatch.Silence): lost, the node's fault. Every live agent stopped alike is a
    paused run (a person's kill -STOP), not a lost node: no verdict. `lost`: node -> (when its pause
    was first seen, wall clock; the reason, `lost: ...`)."""

    def __init__(self, agents: list[subprocess.Popen]) -> None:
        self.agents = agents
        # node -> (monotonic, wall) its stop was first seen
        self.since: dict[int, tuple[float, float]] = {}
        self.lost: dict[int, tuple[float, str]] = {}
        self.next = 0.0

    def check(self, now: float) -> dict[int, tuple[float, str]]:
        """The lost nodes (at most one look at the agents every 0.5 s); now: time.monotonic()."""
        if now < self.next or self.lost:
            return self.lost
        self.next = now + 0.5
        live = [k for k, a in enumerate(self.agents) if a.poll() is None]
        stopped = [k for k in live if procs.stopped(self.agents[k].pid)]
        self.since = {k: self.since.get(k, (now, time.time())) for k in stopped}
        if len(stopped) < len(live):
            self.lost = {
                k: (wall, f"lost: paused for {now - t:.0f} s (its agent is stopped: SIGSTOP)")
                for k, (t, wall) in self.since.items()
                if now - t >= PAUSED_S
            }
        return self.lost

    def end(self, run_id: str, attempt: int) -> None:
        """SIGKILL every process of this attempt on a lost node, where it stands: stopped, it could
        use no stop grace, and on this machine nothing keeps the launcher from it -- left, it would
        wake into a run that went on without it (its writes fenced, but a process of the run left
        behind). First, so that the ranks waiting on it in a collective fail at once and take their
        stop."""
        for k in self.lost:
            for pid in node_pids(run_id, k, attempt):
                procs.kill(pid, signal.SIGKILL)


def lost_memory(plan: Plan, codes: list, lost: dict, swept: set[int]) -> None:
    """--memory-checkpoint: a simulated node that died (its agent SIGKILLed, or paused and lost)
    loses its memory, as a real node would: its store is removed (launchers.node.memstore), the next
    attempt's ranks there find nothing. A node whose agent the launcher's own sweep killed (it
    outlived the stop grace: a loaded machine) is not lost."""
    if not plan.spec.memory_checkpoint:
        return
    dead = [k for k, c in enumerate(codes) if c == -signal.SIGKILL and k not in swept or k in lost]
    slots = plan.slots or list(range(len(codes)))
    for s in memstore.forget_nodes(plan.run_id, [slots[k] for k in dead]):
        print(
            f"launch: node {slots.index(s)} (slot {s}) lost: its memory checkpoints are gone "
            "with it",
            file=sys.stderr,
            flush=True,
        )


def reap(agent: subprocess.Popen) -> int | None:
    try:
        return agent.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def stop_the_rest(
    plan: Plan,
    rd: RunDir,
    agents: list[subprocess.Popen],
    paused: "Paused",
    why: str | None,
    intr: Interrupts,
) -> tuple[list, list[int]]:
    """The attempt ends early (a node failed or was lost, a hang, the run dir removed, a stop): the
    hung ranks first (a collective waiting on them then fails at once), then the agents still
    running get the stop launchers.stops decides and the sweep -> (each agent's exit code, the pids
    the sweep had to kill)."""
    paused.end(plan.run_id, plan.attempt)
    if why == "hung":
        end_hung(rd.path, plan.run_id, plan.attempt)
    how = (
        stop_decision("run dir gone", 0)
        if why == "gone"
        else intr.stop(
            {"hung": "hang", "lost": "lost node"}.get(why or "", "peer failure"),
            plan.spec.stop_grace,
        )
    )
    # not reaped yet
    swept = procs.stop_run(
        plan.run_id,
        [a.pid for a in agents if a.poll() is None],
        how.signal,
        how.wait_s,
        intr.urgent,
    )
    return [reap(a) for a in agents], swept


def node_failures(
    codes: list, exited_at: dict[int, float], lost: dict[int, tuple[float, str]]
) -> list[dict]:
    """The attempt's failed nodes for RunDir.record_outcome: each agent that exited non-zero, when
    its exit was first seen (a node that ended in the stop: now, after the one that made us stop),
    and each node lost to a pause."""
    now = time.time()
    failures = [
        dict(node=k, time=exited_at.get(k, now), **exit_fields(c))
        for k, c in enumerate(codes)
        if c not in (0, None) and k not in lost
    ]
    return failures + [
        dict(node=k, time=t, exit_code=None, signal=None, reason=reason, kind="lost")
        for k, (t, reason) in lost.items()
    ]
