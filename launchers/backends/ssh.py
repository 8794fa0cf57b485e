"""SSH hosts without a scheduler, over paramiko (launchers.sshconn): one Connection and one thread per host.

plan (no network; that is --dry-run; --spares: the hosts of the pool slots it is given) -> preflight (of the
attempt's hosts only: connect all in parallel with verified host keys; on every host python/torch/launchers/program
present and run dir writable; master port probed on the master; the master reachable at MASTER_ADDR:port from
every other host: backends/sshcheck.py) -> start (each host runs the shared builder's command under `python -m
launchers.remote run`, on a pty, output streamed as "[host] [nK rR] line") -> the first failing node stops the
rest (`launchers.remote kill` on each host, then a final sweep) -> with --no-shared-storage the staged files are
collected into the run dir (SFTP).
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
from dataclasses import dataclass, field
from typing import Any

from .. import container, memstore, ports, procs
from ..errors import LaunchError, RunDirGone
from ..firstfail import node_failed
from ..hang import watch as hang_watch
from ..hostfile import ResolvedHost, avoiding, hosts_from_options, pool_hosts, resolve
from ..layout import Presence
from ..remote import AGENT_ENDED, HEARTBEAT, env_file
from ..rundir import TERMINAL, RunDir
from ..show import counted
from ..spec import RunSpec, redact_env
from ..sshconn import close_all, connect_all, describe, get_tree, make_connection, put_private
from ..sshmodel import SSHSettings
from ..sshmodel import settings as ssh_settings
from ..sshwatch import Prefixed, Silence
from ..stops import Stop, stop_decision, wait_s
from . import sshcheck
from .base import Backend, Interrupts, Plan, node_code_fields, node_commands
from .sshwarm import Zygotes

STAGING_ROOT = "/tmp/launch-staging"
FORGET_S = 15.0           # how long the end of a --memory-checkpoint run waits for its hosts to drop their stores


@dataclass
class SSHPlan(Plan):
    rhosts: list[ResolvedHost] = field(default_factory=list)
    rpool: list[ResolvedHost] = field(default_factory=list)      # every host of the pool (nodes, spares)
    settings: SSHSettings = field(default_factory=SSHSettings)
    cwd: str = ""
    node_dir: str = ""        # LAUNCH_RUN_DIR on the hosts: the run dir, or a host-local staging dir
    port_fixed: bool = False

    @property
    def staged(self) -> bool:
        return self.node_dir != self.spec.run_dir

    def pid_file(self, k: int) -> str:
        return f"/tmp/.launch-{self.run_id}-node{k}.pid"

    def remote_line(self, k: int, redact: bool = True) -> str:
        """The exact line sshd runs on host k: cd, the node's env (its secrets go in remote.env_file, 0600, which the
        host agent reads and deletes: shown *** here), the host agent, the builder's argv."""
        nc = self.nodes[k]
        env = redact_env(nc.env_dict, nc.secret) if redact else nc.public_env()
        ef = ["--env-file", env_file(self.run_id, self.attempt, k)] if nc.secret_env() else []
        words = ["env", *(f"{a}={b}" for a, b in env.items()), self.spec.python, "-m", "launchers.remote", "run",
                 "--node", str(k), "--pid-file", self.pid_file(k), *ef, "--", *(nc.shown_argv() if redact else nc.argv)]
        return f"cd {shlex.quote(self.cwd)} 2>/dev/null; exec " + " ".join(shlex.quote(w) for w in words)

    def render(self) -> str:
        out = [f"# run dir: {self.spec.run_dir}", f"# run id:  {self.run_id}  attempt {self.attempt}",
               self.world_line(), f"# master:  {self.master_addr}:{self.master_port} (probed at launch)",
               *self.spares_lines(), *self.cpu_bind_lines()]
        if self.spec.avoid_hosts:           # the site's node ledger (launchers.siteledger)
            out.append(f"# node ledger {self.spec.node_ledger}: quarantined, not used: "
                       + ", ".join(self.spec.avoid_hosts))
        if self.staged:
            out.append(f"# storage: not shared; hosts write {self.node_dir}, collected into the run dir over SFTP")
        for k, h in enumerate(self.rhosts):
            slot = f" (slot {self.slots[k]})" if self.spec.spares else ""
            out += ["", f"# node {k} on {h.user}@{h.label}{slot}:", self.remote_line(k)]
        return "\n".join(out) + "\n"

    def record(self) -> dict[str, Any]:
        return dict(super().record(), addresses=[f"{h.hostname}:{h.port}" for h in self.rhosts],
                    node_dir=self.node_dir, cwd=self.cwd)


class SSHBackend(Backend):
    name = "ssh"
    zygote_kind = Zygotes        # --warm-spares (launchers.backends.sshwarm)

    def __init__(self) -> None:
        self._ready: tuple[int, list] | None = None      # (id(plan), connections) after preflight
        self._reached: set[tuple[str, int, str]] = set()   # (master host, port, host) the reach check passed

    # ------------------------------------------------------------------ plan (pure: no network)
    def plan(self, spec: RunSpec, run_id: str, attempt: int, slots: list[int] | None = None) -> SSHPlan:
        """slots: the pool's slots the nodes run on, in node order (--spares, --nodes MIN:MAX: launchers.recovery;
        one node per slot); slot k is the k-th host of MAX + spares, node 0 (the master) the host of slots[0].
        Default: the first hosts, every one when --nodes is not given (less the spares)."""
        opts, settings = spec.opts, ssh_settings(spec.opts)
        want = (spec.max_nodes or spec.nodes) if "nodes" in spec.explicit else None    # --nodes MIN:MAX: MAX's hosts
        entries = avoiding(hosts_from_options(opts), spec.avoid_hosts, (want or 1) + spec.spares, spec.node_ledger)
        nodes, pool = pool_hosts(entries, want, spec.spares)
        slots = list(slots) if slots is not None else list(range(nodes))
        if bad := [s for s in slots if not 0 <= s < len(pool)]:
            raise LaunchError(f"node slot {bad[0]} has no host: the pool has {len(pool)} hosts (--nodes + --spares)")
        rpool = resolve(pool, settings.ssh_config)        # every host of the pool: two names of one host refused
        rhosts, gpn = [rpool[s] for s in slots], spec.gpus_per_node
        counts = {e.slots for e in pool if e.slots is not None}         # the spares' too: one shape for the run
        if "gpus_per_node" not in spec.explicit and counts:   # --gpus-per-node (when given) overrides slots=
            if len(counts) > 1:
                raise LaunchError(f"hosts have different slots= ({', '.join(map(str, sorted(counts)))}); "
                                  "torchrun needs the same count per node: give --gpus-per-node")
            gpn = counts.pop()
        spec = spec.replace(nodes=len(slots), gpus_per_node=gpn, explicit=("nodes", "gpus_per_node"))
        node_dir = spec.run_dir
        if opts.get("shared_storage") is False and spec.hang_timeout:
            raise LaunchError("--hang-timeout needs the run dir on shared storage (the hosts' progress meets "
                              "there); it is not accepted with --no-shared-storage")
        if opts.get("shared_storage") is False:
            node_dir = os.path.join(opts.get("staging_dir") or STAGING_ROOT, run_id)
        master, port, dist = rhosts[0].hostname, spec.master_port or ports.derive_port(run_id), spec.dist_backend
        return SSHPlan(spec=spec, run_id=run_id, attempt=attempt, master_addr=master, master_port=port,
                       dist_backend=dist, hosts=[h.entry.word for h in rhosts],
                       nodes=self._commands(spec, node_dir, run_id, attempt, master, port, dist, slots),
                       rhosts=rhosts, rpool=rpool, settings=settings, cwd=os.getcwd(), node_dir=node_dir,
                       port_fixed=spec.master_port is not None, slots=slots)

    @staticmethod
    def _commands(spec, node_dir, run_id, attempt, master, port, dist, slots):
        return node_commands(spec.replace(run_dir=node_dir), run_id, attempt, master, port, dist, slots=slots)

    # ------------------------------------------------------------------ preflight (before the run dir exists)
    def preflight(self, plan: SSHPlan) -> None:
        conns = connect_all(plan.rhosts, plan.settings)
        try:
            port, dist = sshcheck.check_hosts(plan, conns), plan.dist_backend
            if plan.staged and dist == "auto":    # no shared run dir for the nodes' records: asked of every host
                dist = sshcheck.decide_backend(plan, conns)
            if (port, dist) != (plan.master_port, plan.dist_backend):    # the master's first free candidate
                plan.master_port, plan.dist_backend = port, dist
                plan.nodes = self._commands(plan.spec, plan.node_dir, plan.run_id, plan.attempt, plan.master_addr,
                                            port, plan.dist_backend, plan.slots)
            sshcheck.check_image(plan, conns)
            pairs = {(plan.rhosts[0].label, plan.master_port, h.label) for h in plan.rhosts[1:]}
            if not pairs <= self._reached:     # a restart on hosts already checked this run: not again (~0.7 s)
                sshcheck.check_reach(plan, conns)
                self._reached |= pairs
        except BaseException:
            close_all(conns)
            raise
        self._ready = (id(plan), conns)

    # ------------------------------------------------------------------ start one attempt
    def start(self, plan: SSHPlan, rd: RunDir) -> int:
        if not self._ready or self._ready[0] != id(plan):       # a restart: check again, connect again
            before = plan.record()
            self.preflight(plan)
            if plan.record() != before:         # the master's port (or, without shared storage, the backend)
                data = rd.read_run_yaml()
                data["attempts"][-1].update(plan.record())
                rd.write_run_yaml(data)
        conns = self._ready[1]
        self._ready = None
        rd.mark_running(plan.attempt, hosts=plan.hosts)
        n = len(conns)
        ended: dict[int, tuple[float, int | None, str | None]] = {}     # node -> (time, exit code, error)
        outs = [Prefixed(f"[{h.entry.name}] ", _write, HEARTBEAT, notes=(AGENT_ENDED,)) for h in plan.rhosts]
        silence = Silence(outs, conns)

        def run_node(k: int) -> None:
            out = outs[k]
            try:
                if plan.nodes[k].secret_env():       # over SFTP, never on a command line (launchers.remote reads it)
                    put_private(conns[k], env_file(plan.run_id, plan.attempt, k), json.dumps(plan.nodes[k].secret_env()))
                r = conns[k].run(plan.remote_line(k, redact=False), pty=True, warn=True, in_stream=False,
                                 out_stream=out, err_stream=out)
                done = r.exited is not None and r.exited >= 0
                ended.setdefault(k, (agent_ended(out), r.exited if done else None, None if done else "connection lost"))
            except Exception as e:  # noqa: BLE001 - the host died or the connection dropped
                ended.setdefault(k, (time.time(), None, f"connection lost ({describe(e, plan.rhosts[k], plan.settings)})"))
            finally:
                out.close()

        pool = ThreadPoolExecutor(max_workers=n)
        futs = [pool.submit(run_node, k) for k in range(n)]
        spec = plan.spec
        watch = hang_watch.LauncherWatch(rd, plan.run_id, plan.attempt, spec.hang_timeout, n, spec.world_size,
                                         monitor_here=False) if spec.hang_timeout else None
        here = Presence(rd.path)
        with Interrupts() as intr:
            try:
                pending, why = self._wait_nodes(set(futs), ended, intr, watch, silence, here, plan.teller())
                if pending:
                    if not intr.got:                   # a stop was already announced by Interrupts
                        print(f"launch: {why}; stopping the other nodes", file=sys.stderr, flush=True)
                    hung = watch is not None and watch.coord.verdict is not None
                    self._stop_pending(plan, conns, futs, [k for k in range(n) if k not in ended],
                                       stop_decision("run dir gone", 0) if here.gone() else
                                       intr.stop("hang" if hung else "peer failure", spec.stop_grace))
                self._stop(plan, conns, [k for k in range(n) if k not in silence.lost], signal.SIGKILL, final=True)
                for k in sorted(silence.lost):
                    print(f"launch: node {k} ({plan.rhosts[k].label}) is lost, not swept: its processes stop when its sshd "
                          "ends the session (ClientAliveInterval), or `launch cancel` the run once it is back",
                          file=sys.stderr, flush=True)
            finally:
                pool.shutdown(wait=False)
        if here.gone():       # nothing collected nor recorded: that would recreate half a run dir
            close_all(conns)
            raise RunDirGone(here.gone_line())
        if plan.staged:
            self._collect(plan, conns, rd)
        close_all(conns)
        return self._finish(plan, rd, ended, intr)

    def _stop_pending(self, plan: SSHPlan, conns, futs, nodes: list[int], stop: Stop) -> None:
        """The nodes still running get one stop signal (through their agents), then the stop grace."""
        self._stop(plan, conns, nodes, stop.signal, stop.wait_s)
        wait(futs, timeout=10 if stop.signal == signal.SIGKILL else stop.wait_s + 10)
        if any(not f.done() for f in futs):
            close_all(conns)                # dropping the pty SIGHUPs the host agents
            wait(futs, timeout=10)

    @staticmethod
    def _wait_nodes(pending: set, ended: dict, intr: Interrupts, watch: hang_watch.LauncherWatch | None,
                    silence: Silence, here: Presence, tell=None) -> tuple[set, str]:
        """Until every node ended, one failed or went silent, a hang was decided, the run dir was removed or we
        are interrupted; tell(): the nodes' --dist-backend auto verdict, said once (launchers.nodebackend)."""
        while pending and not intr.got:
            _, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            if tell:
                tell()
            silence.check(ended)
            bad = sorted((t, k) for k, (t, code, _err) in ended.items() if code != 0)
            if bad:
                return pending, f"node {bad[0][1]} failed" + (f" ({e})" if (e := ended[bad[0][1]][2]) else "")
            if here.gone():
                return pending, "the run dir was removed"
            if watch and (verdict := watch.poll()):
                return pending, hang_watch.describe(verdict)
        return pending, f"got {signal.Signals(intr.signal).name}" if intr.got else "interrupted"

    def _finish(self, plan: SSHPlan, rd: RunDir, ended, intr: Interrupts) -> int:
        n = len(plan.rhosts)
        nodes = {str(k): ended.get(k, (0, None, None))[1] for k in range(n)}
        failures = [{"node": k, **node_code_fields(code), "time": t, "host": plan.rhosts[k].entry.word,
                     "reason": err or f"node exited {code}", "kind": "lost" if err else "agent"}
                    for k, (t, code, err) in sorted(ended.items()) if code != 0]     # err: its connection lost
        failures += [{"node": k, "time": time.time(), "host": plan.rhosts[k].entry.word, "reason": "did not finish",
                      "kind": "lost"} for k in range(n) if k not in ended]
        stopped = signal.Signals(intr.signal).name if intr.got else None
        code = rd.record_outcome(plan.attempt, nodes, stopped_by=stopped, stopped_at=intr.at, node_failures=failures,
                                 hosts=[h.entry.word for h in plan.rhosts])
        ff = rd.read_status().get("first_failure") or {}
        if code == 1 and ff.get("node") is not None:     # the rank's exception line too (launchers.rankcause)
            k = ff["node"]
            print(f"launch: node {k} on {plan.rhosts[k].label} failed: {node_failed(ff, nodes.get(str(k)))}",
                  file=sys.stderr, flush=True)
        return code

    # ------------------------------------------------------------------ stopping and sweeping
    @staticmethod
    def _kill_line(plan: SSHPlan, k: int, sig: int, wait_s: float) -> str:
        return (f"cd {shlex.quote(plan.cwd)} 2>/dev/null; {shlex.quote(plan.spec.python)} -m launchers.remote kill "
                f"{shlex.quote(plan.run_id)} --node {k} --run-dir {shlex.quote(plan.node_dir)} "
                f"--pid-file {shlex.quote(plan.pid_file(k))} "
                f"--signal {signal.Signals(sig).name} --wait {wait_s:g}{container.cleanup_line(plan.spec, plan.run_id, k)}")

    def _stop(self, plan: SSHPlan, conns, nodes, sig: int = signal.SIGTERM, wait_s: float = 0.0,
              final: bool = False) -> None:
        """`launchers.remote kill` on each host (over the open connection, else a fresh one), in parallel: one
        `sig` to the node's agent, up to wait_s for the node to end, then the sweep."""
        nodes = list(nodes)

        def one(k: int) -> None:
            for attempt in range(2):
                try:
                    c = conns[k] if attempt == 0 else make_connection(plan.rhosts[k], plan.settings)
                    r = c.run(self._kill_line(plan, k, sig, wait_s), hide=True, warn=True, in_stream=False,
                              timeout=wait_s + 30)
                    rec = json.loads(r.stdout.strip().splitlines()[-1])
                    if rec.get("forced") or (final and rec.get("before")):
                        print(f"launch: node {k} ({plan.rhosts[k].entry.name}): stopped {rec['before']}, "
                              f"killed {rec['forced']}, left {rec['after']}", file=sys.stderr, flush=True)
                    return
                except Exception:  # noqa: BLE001 - the host is gone: nothing of the run is left running there
                    continue

        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as ex:
            list(ex.map(one, nodes))

    # ------------------------------------------------------------------ --no-shared-storage
    def _collect(self, plan: SSHPlan, conns, rd: RunDir) -> None:
        """Copy every host's staged files (logs, status, checkpoints, metrics...) into the run dir."""
        def one(k: int) -> str | None:
            try:
                sftp = conns[k].sftp()
            except Exception:  # noqa: BLE001
                try:
                    c = make_connection(plan.rhosts[k], plan.settings)
                    c.open()
                    sftp = c.sftp()
                except Exception as e:  # noqa: BLE001
                    return describe(e, plan.rhosts[k], plan.settings)
            get_tree(sftp, plan.node_dir, rd.path)
            return None

        say = counted("collect", len(conns))

        def step(k: int) -> str | None:
            err = one(k)
            say(f"node {k} ({plan.rhosts[k].entry.name})", "files copied" if err is None else "failed")
            return err

        with ThreadPoolExecutor(max_workers=len(conns)) as ex:
            for k, err in enumerate(ex.map(step, range(len(conns)))):
                if err:
                    print(f"launch: could not collect node {k}'s files: {err}", file=sys.stderr, flush=True)

    def forget_memory(self, plan: SSHPlan) -> None:
        """--memory-checkpoint: the run's stores go from every host of its pool (nodes and spares, a lost node's
        host too when it answers), in parallel; a host that does not answer within FORGET_S keeps its copy until
        it reboots (tmpfs). Never fails the run."""
        line = "rm -rf -- " + shlex.quote(memstore.run_store(plan.run_id))
        threads = [threading.Thread(target=_forget_on, args=(h, plan.settings, line), daemon=True,
                                    name="launch-forget-memory") for h in plan.rpool or plan.rhosts]
        end = time.monotonic() + FORGET_S
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))

    # ------------------------------------------------------------------ cancel
    def cancel(self, rd: RunDir) -> None:
        """SIGTERM to the launcher, which stops its nodes gracefully and records it; without a live launcher the
        same stop is done from here, host by host."""
        st = rd.update_status(cancel_requested=True, cancel_at=time.time())
        spec = rd.spec()
        if rd.launcher_alive(st):
            pid = st["launcher"]["pid"]
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + wait_s(spec.stop_grace) + 30
            while procs.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        data = rd.read_run_yaml()
        plan = self.plan(spec, data["run_id"], attempt=len(data["attempts"]) - 1,
                         slots=data["attempts"][-1].get("slots"))           # the last attempt's hosts
        self._stop(plan, [make_connection(h, plan.settings) for h in plan.rhosts], range(len(plan.rhosts)),
                   signal.SIGTERM, wait_s(spec.stop_grace), final=True)
        with rd.lock():
            if rd.read_status().get("state") not in TERMINAL:
                rd.update_status(state="CANCELLED", reason="by launch cancel", first_failure=None)


def _forget_on(h: ResolvedHost, settings: SSHSettings, line: str) -> None:
    """One host's part of forget_memory: its own connection, so that a host that is down costs only itself."""
    try:
        c = make_connection(h, settings)
        try:
            c.run(line, hide=True, warn=True, in_stream=False, timeout=FORGET_S)
        finally:
            c.close()
    except Exception:  # noqa: BLE001 - best effort: the store is tmpfs, gone at the host's next boot
        pass


def agent_ended(out: Prefixed) -> float:
    """When a node ended: when its host saw its agent end (launchers.remote's AGENT_ENDED line; a host clock ahead
    of ours is capped at now), else now (its session's end). The session of an agent that died hard ends only
    after its host stopped the ranks it left (their stop grace): later than those ranks' records, and than the
    records of the peers that lost them."""
    try:
        return min(float(out.noted[AGENT_ENDED]), time.time())
    except (KeyError, ValueError):
        return time.time()


_out_lock = threading.Lock()


def _write(text: str) -> None:
    with _out_lock:
        sys.stdout.write(text)
        sys.stdout.flush()

