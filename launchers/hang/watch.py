"""NodeMonitor (one per node) and Coordinator (one per run): the two halves of --hang-timeout.

Every INTERVAL_S a NodeMonitor samples its node's ranks and publishes progress/node<K>.json; the
Coordinator reads every node's file and, once no rank advanced for the timeout, writes
hang/attempt<A>/request.json. Each NodeMonitor answers with its ranks' stacks and their
stalled/waiting call (hang/attempt<A>/node<K>.json); the Coordinator adds "behind in steps", writes
stop.json (the hung ranks: programs read it to tell a hang's stop from a preemption,
launchers.heartbeat.hang_stop), verdict.json and `hang` into status.json. The hung ranks' programs
are ended first (SIGKILL by each NodeMonitor that sees the verdict, and by the local launcher before
its stop: end_hung), so a collective waiting on them fails at once and the other ranks' handlers run
within their grace; then the run is stopped by whoever owns its processes (the launcher on local and
SSH, each node's task on Slurm, which watches for the verdict). Stdlib only.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Callable

from .. import layout
from ..frozen import extcache
from ..records.rundir import RunDir
from . import stacks
from .sample import ENDED, Tracker, rank_programs
from .verdict import hang_reason, hung_ranks

INTERVAL_S = 1.0
ANSWER_WAIT_S = 20.0  # the Coordinator waits this long for every node's stacks


def write(path: str, obj: dict[str, Any]) -> None:
    layout.atomic_write(path, json.dumps(obj, sort_keys=True), durable=False)


class NodeMonitor(threading.Thread):
    """Samples one node's ranks (every node on this machine: nodes None), answers a stack request
    and calls on_verdict(verdict) once when a hang was decided."""

    def __init__(
        self,
        run_dir: str,
        run_id: str,
        attempt: int,
        nodes: list[int] | None = None,
        on_verdict: Callable[[dict], None] | None = None,
    ):
        super().__init__(daemon=True, name="launch-hang-monitor")
        self.run_dir, self.attempt, self.nodes, self.on_verdict = (
            run_dir,
            attempt,
            nodes,
            on_verdict,
        )
        self.tracker = Tracker(
            run_dir, run_id, attempt, nodes[0] if nodes and len(nodes) == 1 else None, time.time()
        )
        self.stopped = threading.Event()
        self.answered = self.verdict_seen = False

    def path(self, what: str, **kw: Any) -> str:
        return layout.path(self.run_dir, what, attempt=self.attempt, **kw)

    def run(self) -> None:
        while not self.stopped.wait(INTERVAL_S):
            try:
                self.tick(time.time())
            except OSError:
                continue  # the run dir is going away (cleanup): nothing to watch any more

    def tick(self, now: float) -> None:
        layout.present(self.run_dir)  # a removed run dir is not recreated by a progress record
        ranks = self.tracker.sample(now)
        by_node: dict[int, dict] = {}
        for r, t in ranks.items():
            by_node.setdefault(t["node"], {})[str(r)] = {
                k: t[k] for k in ("pid", "state", "step", "step_time", "last_advance", "heartbeat")
            }
        for node, view in by_node.items():
            write(
                layout.path(self.run_dir, "node_progress", node=node),
                {"node": node, "attempt": self.attempt, "time": now, "ranks": view},
            )
        if not self.answered and layout.read_json(self.path("hang_request")) is not None:
            self.answered = True
            found = stacks.capture(self.run_dir, self.attempt, ranks)
            for node in sorted(by_node):
                write(
                    self.path("hang_node", node=node),
                    {
                        "node": node,
                        "ranks": {str(r): v for r, v in found.items() if v["node"] == node},
                    },
                )
        if not self.verdict_seen:
            verdict = layout.read_json(self.path("hang_verdict"))
            if verdict is not None:
                self.verdict_seen = True
                end_hung(self.run_dir, self.tracker.run_id, self.attempt, self.tracker.node)
                if self.on_verdict:
                    self.on_verdict(verdict)


class Coordinator:
    """Decides that the run hangs and which ranks stalled; check() is called about every
    INTERVAL_S."""

    def __init__(self, rd: RunDir, attempt: int, timeout: float, nnodes: int, world: int):
        self.rd, self.attempt, self.timeout, self.nnodes, self.world = (
            rd,
            attempt,
            timeout,
            nnodes,
            world,
        )
        self.requested: float | None = None
        self.since = 0.0
        self.verdict: dict | None = None
        self.ext_dir = extcache.ext_dir(rd.read_run_yaml().get("spec") or {})
        # when a torch extension build was last seen under way: no hang while it builds
        self.built = 0.0

    def path(self, what: str, **kw: Any) -> str:
        return layout.path(self.rd.path, what, attempt=self.attempt, **kw)

    def progress(self) -> dict[int, dict]:
        out = {}
        for k in range(self.nnodes):
            view = layout.read_json(layout.path(self.rd.path, "node_progress", node=k))
            if view and view.get("attempt") == self.attempt:
                out.update({int(r): dict(t, node=k) for r, t in view["ranks"].items()})
        return out

    def check(self, now: float) -> dict | None:
        """The verdict once decided (then every call returns it), else None."""
        if self.verdict is not None:
            return self.verdict
        if self.requested is None:
            ranks = self.progress()
            if len(ranks) < self.world:
                return None
            if any(secs < extcache.STALE_S for _, secs in extcache.building(self.ext_dir, now)):
                self.built = now
            live = [t for t in ranks.values() if t.get("state") not in ENDED]
            if not live:
                # every rank's program has exited: the agents' exits end the attempt, no hang
                return None
            # an exit counts too
            self.since = max(self.built, *(t["last_advance"] for t in ranks.values()))
            if now - self.since < self.timeout:
                return None
            self.requested = now
            write(
                self.path("hang_request"),
                {"since": self.since, "time": now, "timeout": self.timeout},
            )
            return None
        answers = [layout.read_json(self.path("hang_node", node=k)) for k in range(self.nnodes)]
        if any(a is None for a in answers) and now - self.requested < ANSWER_WAIT_S:
            return None
        found = {int(r): v for a in answers if a for r, v in a["ranks"].items()}
        self.verdict = hang_decision(
            found, self.world, self.since, self.timeout, self.path("hang"), self.attempt
        )
        write(
            self.path("hang_stop"),
            {
                "attempt": self.attempt,
                "reason": "hang",
                "time": round(now, 3),
                # before anyone acts on it
                "hung_ranks": hung_ranks(self.verdict),
            },
        )
        write(self.path("hang_verdict"), self.verdict)
        self.rd.update_status(hang=self.verdict)
        return self.verdict


def hang_decision(
    found: dict[int, dict], world: int, since: float, timeout: float, where: str, attempt: int
) -> dict:
    """Stalled: stopped, stack elsewhere, or behind in steps; waiting: in torch.distributed and not
    behind. When every rank waits (and none is behind) they are all named stalled: a mismatch of
    collectives."""
    steps = [v["step"] for v in found.values() if v.get("step") is not None]
    top = max(steps) if steps else None
    for v in found.values():
        if (
            v["class"] == "waiting"
            and top is not None
            and v.get("step") is not None
            and v["step"] < top
        ):
            v.update(
                {"class": "stalled", "why": f"behind: step {v['step']} while others reached {top}"}
            )
    for r in range(world):
        found.setdefault(
            r, {"class": "stalled", "why": "no answer from its node", "step": None, "node": None}
        )
    stalled = sorted(r for r, v in found.items() if v["class"] == "stalled")
    if not stalled:
        stalled = sorted(found)
        for v in found.values():
            v["why"] = "every rank waits in a collective (mismatched collectives?): " + v["why"]
    waiting = sorted(r for r in found if r not in stalled)
    return {
        "attempt": attempt,
        "stalled_ranks": stalled,
        "waiting_ranks": waiting,
        "since": round(since, 3),
        "timeout": timeout,
        "dir": where,
        "ranks": {str(r): v for r, v in sorted(found.items())},
    }


def end_hung(run_dir: str, run_id: str, attempt: int, node: int | None = None) -> list[int]:
    """SIGKILL the programs of the hung ranks that stop.json names, those of `node` on this machine
    (every node's here: None); the ranks ended. A stopped program dies too; its wrapper records it
    (`ended_as: hung`)."""
    stop = layout.read_json(layout.path(run_dir, "hang_stop", attempt=attempt)) or {}
    hung = {r for r in stop.get("hung_ranks") or [] if isinstance(r, int)}
    ended = []
    for rank, (pid, _) in sorted(rank_programs(run_id, node).items()):
        if rank in hung:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(rank)
            except OSError:
                pass  # already gone
    return ended


class LauncherWatch:
    """The launcher's side (local and SSH): the Coordinator, plus on local the NodeMonitor of every
    node."""

    def __init__(
        self,
        rd: RunDir,
        run_id: str,
        attempt: int,
        timeout: float,
        nnodes: int,
        world: int,
        monitor_here: bool,
    ):
        self.coord = Coordinator(rd, attempt, timeout, nnodes, world)
        self.monitor = NodeMonitor(rd.path, run_id, attempt) if monitor_here else None
        if self.monitor:
            self.monitor.start()
        self.next = 0.0

    def poll(self) -> dict | None:
        """The verdict, at most one check per INTERVAL_S (cheap to call in a tight loop)."""
        now = time.time()
        if self.coord.verdict is None and now < self.next:
            return None
        self.next = now + INTERVAL_S
        return self.coord.check(now)

    def close(self) -> None:
        if self.monitor:
            self.monitor.stopped.set()
            self.monitor.join(timeout=5)


def describe(verdict: dict) -> str:
    """One line for the console: who stalled, why, how many wait on them, where the stacks are."""
    return hang_reason(verdict)
