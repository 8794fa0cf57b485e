"""The per-node task of a Slurm run: one per allocated node (srun, one task per node).

Node rank = SLURM_NODEID; attempt = base attempt + SLURM_RESTART_COUNT (in the user's own allocation: the base
attempt, which the launcher numbers past a requeue: launchers.backends.slurm.inalloc). The node reads what the launcher
resolved (spec, run id, dist backend, the agent's stop settings, max requeues) from slurm/spec-a<A>.json
(nodespec) -- no yaml, no re-derivation. Node 0 (the first host of the allocation) resolves its own non-loopback address,
binds a small beacon socket on it (proof that the address is local), chooses the port (--master-port, else
derived from the Slurm job id, probed) and publishes both in slurm/master-<job>-<step>-r<restart>.json; the
other nodes read it and check that the beacon answers before starting their agent, so an unreachable master
is a one-line failure, never a hang. With --preflight gpu every node first runs the GPU check and waits for
every node's verdict (launchers.backends.slurm.gpugate): a bad node stops the job before any agent. Each node runs the command from launchers.torchrun.node_command (the one
builder) and records how it ended in status/node<K>.json (through RunDir).

Stop signals: Slurm signals every process of the step (the agent, each rank's wrapper, the program). The
agent is told to handle USR2 like SIGTERM (forward to its workers and wait for them), the wrappers forward
it to the program, which writes a checkpoint and exits. This task only notes the signal and waits; what
follows a USR2 is launchers.backends.slurm.requeue's. Stdlib only; no torch, no submitit.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from ... import layout, memstore, ports, procs
from ...container import agent_code, in_container, step_cwd, wrap
from ...containeropts import host_limits
from ...errors import LaunchError
from ...nodebackend import early as early_backend
from ...rundir import RunDir, exit_fields
from ...spec import RunSpec
from ...stops import stop_decision, wait_s
from ...torchrun import NodeCommand, node_command, node_environ
from . import gone
from .env import NodelistError, SlurmEnv
from .nodespec import load_node_spec
from .requeue import after_stop

MASTER_WAIT_S = 120.0      # other nodes wait this long for node 0 to publish the master address
BEACON_WAIT_S = 60.0       # ... and this long for node 0's beacon to answer
PEER_GRACE_S = 5.0         # a node still running this long after another node failed is stopped (watch_peers)
NODE_SHOWN = "<its Slurm node name>"     # the dry-run's, in a node's --memory-checkpoint store


class NodeError(Exception):
    """A node could not start its part of the job; recorded in status/node<K>.json."""


def slurm_node_command(spec: RunSpec, node: int, addr: str, port: Any, run_id: str, attempt: int, dist: str,
                       agent_env: dict[str, str], slot: int | None = None, host: str | None = None) -> NodeCommand:
    """The builder's command, plus what the agent needs to pass stop signals on (shown in the dry-run), in the
    job's container (launchers.container: a pyxis/OCI step is inside already, podman/apptainer wrap the agent).
    slot: the node's place in the allocation when the run has spares (LAUNCH_NODE_SLOT). host: the node's name
    in Slurm, its in-memory checkpoints' store (--memory-checkpoint; None: the dry-run's placeholder)."""
    nc = node_command(spec, node_rank=node, master_addr=addr, master_port=port, run_id=run_id,
                      attempt=attempt, dist_backend=dist, slot=slot)
    env = {**dict(nc.env), **memory_env(spec, run_id, host), **agent_env}
    return wrap(spec, NodeCommand(node_rank=nc.node_rank, argv=nc.argv, env=tuple(env.items()), secret=nc.secret),
                run_id, limits=host_limits())


def memory_env(spec: RunSpec, run_id: str, host: str | None) -> dict[str, str]:
    """--memory-checkpoint: the node's store is its Slurm node name's (launchers.memstore: nodes that share one
    /dev/shm stay apart, a spare that replaces a lost node finds nothing of the lost one's)."""
    if host is not None:
        return memstore.worker_env(spec.memory_checkpoint, run_id, None, False, host=host)
    env = memstore.worker_env(spec.memory_checkpoint, run_id, None, False)
    return {**env, memstore.ENV_DIR: os.path.join(env[memstore.ENV_DIR], NODE_SHOWN)} if env else {}


def same_env(spec: RunSpec, nc: NodeCommand) -> bool:
    """Whether the ranks see this task's environment as the agent is given it: no container around the agent, and
    the agent's python this interpreter itself (a --python wrapper script may change PATH on its way)."""
    return not in_container(spec) and os.path.realpath(nc.argv[0]) == os.path.realpath(sys.executable)


# ------------------------------------------------------------------------------------------ master address

def master_address(first_host: str, other_host: str | None, nnodes: int) -> str:
    """The first host's address as other nodes reach it; loopback only for a one-node job."""
    try:
        ips = [ai[4][0] for ai in socket.getaddrinfo(first_host, None, socket.AF_INET, socket.SOCK_STREAM)]
    except socket.gaierror as e:
        raise NodeError(f"first host {first_host!r} does not resolve on itself: {e}") from None
    routable = [ip for ip in ips if not ip.startswith("127.")]
    if routable:
        return routable[0]
    if other_host:  # the source address this host uses to reach another node of the allocation
        try:
            peer = socket.gethostbyname(other_host)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, 9))
                ip = s.getsockname()[0]
            if not ip.startswith("127."):
                return ip
        except OSError:
            pass
    if nnodes == 1:
        return ips[0] if ips else "127.0.0.1"
    raise NodeError(f"first host {first_host!r} resolves only to loopback ({', '.join(ips)}); the other nodes "
                    "cannot reach it: fix its /etc/hosts or DNS entry")


class Beacon:
    """A listening socket on the master address: binding proves the address is local, connecting proves
    other nodes reach it."""

    def __init__(self, addr: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.bind((addr, 0))
        except OSError as e:
            raise NodeError(f"master address {addr} is not an address of this host ({socket.gethostname()}): {e}") \
                from None
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
                conn.close()
            except OSError:
                return


def check_reachable(addr: str, port: int, deadline: float, stopped) -> None:
    last = None
    while time.monotonic() < deadline and not stopped():
        try:
            with socket.create_connection((addr, port), timeout=3):
                return
        except OSError as e:
            last = e
            time.sleep(0.5)
    raise NodeError(f"master {addr} (beacon port {port}) is not reachable from {socket.gethostname()}: {last}")


def wait_master(path: str, stopped) -> dict[str, Any]:
    deadline = time.monotonic() + MASTER_WAIT_S
    while time.monotonic() < deadline and not stopped():
        rec = layout.read_json(path)
        if rec is not None:
            return rec
        time.sleep(0.02)
    raise NodeError(f"node 0 did not publish the master address within {MASTER_WAIT_S:.0f} s ({path})")


# ------------------------------------------------------------------------------------------ the node task

class NodeRun:
    """One node's part of one attempt."""

    def __init__(self, run_dir: str, base_attempt: int, in_allocation: bool):
        self.env = SlurmEnv.read()
        self.in_allocation, self.step_error = in_allocation, None
        try:
            self.node = self.env.step_node()      # a step of the loop over attempts (--spares): the step's order
        except NodelistError as e:
            self.node, self.step_error = self.env.node_id, str(e)
        self.restart = self.env.restart_count      # this run of the job, in the rendezvous' path: a requeued job
        #                                            numbers its steps from 0 again (the user's allocation too)
        added = 0 if in_allocation else self.restart   # in the user's allocation the launcher numbers attempts
        self.attempt = base_attempt + added if self.env.step_attempt is None else self.env.step_attempt
        self.rd = RunDir(run_dir)
        self.here = layout.Presence(self.rd.path)       # the run dir as this node found it (watch_gone)
        self.ns = load_node_spec(self.rd, base_attempt)
        if 0 < len(self.env.step_hosts) < self.ns.spec.nodes:    # --nodes MIN:MAX: the loop shrank the run
            self.ns = replace(self.ns, spec=self.ns.spec.replace(nodes=len(self.env.step_hosts)))
        self.dir_gone = False
        self.stops: list[str] = []
        self.peer_failed: str | None = None
        self.base_rec = {"node": self.node, "attempt": self.attempt, "host": socket.gethostname(),
                         "pid": os.getpid(), "slurm_job_id": self.env.job_id, "slurm_restart": self.restart}

    def on_stop(self, signum, _frame) -> None:
        self.stops.append(signal.Signals(signum).name)

    def stopped(self) -> bool:
        return bool(self.stops)

    def rendezvous(self, hosts: list[str]) -> tuple[str, int]:
        """Node 0 publishes the master address and port; the others read them and check they reach it."""
        spec, job = self.ns.spec, self.env.job_id
        path = layout.path(self.rd.path, "rendezvous", job=job, step=self.env.step_id, restart=self.restart)
        if self.node == 0:
            addr = master_address(hosts[0], hosts[1] if len(hosts) > 1 else None, spec.nodes)
            beacon = Beacon(addr)
            self.beacon = beacon                  # kept open while the node runs
            key = f"slurm-{job}" + (f".{self.env.step_id}" if self.in_allocation or self.env.step_hosts else "")
            port = ports.choose_port(key, spec.master_port, addr)
            layout.present(self.rd.path)          # never recreates a removed run dir (its slurm/ folder)
            layout.atomic_write(path, json.dumps({"addr": addr, "port": port, "beacon": beacon.port,
                                                  "host": hosts[0]}), durable=False)
            return addr, port
        info = wait_master(path, self.stopped)
        check_reachable(info["addr"], info["beacon"], time.monotonic() + BEACON_WAIT_S, self.stopped)
        return info["addr"], info["port"]

    def command(self, k: int, addr: str, port: Any, hosts: list[str]) -> NodeCommand:
        ns, slots = self.ns, self.env.step_slots           # --spares: node k's slot in the pool
        slot = slots[k] if k < len(slots) else None
        host = (self.env.node_name if k == self.node else "") or (hosts[k] if k < len(hosts) else "")
        return slurm_node_command(ns.spec, k, addr, port, ns.run_id, self.attempt, ns.dist_backend, ns.agent_env,
                                  slot, host or socket.gethostname().split(".")[0])

    def start(self) -> int:
        """Rendezvous, start the agent, record, wait; the agent's exit code."""
        if self.step_error:
            raise NodeError(self.step_error)
        try:
            hosts = list(self.env.step_hosts) or self.env.hostnames()
        except NodelistError as e:
            raise NodeError(str(e)) from None
        if len(hosts) < self.ns.spec.nodes:
            raise NodeError(f"the allocation has {len(hosts)} nodes ({self.env.nodelist}), "
                            f"the job needs {self.ns.spec.nodes}")
        if "gpu" in self.ns.spec.preflight:      # every node's verdict before any rendezvous (slurm.gpugate)
            from .gpugate import check_node  # here: its GPU tools' parsers are not on a plain job's start path
            gpus = self.ns.spec.gpus_per_node if self.ns.dist_backend == "nccl" else None    # auto: nodebackend
            check_node(self.rd.path, {"job": self.env.job_id, "step": self.env.step_id, "restart": self.restart,
                                      "node": self.node}, self.ns.spec.nodes, gpus, self.stopped)
        addr, port = self.rendezvous(hosts)
        nc = self.command(self.node, addr, port, hosts)
        if self.stops:
            raise NodeError(f"stopped by {self.stops[0]} before starting")
        log = self.rd.start_agent_log(self.node, self.attempt, nc.shell(),
                                      f"{socket.gethostname()} | slurm job {self.env.job_id}")
        env = node_environ(os.environ, nc)
        if self.ns.dist_backend == "auto" and same_env(self.ns.spec, nc):    # the ranks' answer, while torchrun
            early_backend(self.rd.path, env, self.node, self.attempt, self.ns.spec.gpus_per_node)   # starts
        agent = procs.start_session(nc.argv, env, log, cwd=step_cwd(self.ns.spec))
        self.watch_hangs(agent.pid)
        threading.Thread(target=self.watch_peers, args=(agent,), daemon=True, name="launch-peer-watch").start()
        threading.Thread(target=self.watch_gone, args=(agent,), daemon=True, name="launch-gone-watch").start()
        if self.node == 0:           # bookkeeping while the agent imports torch (off the start-up path)
            self.record_attempt(addr, port, hosts[:self.ns.spec.nodes])
            self.rd.update_status(state="RUNNING", attempt=self.attempt, nodes={}, first_failure=None, reason=None,
                                  slurm_job_id=self.env.job_id)
        self.rd.write_node_record(self.node, dict(self.base_rec, state="RUNNING", master=f"{addr}:{port}",
                                                  agent_pid=agent.pid, time=time.time()))
        return agent.wait()

    def watch_hangs(self, agent_pid: int) -> None:
        """--hang-timeout: this node's monitor (it stops the node's processes once a hang is decided) and, on
        node 0, the run's coordinator."""
        spec = self.ns.spec
        if not spec.hang_timeout:
            return
        from ...hang.verdict import hang_reason
        from ...hang.watch import Coordinator, NodeMonitor
        from ...remote import stop_node

        def stop(verdict: dict) -> None:          # the ranks waiting on the hung one get the stop and the grace
            print(f"launch: node {self.node}: {hang_reason(verdict)}; stopping this node", file=sys.stderr, flush=True)
            how = stop_decision("hang", spec.stop_grace)
            stop_node(self.ns.run_id, self.node, sig=how.signal, wait_s=how.wait_s, agent_pid=agent_pid)

        NodeMonitor(self.rd.path, self.ns.run_id, self.attempt, nodes=[self.node], on_verdict=stop).start()
        if self.node == 0:
            coord = Coordinator(self.rd, self.attempt, spec.hang_timeout, spec.nodes, spec.world_size)
            threading.Thread(target=coordinate, args=(coord,), daemon=True, name="launch-hang-coordinator").start()

    def watch_peers(self, agent) -> None:
        """Another node of this attempt ended in failure without a stop signal (its agent died, its task
        failed) while this agent still runs: its workers may already be gone (done, or stopped by that node's
        sweep) and this agent would wait for the dead peer in torchrun's exit barrier (300 s). After
        PEER_GRACE_S (the failure's own propagation first) this node is stopped like a cancel: the stop to
        the agent, the programs' stop grace, then the sweep; an agent whose workers are all gone is killed."""
        since = None
        while agent.poll() is None and not self.stops:
            failed = [k for k, r in self.rd.node_records(self.ns.spec.nodes, self.attempt).items()
                      if k != self.node and r.get("state") == "EXITED" and not r.get("stop_signals")
                      and r.get("slurm_job_id") == self.env.job_id and (r.get("exit_code") or r.get("signal"))]
            since = (since or time.monotonic()) if failed else None
            if since is not None and time.monotonic() - since >= PEER_GRACE_S:
                self.peer_failed = f"node {failed[0]} ended in failure"
                print(f"launch: node {self.node}: {self.peer_failed} while this node still runs; stopping it",
                      file=sys.stderr, flush=True)
                from ...remote import node_pids, stop_node
                if [p for p in node_pids(self.ns.run_id, self.node) if p != agent.pid]:
                    stop_node(self.ns.run_id, self.node, wait_s=wait_s(self.ns.spec.stop_grace), agent_pid=agent.pid)
                else:        # only the agent is left, in the exit barrier: a C++ wait no signal handler interrupts
                    procs.kill(agent.pid, signal.SIGKILL)
                return
            time.sleep(1.0)

    def watch_gone(self, agent) -> None:
        """The run dir removed while this node runs: its records cannot be kept. This node's processes are
        killed at once (no grace: what a program wrote would recreate half a run dir), the node writes nothing
        more, node 0 cancels the job (launchers.backends.slurm.gone)."""
        if gone.watch(self.here.gone, lambda: agent.poll() is not None):
            from ...remote import stop_node
            self.dir_gone = True
            how = stop_decision("run dir gone", 0)
            stop_node(self.ns.run_id, self.node, sig=how.signal, wait_s=how.wait_s, agent_pid=agent.pid)

    def end_gone(self) -> int:
        """The run dir is gone (noticed by watch_gone, or once the agent ended): one line in this node's Slurm
        log, what is left of the run on this node killed, node 0 cancels the job; nothing written."""
        print(f"launch: node {self.node}: {self.here.gone_line()}", file=sys.stderr, flush=True)
        from ...remote import stop_node
        from ..base import remove_containers
        stop_node(self.ns.run_id, self.node, sig=signal.SIGKILL, wait_s=0)
        remove_containers(self.ns.spec, self.ns.run_id, [self.node])
        if self.node == 0 and (why := gone.cancel_own(self.env.job_id, self.env.step_id, self.in_allocation)):
            print(f"launch: node 0: scancel of job {self.env.job_id} failed: {why}", file=sys.stderr, flush=True)
        return 1

    def sweep(self) -> None:
        """What still carries the run id on this node once its agent is gone -- the workers of an agent that
        died hard, a daemon a program double-forked: Slurm's process tracking (proctrack/linuxproc follows
        parents) loses both. Rank wrappers get the stop (their programs the stop grace), then the leftovers
        are SIGKILLed; with no wrapper left there is nothing to wait for. After the node record, so the node
        (not the ranks this stops) is the first failure when its agent died."""
        from ...remote import node_pids, stop_node
        from ..base import remove_containers
        remove_containers(self.ns.spec, self.ns.run_id, [self.node])     # a podman container its agent left
        left = node_pids(self.ns.run_id, self.node, self.attempt)      # this attempt's: never another's node K
        if not left:
            return
        graceful = any(procs.is_rank_wrapper(p) for p in left)
        done = stop_node(self.ns.run_id, self.node, sig=signal.SIGTERM if graceful else signal.SIGKILL,
                         wait_s=wait_s(self.ns.spec.stop_grace), attempt=self.attempt)
        print(f"launch: node {self.node}: {len(left)} process(es) of the run outlived the agent; stopped "
              f"(killed: {len(done['forced'])})", file=sys.stderr, flush=True)

    def record_attempt(self, addr: str, port: int, hosts: list[str]) -> None:
        """run.yaml: node 0 is its only writer while the job runs (the launcher wrote it before submitting)."""
        spec = self.ns.spec
        self.rd.update_attempt(self.attempt, {
            "master_addr": addr, "master_port": port, "dist_backend": self.ns.dist_backend, "hosts": hosts,
            "commands": [self.command(k, addr, port, hosts).shell() for k in range(spec.nodes)],
            "slurm_job_id": self.env.job_id, "slurm_restart": self.restart,
        }, {"nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node, "reason": "requeued by Slurm"})

    def __call__(self) -> int:
        for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self.on_stop)
        signal.signal(signal.SIGCONT, signal.SIG_DFL)
        error, kind = None, None
        try:
            code = self.start()
        except FileNotFoundError:                    # a record refused to recreate the removed run dir
            if not self.here.gone():
                raise
            code = 1
        except (NodeError, LaunchError) as e:
            if self.here.gone():
                return self.end_gone()
            error, code, kind = str(e), 1, getattr(e, "kind", None)      # errors.NodeFault: typed
            print(f"launch: node {self.node}: {error}", file=sys.stderr, flush=True)
        if self.dir_gone or self.here.gone():
            return self.end_gone()
        self.rd.write_node_record(self.node, dict(self.base_rec, state="EXITED", stop_signals=sorted(set(self.stops)),
                                                  error=error, time=time.time(), stopped_because=self.peer_failed,
                                                  **({"kind": kind} if kind else {}),
                                                  **exit_fields(agent_code(self.ns.spec, code))))
        self.sweep()
        if self.node == 0 and "SIGUSR2" in self.stops and not self.in_allocation:   # the user's job: never
            after_stop(self.rd, self.ns.spec, self.attempt, self.restart, self.env.job_id,  # requeued by launch
                       self.ns.max_requeues)                                          # (.inalloc)
        return code


def coordinate(coord) -> None:
    from ...hang.watch import INTERVAL_S
    try:
        while coord.check(time.time()) is None:
            time.sleep(INTERVAL_S)
    except FileNotFoundError:            # the run dir was removed: NodeRun.watch_gone ends the node
        return


def run_node(run_dir: str, base_attempt: int, in_allocation: bool = False) -> int:
    return NodeRun(run_dir, base_attempt, in_allocation)()
