"""Slurm submit -> all ranks running, on the dev cluster (`make slurm-up`): `launch slurm` vs a
hand-written sbatch script running the same torchrun line (srun, one task per node, node rank from
SLURM_NODEID).

`launch slurm` runs as a user's second and later submits do: handed to the warm launcher
(launchers.warmstart) the first one left behind; the same without it (LAUNCH_WARM=0) is printed
alongside. The program only writes a marker file per rank (named by RANK) and exits, so the figure
is the time from starting the submit command until every rank's program has started. Interleaved
rounds; after each job the cluster is drained before the next one. Fails clearly when the cluster is
not up.

Slurm starts a pending job at its next backfill pass (every bf_interval = 1 s on the dev cluster;
its main scheduler does not start batch jobs at submit time), so each figure holds a wait of 0 to
1 s that depends only on when, within that interval, the job was submitted (its phase). Drained and
submitted one after another, the jobs' phases follow the previous job's length rather than chance
(measured: a median wait of 334 ms for one side, 226 for the other), and independent random phases
would put +-0.3 s of noise on every sample. So every case of a round is submitted at the same phase
of the pass (learnt from the previous job's start: the birth of its Slurm output file), and the
rounds' phases are spread evenly over the interval from a random start (a stratified sample of a
uniformly random phase). The mean over the rounds then estimates the mean over a random phase --
what users see -- and a submit that reaches sbatch later pays for it in the rounds where that
crosses the pass (a trimmed mean or a median would drop exactly those rounds: the figure is the
mean).
"""

from __future__ import annotations

import glob
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import compile_project, figure, interleaved, mean, median, ms_since, rounds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
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


class Phases:
    """When each round's cases are submitted: at one phase of Slurm's backfill pass (the module's
    doc), round r's (r + u) / rounds of the interval, in a shuffled order."""

    def __init__(self, n: int, cases: int) -> None:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
        m = re.search(r"bf_interval=(\d+)", out)
        self.period = float(m.group(1)) if m else 30.0
        u = random.random()
        self.offsets = [(r + u) / n for r in range(n)]
        random.shuffle(self.offsets)
        self.ref: float | None = None  # a pass: the start of the job seen last
        self.cases, self.calls = cases, 0

    def seen(self, output: str, t0: float) -> float:
        """A job's Slurm output file, created as its batch script started (at a pass); ms from t0
        (time.time() at its submit) to that start."""
        out = subprocess.run(["stat", "-c", "%.9W", output], capture_output=True, text=True)
        born = float(out.stdout.strip() or 0)
        self.ref = born if born > 0 else None
        return (born - t0) * 1000 if born > 0 else float("nan")

    def wait(self) -> None:
        """Sleep until this round's phase (a round is one call per case; the warm-up's: any
        phase)."""
        r, self.calls = self.calls // self.cases - 1, self.calls + 1
        if self.ref is None or r < 0:
            return
        at = self.ref + self.offsets[r % len(self.offsets)] * self.period
        now = time.time()
        time.sleep(at + ((now - at) // self.period + 1) * self.period - now)


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
    # until the batch script started
    started: dict[str, list[float]] = {"launch": [], "cold": [], "hand": []}

    def fresh() -> str:
        n[0] += 1
        d = os.path.join(tmp, "markers", f"m{n[0]}")
        os.mkdir(d)
        return d

    phases = Phases(ROUNDS, cases=3)

    def submit(env: dict[str, str], into: str) -> float:
        drain()
        markers = fresh()
        run_dir = os.path.join(tmp, "runs", f"r{n[0]}")
        phases.wait()
        t0, wall = time.perf_counter(), time.time()
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
                run_dir,
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
        took = until_ranks(markers, t0)
        started[into].append(phases.seen(glob.glob(f"{run_dir}/slurm/*_0_log.out")[0], wall))
        return took

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
        phases.wait()
        t0, wall = time.perf_counter(), time.time()
        job = subprocess.run(
            ["sbatch", "--parsable", script], cwd=tmp, check=True, capture_output=True, text=True
        ).stdout
        returned["hand"].append(ms_since(t0))
        took = until_ranks(markers, t0)
        job = job.strip().split(";")[0]
        started["hand"].append(phases.seen(os.path.join(tmp, f"hand-{job}.out"), wall))
        return took

    load = os.getloadavg()
    res = interleaved({"launch": ours, "hand": hand, "cold": cold}, rounds=ROUNDS)
    started = {k: v[-ROUNDS:] for k, v in started.items()}  # (the warm-up round's left out)
    drain()
    stop_servers(os.path.join(tmp, "state"))
    print(
        f"  launch slurm: {[round(x) for x in res['launch']]} ms; hand-written sbatch: "
        f"{[round(x) for x in res['hand']]} ms",
        flush=True,
    )
    print(
        f"  submit -> batch script started (Slurm's wait; means): launch slurm "
        f"{mean(started['launch']):.0f} ms, sbatch {mean(started['hand']):.0f} "
        f"ms; then -> ranks running (medians): launch slurm "
        f"{median([a - b for a, b in zip(res['launch'], started['launch'])]):.0f} ms, "
        f"sbatch {median([a - b for a, b in zip(res['hand'], started['hand'])]):.0f} ms",
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
        f"{median(res['hand']):.0f} ms (ratio {median(res['launch']) / median(res['hand']):.2f}; "
        "the figure is the mean over the rounds' phases: see the module's doc)",
        flush=True,
    )
    figure(
        f"slurm submit -> {NODES}x{PER_NODE} ranks running",
        mean(res["launch"]),
        mean(res["hand"]),
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
