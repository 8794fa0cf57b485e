"""What a backend is. `plan()` is pure enough to print (that is --dry-run); `start()` executes
exactly the plan.

A backend differs from another only in how it starts nodes and watches them: it never builds a
torchrun line (launchers.torchrun does) nor lays out a directory (launchers.records.rundir does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .. import layout, procs
from ..containers.container import cleanup_argv, wrap
from ..containers.containeropts import host_limits
from ..cpubind import describe
from ..errors import LaunchError, brief
from ..nodebackend import AUTO, PLANNED, Teller
from ..records.rundir import TERMINAL, RunDir
from ..spec import RunSpec
from ..stops import stop_decision
from ..torchrun import NodeCommand, node_command
from ..warmfork import socket_path as warm_socket


@dataclass
class Plan:
    spec: RunSpec
    run_id: str
    attempt: int
    master_addr: str
    master_port: int
    dist_backend: str
    nodes: list[NodeCommand]
    hosts: list[str] = field(default_factory=list)  # one per node where the backend knows them
    script: str | None = None  # e.g. the sbatch script
    cpu_sets: list | None = None  # each local rank's CPUs where the nodes are this machine
    # node k on node slot slots[k] of the pool (launchers.resilience.recovery)
    slots: list[int] = field(default_factory=list)
    # host -> the image's digest there (preflight)
    image_digests: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        """Exactly what would run: the script (if any) and each node's command."""
        out = [
            f"# run dir: {self.spec.run_dir}",
            f"# run id:  {self.run_id}  attempt {self.attempt}",
            self.world_line(),
        ]
        out += self.spares_lines() + self.cpu_bind_lines()
        if self.script is not None:
            out += [
                "",
                "# ---- sbatch script ----",
                self.script.rstrip("\n"),
                "# ---- end of sbatch script ----",
            ]
        for nc in self.nodes:
            where = f" on {self.hosts[nc.node_rank]}" if self.hosts else ""
            where += f" (slot {self.slots[nc.node_rank]})" if self.slots else ""
            out += ["", f"# node {nc.node_rank}{where}:", nc.shell()]
        return "\n".join(out) + "\n"

    def world_line(self) -> str:
        """The job's shape and distributed backend (auto: decided on each node,
        launchers.nodebackend)."""
        spec = self.spec
        return (
            f"# world:   {spec.nodes} nodes x {spec.gpus_per_node} processes = {spec.world_size}"
            + (f"; {PLANNED}" if self.dist_backend == AUTO else f" ({self.dist_backend})")
        )

    def teller(self) -> Teller | None:
        """The launcher's line for the nodes' --dist-backend auto verdict while it watches them
        (local, SSH)."""
        return (
            Teller(self.spec.run_dir, self.attempt, len(self.nodes))
            if self.dist_backend == AUTO
            else None
        )

    def spares_lines(self) -> list[str]:
        """--spares: how many, when a node is quarantined, the restart budget; --nodes MIN:MAX: the
        range (launchers.resilience.recovery)."""
        spec, out = self.spec, []
        if spec.min_nodes:
            out.append(
                f"# nodes:   {spec.nodes} of {spec.min_nodes}:{spec.max_nodes}: with no spare "
                f"left a node that must leave shrinks the run (never below {spec.min_nodes}); a "
                "restart grows it back"
            )
        if spec.spares or spec.min_nodes:
            out.append(
                f"# spares:  {spec.spares} idle node slot(s); a node is quarantined at "
                f"{spec.quarantine_after} strikes; at most {spec.max_restarts} restarts"
            )
        return out

    def cpu_bind_lines(self) -> list[str]:
        """Each local rank's CPUs where the plan knows the nodes' topology (this machine), else how
        it is decided."""
        mode = self.spec.cpu_bind
        if self.cpu_sets is not None or mode == "none":
            return describe(
                mode, self.cpu_sets or [], "local rank" if self.spec.nodes == 1 else "rank"
            )
        return [f"# cpu-bind {mode}: decided on each node from its topology (launchers.cpubind)"]

    def record(self) -> dict[str, Any]:
        """What run.yaml keeps of this attempt."""
        return {
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "dist_backend": self.dist_backend,
            "hosts": list(self.hosts),
            "commands": [nc.shell() for nc in self.nodes],
            **({"slots": list(self.slots)} if self.slots else {}),
        }


WARM_WAIT_S = 60.0  # --warm-spares: how long a restart waits for its slots' zygotes still starting


class Backend:
    name = "base"
    owns_restarts = True  # the launcher loops over attempts (local, ssh); Slurm requeues instead
    zygote_kind: Any = None  # --warm-spares: the backend's Zygotes (local, ssh)

    def plan(
        self, spec: RunSpec, run_id: str, attempt: int, slots: list[int] | None = None
    ) -> Plan:
        """The attempt's plan. slots: the run's pool's active slots, in node order (--spares,
        --nodes MIN:MAX: launchers.resilience.recovery; restarts.plan_on): node k runs on slots[k],
        node 0 the rendezvous host; None: the backend's first nodes. Slurm's in-job loop picks a
        step's hosts itself (backends.slurm.steps)."""
        raise NotImplementedError

    def preflight(self, plan: Plan) -> None:
        """Checks that need the nodes (reachable, python/torch/program present) before anything is
        created or started; raise LaunchError naming the node. Default: nothing to check."""

    def start(self, plan: Plan, rd: RunDir) -> int:
        """Run (or submit) one attempt; returns the exit code for the CLI."""
        raise NotImplementedError

    def cancel(self, rd: RunDir) -> None:
        raise NotImplementedError

    def forget_memory(self, plan: Plan) -> None:
        """--memory-checkpoint: the run ended, its in-memory checkpoints go from every node of its
        pool (launchers.node.memstore). Default: nothing (Slurm: a submitted job removes them at its
        own end)."""

    def warm_up(self, plan: Plan) -> None:
        """--warm-spares: the zygotes of the run's pool (the backend's `zygotes` kind), started
        once, with its first attempt (launchers.warmfork); a later attempt restarts one that
        ended."""
        if plan.spec.opts.get("warm_spares") and self.zygote_kind is not None:
            self.zygotes = getattr(self, "zygotes", None) or self.zygote_kind()
            self.zygotes.ensure(plan)
            # a restart: a zygote still importing torch is sooner ready than a cold start
            if plan.attempt:
                deadline = time.monotonic() + WARM_WAIT_S
                while (
                    not all(
                        self.zygotes.ready(plan, s) for s in plan.slots or range(len(plan.nodes))
                    )
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.05)

    def end_run(self, plan: Plan) -> None:
        """The run's attempts are over: what the backend kept for its restarts goes (the
        zygotes)."""
        if getattr(self, "zygotes", None) is not None:
            self.zygotes.close()

    def refresh(self, rd: RunDir) -> dict[str, Any]:
        """Current status (backends with a scheduler ask it); default: status.json as written,
        corrected when the launcher that runs it died (also between two attempts: REQUEUED)."""
        return rd.check_launcher(("RUNNING", "PENDING", "REQUEUED"))

    def active(self, rd: RunDir) -> bool:
        """Whether some attempt of the run may still be running (resume refuses then)."""
        return self.refresh(rd).get("state") not in TERMINAL

    def busy(self, st: dict[str, Any]) -> str | None:
        """From status.json alone (a resume checks it under the run's lock, with adding its
        attempt): what runs or starts an attempt of the run now -- "starting (launcher pid P on H)",
        "running (...)" -- else None."""
        return launcher_busy(st)


def launcher_busy(st: dict[str, Any]) -> str | None:
    """A launcher starting an attempt (`starting`: until it records the attempt started) or running
    one, alive; one recorded on another host (not answerable here) counts while the state says it
    runs (or restarts it: REQUEUED)."""
    for key, word in (("starting", "starting"), ("launcher", "running")):
        rec = st.get(key) or {}
        other_host = rec.get("host") != socket.gethostname() and st.get("state") in (
            "PENDING",
            "RUNNING",
            "REQUEUED",  # between two attempts: its launcher restarts it
        )
        if rec.get("pid") and (procs.record_alive(rec) or (key == "launcher" and other_host)):
            return f"{word} (launcher pid {rec['pid']} on {rec.get('host')})"
    return None


def busy_line(path: str, why: str) -> str:
    """The one line refusing a second attempt of a run (`launch resume`)."""
    return (
        f"run {path!r} is {why}; one attempt at a time: wait for it to end or `launch "
        "cancel` it first"
    )


def node_commands(
    spec: RunSpec,
    run_id: str,
    attempt: int,
    master_addr: str,
    master_port: int,
    dist_backend: str,
    one_machine: bool = False,
    slots: list[int] | None = None,
) -> list[NodeCommand]:
    """Each node's command from the one builder, in the job's container when it has one
    (launchers.containers.container); slots: node k runs on node slot slots[k] of the run's pool
    (launchers.resilience.recovery), told as LAUNCH_NODE_SLOT; a container's resource limits are
    this host's (an SSH host's may differ: its hard limits must not be lower)."""
    limits = host_limits()
    slot = [slots[k] if slots else None for k in range(spec.nodes)]
    warm = [
        warm_socket(run_id, k if s is None else s) if spec.opts.get("warm_spares") else None
        for k, s in enumerate(slot)
    ]  # --warm-spares: each slot's zygote (launchers.warmfork)
    return [
        wrap(
            spec,
            node_command(
                spec,
                node_rank=k,
                master_addr=master_addr,
                master_port=master_port,
                run_id=run_id,
                attempt=attempt,
                dist_backend=dist_backend,
                one_machine=one_machine,
                slot=slot[k],
                warm=warm[k],
            ),
            run_id,
            limits=limits,
        )
        for k in range(spec.nodes)
    ]


def remove_containers(spec: RunSpec, run_id: str, nodes) -> None:
    """The nodes' containers (run here), when the job's runtime leaves one behind a SIGKILLed agent
    (launchers.containers.container.cleanup_argv: podman); one already gone is not an error."""
    for k in nodes:
        argv = cleanup_argv(spec, run_id, k)
        if argv:
            try:
                subprocess.run(argv, capture_output=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as e:
                print(
                    f"launch: node {k}: {' '.join(argv)} failed: {e}", file=sys.stderr, flush=True
                )


class Interrupts:
    """The launcher's own SIGINT (Ctrl-C) / SIGTERM (`launch cancel`, kill) while it runs an
    attempt: the first asks for a graceful stop (that one signal goes to every program), a second
    one for killing now."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self.at: float | None = None
        self.old: dict = {}

    def __enter__(self) -> "Interrupts":
        self.old = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)

    def handler(self, signum: int, _frame) -> None:
        self.got.append(signum)
        if len(self.got) == 1:
            self.at = time.time()
            os.write(
                sys.stderr.fileno(),
                f"launch: got {signal.Signals(signum).name}: stopping every rank (the "
                "programs get it once, then the stop grace; Ctrl-C again to kill now)\n".encode(),
            )

    @property
    def signal(self) -> int | None:
        return self.got[0] if self.got else None

    def urgent(self) -> bool:
        return len(self.got) >= 2

    def stop(self, why: str, grace: float):
        """The stop to carry out (launchers.stops.stop_decision): the signal we got, or `why`'s (a
        hang, a peer's failure) when we got none; a second Ctrl-C: kill now."""
        if self.urgent():
            return stop_decision("urgent", grace)
        return (
            stop_decision("signal", grace, self.signal) if self.got else stop_decision(why, grace)
        )


def node_code_fields(code: int | None) -> dict[str, Any]:
    """A node code of the convention below (a remote agent's exit) as a record's exit_code/signal
    fields."""
    name = (
        {int(s): s.name for s in signal.Signals}.get(code - 128)
        if code is not None and code > 128
        else None
    )
    return {"exit_code": None, "signal": name} if name else {"exit_code": code, "signal": None}


def node_exit(code: int | None) -> int | None:
    """A node's exit as every backend reports it: the exit code, or 128 + N when signal N ended
    it."""
    return None if code is None else (128 - code if code < 0 else code)


@contextlib.contextmanager
def synced_together():
    """The block's durable writes (layout.atomic_write) are fsynced together as it ends, each in a
    thread of its own: one flush's wait (the file system commits them at once) instead of one per
    file. They are on disk before anything is started (the run dir's files at open; a Slurm job's
    before its sbatch), as when each write waited for its own. A block inside another leaves its
    writes to the outer one. A flush that fails (an I/O error, a quota met at fsync on a network
    file system): LaunchError naming the file, as a failed write says it."""
    outer, layout.SYNC_LATER = layout.SYNC_LATER, []
    ok = False
    try:
        yield
        ok = True
    finally:
        paths, layout.SYNC_LATER = list(dict.fromkeys(layout.SYNC_LATER)), outer
        if outer is not None:
            outer.extend(paths)
        elif paths:
            errors: list[tuple[str, OSError]] = []
            k = min(len(paths), 16)  # a sweep's many run dirs: 16 threads at most
            threads = [
                threading.Thread(target=_fsync, args=(paths[i::k], errors)) for i in range(1, k)
            ]
            for t in threads:
                t.start()
            _fsync(paths[0::k], errors)
            for t in threads:
                t.join()
            if errors and ok:  # as the write itself would have raised it
                path, e = errors[0]
                raise LaunchError(
                    f"{brief(path)} cannot be flushed to disk ({e.strerror or e}); nothing was "
                    "started; accepted: a run dir on a file system that takes writes (free "
                    "space, no I/O error)"
                )


def _fsync(paths: list[str], errors: list[tuple[str, OSError]]) -> None:
    """fsync files written in the block; one removed since (a run dir given up) is nothing to
    keep."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            errors.append((path, e))
