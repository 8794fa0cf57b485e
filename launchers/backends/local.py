"""N simulated nodes on this machine: one torchrun agent per node, each in its own session, all joined
through 127.0.0.1:<port> with the exact per-node command a cluster node would run."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from .. import procs
from ..follow import follow_in_thread
from ..rundir import RunDir
from ..spec import JobSpec
from .base import Backend, Plan, choose_port, dist_backend_for, node_commands

MASTER = "127.0.0.1"


class LocalBackend(Backend):
    name = "local"
    grace = 5.0
    stream = True          # print prefixed rank output while the job runs

    def plan(self, spec: JobSpec, run_id: str, attempt: int) -> Plan:
        port = choose_port(spec, run_id, MASTER)
        dist = dist_backend_for(spec)
        return Plan(spec=spec, run_id=run_id, attempt=attempt, master_addr=MASTER, master_port=port,
                    dist_backend=dist, nodes=node_commands(spec, run_id, attempt, MASTER, port, dist))

    def start(self, plan: Plan, rd: RunDir) -> int:
        attempt = plan.attempt
        rd.write_status(state="RUNNING", attempt=attempt, nodes={}, first_failure=None,
                        launcher={"pid": os.getpid(), "host": socket.gethostname(),
                                  "start": procs.start_ticks(os.getpid())})
        interrupted: list[int] = []
        old = {s: signal.signal(s, lambda signum, _f: interrupted.append(signum))
               for s in (signal.SIGINT, signal.SIGTERM)}
        agents: list[subprocess.Popen] = []
        thread, stop = follow_in_thread(rd) if self.stream else (None, None)
        try:
            for nc in plan.nodes:
                log = rd.agent_log(nc.node_rank)
                os.makedirs(os.path.dirname(log), exist_ok=True)
                with open(log, "a", encoding="utf-8") as f:
                    f.write(f"===== launch attempt {attempt} | node {nc.node_rank} | {time.strftime('%F %T')} =====\n"
                            f"{nc.shell()}\n")
                agents.append(procs.start_session(nc.argv, {**os.environ, **nc.env_dict}, log))
            codes = self._watch(agents, interrupted)
            if interrupted or any(c not in (0, None) for c in codes):
                procs.terminate_run(plan.run_id, agents, grace=self.grace)
                codes = [a.poll() for a in agents]
        finally:
            if stop is not None:
                stop.set()
                thread.join(timeout=5)
            for s, h in old.items():
                signal.signal(s, h)
        nodes = {str(k): c for k, c in enumerate(codes)}
        if interrupted:
            rd.write_status(state="CANCELLED", nodes=nodes, first_failure=rd.first_failure(attempt),
                            reason=f"launcher got {signal.Signals(interrupted[0]).name}")
            return 130
        if all(c == 0 for c in codes):
            rd.write_status(state="COMPLETED", nodes=nodes, first_failure=None)
            return 0
        failure = rd.first_failure(attempt) or _agent_failure(codes)
        rd.write_status(state="FAILED", nodes=nodes, first_failure=failure)
        return 1

    @staticmethod
    def _watch(agents: list[subprocess.Popen], interrupted: list[int]) -> list[int | None]:
        """Wait until every agent exits, one fails, or we are interrupted."""
        while not interrupted:
            codes = [a.poll() for a in agents]
            if any(c not in (0, None) for c in codes) or all(c is not None for c in codes):
                return codes
            time.sleep(0.05)
        return [a.poll() for a in agents]

    def refresh(self, rd: RunDir) -> dict:
        """status.json, except that a RUNNING run whose launcher is gone (killed) is reported as FAILED."""
        st = rd.read_status()
        launcher = st.get("launcher") or {}
        if st.get("state") in ("RUNNING", "PENDING") and launcher.get("host") == socket.gethostname() \
                and not _launcher_alive(launcher):
            st = dict(st, state="FAILED", reason="the launcher exited without recording the end (killed?)")
        return st

    def active(self, rd: RunDir) -> bool:
        return _launcher_alive(rd.read_status().get("launcher") or {}) or bool(procs.tagged_pids(rd.run_id))

    def cancel(self, rd: RunDir) -> None:
        st = rd.read_status()
        launcher = st.get("launcher") or {}
        pid = launcher.get("pid")
        if launcher.get("host") == socket.gethostname() and _launcher_alive(launcher):
            os.kill(pid, signal.SIGTERM)      # the launcher tears its nodes down and records CANCELLED
            deadline = time.monotonic() + 15
            while procs.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        procs.terminate_run(rd.run_id)
        if rd.read_status().get("state") not in ("COMPLETED", "FAILED", "CANCELLED"):
            rd.write_status(state="CANCELLED", reason="launch cancel")


def _agent_failure(codes: list[int | None]) -> dict | None:
    for k, c in enumerate(codes):
        if c not in (0, None):
            return {"node": k, "rank": None, "exit_code": c if c > 0 else None,
                    "signal": signal.Signals(-c).name if c < 0 else None, "time": time.time()}
    return None


def _launcher_alive(launcher: dict) -> bool:
    pid = launcher.get("pid")
    return bool(pid) and procs.alive(pid) and procs.start_ticks(pid) == launcher.get("start")
