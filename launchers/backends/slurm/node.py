"""The per-node task of a Slurm run: one per allocated node (srun, one task per node).

Node rank = SLURM_NODEID; attempt = base attempt + SLURM_RESTART_COUNT (in the user's own
allocation: the base attempt, which the launcher numbers past a requeue:
launchers.backends.slurm.inalloc). The node reads what the launcher resolved (spec, run id, dist
backend, the agent's stop settings, max requeues) from slurm/spec-a<A>.json (nodespec) -- no yaml,
no re-derivation. Node 0 (the first host of the allocation) resolves its own non-loopback address,
binds a small beacon socket on it (proof that the address is local), chooses the port
(--master-port, else derived from the Slurm job id, probed) and publishes both in
slurm/master-<job>-<step>-r<restart>.json; the other nodes read it and check that the beacon answers
before starting their agent, so an unreachable master is a one-line failure, never a hang. With
--preflight gpu every node first runs the GPU check and waits for every node's verdict
(launchers.backends.slurm.gpugate): a bad node stops the job before any agent. Each node runs the
command from launchers.torchrun.node_command (the one builder; launchers.backends.slurm.nodecmd) and
records how it ended in status/node<K>.json (through RunDir). The rendezvous' addresses and beacon
are launchers.backends.slurm.rendezvous's, the watches over the running agent (a hang, a failed peer
node, the run dir removed) launchers.backends.slurm.nodewatch's.

Stop signals: Slurm signals every process of the step (the agent, each rank's wrapper, the program).
The agent is told to handle USR2 like SIGTERM (forward to its workers and wait for them), the
wrappers forward it to the program, which writes a checkpoint and exits. This task only notes the
signal and waits; what follows a USR2 is launchers.backends.slurm.requeue's. Stdlib only; no torch,
no submitit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from ... import layout, ports, procs
from ...containers.container import agent_code, step_cwd
from ...errors import LaunchError
from ...nodebackend import early as early_backend
from ...records.rundir import RunDir, exit_fields
from ...stops import wait_s
from ...torchrun import NodeCommand, node_environ
from .. import earlyagent
from . import gone
from .env import NodelistError, SlurmEnv
from .nodecmd import same_env, slurm_node_command
from .nodespec import load_node_spec
from .nodewatch import NodeWatches
from .rendezvous import (
    BEACON_WAIT_S,
    Beacon,
    NodeError,
    check_reachable,
    master_address,
    wait_master,
)
from .requeue import after_stop


class NodeRun(NodeWatches):
    """One node's part of one attempt."""

    def __init__(self, run_dir: str, base_attempt: int, in_allocation: bool):
        self.env = SlurmEnv.read()
        self.in_allocation, self.step_error = in_allocation, None
        try:
            # a step of the loop over attempts (--spares): the step's order
            self.node = self.env.step_node()
        except NodelistError as e:
            self.node, self.step_error = self.env.node_id, str(e)
        # this run of the job, in the rendezvous' path: a requeued job
        self.restart = self.env.restart_count
        #                                            numbers its steps from 0 again (the user's
        #                                            allocation too)
        # in the user's allocation the launcher numbers attempts
        added = 0 if in_allocation else self.restart
        self.attempt = (
            base_attempt + added if self.env.step_attempt is None else self.env.step_attempt
        )
        self.rd = RunDir(run_dir)
        self.here = layout.Presence(self.rd.path)  # the run dir as this node found it (watch_gone)
        self.ns = load_node_spec(self.rd, base_attempt)
        # --nodes MIN:MAX: the loop shrank the run
        if 0 < len(self.env.step_hosts) < self.ns.spec.nodes:
            self.ns = replace(self.ns, spec=self.ns.spec.replace(nodes=len(self.env.step_hosts)))
        self.dir_gone = False
        self.stops: list[str] = []
        self.peer_failed: str | None = None
        self.base_rec = {
            "node": self.node,
            "attempt": self.attempt,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job_id": self.env.job_id,
            "slurm_restart": self.restart,
        }

    def on_stop(self, signum, _frame) -> None:
        self.stops.append(signal.Signals(signum).name)

    def stopped(self) -> bool:
        return bool(self.stops)

    def rendezvous(self, hosts: list[str]) -> tuple[str, int]:
        """Node 0 publishes the master address and port; the others read them and check they reach
        it."""
        spec, job = self.ns.spec, self.env.job_id
        path = layout.path(
            self.rd.path, "rendezvous", job=job, step=self.env.step_id, restart=self.restart
        )
        if self.node == 0:
            addr = master_address(hosts[0], hosts[1] if len(hosts) > 1 else None, spec.nodes)
            beacon = Beacon(addr)
            self.beacon = beacon  # kept open while the node runs
            key = f"slurm-{job}" + (
                f".{self.env.step_id}" if self.in_allocation or self.env.step_hosts else ""
            )
            port = ports.choose_port(key, spec.master_port, addr)
            layout.present(self.rd.path)  # never recreates a removed run dir (its slurm/ folder)
            layout.atomic_write(
                path,
                json.dumps({"addr": addr, "port": port, "beacon": beacon.port, "host": hosts[0]}),
                durable=False,
            )
            return addr, port
        info = wait_master(path, self.stopped)
        check_reachable(
            info["addr"], info["beacon"], time.monotonic() + BEACON_WAIT_S, self.stopped
        )
        return info["addr"], info["port"]

    def command(self, k: int, addr: str, port: Any, hosts: list[str]) -> NodeCommand:
        ns, slots = self.ns, self.env.step_slots  # --spares: node k's slot in the pool
        slot = slots[k] if k < len(slots) else None
        host = (self.env.node_name if k == self.node else "") or (
            hosts[k] if k < len(hosts) else ""
        )
        return slurm_node_command(
            ns.spec,
            k,
            addr,
            port,
            ns.run_id,
            self.attempt,
            ns.dist_backend,
            ns.agent_env,
            slot,
            host or socket.gethostname().split(".")[0],
        )

    def start(self) -> int:
        """Rendezvous, start the agent, record, wait; the agent's exit code."""
        hosts = self.allocation_hosts()
        # every node's verdict before any rendezvous (slurm.gpugate)
        if "gpu" in self.ns.spec.preflight:
            self.gpu_gate()
        addr, port = self.rendezvous(hosts)
        nc = self.command(self.node, addr, port, hosts)
        self.refuse_if_stopped()
        agent = self.start_agent(nc)
        self.watch_hangs(agent.pid)
        threading.Thread(
            target=self.watch_peers, args=(agent,), daemon=True, name="launch-peer-watch"
        ).start()
        threading.Thread(
            target=self.watch_gone, args=(agent,), daemon=True, name="launch-gone-watch"
        ).start()
        if self.node == 0:  # bookkeeping while the agent imports torch (off the start-up path)
            self.record_attempt(addr, port, hosts[: self.ns.spec.nodes])
            self.rd.update_status(
                state="RUNNING",
                attempt=self.attempt,
                nodes={},
                first_failure=None,
                reason=None,
                slurm_job_id=self.env.job_id,
            )
        self.rd.write_node_record(
            self.node,
            dict(
                self.base_rec,
                state="RUNNING",
                master=f"{addr}:{port}",
                agent_pid=agent.pid,
                time=time.time(),
            ),
        )
        return agent.wait()

    def allocation_hosts(self) -> list[str]:
        """The hosts of this step (--spares) or of the allocation, at least as many as the job's
        nodes."""
        if self.step_error:
            raise NodeError(self.step_error)
        try:
            hosts = list(self.env.step_hosts) or self.env.hostnames()
        except NodelistError as e:
            raise NodeError(str(e)) from None
        if len(hosts) < self.ns.spec.nodes:
            raise NodeError(
                f"the allocation has {len(hosts)} nodes ({self.env.nodelist}), "
                f"the job needs {self.ns.spec.nodes}"
            )
        return hosts

    def gpu_gate(self) -> None:
        """--preflight gpu: this node's GPU check, then every node's verdict
        (launchers.backends.slurm.gpugate)."""
        # here: its GPU tools' parsers are not on a plain job's start path
        from .gpugate import check_node

        # auto: nodebackend
        gpus = self.ns.spec.gpus_per_node if self.ns.dist_backend == "nccl" else None
        check_node(
            self.rd.path,
            {
                "job": self.env.job_id,
                "step": self.env.step_id,
                "restart": self.restart,
                "node": self.node,
            },
            self.ns.spec.nodes,
            gpus,
            self.stopped,
        )

    def refuse_if_stopped(self, gate=None) -> None:
        """A stop that came before the agent's start: no agent (slurmstepd's signal reached this
        step's processes already and would never reach one started now); the node's early gate, if
        it has one, is ended."""
        if self.stops:
            if gate is not None:
                gate.close()
            raise NodeError(f"stopped by {self.stops[0]} before starting")

    def start_agent(self, nc: NodeCommand) -> subprocess.Popen:
        """The agent started in its own session, its output in this attempt's agent log."""
        log = self.rd.start_agent_log(
            self.node,
            self.attempt,
            nc.shell(),
            f"{socket.gethostname()} | slurm job {self.env.job_id}",
        )
        env = node_environ(os.environ, nc)
        # the ranks' answer, while torchrun
        if self.ns.dist_backend == "auto" and same_env(self.ns.spec, nc):
            # starts
            early_backend(self.rd.path, env, self.node, self.attempt, self.ns.spec.gpus_per_node)
        # the gate this task started as it started (launchers.backends.earlyagent), else cold (in
        # an OCI container, where the agent starts in the launch dir, the gate is ended)
        cwd, agent = step_cwd(self.ns.spec), None
        gate = earlyagent.prestarted(nc.argv, env) if cwd is None else earlyagent.discard()
        if gate is not None:
            if self.node > 0:  # its torch is imported: it would reach the store before it listens
                earlyagent.await_master(env, self.stopped)
            self.refuse_if_stopped(gate)  # a stop while it waited
            agent = gate.go(nc.argv, env, log)
        return agent or procs.start_session(nc.argv, env, log, cwd=cwd)

    def end_gone(self) -> int:
        """The run dir is gone (noticed by watch_gone, or once the agent ended): one line in this
        node's Slurm log, what is left of the run on this node killed, node 0 cancels the job;
        nothing written."""
        print(f"launch: node {self.node}: {self.here.gone_line()}", file=sys.stderr, flush=True)
        from ...nodeagent import stop_node
        from ..base import remove_containers

        stop_node(self.ns.run_id, self.node, sig=signal.SIGKILL, wait_s=0)
        remove_containers(self.ns.spec, self.ns.run_id, [self.node])
        if self.node == 0 and (
            why := gone.cancel_own(self.env.job_id, self.env.step_id, self.in_allocation)
        ):
            print(
                f"launch: node 0: scancel of job {self.env.job_id} failed: {why}",
                file=sys.stderr,
                flush=True,
            )
        return 1

    def sweep(self) -> None:
        """What still carries the run id on this node once its agent is gone -- the workers of an
        agent that died hard, a daemon a program double-forked: Slurm's process tracking
        (proctrack/linuxproc follows parents) loses both. Rank wrappers get the stop (their programs
        the stop grace), then the leftovers are SIGKILLed; with no wrapper left there is nothing to
        wait for. After the node record, so the node (not the ranks this stops) is the first failure
        when its agent died."""
        from ...nodeagent import node_pids, stop_node
        from ..base import remove_containers

        # a podman container its agent left
        remove_containers(self.ns.spec, self.ns.run_id, [self.node])
        # this attempt's: never another's node K
        left = node_pids(self.ns.run_id, self.node, self.attempt)
        if not left:
            return
        graceful = any(procs.is_rank_wrapper(p) for p in left)
        done = stop_node(
            self.ns.run_id,
            self.node,
            sig=signal.SIGTERM if graceful else signal.SIGKILL,
            wait_s=wait_s(self.ns.spec.stop_grace),
            attempt=self.attempt,
        )
        print(
            f"launch: node {self.node}: {len(left)} process(es) of the run outlived the agent; "
            f"stopped (killed: {len(done['forced'])})",
            file=sys.stderr,
            flush=True,
        )

    def record_attempt(self, addr: str, port: int, hosts: list[str]) -> None:
        """run.yaml: node 0 is its only writer while the job runs (the launcher wrote it before
        submitting)."""
        spec = self.ns.spec
        self.rd.update_attempt(
            self.attempt,
            {
                "master_addr": addr,
                "master_port": port,
                "dist_backend": self.ns.dist_backend,
                "hosts": hosts,
                "commands": [self.command(k, addr, port, hosts).shell() for k in range(spec.nodes)],
                "slurm_job_id": self.env.job_id,
                "slurm_restart": self.restart,
            },
            {
                "nodes": spec.nodes,
                "gpus_per_node": spec.gpus_per_node,
                "reason": "requeued by Slurm",
            },
        )

    def __call__(self) -> int:
        for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self.on_stop)
        signal.signal(signal.SIGCONT, signal.SIG_DFL)
        error, kind = None, None
        try:
            code = self.start()
        except FileNotFoundError:  # a record refused to recreate the removed run dir
            if not self.here.gone():
                raise
            code = 1
        except (NodeError, LaunchError) as e:
            if self.here.gone():
                return self.end_gone()
            error, code, kind = str(e), 1, getattr(e, "kind", None)  # errors.NodeFault: typed
            print(f"launch: node {self.node}: {error}", file=sys.stderr, flush=True)
        if self.dir_gone or self.here.gone():
            return self.end_gone()
        self.rd.write_node_record(
            self.node,
            dict(
                self.base_rec,
                state="EXITED",
                stop_signals=sorted(set(self.stops)),
                error=error,
                time=time.time(),
                stopped_because=self.peer_failed,
                **({"kind": kind} if kind else {}),
                **exit_fields(agent_code(self.ns.spec, code)),
            ),
        )
        self.sweep()
        # the user's job: never
        if self.node == 0 and "SIGUSR2" in self.stops and not self.in_allocation:
            # requeued by launch
            after_stop(
                self.rd,
                self.ns.spec,
                self.attempt,
                self.restart,
                self.env.job_id,
                self.ns.max_requeues,
            )  # (.inalloc)
        return code


def run_node(run_dir: str, base_attempt: int, in_allocation: bool = False) -> int:
    return NodeRun(run_dir, base_attempt, in_allocation)()
