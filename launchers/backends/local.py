"""N simulated nodes on this machine: one torchrun agent per node, each in its own session, all joined
through 127.0.0.1:<port> with the exact per-node command a cluster node would run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from .. import procs
from ..follow import follow_in_thread
from ..hang.watch import LauncherWatch, describe
from ..ports import choose_port
from ..rundir import TERMINAL, RunDir, exit_fields
from ..spec import JobSpec
from ..torchrun import node_environ
from .base import Backend, Plan, dist_backend_for, node_commands

MASTER = "127.0.0.1"


class LocalBackend(Backend):
    name = "local"
    grace = 5.0
    stream = True          # print prefixed rank output while the job runs

    def plan(self, spec: JobSpec, run_id: str, attempt: int) -> Plan:
        port = choose_port(run_id, spec.master_port, MASTER)
        dist = dist_backend_for(spec)
        return Plan(spec=spec, run_id=run_id, attempt=attempt, master_addr=MASTER, master_port=port,
                    dist_backend=dist, nodes=node_commands(spec, run_id, attempt, MASTER, port, dist))

    def start(self, plan: Plan, rd: RunDir) -> int:
        attempt = plan.attempt
        rd.mark_running(attempt)
        interrupted: list[int] = []
        old = {s: signal.signal(s, lambda signum, _f: interrupted.append(signum))
               for s in (signal.SIGINT, signal.SIGTERM)}
        agents: list[subprocess.Popen] = []
        spec = plan.spec
        watch = LauncherWatch(rd, plan.run_id, attempt, spec.hang_timeout, spec.nodes, spec.world_size,
                              monitor_here=True) if spec.hang_timeout else None
        thread, stop = follow_in_thread(rd.path) if self.stream else (None, None)
        try:
            for nc in plan.nodes:
                log = rd.start_agent_log(nc.node_rank, attempt, nc.shell())
                agents.append(procs.start_session(nc.argv, node_environ(os.environ, nc), log))
            codes = self._watch(agents, interrupted, watch)
            if interrupted or any(c not in (0, None) for c in codes) or (watch and watch.coord.verdict):
                procs.terminate_run(plan.run_id, agents, grace=self.grace)
                codes = [a.poll() for a in agents]
        finally:
            if watch:
                watch.close()
            if stop is not None:
                stop.set()
                thread.join(timeout=5)
            for s, h in old.items():
                signal.signal(s, h)
        stopped = signal.Signals(interrupted[0]).name if interrupted else None
        failures = [dict(node=k, time=time.time(), **exit_fields(c)) for k, c in enumerate(codes) if c not in (0, None)]
        return rd.record_outcome(attempt, {str(k): c for k, c in enumerate(codes)}, stopped_by=stopped,
                                 node_failures=failures)

    @staticmethod
    def _watch(agents: list[subprocess.Popen], interrupted: list[int], watch: LauncherWatch | None) -> list[int | None]:
        """Wait until every agent exits, one fails, a hang is decided, or we are interrupted."""
        while not interrupted:
            codes = [a.poll() for a in agents]
            if any(c not in (0, None) for c in codes) or all(c is not None for c in codes):
                return codes
            if watch and (verdict := watch.poll()):
                print(f"launch: {describe(verdict)}", file=sys.stderr, flush=True)
                return codes
            time.sleep(0.05)
        return [a.poll() for a in agents]

    def active(self, rd: RunDir) -> bool:
        return rd.launcher_alive() or bool(procs.tagged_pids(rd.run_id))

    def cancel(self, rd: RunDir) -> None:
        st = rd.read_status()
        if rd.launcher_alive(st):
            pid = st["launcher"]["pid"]
            os.kill(pid, signal.SIGTERM)      # the launcher tears its nodes down and records CANCELLED
            deadline = time.monotonic() + 15
            while procs.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        procs.terminate_run(rd.run_id)
        with rd.lock():
            if rd.read_status().get("state") not in TERMINAL:
                rd.update_status(state="CANCELLED", reason="launch cancel")
