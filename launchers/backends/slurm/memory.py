"""--memory-checkpoint on Slurm: the run's in-memory checkpoints go at the job's end, from every
node it had.

Each node keeps its ranks' copies under its own Slurm node name (launchers.node.memstore: nodes that
share a /dev/shm, as the dev cluster's do, stay apart). What the ranks of a completed run wrote they
remove themselves; what is left -- a lost node's store, a spare's, the copies of a failed or
cancelled run -- goes here, at the batch script's end (after the loop over steps, or after the node
tasks' srun and its finalize; before a `launch cancel` ends the job): one srun step per node of the
allocation, side by side (--overlap), FORGET_S at most each, so a node that is down costs only
itself and says so in one line. In the user's own allocation the launcher does it once its srun has
ended (SlurmBackend.forget_memory). Stdlib only.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

from ...node import memstore
from .env import NodelistError, SlurmEnv

FORGET_S = 15.0


def forget_argv(host: str, run_id: str) -> list[str]:
    """One node's removal: an srun step of the job on that node alone (never bound, never a GPU)."""
    return [
        "srun",
        "--overlap",
        "--quiet",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={host}",
        "--cpu-bind=none",
        "--kill-on-bad-exit=0",
        "--job-name=launch-forget-memory",
        "--output=/dev/null",
        # 0: gone from there
        "sh",
        "-c",
        'rm -rf -- "$0"; ! test -e "$0"',
        memstore.run_store(run_id),
    ]


def forget(run_id: str, hosts: list[str], timeout: float = FORGET_S) -> list[str]:
    """The run's stores removed on every host (in parallel); the hosts where that was not confirmed
    in time."""
    started = [
        (
            h,
            subprocess.Popen(
                forget_argv(h, run_id),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        )
        for h in hosts
    ]
    deadline, left = time.monotonic() + timeout, []
    for host, p in started:
        try:
            if p.wait(timeout=max(0.1, deadline - time.monotonic())) != 0:
                left.append(host)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            left.append(host)
    return left


def forget_job(spec, run_id: str, env: SlurmEnv | None = None) -> None:
    """--memory-checkpoint: the run's stores go from every node of this allocation (the job's
    end)."""
    if not spec.memory_checkpoint:
        return
    env = env or SlurmEnv.read()
    try:
        hosts = env.hostnames() or [env.node_name]
    except NodelistError:
        hosts = [env.node_name] if env.node_name else []
    left = forget(run_id, [h for h in hosts if h])
    if left:
        print(
            "launch: --memory-checkpoint: the run's in-memory checkpoints could not be removed "
            f"on {','.join(left)} within {FORGET_S:g} s (left in "
            f"{shlex.quote(memstore.run_store(run_id))} there)",
            file=sys.stderr,
            flush=True,
        )
