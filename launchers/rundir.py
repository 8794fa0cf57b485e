"""The run directory: the one place every backend writes to (shared storage on a cluster).

run.yaml      resolved spec, per-node commands, port/address, versions, attempts (launcher-owned)
status.json   state, attempt, per-node exit codes, first_failure (launcher-owned)
status/       rank<R>.json written by each rank's wrapper when it exits
logs/         node<K>/rank<R>.log and node<K>/agent.log, appended per attempt
checkpoints/  step-<N>/ and `latest` (written by the job)
The launcher creates the directory once and never overwrites anything the job wrote.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator

from . import __version__
from .ckptptr import read_latest, write_latest  # noqa: F401  (re-exported: the one pointer contract)
from .errors import LaunchError
from .spec import JobSpec, redact_env

STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "REQUEUED")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def runs_root(root: str | None = None) -> str:
    return os.path.abspath(root or os.environ.get("LAUNCH_RUNS_ROOT") or "runs")


def choose_run_dir(run_dir: str | None, name: str, root: str | None = None) -> str:
    if run_dir:
        path = os.path.abspath(run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = os.path.join(runs_root(root), f"{name}-{stamp}-{os.urandom(2).hex()}")
    if os.path.exists(path):
        raise LaunchError(f"run dir {path!r} already exists; use `launch resume {path}` or another --run-dir")
    return path


def new_run_id(spec: JobSpec) -> str:
    return f"{os.path.basename(spec.run_dir)}-{os.urandom(4).hex()}"


def atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class RunDir:
    path: str

    # ------------------------------------------------------------------ creation / opening
    @classmethod
    def create(cls, spec: JobSpec, run_id: str, plan: dict[str, Any]) -> "RunDir":
        """Create the directory (refusing an existing one) and write run.yaml + status.json."""
        try:
            os.makedirs(os.path.dirname(spec.run_dir), exist_ok=True)
            os.mkdir(spec.run_dir)
        except FileExistsError:
            raise LaunchError(f"run dir {spec.run_dir!r} already exists; use `launch resume`") from None
        rd = cls(spec.run_dir)
        for sub in ("logs", "checkpoints", "status"):
            os.makedirs(os.path.join(rd.path, sub), exist_ok=True)
        rd.write_run_yaml({
            "run_id": run_id,
            "created": _now(),
            "versions": {"launchers": __version__, "python": "%d.%d.%d" % sys.version_info[:3], "host": socket.gethostname()},
            "spec": redacted_spec(spec),
            "attempts": [dict(plan, attempt=0, started=_now())],
        })
        rd.write_status(state="PENDING", attempt=0, nodes={}, first_failure=None)
        return rd

    @classmethod
    def open(cls, path: str) -> "RunDir":
        path = os.path.abspath(path)
        if not os.path.isfile(os.path.join(path, "run.yaml")):
            raise LaunchError(f"{path!r} is not a run dir (no run.yaml)")
        return cls(path)

    # ------------------------------------------------------------------ run.yaml
    @property
    def run_yaml_path(self) -> str:
        return os.path.join(self.path, "run.yaml")

    def read_run_yaml(self) -> dict[str, Any]:
        import yaml      # imported where used: node start-up (slurmnode) reads the spec from JSON, without yaml
        with open(self.run_yaml_path, encoding="utf-8") as f:
            return yaml.safe_load(f)

    def write_run_yaml(self, data: dict[str, Any]) -> None:
        import yaml
        atomic_write(self.run_yaml_path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))

    def spec(self) -> JobSpec:
        """The recorded spec. Redacted env values are taken from the current environment when set."""
        return spec_from_record(self.read_run_yaml()["spec"])

    @property
    def run_id(self) -> str:
        return self.read_run_yaml()["run_id"]

    def add_attempt(self, spec: JobSpec, plan: dict[str, Any]) -> int:
        data = self.read_run_yaml()
        attempt = len(data["attempts"])
        data["attempts"].append(dict(plan, attempt=attempt, started=_now(), nodes=spec.nodes,
                                     gpus_per_node=spec.gpus_per_node))
        data["spec"] = redacted_spec(spec)
        self.write_run_yaml(data)
        return attempt

    # ------------------------------------------------------------------ status
    @property
    def status_path(self) -> str:
        return os.path.join(self.path, "status.json")

    def read_status(self) -> dict[str, Any]:
        try:
            with open(self.status_path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return {"state": "PENDING", "attempt": 0, "nodes": {}, "first_failure": None}

    def write_status(self, **fields: Any) -> dict[str, Any]:
        st = self.read_status() if os.path.exists(self.status_path) else {}
        st.update(fields)
        if st.get("state") not in STATES:
            raise ValueError(f"bad state {st.get('state')!r}")
        st["updated"] = _now()
        atomic_write(self.status_path, json.dumps(st, indent=1, sort_keys=True) + "\n")
        return st

    def rank_exits(self, attempt: int) -> list[dict[str, Any]]:
        """Exit records written by each rank's wrapper in this attempt, earliest first."""
        out = []
        d = os.path.join(self.path, "status")
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
            if name.startswith("rank") and name.endswith(".json"):
                try:
                    with open(os.path.join(d, name), encoding="utf-8") as f:
                        rec = json.load(f)
                except (OSError, ValueError):
                    continue
                if rec.get("attempt") == attempt:
                    out.append(rec)
        return sorted(out, key=lambda r: r["time"])

    def first_failure(self, attempt: int) -> dict[str, Any] | None:
        for rec in self.rank_exits(attempt):
            if rec.get("exit_code") != 0:
                return {k: rec.get(k) for k in ("node", "rank", "exit_code", "signal", "time")}
        return None

    # ------------------------------------------------------------------ layout
    def log_dir(self, node: int) -> str:
        return os.path.join(self.path, "logs", f"node{node}")

    def agent_log(self, node: int) -> str:
        return os.path.join(self.log_dir(node), "agent.log")

    def rank_logs(self) -> Iterator[tuple[int, int, str]]:
        """(node, rank, path) for every rank log present, ordered by rank."""
        found = []
        logs = os.path.join(self.path, "logs")
        for node_dir in os.listdir(logs) if os.path.isdir(logs) else ():
            if not node_dir.startswith("node"):
                continue
            for f in os.listdir(os.path.join(logs, node_dir)):
                if f.startswith("rank") and f.endswith(".log"):
                    found.append((int(node_dir[4:]), int(f[4:-4]), os.path.join(logs, node_dir, f)))
        return iter(sorted(found, key=lambda t: t[1]))

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.path, "checkpoints")

    def latest_checkpoint(self) -> str | None:
        return read_latest(self.checkpoint_dir)

    def last_step(self) -> int | None:
        try:
            with open(os.path.join(self.path, "metrics.jsonl"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                lines = f.read().decode("utf-8", "replace").strip().splitlines()
            return int(json.loads(lines[-1])["step"]) if lines else None
        except (OSError, ValueError, KeyError, IndexError):
            return None


def list_runs(root: str | None = None) -> list[RunDir]:
    base = runs_root(root)
    runs = []
    for name in os.listdir(base) if os.path.isdir(base) else ():
        p = os.path.join(base, name)
        if os.path.isfile(os.path.join(p, "run.yaml")):
            runs.append(RunDir(p))
    return sorted(runs, key=lambda r: os.path.getmtime(r.run_yaml_path), reverse=True)


def spec_from_record(recorded: dict[str, Any]) -> JobSpec:
    """A spec as run.yaml records it (secret env values as ***) -> JobSpec, with the secret values taken from
    the current environment when set there."""
    d = dict(recorded)
    env = dict(d.get("env") or {})
    for k, v in env.items():
        if v == "***" and k in os.environ:
            env[k] = os.environ[k]
    d["env"] = env
    return JobSpec.from_dict(d)


def redacted_spec(spec: JobSpec) -> dict[str, Any]:
    d = spec.to_dict()
    d["env"] = redact_env(d["env"])
    return d


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"
