"""Turns on a shared dev cluster (make test runs the tests of one cluster on several pytest-xdist
workers at once).

Most cluster tests only start their own runs, so several may use the dev Slurm cluster or the SSH
test hosts at once: Slurm queues what does not fit, and each run is found by its own run id, job id
or run dir. A test marked `exclusive` disrupts its cluster or reads its cluster-wide state (kills or
pauses slurmd, slurmctld or a host, cuts a link, takes every node, compares the whole queue before
and after): it runs while no other test of that cluster does. A readers-writer lock per cluster
(flock, shared by every worker of the run): the shared tests hold it shared, an exclusive test holds
it alone; a gate in front of it keeps new shared tests out once an exclusive one waits, so the
exclusive one gets its turn when the running ones end (flock alone promises no order). A turn lasts
one test: a fixture that holds a part of a cluster (a job taking every node, a stopped daemon) is
function-scoped.

scheduler(): pytest-xdist's LoadScope over our scopes (conftest.scope_of: "slurm!" a cluster's
exclusive tests, "slurm:MODULE" its other tests of a module, else the module), in collection order
(the exclusive lanes first), taking for a worker the first scope it may have now: no other scope of
a cluster while its exclusive lane is under way (they would only wait for their turn: the workers
run local modules meanwhile), and at most CAPS workers on a cluster at once after it.

once(): what several workers' modules need alike (an uninterrupted reference run) is made once per
run, by the first worker that asks; the others wait for it and read its result."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def turn(lock_dir: str, cluster: str, exclusive: bool) -> Iterator[None]:
    """Hold `cluster`'s lock (under lock_dir: one per make test run) shared, or alone when
    exclusive."""
    base = os.path.join(lock_dir, f"{cluster}-cluster")
    with open(base + ".gate", "a+b") as gate, open(base + ".lock", "a+b") as lock:
        # in line: behind an exclusive test that waits, never past it
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # both fds close (and unlock) on leaving the with


def once(run_dir: str, key: str, make: Callable[[str], object]):
    """make(a fresh directory under run_dir) once per make test run (run_dir: the run's shared
    directory, removed at its end), whichever worker asks first; its JSON-able result is kept and
    read by every later caller. A make that fails keeps nothing: the next caller tries again."""
    path = os.path.join(run_dir, f"once-{key}.json")
    with open(path + ".lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        value = make(tempfile.mkdtemp(prefix=f"{key}-", dir=run_dir))
        with open(path + ".new", "w", encoding="utf-8") as f:
            json.dump(value, f)
        os.replace(path + ".new", path)
        return value


CAPS = {"slurm": 3, "ssh": 2}  # workers on one cluster at once


def cluster_of(scope: str) -> str | None:
    head = scope.split(":", 1)[0].rstrip("!")
    return head if head in CAPS else None


def scheduler(config, log, scopes_file: str):
    from xdist.scheduler import LoadScopeScheduling

    class ClusterGroups(LoadScopeScheduling):
        scopes: dict = {}

        def _split_scope(self, nodeid: str) -> str:
            if not self.scopes:
                with open(scopes_file, encoding="utf-8") as f:
                    self.scopes.update(json.load(f))
            return self.scopes[nodeid]

        def _busy(self, cluster: str) -> tuple[int, bool]:
            """(workers with a scope of `cluster` under way, whether its exclusive lane is one of
            them). A worker keeps its last test until it gets more work or is shut down (pytest
            needs the next item): a scope whose one test left is its worker's only one is not under
            way (it runs once that worker gets any)."""
            n, lane = 0, False
            for work in self.assigned_work.values():
                held = self._pending_of(work) == 1
                for scope, unit in work.items():
                    left = sum(not done for done in unit.values())
                    if cluster_of(scope) == cluster and left > 0 and not (left == 1 and held):
                        n, lane = n + 1, lane or scope.endswith("!")
            return n, lane

        def _may_take(self, scope: str, busy: dict[str, tuple[int, bool]]) -> bool:
            cluster = cluster_of(scope)
            if cluster is None:
                return True
            n, lane = busy[cluster]
            return n == 0 if scope.endswith("!") else not lane and n < CAPS[cluster]

        def _assign_work_unit(self, node) -> None:
            """The first scope in the queue that this node may take now (_may_take), if any."""
            busy = {c: self._busy(c) for c in CAPS}  # once per call, not once per scope looked at
            scope = next((s for s in self.workqueue if self._may_take(s, busy)), None)
            if scope is None:
                return  # offered again when a scope's test ends (mark_test_complete)
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some(
                [collection.index(i) for i, done in work_unit.items() if not done]
            )

        def mark_test_complete(self, node, item_index, duration=0) -> None:
            super().mark_test_complete(node, item_index, duration)
            for other in self.nodes:  # a node left without work by a cap may take a scope now
                if other is not node and self.workqueue:
                    self._reschedule(other)

    return ClusterGroups(config, log)
