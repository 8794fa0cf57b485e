"""SSH hosts without a scheduler, over paramiko (launchers.ssh.sshconn): one Connection and one
thread per host.

plan (no network; that is --dry-run; --spares: the hosts of the pool slots it is given) -> preflight
(of the attempt's hosts only: connect all in parallel with verified host keys; on every host
python/torch/launchers/program present and run dir writable; master port probed on the master; the
master reachable at MASTER_ADDR:port from every other host: backends/sshcheck.py) -> start (each
host runs the shared builder's command under `python -m launchers.remote run`, on a pty, output
streamed as "[host] [nK rR] line") -> the first failing node stops the rest (`launchers.remote kill`
on each host, then a final sweep) -> with --no-shared-storage the staged files are collected into
the run dir (SFTP).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from .. import procs
from ..diagnosis.firstfail import node_failed
from ..errors import RunDirGone
from ..hang import watch as hang_watch
from ..layout import Presence
from ..node import memstore
from ..nodeagent import AGENT_ENDED, HEARTBEAT, env_file
from ..records.rundir import TERMINAL, RunDir
from ..spec import RunSpec
from ..ssh.sshconn import close_all, connect_all, describe, make_connection, put_private
from ..ssh.sshwatch import Prefixed, Silence
from ..stops import Stop, stop_decision, wait_s
from . import sshcheck
from .base import Backend, Interrupts, node_code_fields
from .sshops import FORGET_S, collect, forget_on, stop_nodes
from .sshplan import SSHPlan, commands, make_plan
from .sshwarm import Zygotes


class SSHBackend(Backend):
    name = "ssh"
    zygote_kind = Zygotes  # --warm-spares (launchers.backends.sshwarm)

    def __init__(self) -> None:
        self._ready: tuple[int, list] | None = None  # (id(plan), connections) after preflight
        # (master host, port, host) the reach check passed
        self._reached: set[tuple[str, int, str]] = set()

    def plan(
        self, spec: RunSpec, run_id: str, attempt: int, slots: list[int] | None = None
    ) -> SSHPlan:
        """Pure: no network (launchers.backends.sshplan)."""
        return make_plan(spec, run_id, attempt, slots)

    # -------------------------------------------------------- preflight (before the run dir exists)
    def preflight(self, plan: SSHPlan) -> None:
        conns = connect_all(plan.rhosts, plan.settings)
        try:
            port, dist = sshcheck.check_hosts(plan, conns), plan.dist_backend
            # no shared run dir for the nodes' records: asked of every host
            if plan.staged and dist == "auto":
                dist = sshcheck.decide_backend(plan, conns)
            # the master's first free candidate
            if (port, dist) != (plan.master_port, plan.dist_backend):
                plan.master_port, plan.dist_backend = port, dist
                plan.nodes = commands(
                    plan.spec,
                    plan.node_dir,
                    plan.run_id,
                    plan.attempt,
                    plan.master_addr,
                    port,
                    plan.dist_backend,
                    plan.slots,
                )
            sshcheck.check_image(plan, conns)
            pairs = {(plan.rhosts[0].label, plan.master_port, h.label) for h in plan.rhosts[1:]}
            # a restart on hosts already checked this run: not again (~0.7 s)
            if not pairs <= self._reached:
                sshcheck.check_reach(plan, conns)
                self._reached |= pairs
        except BaseException:
            close_all(conns)
            raise
        self._ready = (id(plan), conns)

    # ------------------------------------------------------------------ start one attempt
    def start(self, plan: SSHPlan, rd: RunDir) -> int:
        if not self._ready or self._ready[0] != id(plan):  # a restart: check again, connect again
            before = plan.record()
            self.preflight(plan)
            # the master's port (or, without shared storage, the backend)
            if plan.record() != before:
                data = rd.read_run_yaml()
                data["attempts"][-1].update(plan.record())
                rd.write_run_yaml(data)
        conns = self._ready[1]
        self._ready = None
        rd.mark_running(plan.attempt, hosts=plan.hosts)
        n = len(conns)
        # node -> (time, exit code, error)
        ended: dict[int, tuple[float, int | None, str | None]] = {}
        outs = [
            Prefixed(f"[{h.entry.name}] ", _write, HEARTBEAT, notes=(AGENT_ENDED,))
            for h in plan.rhosts
        ]
        silence = Silence(outs, conns)

        pool = ThreadPoolExecutor(max_workers=n)
        futs = [pool.submit(run_node, plan, conns[k], k, outs[k], ended) for k in range(n)]
        spec = plan.spec
        watch = (
            hang_watch.LauncherWatch(
                rd,
                plan.run_id,
                plan.attempt,
                spec.hang_timeout,
                n,
                spec.world_size,
                monitor_here=False,
            )
            if spec.hang_timeout
            else None
        )
        here = Presence(rd.path)
        with Interrupts() as intr:
            try:
                self._until_the_end(plan, conns, futs, ended, intr, watch, silence, here)
            finally:
                pool.shutdown(wait=False)
        if here.gone():  # nothing collected nor recorded: that would recreate half a run dir
            close_all(conns)
            raise RunDirGone(here.gone_line())
        if plan.staged:
            collect(plan, conns, rd)
        close_all(conns)
        return self._finish(plan, rd, ended, intr)

    def _until_the_end(
        self,
        plan: SSHPlan,
        conns,
        futs,
        ended: dict,
        intr: Interrupts,
        watch: hang_watch.LauncherWatch | None,
        silence: Silence,
        here: Presence,
    ) -> None:
        """Wait for the nodes (_wait_nodes); on a node's failure, a hang, the run dir removed or a
        stop, the rest are stopped; then every host not lost is swept (SIGKILL to whatever of the
        run is left there)."""
        n = len(conns)
        pending, why = self._wait_nodes(set(futs), ended, intr, watch, silence, here, plan.teller())
        if pending:
            if not intr.got:  # a stop was already announced by Interrupts
                print(f"launch: {why}; stopping the other nodes", file=sys.stderr, flush=True)
            hung = watch is not None and watch.coord.verdict is not None
            self._stop_pending(
                plan,
                conns,
                futs,
                [k for k in range(n) if k not in ended],
                stop_decision("run dir gone", 0)
                if here.gone()
                else intr.stop("hang" if hung else "peer failure", plan.spec.stop_grace),
            )
        stop_nodes(
            plan, conns, [k for k in range(n) if k not in silence.lost], signal.SIGKILL, final=True
        )
        for k in sorted(silence.lost):
            print(
                f"launch: node {k} ({plan.rhosts[k].label}) is lost, not swept: its processes "
                "stop when its sshd ends the session (ClientAliveInterval), or `launch cancel` "
                "the run once it is back",
                file=sys.stderr,
                flush=True,
            )

    def _stop_pending(self, plan: SSHPlan, conns, futs, nodes: list[int], stop: Stop) -> None:
        """The nodes still running get one stop signal (through their agents), then the stop
        grace."""
        stop_nodes(plan, conns, nodes, stop.signal, stop.wait_s)
        wait(futs, timeout=10 if stop.signal == signal.SIGKILL else stop.wait_s + 10)
        if any(not f.done() for f in futs):
            close_all(conns)  # dropping the pty SIGHUPs the host agents
            wait(futs, timeout=10)

    @staticmethod
    def _wait_nodes(
        pending: set,
        ended: dict,
        intr: Interrupts,
        watch: hang_watch.LauncherWatch | None,
        silence: Silence,
        here: Presence,
        tell=None,
    ) -> tuple[set, str]:
        """Until every node ended, one failed or went silent, a hang was decided, the run dir was
        removed or we are interrupted; tell(): the nodes' --dist-backend auto verdict, said once
        (launchers.nodebackend)."""
        while pending and not intr.got:
            _, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            if tell:
                tell()
            silence.check(ended)
            bad = sorted((t, k) for k, (t, code, _err) in ended.items() if code != 0)
            if bad:
                return pending, f"node {bad[0][1]} failed" + (
                    f" ({e})" if (e := ended[bad[0][1]][2]) else ""
                )
            if here.gone():
                return pending, "the run dir was removed"
            if watch and (verdict := watch.poll()):
                return pending, hang_watch.describe(verdict)
        return pending, f"got {signal.Signals(intr.signal).name}" if intr.got else "interrupted"

    def _finish(self, plan: SSHPlan, rd: RunDir, ended, intr: Interrupts) -> int:
        n = len(plan.rhosts)
        nodes = {str(k): ended.get(k, (0, None, None))[1] for k in range(n)}
        failures = [
            {
                "node": k,
                **node_code_fields(code),
                "time": t,
                "host": plan.rhosts[k].entry.word,
                "reason": err or f"node exited {code}",
                "kind": "lost" if err else "agent",
            }
            # err: its connection lost
            for k, (t, code, err) in sorted(ended.items())
            if code != 0
        ]
        failures += [
            {
                "node": k,
                "time": time.time(),
                "host": plan.rhosts[k].entry.word,
                "reason": "did not finish",
                "kind": "lost",
            }
            for k in range(n)
            if k not in ended
        ]
        stopped = signal.Signals(intr.signal).name if intr.got else None
        code = rd.record_outcome(
            plan.attempt,
            nodes,
            stopped_by=stopped,
            stopped_at=intr.at,
            node_failures=failures,
            hosts=[h.entry.word for h in plan.rhosts],
        )
        ff = rd.read_status().get("first_failure") or {}
        # the rank's exception line too (launchers.node.rankcause)
        if code == 1 and ff.get("node") is not None:
            k = ff["node"]
            print(
                f"launch: node {k} on {plan.rhosts[k].label} failed: "
                f"{node_failed(ff, nodes.get(str(k)))}",
                file=sys.stderr,
                flush=True,
            )
        return code

    def forget_memory(self, plan: SSHPlan) -> None:
        """--memory-checkpoint: the run's stores go from every host of its pool (nodes and spares, a
        lost node's host too when it answers), in parallel; a host that does not answer within
        FORGET_S keeps its copy until it reboots (tmpfs). Never fails the run."""
        line = "rm -rf -- " + shlex.quote(memstore.run_store(plan.run_id))
        threads = [
            threading.Thread(
                target=forget_on,
                args=(h, plan.settings, line),
                daemon=True,
                name="launch-forget-memory",
            )
            for h in plan.rpool or plan.rhosts
        ]
        end = time.monotonic() + FORGET_S
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))

    # ------------------------------------------------------------------ cancel
    def cancel(self, rd: RunDir) -> None:
        """SIGTERM to the launcher, which stops its nodes gracefully and records it; without a live
        launcher the same stop is done from here, host by host."""
        st = rd.update_status(cancel_requested=True, cancel_at=time.time())
        spec = rd.spec()
        if rd.launcher_alive(st):
            pid = st["launcher"]["pid"]
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + wait_s(spec.stop_grace) + 30
            while procs.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        data = rd.read_run_yaml()
        plan = self.plan(
            spec,
            data["run_id"],
            attempt=len(data["attempts"]) - 1,
            slots=data["attempts"][-1].get("slots"),
        )  # the last attempt's hosts
        stop_nodes(
            plan,
            [make_connection(h, plan.settings) for h in plan.rhosts],
            range(len(plan.rhosts)),
            signal.SIGTERM,
            wait_s(spec.stop_grace),
            final=True,
        )
        with rd.lock():
            if rd.read_status().get("state") not in TERMINAL:
                rd.update_status(state="CANCELLED", reason="by launch cancel", first_failure=None)


def run_node(plan: SSHPlan, conn, k: int, out: Prefixed, ended: dict) -> None:
    """Node k on its host (its thread): its secrets over SFTP, never on a command line
    (launchers.remote reads them), then its line on a pty, output streamed through `out`; how it
    ended into ended[k] (time, exit code or None, why: its connection lost)."""
    try:
        if plan.nodes[k].secret_env():
            put_private(
                conn, env_file(plan.run_id, plan.attempt, k), json.dumps(plan.nodes[k].secret_env())
            )
        r = conn.run(
            plan.remote_line(k, redact=False),
            pty=True,
            warn=True,
            in_stream=False,
            out_stream=out,
            err_stream=out,
        )
        done = r.exited is not None and r.exited >= 0
        ended.setdefault(
            k, (agent_ended(out), r.exited if done else None, None if done else "connection lost")
        )
    except Exception as e:  # noqa: BLE001 - the host died or the connection dropped
        ended.setdefault(
            k,
            (time.time(), None, f"connection lost ({describe(e, plan.rhosts[k], plan.settings)})"),
        )
    finally:
        out.close()


def agent_ended(out: Prefixed) -> float:
    """When a node ended: when its host saw its agent end (launchers.remote's AGENT_ENDED line; a
    host clock ahead of ours is capped at now), else now (its session's end). The session of an
    agent that died hard ends only after its host stopped the ranks it left (their stop grace):
    later than those ranks' records, and than the records of the peers that lost them."""
    try:
        return min(float(out.noted[AGENT_ENDED]), time.time())
    except (KeyError, ValueError):
        return time.time()


_out_lock = threading.Lock()


def _write(text: str) -> None:
    with _out_lock:
        sys.stdout.write(text)
        sys.stdout.flush()
