"""RunRecords: a run dir's status.json and its per-rank / per-node records, written under one lock
(status/.lock, an flock on shared storage, re-entrant within a process: the launcher, a Slurm node
0, the batch side and every rank's wrapper may write at the same time). status.json is
read-modify-written (update_status), its secret values redacted and --notify told of a change; a
record of an older attempt is refused (launchers.records.fence); nothing is written into a removed
run dir (layout.present). RunDir (launchers.records.rundir) is a RunRecords that adds the run:
run.yaml, its attempts and the end of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from .. import layout
from ..credentials import secretenv
from ..errors import LaunchError
from ..hang.verdict import hang_reason
from . import fence, notify

if TYPE_CHECKING:  # the spec module only where a spec is made: the rank wrapper imports this one
    from ..spec import RunSpec

STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "REQUEUED")
EMPTY_STATUS = {"state": "PENDING", "attempt": 0, "nodes": {}, "first_failure": None}

_held: dict[str, tuple[int, Any]] = {}  # run dir -> (depth, open lock file): the lock is re-entrant
_held_guard = threading.RLock()


@dataclass
class RunRecords:
    path: str
    # the status this process could not write (disk full), if any
    unrecorded: dict[str, Any] | None = None
    newer: str | None = None  # opened read-only: the newer launchers version that wrote it
    # its spec's secret values (hold)
    held: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def hold(self, spec: RunSpec) -> None:
        """Keep the secret values of the spec this process runs out of status.json's reasons and
        --notify's events."""
        self.held = tuple(sorted({*self.held, *secretenv.values_of(spec, os.environ)}))

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive across processes and nodes (flock on shared storage), re-entrant within a
        process."""
        with _held_guard:
            depth, f = _held.get(self.path, (0, None))
            if depth == 0:
                layout.present(self.path)  # never recreates a removed run dir
                os.makedirs(layout.own_path(self.path, "records"), exist_ok=True)
                f = open(layout.own_path(self.path, "lock"), "a")
                fcntl.flock(f, fcntl.LOCK_EX)
            _held[self.path] = (depth + 1, f)
            try:
                yield
            finally:
                depth, f = _held.pop(self.path)
                if depth > 1:
                    _held[self.path] = (depth - 1, f)
                else:
                    fcntl.flock(f, fcntl.LOCK_UN)
                    f.close()

    @property
    def status_path(self) -> str:
        return layout.path(self.path, "status")

    def read_status(self) -> dict[str, Any]:
        data = layout.read_json(self.status_path)
        return dict(EMPTY_STATUS) if data is None else {**EMPTY_STATUS, **data}

    def update_status(self, **fields: Any) -> dict[str, Any]:
        """Read-modify-write of status.json under the lock; returns the new status."""
        if "state" in fields and fields["state"] not in STATES:
            raise ValueError(f"bad state {fields['state']!r}")
        with self.lock():
            st = layout.read_json(self.status_path) or {}
            old = dict(st)
            # no secret in a reason
            st.update(secretenv.redact_fields(fields, lambda: notify.known_secrets(self.held)))
            st["updated"] = now()
            try:
                layout.atomic_write(
                    layout.own_path(self.path, "status"),
                    json.dumps(st, indent=1, sort_keys=True) + "\n",
                )
                self.unrecorded = None
            # the run goes on (or ends with its honest code) without the record
            except OSError as e:
                if not layout.disk_full(e):
                    raise
                self.unrecorded = st
                print(
                    f"launch: disk full: cannot write {self.status_path} ({e.strerror}); not "
                    f"recorded: state {st.get('state')}",
                    file=sys.stderr,
                    flush=True,
                )
            # --notify: once per change, by whoever recorded it
            if event := notify.event_of(old, st):
                notify.on_change(
                    self.path,
                    event,
                    st,
                    hang_reason(st["hang"]) if event == "HANG" else None,
                    self.held,
                )
            return st

    def start_attempt(self, **fields: Any) -> dict[str, Any]:
        """Record an attempt started (its state and fields, `starting` cleared), unless `launch
        cancel` asked to stop the run while it was starting: then CANCELLED and a LaunchError,
        nothing started."""
        with self.lock():
            if self.read_status().get("cancel_requested"):
                self.update_status(
                    state="CANCELLED", reason="by launch cancel, before it started", starting=None
                )
                raise LaunchError(
                    f"run {self.path!r} was cancelled (`launch cancel`) before this attempt started"
                )
            return self.update_status(**{"cancel_requested": None, "starting": None, **fields})

    def write_rank_record(self, rec: dict[str, Any]) -> None:
        layout.present(self.path)  # an older attempt's record is refused (launchers.records.fence)
        if not fence.check(self.path, rec.get("attempt"), f"the exit record of rank {rec['rank']}"):
            layout.atomic_write(
                layout.own_path(self.path, "rank_record", rank=rec["rank"]),
                json.dumps(rec),
                durable=False,
            )

    def rank_exits(self, attempt: int) -> list[dict[str, Any]]:
        """Exit records written by each rank's wrapper in this attempt, earliest first."""
        out = []
        d = layout.path(self.path, "records")
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
            if name.startswith("rank") and name.endswith(".json"):
                rec = layout.read_json(os.path.join(d, name))
                if rec is not None and rec.get("attempt") == attempt:
                    out.append(rec)
        return sorted(out, key=lambda r: r["time"])

    def write_node_record(self, node: int, rec: dict[str, Any]) -> None:
        layout.present(self.path)
        if not fence.check(self.path, rec.get("attempt"), f"the record of node {node}"):
            layout.atomic_write(
                layout.own_path(self.path, "node_record", node=node), json.dumps(rec), durable=False
            )

    def node_records(self, nnodes: int, attempt: int) -> dict[int, dict[str, Any]]:
        """Node records of this attempt (node -> record)."""
        out = {}
        for k in range(nnodes):
            rec = layout.read_json(layout.path(self.path, "node_record", node=k))
            if rec is not None and rec.get("attempt") == attempt:
                out[k] = rec
        return out


def now() -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        + f".{int(time.time() * 1000) % 1000:03d}"
    )
