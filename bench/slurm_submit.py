"""Slurm submit -> all ranks running, on the dev cluster (`make slurm-up`): `launch slurm` vs a
hand-written sbatch script running the same torchrun line (srun, one task per node, node rank from
SLURM_NODEID).

`launch slurm` runs as a user's second and later submits do: handed to the warm launcher
(launchers.warmstart) the first one left behind; the same without it (LAUNCH_WARM=0) is printed
alongside. The program only writes a marker file per rank (named by RANK) and exits, so the figure
is the time from starting the submit command until every rank's program has started. Interleaved
rounds, medians; after each job the cluster is drained before the next one. Fails clearly when the
cluster is not up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import compile_project, figure, interleaved, median, ms_since, rounds, trimmed_mean  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
# Slurm's own start latency (submit -> batch script running) is set by the backfill pass that starts
# the job (every second on the dev cluster; the main scheduler does not start batch jobs at submit
# time): ~uniform 0-1 s for both sides alike. For such bounded noise a mean is a better estimate
# than a median, so the figure is the 10%-trimmed mean over more rounds than the other benches
# (medians are printed too).
ROUNDS = rounds(15)
NODES, PER_NODE = 2, 2
PORT = 29731

MARKER = """import os, sys
open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").close()
"""

HAND = """#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={per_node}
#SBATCH --time=5
#SBATCH --output={tmp}/hand-%j.out
MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun bash -c 'exec {python} -m torch.distributed.run --nnodes {nodes} --nproc-per-node {per_node} \\
  --node-rank "$SLURM_NODEID" --master-addr '"$MASTER"' --master-port {port} --max-restarts 0 \\
  --monitor-interval 0.1 {tmp}/proj/marker.py "$0"' {markers}
"""


def cluster_up() -> bool:
    p = subprocess.run(
        [os.path.join(ROOT, "slurm", "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    return p.returncode == 0


def drain(deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True
    ).stdout.strip():
        if time.monotonic() > end:
            sys.exit("bench: the cluster did not drain within 120 s")
        time.sleep(0.1)
    time.sleep(0.5)  # the last job's processes finish exiting before the next one is timed


def prime(env: dict[str, str], cwd: str, deadline_s: float = 60) -> None:
    """Leave the warm launcher behind (what a user's first submit does) and wait until it listens
    (its socket is bound once it has imported everything)."""
    subprocess.run(
        [os.path.join(BIN, "launch"), "slurm", "--nodes", "abc", "--", "x.py"],
        cwd=cwd,
        env=env,
        capture_output=True,
    )
    warm = os.path.join(env["LAUNCH_STATE_DIR"], "warm")
    end = time.monotonic() + deadline_s
    while not (os.path.isdir(warm) and any(f.endswith(".sock") for f in os.listdir(warm))):
        if time.monotonic() > end:
            sys.exit("bench slurm_submit: no warm launcher listened within 60 s")
        time.sleep(0.1)


def stop_servers(state: str) -> None:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"launchers.warmstart" in cmd and state.encode() in cmd:
                os.kill(int(d), 15)


def until_ranks(markers: str, t0: float, timeout: float = 180) -> float:
    world = NODES * PER_NODE
    while len(os.listdir(markers)) < world:
        if time.perf_counter() - t0 > timeout:
            sys.exit(
                f"bench: only {len(os.listdir(markers))} of {world} ranks started within "
                f"{timeout:.0f} s"
            )
        time.sleep(0.01)
    return ms_since(t0)


def main() -> None:
    compile_project()
    if not cluster_up():
        sys.exit("bench slurm_submit: the dev Slurm cluster is not up; run `make slurm-up` first")
    tmp = tempfile.mkdtemp(prefix="bench-slurm-", dir="/tmp")
    # the launch directory holds the program only, as a project would: the run
    proj = os.path.join(tmp, "proj")
    # dirs, markers and the state dir lie beside it, not in its snapshot
    os.makedirs(os.path.join(tmp, "markers"))
    os.makedirs(proj)
    with open(os.path.join(proj, "marker.py"), "w") as f:
        f.write(MARKER)
    n = [0]
    # until the submit command returned
    returned: dict[str, list[float]] = {"launch": [], "cold": [], "hand": []}

    def fresh() -> str:
        n[0] += 1
        d = os.path.join(tmp, "markers", f"m{n[0]}")
        os.mkdir(d)
        return d

    def submit(env: dict[str, str], into: str) -> float:
        drain()
        markers = fresh()
        t0 = time.perf_counter()
        subprocess.run(
            [
                os.path.join(BIN, "launch"),
                "slurm",
                "--nodes",
                str(NODES),
                "--gpus-per-node",
                str(PER_NODE),
                "--time",
                "5",
                "--master-port",
                str(PORT),
                "--run-dir",
                os.path.join(tmp, "runs", f"r{n[0]}"),
                "--",
                os.path.join(proj, "marker.py"),
                markers,
            ],
            cwd=proj,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        returned[into].append(ms_since(t0))
        return until_ranks(markers, t0)

    warm_env = {**os.environ, "LAUNCH_WARM": "1", "LAUNCH_STATE_DIR": os.path.join(tmp, "state")}
    cold_env = {**os.environ, "LAUNCH_WARM": "0"}
    prime(warm_env, proj)

    def ours() -> float:
        return submit(warm_env, "launch")

    def cold() -> float:
        return submit(cold_env, "cold")

    def hand() -> float:
        drain()
        markers = fresh()
        script = os.path.join(tmp, f"hand{n[0]}.sbatch")
        with open(script, "w") as f:
            f.write(
                HAND.format(
                    nodes=NODES,
                    per_node=PER_NODE,
                    tmp=tmp,
                    python=sys.executable,
                    port=PORT,
                    markers=markers,
                )
            )
        t0 = time.perf_counter()
        subprocess.run(["sbatch", script], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        returned["hand"].append(ms_since(t0))
        return until_ranks(markers, t0)

    load = os.getloadavg()
    res = interleaved({"launch": ours, "hand": hand, "cold": cold}, rounds=ROUNDS)
    drain()
    stop_servers(os.path.join(tmp, "state"))
    print(
        f"  launch slurm: {[round(x) for x in res['launch']]} ms; hand-written sbatch: "
        f"{[round(x) for x in res['hand']]} ms",
        flush=True,
    )
    print(
        "  submit command returned after (median): launch slurm "
        f"{median(returned['launch']):.0f} ms, sbatch {median(returned['hand']):.0f} ms (goal: "
        "launch slurm <= sbatch + 50 ms)",
        flush=True,
    )
    print(
        f"  without the warm launcher (LAUNCH_WARM=0): submit -> ranks {median(res['cold']):.0f} "
        f"ms, the command returned after {median(returned['cold']):.0f} ms (medians; the goals "
        "are for the warm launcher)",
        flush=True,
    )
    print(
        f"  load average (1 min): {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the "
        "end (the machine's other work is in every figure)",
        flush=True,
    )
    print(
        f"  medians: launch slurm {median(res['launch']):.0f} ms, hand-written sbatch "
        f"{median(res['hand']):.0f} ms (ratio {median(res['launch']) / median(res['hand']):.2f})",
        flush=True,
    )
    figure(
        f"slurm submit -> {NODES}x{PER_NODE} ranks running",
        trimmed_mean(res["launch"]),
        trimmed_mean(res["hand"]),
        "<= 1.05",
    )
    figure(
        "slurm submit command returns: launch slurm / sbatch",
        median(returned["launch"]),
        median(returned["hand"]),
        "<= sbatch + 50 ms",
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
