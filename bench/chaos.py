"""Chaos benchmark (issue 23 item 9, issue 37 item 6): the same training run twice (2 nodes x 1
rank, 2 spares, the convnet with a per-step delay so it lasts minutes), once undisturbed and once
while a killer SIGKILLs a random rank program or torchrun agent of the run every T seconds, on
`launch local` or `launch ssh` (the 4 SSH test hosts: 2 active, 2 spares). Prints the effective
training time (the undisturbed run's wall time / the disturbed run's, for the same steps: the share
of the wall time spent on steps that count), the steps lost per fault (the steps a restart trained
again: the last step an attempt logged minus the step the next one resumed from), each phase of
recovery (mean seconds since the fault, from status.json's recovery timeline) and whether every
restart came from the policy (no person). Usage: .venv/bin/python bench/chaos.py [T seconds, default
60] [steps, default 1200] [local|ssh, default local] [modes, default storage,memory+warm: one
disturbed run per mode, each against the same undisturbed run without options: storage (checkpoints
on storage only), memory (--memory-checkpoint), warm (--warm-spares), memory+warm]. `make bench`
runs a short form (bench/run_all.py: 20 s, 300 steps, local); the long form (60 1200, and 300 for
one fault per five minutes) by hand. BENCH_TINY=1 (tests/test_bench_tiny.py): the given steps
without the per-step delay, and one kill only (after T seconds)."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from launchers import procs  # noqa: E402
from launchers.hang.sample import rank_programs  # noqa: E402

LAUNCH = os.path.join(os.path.dirname(sys.executable), "launch")


SSH = [
    "ssh",
    "--hosts",
    "sshhost1,sshhost2,sshhost3,sshhost4",
    "--ssh-config",
    "/run/launch-ssh-hosts/ssh_config",
    "--known-hosts",
    "/run/launch-ssh-hosts/known_hosts",
]
STEP = re.compile(r"^step (\d+)/\d+ ")
RESUMED = re.compile(r"^resumed from .+? \(step (\d+),")  # a checkpoint's name, or `memory step N`
HEADER = re.compile(r"^===== launch attempt (\d+) ")


def run(
    d: str,
    name: str,
    steps: int,
    every: float,
    seed: int,
    backend: str,
    extra: tuple[str, ...] = (),
) -> tuple[float, dict, list[str]]:
    run_dir = os.path.join(d, name)
    delay = "0" if os.environ.get("BENCH_TINY") == "1" else "0.1"
    argv = [
        LAUNCH,
        *(SSH if backend == "ssh" else ["local"]),
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--spares",
        "2",
        "--max-restarts",
        "1000",
        "--quarantine-after",
        "1000",
        *extra,
        "--run-dir",
        run_dir,
        "--",
        "-m",
        "workloads.convnet",
        "--dataset",
        "digits",
        "--max-steps",
        str(steps),
        "--checkpoint-every",
        "50",
        "--step-delay",
        delay,
        "--log-every",
        "1",
        "--no-tensorboard",
    ]
    rng, kills, t0 = random.Random(seed), [], time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=d)
    next_kill = t0 + every if every else float("inf")
    while p.poll() is None:
        time.sleep(0.5)
        if time.monotonic() < next_kill:
            continue
        next_kill = time.monotonic() + every
        try:
            with open(os.path.join(run_dir, "run.yaml")) as f:
                run_id = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("run_id:"))
        except (OSError, StopIteration):
            continue
        victims = [("worker", pid) for pid, _ in rank_programs(run_id).values()]
        victims += [("agent", pid) for pid in procs.agent_pids(run_id)]
        if victims:
            kind, pid = rng.choice(victims)
            procs.kill(pid, signal.SIGKILL)
            kills.append(kind)
            if os.environ.get("BENCH_TINY") == "1":
                next_kill = float("inf")
    wall = time.monotonic() - t0
    with open(os.path.join(run_dir, "status.json")) as f:
        return wall, json.load(f), kills


def steps_lost(run_dir: str) -> list[int]:
    """Per restart: the last step the failed attempt logged minus the step the next attempt resumed
    from (rank 0's log, node 0 of every attempt; --log-every 1)."""
    last: dict[int, int] = {}
    resumed: dict[int, int] = {}
    attempt, seen = 0, set()
    with open(os.path.join(run_dir, "logs", "node0", "rank0.log"), errors="replace") as f:
        for ln in f:
            if m := HEADER.match(ln):
                attempt = int(m.group(1))
                seen.add(attempt)
            elif m := STEP.match(ln):
                last[attempt] = int(m.group(1))
            elif m := RESUMED.match(ln):
                resumed[attempt] = int(m.group(1))
    return [max(0, last.get(a - 1, 0) - resumed.get(a, 0)) for a in sorted(seen) if a > 0]


def phases(rec: list[dict]) -> str:
    """Each phase of recovery: its mean seconds since the fault over the restarts."""
    seen: dict[str, list[float]] = {}
    for r in rec:
        for p in r.get("phases") or ():
            if p.get("since_fault_s") is not None:
                seen.setdefault(p["name"], []).append(p["since_fault_s"])
    return ", ".join(f"{k} {sum(v) / len(v):.2f} s" for k, v in seen.items() if k != "fault")


def main() -> int:
    every = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1200
    backend = sys.argv[3] if len(sys.argv) > 3 else "local"
    if backend not in ("local", "ssh"):
        sys.exit(f"chaos: backend {backend!r} is not accepted; choose local or ssh")
    modes = (sys.argv[4] if len(sys.argv) > 4 else "storage,memory+warm").split(",")
    flags = {"storage": (), "memory": ("--memory-checkpoint",), "warm": ("--warm-spares",)}
    if not all(m and set(m.split("+")) <= set(flags) for m in modes):
        sys.exit(
            f"chaos: mode {sys.argv[4]!r} is not accepted; choose storage, memory "
            "(--memory-checkpoint), warm (--warm-spares), memory+warm, or several of them with "
            "commas"
        )
    ok = True
    with tempfile.TemporaryDirectory(dir="/tmp") as d:  # /tmp: the SSH test hosts see it
        # the same program, none of the options
        ref_wall, ref, _ = run(d, "calm", steps, 0, 0, backend)
        for mode in modes:
            extra = tuple(f for m in mode.split("+") for f in flags[m])
            wall, st, kills = run(d, mode, steps, every, 7, backend, extra)
            ok &= report(
                backend,
                mode,
                every,
                steps,
                (ref_wall, ref),
                (wall, st, kills),
                steps_lost(os.path.join(d, mode)),
            )
    return 0 if ok else 1


def report(
    backend: str, mode: str, every: float, steps: int, calm: tuple, chaos: tuple, lost: list[int]
) -> bool:
    """The three lines of one disturbed run against the undisturbed one; whether both completed, no
    person needed."""
    (ref_wall, ref), (wall, st, kills) = calm, chaos
    rec = st.get("recovery") or []
    times = [
        r["detection_to_first_step_s"]
        for r in rec
        if r.get("detection_to_first_step_s") is not None
    ]
    mean = sum(times) / len(times) if times else float("nan")
    people = sum(1 for r in rec if r.get("person") == "yes")
    print(
        f"chaos: {backend}, {mode}, one kill every {every:.0f} s, {steps} steps; undisturbed "
        f"{ref['state']} in {ref_wall:.0f} s, disturbed {st['state']} in {wall:.0f} s after "
        f"{len(kills)} kills ({kills.count('worker')} workers, {kills.count('agent')} agents), "
        f"{len(rec)} restarts"
    )
    goal = (
        "goal at one fault every five minutes: >= 0.99"
        if every >= 300
        else "goal at one fault a minute: >= 0.95"
    )
    print(
        f"chaos: effective training time {ref_wall / wall:.2f} (undisturbed / disturbed wall; "
        f"{goal}); mean recovery (detection -> first step) "
        f"{mean:.1f} s over {len(times)} (goal, warm: <= 2 s); restarts needing a person: "
        f"{people}"
    )
    print(
        f"chaos: steps lost per fault {sum(lost) / len(lost) if lost else 0:.1f} (each: {lost}); "
        f"recovery phases since the fault: {phases(rec) or '-'}",
        flush=True,
    )
    return st["state"] == ref["state"] == "COMPLETED" and people == 0


if __name__ == "__main__":
    sys.exit(main())
