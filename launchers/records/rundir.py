"""RunDir: the only writer of run.yaml, status.json and the per-rank / per-node records of a run
directory.

Every backend, every Slurm node and every rank's wrapper writes through it, status.json and the
records under one lock (status/.lock, an flock: the launcher, a Slurm node 0 and the batch side may
write at the same time: launchers.records.runrecords, RunDir's base). The end of an attempt is
decided in one place for every backend: `record_outcome()`. Paths come from launchers.layout;
`checkpoints/latest` is launchers.ckptptr's. The launcher creates the directory once and never
overwrites anything the job wrote.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import __version__, layout, procs, sweep, trust
from ..ckptptr import read_latest
from ..credentials import secretenv
from ..diagnosis import firstfail
from ..errors import LaunchError, brief
from ..hang.verdict import hang_failure, hang_reason
from ..procs import exit_fields  # noqa: F401  (its home: procs; imported from here by the backends)
from ..stops import ENDINGS, exit_code, stopped_reason
from . import fence, notify, rundircheck, runindex
from .runrecords import RunRecords, now

if TYPE_CHECKING:  # the spec module only where a spec is made: the rank wrapper imports this one
    from ..spec import RunSpec

TERMINAL = tuple(ENDINGS)  # the one table of endings: launchers.stops


def new_run_id(spec: RunSpec) -> str:
    return f"{os.path.basename(spec.run_dir)}-{os.urandom(4).hex()}"


class RunDir(RunRecords):
    """A run dir (RunRecords: its path, status.json and records under the lock) and its run: created
    or opened, run.yaml and its attempts, the launcher's liveness, the end of an attempt, what the
    job wrote.

    on_failure(first failure, nodes), set by whoever decides after a failed attempt
    (restarts.run_attempts; a plain Slurm job's finalize): record_outcome hands it a failed attempt
    (not a stop) under the lock, before any verdict is written. It writes what the end needs
    (nodes.json, the site ledger) and returns the line why another attempt follows (status REQUEUED
    with it) or None (FAILED, written last)."""

    on_failure: Callable[[dict[str, Any] | None, dict[str, Any]], str | None] | None = None

    # ------------------------------------------------------------------ creation / opening
    @classmethod
    def create(cls, spec: RunSpec, run_id: str, plan: dict[str, Any]) -> "RunDir":
        """Create the directory (refusing an existing one) and write run.yaml + status.json."""
        try:
            os.makedirs(os.path.dirname(spec.run_dir), exist_ok=True)
            os.mkdir(spec.run_dir)
        except FileExistsError:
            raise LaunchError(
                f"run dir {spec.run_dir!r} already exists; use `launch resume`"
            ) from None
        except OSError as e:
            raise LaunchError(
                f"run dir {brief(spec.run_dir)} cannot be created ({e.strerror}); give --run-dir "
                "in a directory you can write"
            ) from None
        rd = cls(spec.run_dir)
        try:
            rd.write_new(spec, run_id, plan)
        except OSError as e:  # nothing was started: leave nothing behind
            import shutil

            shutil.rmtree(spec.run_dir, ignore_errors=True)
            raise LaunchError(
                f"run dir {brief(spec.run_dir)} cannot be written ({e.strerror}); "
                "give --run-dir on a writable file system with free space"
            ) from None
        runindex.note(rd.path)  # outside the runs root: `launch list` finds it through the index
        return rd

    def write_new(self, spec: RunSpec, run_id: str, plan: dict[str, Any]) -> None:
        """The new run dir's layout, status.json and then run.yaml (what makes it a run dir,
        last)."""
        self.hold(spec)  # its secret values: kept out of status and --notify's events
        notify.arm(self.path)  # this launcher's --notify: it alone sends the run's events
        for sub in ("logs", "checkpoints", "records"):
            os.makedirs(layout.own_path(self.path, sub), exist_ok=True)
        self.update_status(
            state="PENDING", attempt=0, nodes={}, first_failure=None, starting=procs.self_record()
        )  # this launcher, until its attempt starts
        self.write_run_yaml(
            {
                "run_id": run_id,
                "created": now(),
                "versions": {
                    "launchers": __version__,
                    "python": "%d.%d.%d" % sys.version_info[:3],
                    "host": socket.gethostname(),
                },
                "spec": redacted_spec(spec),
                "attempts": [dict(plan, attempt=0, started=now())],
            }
        )

    @classmethod
    def open(cls, path: str, read_only: bool = False) -> "RunDir":
        """A run dir made by launch; one written by a newer launchers only when read_only (rd.newer:
        its version)."""
        path = os.path.abspath(path)
        if not layout.is_run_dir(path) and sweep.is_sweep_dir(path):
            runs = [os.path.basename(d) for d in sweep.member_dirs(path)]
            raise LaunchError(
                f"{path!r} is a sweep dir, not a run dir; give one of its runs: "
                f"{', '.join(runs[:5]) or '(none yet)'}{' ...' if len(runs) > 5 else ''}"
            )
        if not layout.is_run_dir(path):
            raise LaunchError(
                f"{path!r} is not a run dir (no run.yaml); give a directory made by `launch` "
                "(see `launch list`)"
            )
        rd = cls(path)
        rd.newer = rundircheck.newer_version(rd.read_run_yaml(), __version__, path, read_only)
        if why := rundircheck.json_problem(rd.status_path):  # its fields' types too (issue 35)
            raise LaunchError(
                f"{path!r} is not a usable run dir: status.json {why}; accepted: a run dir made by "
                "`launch` (its status.json: a JSON object of the fields it writes)"
            )
        return rd

    # ------------------------------------------------------------------ run.yaml
    @property
    def run_yaml_path(self) -> str:
        return layout.path(self.path, "run_yaml")

    def read_run_yaml(self) -> dict[str, Any]:
        data, why = layout.load_run_yaml(self.path)
        if why:
            raise LaunchError(
                f"{self.path!r} is not a usable run dir: run.yaml {why}; accepted: a run.yaml "
                "written by `launch` (run_id, spec, attempts)"
            )
        return data

    def write_run_yaml(self, data: dict[str, Any]) -> None:
        layout.atomic_write(layout.own_path(self.path, "run_yaml"), layout.run_yaml_text(data))
        # run.yaml's newest attempt: the generation
        fence.advance(self.path, fence.newest(data.get("attempts")))

    def spec(self) -> RunSpec:
        """The recorded spec. Redacted env values are taken from the current environment when
        set."""
        return spec_from_record(self.read_run_yaml()["spec"])

    @property
    def run_id(self) -> str:
        return self.read_run_yaml()["run_id"]

    def add_attempt(self, spec: RunSpec, plan: dict[str, Any]) -> int:
        data = self.read_run_yaml()
        attempt = len(data["attempts"])
        data["attempts"].append(
            dict(
                plan,
                attempt=attempt,
                started=now(),
                nodes=spec.nodes,
                gpus_per_node=spec.gpus_per_node,
            )
        )
        data["spec"] = redacted_spec(spec)
        self.hold(spec)
        notify.arm(self.path)  # the launcher of this attempt (`launch resume`, a Slurm requeue)
        self.write_run_yaml(data)
        return attempt

    def claim_attempt(
        self, spec: RunSpec, plan: dict[str, Any], attempt: int, refusal: Any
    ) -> None:
        """A new attempt (`launch resume`) checked and added under one hold of the lock, so that of
        two racing resumes one is refused: `refusal(status)` is the line refusing it (one running or
        starting), else None. The status then names this process `starting` until the attempt starts
        (start_attempt)."""
        with self.lock():
            why = refusal(self.read_status()) or (
                len(self.read_run_yaml()["attempts"]) != attempt
                and f"run {self.path!r} got another attempt meanwhile; try again"
            )
            if why:
                raise LaunchError(why)
            self.add_attempt(spec, plan)
            self.update_status(starting=procs.self_record(), cancel_requested=None)

    def update_attempt(self, attempt: int, fields: dict[str, Any], new: dict[str, Any]) -> None:
        """Merge `fields` into attempt `attempt` of run.yaml, appending it (with `new` too) when it
        is not there yet (an attempt Slurm started by requeueing the job)."""
        data = self.read_run_yaml()
        attempts = data.setdefault("attempts", [])
        if attempt < len(attempts):
            attempts[attempt].update(fields)
        else:
            attempts.append(dict(fields, attempt=attempt, started=now(), **new))
        self.write_run_yaml(data)

    def mark_running(self, attempt: int, **extra: Any) -> None:
        """The start of an attempt run by this process (local, SSH, in a Slurm allocation): its
        liveness record lets `status`/`cancel` tell a live launcher from a killed one (and hold its
        proof: launchers.trust)."""
        trust.hold(self.path)
        self.start_attempt(
            state="RUNNING",
            attempt=attempt,
            nodes={},
            first_failure=None,
            reason=None,
            hang=None,
            surviving_pids=None,
            stopped_by=None,
            launcher=procs.self_record(),
            **extra,
        )

    def launcher_alive(self, st: dict[str, Any] | None = None) -> bool:
        return procs.record_alive(
            (st if st is not None else self.read_status()).get("launcher") or {}
        )

    def check_launcher(self, live: tuple[str, ...] = ("RUNNING", "PENDING")) -> dict[str, Any]:
        """status.json; a run in a `live` state whose launcher (recorded on this host) is dead is
        corrected to FAILED ("launcher died"), with the run's processes still alive here listed
        (`launch cancel` ends them). (REQUEUED is live where the launcher owns the restarts: local,
        SSH; on Slurm, Slurm does.)"""
        st = self.read_status()
        rec = st.get("launcher") or {}
        if (
            st.get("state") not in live
            or not rec
            or rec.get("host") != socket.gethostname()
            or self.launcher_alive(st)
        ):
            return st
        with self.lock():
            cur = self.read_status()
            if cur.get("state") not in live or cur.get("launcher") != rec:
                return cur
            alive = trust.run_pids(self.run_id, self.path)  # never another run dir's (issue 35)
            return self.update_status(
                state="FAILED",
                surviving_pids=alive,
                reason=f"launcher died (pid {rec.get('pid')}"
                f" on {rec.get('host')} ended without recording the end: killed?)"
                + (f"; {len(alive)} process(es) of the run still alive" if alive else ""),
            )

    def first_failure(self, attempt: int) -> dict[str, Any] | None:
        """The earliest failing rank record of the attempt (with its exception or reason when its
        wrapper found one)."""
        return firstfail.earliest(self.rank_exits(attempt))

    # ------------------------------------------------------------------ the end of an attempt
    def record_outcome(
        self,
        attempt: int,
        nodes: dict[str, int | None],
        *,
        stopped_by: str | None = None,
        stopped_at: float | None = None,
        node_failures: list[dict[str, Any]] = (),
        reason: str | None = None,
        hosts: list[str] | None = None,
    ) -> int:
        """The end of an attempt, the same rule on every backend; returns the launcher's exit code.

        stopped_by (the signal the launcher got): CANCELLED, exit 130 (SIGINT: Ctrl-C) or 143
        (SIGTERM: `launch cancel`, kill), with a first failure only for a rank that failed before
        the stop (stopped_at). Every node 0: COMPLETED, 0. Otherwise FAILED, 1, with first_failure
        the first stalled rank when a hang was detected in this attempt (status `hang`), else the
        earliest failure in time among the failing rank records of the attempt and `node_failures`
        ({node, exit_code, signal, time, reason[, host]}) of nodes that left no failing rank record
        (a node that died, lost its connection or could not start). Ranks killed after the stop
        grace are named in the reason."""
        with self.lock():
            st = self.read_status()
            killed = self.killed_after_grace(attempt)
            if stopped_by:
                ff = self.first_failure(attempt)
                if ff is not None and (stopped_at is None or ff["time"] >= stopped_at):
                    ff = None
                how = stopped_reason(stopped_by, bool(st.get("cancel_requested")))
                self.update_status(
                    state="CANCELLED",
                    nodes=nodes,
                    first_failure=ff,
                    stopped_by=stopped_by,
                    reason=join(reason or how, killed),
                )
                return exit_code({"state": "CANCELLED", "stopped_by": stopped_by})
            hang = st.get("hang") or {}
            # a hang's stop is FAILED, even
            hung = hang.get("attempt") == attempt and hang.get("stalled_ranks")
            # if every
            if not hung and nodes and all(c == 0 for c in nodes.values()) and not node_failures:
                # program
                self.update_status(state="COMPLETED", nodes=nodes, first_failure=None, reason=None)
                return 0  # ended well on the stop
            if hung:
                ff, reason = hang_failure(hang, hosts), reason or hang_reason(hang)
            else:
                ff = self.decide_first_failure(attempt, node_failures, hosts)
            if ff is not None and ff.get("rank") is None:
                reason = reason or ff.get("reason")
            return self.failed(ff, nodes, join(reason, killed))

    def failed(
        self, ff: dict[str, Any] | None, nodes: dict[str, int | None], reason: str | None
    ) -> int:
        """A failed attempt's end, under the lock: on_failure first, then REQUEUED with its line
        why, else FAILED (last: the ledgers the hook wrote are in before it shows); the verdict is
        written even if the hook raises."""
        why = None
        try:
            why = self.on_failure(ff, nodes) if self.on_failure is not None else None
        finally:
            if why:  # another attempt follows: never FAILED meanwhile (as Slurm's in-job steps)
                self.update_status(state="REQUEUED", nodes=nodes, first_failure=ff, reason=why)
            else:
                self.update_status(state="FAILED", nodes=nodes, first_failure=ff, reason=reason)
        return 1

    def killed_after_grace(self, attempt: int) -> str | None:
        return firstfail.killed_after_grace(self.rank_exits(attempt))

    def decide_first_failure(
        self, attempt: int, node_failures: list[dict[str, Any]] = (), hosts: list[str] | None = None
    ) -> dict[str, Any] | None:
        return firstfail.first_failure(self.rank_exits(attempt), node_failures, hosts)

    # ------------------------------------------------------------------ what the job wrote
    def log_dir(self, node: int) -> str:
        return layout.path(self.path, "node_logs", node=node)

    def agent_log(self, node: int) -> str:
        return layout.path(self.path, "agent_log", node=node)

    def start_agent_log(self, node: int, attempt: int, command: str, where: str = "") -> str:
        """Append the attempt's header and the node's command to its agent.log; returns the log's
        path."""
        layout.present(self.path)  # never recreates a removed run dir
        log = layout.own_path(self.path, "agent_log", node=node)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write(layout.agent_header(attempt, node, where) + command + "\n")
        return log

    def rank_logs(self) -> list[tuple[int, int, str]]:
        return layout.rank_logs(self.path)

    @property
    def checkpoint_dir(self) -> str:
        return layout.path(self.path, "checkpoints")

    def latest_checkpoint(self) -> str | None:
        return read_latest(self.checkpoint_dir)

    def last_step(self) -> int | None:
        return rundircheck.last_step(self.path)


def join(*parts: str | None) -> str | None:
    return "; ".join(p for p in parts if p) or None


def list_runs(root: str | None = None) -> list[RunDir]:
    """The run dirs under the runs root and those in the runs index (made elsewhere), newest
    first."""
    return [RunDir(p) for p in runindex.run_dirs(layout.runs_root(root))]


def spec_from_record(recorded: dict[str, Any]) -> RunSpec:
    """A spec as run.yaml records it -> RunSpec, its secret values taken from this process's
    environment (secretenv.taken_back: a resume first refuses when one is not there; a Slurm job's
    and the API's detached launcher's have them by secretenv.handover)."""
    from ..spec import RunSpec

    return RunSpec.from_dict(secretenv.taken_back(recorded, os.environ))


def redacted_spec(spec: RunSpec) -> dict[str, Any]:
    """What run.yaml records of a spec: every secret value as ***, the --secret variables by name
    only, the program's arguments with their credentials as *** (secretenv.record_spec)."""
    from ..credentials.secretenv import record_spec

    return record_spec(spec.to_dict())
