"""Where everything lives in a run directory: the one place its paths are spelled.

Stdlib only and free of side effects except the two small atomic writers at the end: every side uses it --
the launcher, each rank's wrapper (launchers.rankexec), an SSH host's agent (launchers.remote) and a Slurm
node (launchers.backends.slurm.node) -- so none of them spells a path of its own.

    run.yaml                       resolved spec, per-node commands, versions, attempts
    status.json                    state, attempt, per-node exit codes, first failure (RunDir writes it)
    status/rank<R>.json            how rank R ended (written through RunDir by its wrapper)
    status/node<K>.json            how node K ended (Slurm nodes)
    status/.lock                   the lock every writer of status.json and the records holds
    logs/node<K>/rank<R>.log       rank R's output, appended per attempt after a header line
    logs/node<K>/agent.log         the torchrun agent's output
    checkpoints/step-<N>/, latest  written by the job (launchers.ckptptr owns `latest`)
    metrics.jsonl, final.json      written by the job (rank 0)
    slurm/                         Slurm only: submitit's folder (sbatch output, pickles), node spec, rendezvous
"""
from __future__ import annotations

import os
import time

from .errors import LaunchError

RUN_YAML = "run.yaml"
STATUS = "status.json"


# ------------------------------------------------------------------------------------------ choosing a run dir

def runs_root(root: str | None = None) -> str:
    return os.path.abspath(root or os.environ.get("LAUNCH_RUNS_ROOT") or "runs")


def choose_run_dir(run_dir: str | None, name: str, root: str | None = None) -> str:
    """--run-dir as given (absolute), else <runs root>/<name>-<time>-<random>; never an existing path."""
    if run_dir:
        path = os.path.abspath(run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = os.path.join(runs_root(root), f"{name}-{stamp}-{os.urandom(2).hex()}")
    if os.path.exists(path):
        raise LaunchError(f"run dir {path!r} already exists; use `launch resume {path}` or another --run-dir")
    return path


def is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, RUN_YAML))


# ------------------------------------------------------------------------------------------ paths

def run_yaml(run_dir: str) -> str:
    return os.path.join(run_dir, RUN_YAML)


def status_json(run_dir: str) -> str:
    return os.path.join(run_dir, STATUS)


def records_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "status")


def status_lock(run_dir: str) -> str:
    return os.path.join(records_dir(run_dir), ".lock")


def rank_record(run_dir: str, rank: int) -> str:
    return os.path.join(records_dir(run_dir), f"rank{rank}.json")


def node_record(run_dir: str, node: int) -> str:
    return os.path.join(records_dir(run_dir), f"node{node}.json")


def logs_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "logs")


def node_log_dir(run_dir: str, node: int) -> str:
    return os.path.join(logs_dir(run_dir), f"node{node}")


def rank_log(run_dir: str, node: int, rank: int) -> str:
    return os.path.join(node_log_dir(run_dir, node), f"rank{rank}.log")


def agent_log(run_dir: str, node: int) -> str:
    return os.path.join(node_log_dir(run_dir, node), "agent.log")


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def metrics(run_dir: str) -> str:
    return os.path.join(run_dir, "metrics.jsonl")


def slurm_dir(run_dir: str) -> str:
    """Slurm's folder in the run dir: submitit's (sbatch output, pickles) and the node task's files."""
    return os.path.join(run_dir, "slurm")


def slurm_jobs(run_dir: str) -> str:
    return os.path.join(slurm_dir(run_dir), "jobs")


def node_spec(run_dir: str, base_attempt: int) -> str:
    return os.path.join(slurm_dir(run_dir), f"spec-a{base_attempt}.json")


def rendezvous(run_dir: str, job_id: str, step: str, restart: int) -> str:
    return os.path.join(slurm_dir(run_dir), f"master-{job_id}-{step}-r{restart}.json")


def rank_logs(run_dir: str) -> list[tuple[int, int, str]]:
    """(node, rank, path) for every rank log present, ordered by rank."""
    found = []
    base = logs_dir(run_dir)
    for node_dir in os.listdir(base) if os.path.isdir(base) else ():
        if not (node_dir.startswith("node") and node_dir[4:].isdigit()):
            continue
        for f in os.listdir(os.path.join(base, node_dir)):
            if f.startswith("rank") and f.endswith(".log") and f[4:-4].isdigit():
                found.append((int(node_dir[4:]), int(f[4:-4]), os.path.join(base, node_dir, f)))
    return sorted(found, key=lambda t: t[1])


def agent_header(attempt: int | str, node: int, where: str = "") -> str:
    """The line each agent start appends to its agent.log (every backend writes the same one)."""
    at = f" | {where}" if where else ""
    return f"===== launch attempt {attempt} | node {node}{at} | {time.strftime('%F %T')} =====\n"


# ------------------------------------------------------------------------------------------ atomic writes

def atomic_write(path: str, text: str, durable: bool = True) -> None:
    """Replace path at once: readers (on any node) see the old file or the new one, never a part."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    """A JSON record, or None when it is missing or not (yet) whole."""
    import json          # here: rank wrappers import this module before their program starts
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
