"""Helpers every fault test (local, SSH, Slurm) may import: `from common import ...` (tests/faults
is on sys.path).

The dev clusters' nodes (SSH hosts sshhost1..4, Slurm nodes lnode1..4) are network (and uts)
namespaces of this machine sharing its pid namespace and file system, so one /proc scan here sees
every process of every node: `orphans(run_id)` is the orphan scan for all three backends (it names
each survivor's namespace = its node). Run dirs are on the shared file system, so status.json,
final.json, progress/ and metrics.jsonl are read here.

Times are wall-clock (time.time()), the clock the run's own records use (progress/rank<R>.json,
metrics.jsonl).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import yaml

from launchers import procs
from record import record

# The resume-check workload: tiny convnet, one metrics line per step (first-step times), no
# tensorboard.
CONVNET = [
    "-m",
    "workloads.convnet",
    "--dataset",
    "digits",
    "--seed",
    "7",
    "--batch-size",
    "8",
    "--log-every",
    "1",
    "--no-tensorboard",
]


def convnet(max_steps: int, checkpoint_every: int, *extra: str) -> list[str]:
    """The program part of a launch line (after `--`). Add "--step-delay", "0.25" (workloads'
    fault-injection flag: every step sleeps; the result is unchanged) to make a run long enough to
    inject a fault mid-training."""
    return [
        *CONVNET,
        "--max-steps",
        str(max_steps),
        "--checkpoint-every",
        str(checkpoint_every),
        *extra,
    ]


# ------------------------------------------------------------------ run-dir records
def read_json(path: str | os.PathLike) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def run_id(run_dir: str | os.PathLike) -> str:
    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]


def status(run_dir: str | os.PathLike) -> dict:
    return read_json(Path(run_dir, "status.json")) or {}


def final_sha(run_dir: str | os.PathLike) -> str | None:
    """final.json's param_sha256 (rank 0 writes it at the end of a completed run), or None."""
    return (read_json(Path(run_dir, "final.json")) or {}).get("param_sha256")


def latest_checkpoint(run_dir: str | os.PathLike) -> tuple[str | None, bool]:
    """(the name checkpoints/latest points to, whether that checkpoint is complete: its DCP
    .metadata exists)."""
    ptr = Path(run_dir, "checkpoints", "latest")
    name = ptr.read_text().strip() if ptr.is_file() else None
    return name, bool(name) and Path(run_dir, "checkpoints", name, ".metadata").is_file()


def assert_latest_complete(run_dir: str | os.PathLike) -> str:
    name, complete = latest_checkpoint(run_dir)
    assert name and complete, (
        f"checkpoints/latest in {run_dir} names {name!r}, which is not a complete checkpoint"
    )
    return name


def first_failure_text(st: dict) -> str | None:
    """status.json's first failure as one short phrase for the table: 'rank 1 (node 1): SIGKILL'."""
    ff = st.get("first_failure")
    if not ff:
        return None
    who = f"rank {ff['rank']}" if ff.get("rank") is not None else f"node {ff.get('node')}"
    if ff.get("rank") is not None and ff.get("node") is not None:
        who += f" (node {ff['node']})"
    if ff.get("host"):
        who += f" on {ff['host']}"
    cause = (
        ff.get("signal")
        or (f"exit {ff['exit_code']}" if ff.get("exit_code") is not None else None)
        or ff.get("reason")
        or st.get("reason")
    )
    return f"{who}: {cause}" if cause else who


# ------------------------------------------------------------------ processes
def netns_of(pid: int) -> str:
    """The network namespace (= dev-cluster node) of pid: 'sshhost2', 'lnode1', or 'host' for this
    machine."""
    p = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True)
    return p.stdout.strip() or "host"


def describe_pid(pid: int) -> str:
    try:
        cmd = (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        cmd = "?"
    return f"pid {pid} on {netns_of(pid)}: {cmd[:160]}"


def orphans(run_id: str, settle_s: float = 10.0) -> list[str]:
    """Processes carrying the run id on any node, after waiting up to settle_s for them to go (exits
    take a moment). Each as 'pid N on NODE: cmdline'; [] is the only good answer."""
    deadline = time.monotonic() + settle_s
    while (pids := procs.tagged_pids(run_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [describe_pid(p) for p in pids]


def kill_orphans(run_id: str) -> None:
    """Test cleanup after a failed assertion: SIGKILL what carries the run id (by exact tag, never
    by name)."""
    for pid in procs.tagged_pids(run_id):
        procs.kill(pid, 9)


def proc_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def agent_pid(run_id: str, node: int) -> int | None:
    """The torchrun agent of `node` (its NODE_RANK) of a run, on any node of the dev clusters."""
    for pid in procs.agent_pids(run_id):
        if proc_env(pid).get("NODE_RANK") == str(node):
            return pid
    return None


def rank_pid(run_id: str, rank: int) -> int | None:
    """The training program of `rank` (the rank wrapper's child, the process that computes)."""
    from launchers.hang.sample import rank_programs

    hit = rank_programs(run_id).get(rank)
    return hit[0] if hit else None


# ------------------------------------------------------------------ waiting and timing
def wait_for(pred, timeout: float, what: str, interval: float = 0.1):
    """Poll pred() until it returns something truthy (returned); AssertionError naming `what` after
    timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def progress(run_dir: str | os.PathLike) -> dict[int, dict]:
    """rank -> its heartbeat record (progress/rank<R>.json: step, attempt, time, pid)."""
    out = {}
    for p in Path(run_dir, "progress").glob("rank*.json"):
        rec = read_json(p)
        if rec and p.stem[4:].isdigit():
            out[int(p.stem[4:])] = rec
    return out


def wait_step(
    run_dir: str | os.PathLike,
    step: int,
    *,
    attempt: int = 0,
    world: int = 1,
    timeout: float = 180,
    alive=None,
) -> float:
    """Wait until every rank of `world` reports step >= `step` in `attempt`; returns the wall time
    seen. alive(): optional check that the run is still going (e.g. lambda: proc.poll() is None)."""

    def done():
        if alive is not None:
            assert alive(), f"the run ended before every rank reached step {step}"
        recs = progress(run_dir)
        return (
            all(
                (r := recs.get(k)) and r.get("attempt") == attempt and (r.get("step") or 0) >= step
                for k in range(world)
            )
            and time.time()
        )

    return wait_for(
        done, timeout, f"step {step} of attempt {attempt} on {world} rank(s) in {run_dir}", 0.05
    )


def metrics(run_dir: str | os.PathLike) -> list[dict]:
    p = Path(run_dir, "metrics.jsonl")
    if not p.is_file():
        return []
    out = []
    for ln in p.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(ln))
    return out


def first_step_time(run_dir: str | os.PathLike, attempt: int) -> float | None:
    """Wall time of the first training step of `attempt` (metrics.jsonl, rank 0; CONVNET logs every
    step)."""
    for m in metrics(run_dir):
        if m.get("attempt") == attempt and m.get("kind") != "eval" and "time" in m:
            return float(m["time"])
    return None


def seconds(a: float | None, b: float | None) -> float | None:
    """b - a rounded, or None when either is unknown."""
    return None if a is None or b is None else round(b - a, 2)


# ------------------------------------------------------------------ one table row per fault
@contextlib.contextmanager
def fault_row(backend: str, fault: str, **fields):
    """Collect a fault's row while the test runs and record it exactly once, pass or fail:

        with fault_row("local", "SIGKILL worker") as row:
            ...; row["exit_code"] = p.returncode; row["orphans"] = len(left) ...

    passed is True only when the body finished without an exception and no orphans were counted."""
    row = {"user_sees": "-", "exit_code": None, **fields}
    ok = False
    try:
        yield row
        ok = True
    except BaseException as e:
        row.setdefault("error", f"{type(e).__name__}: {str(e)[:300]}")
        raise
    finally:
        row["passed"] = ok and not row.get("orphans")
        record(backend, fault, **row)
