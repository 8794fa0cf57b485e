"""Hang detection: latency from the moment a rank hangs (SIGSTOP) to the end of the run, against
--hang-timeout, per backend (local always; SSH and Slurm when the dev clusters are up), and the cost
of launchers.heartbeat on a training step measured side by side (the same step loop with and without
heartbeat.step).

The hanging program is copied into the directory launched from (a scratch one), as a user's program
lives in their project: `launch slurm` runs the ranks from a snapshot of that tree (on by default
there), and a program outside it is refused. BENCH_BACKENDS=local,ssh,slurm: only those (default:
local and every dev cluster that is up); BENCH_TINY=1: the tiny form (tests/test_bench_tiny.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, TINY, compile_project, figure, interleaved, median, rounds

TIMEOUT = 3 if TINY else 10
LAUNCH = os.path.join(os.path.dirname(sys.executable), "launch")
SSH = [
    "ssh",
    "--hosts",
    "sshhost1,sshhost2",
    "--ssh-config",
    "/run/launch-ssh-hosts/ssh_config",
    "--known-hosts",
    "/run/launch-ssh-hosts/known_hosts",
]


def hung_at(run_dir: str) -> float:
    for dirpath, _, files in os.walk(os.path.join(run_dir, "logs")):
        for f in files:
            with open(os.path.join(dirpath, f)) as fh:
                for ln in fh:
                    if ln.startswith("HANGING "):
                        return float(ln.split(" at ")[1])
    raise RuntimeError("no rank hung")


def latency(backend: list[str], tmp: str, i: int) -> float:
    run_dir = os.path.join(tmp, "runs", f"h{i}")
    extra = ["--wait", "--time", "10"] if backend[0] == "slurm" else []
    p = subprocess.run(
        [
            LAUNCH,
            *backend,
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--hang-timeout",
            str(TIMEOUT),
            *extra,
            "--env",
            "TEST_HANG_RANK=1",
            "--env",
            f"TEST_HANG_STEP={1 if TINY else 3}",
            "--run-dir",
            run_dir,
            "--",
            "hang_worker.py",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp,
    )
    try:
        return time.time() - hung_at(run_dir)
    except (RuntimeError, OSError):
        raise SystemExit(
            f"hang_detection: {backend[0]}: no rank hung; launch exited {p.returncode}: "
            f"{(p.stderr.strip().splitlines() or ['(no output)'])[-1][:500]}"
        ) from None


def heartbeat_cost(rounds: int = 7, steps: int = 1000, calls: int = 20000) -> None:
    """A small CPU training step (a 256x256 matmul + SGD) against the same step plus heartbeat.step,
    interleaved round by round in one process (the machine's noise hits both alike); each the
    fastest round's mean step (a beat adds ~3 us to ~450: the medians' round-to-round noise, a few
    %, hid it)."""
    code = f"""
import os, sys, time, tempfile
os.environ["LAUNCH_RUN_DIR"] = tempfile.mkdtemp()
import torch
from launchers import heartbeat
torch.manual_seed(0); w = torch.randn(256, 256, requires_grad=True); x = torch.randn(64, 256)
opt = torch.optim.SGD([w], lr=1e-3)
fd = os.open(os.path.join(os.environ["LAUNCH_RUN_DIR"], "bare"), os.O_WRONLY | os.O_CREAT)
bare = b" " * 191 + b"\\n"
def run(beat):
    t0 = time.perf_counter()
    for s in range({steps}):
        loss = (x @ w).square().mean(); opt.zero_grad(); loss.backward(); opt.step()
        if beat == 1: heartbeat.step(s)
        elif beat == 2: os.pwrite(fd, bare, 0)
    return (time.perf_counter() - t0) / {steps} * 1e6
run(1); run(0); run(2)
a, b, c = [], [], []
for r in range({rounds}):
    for beat in ((1, 0, 2) if r % 2 else (0, 2, 1)):
        {{1: a, 0: b, 2: c}}[beat].append(run(beat))
t0 = time.perf_counter()
for s in range({calls}):
    heartbeat.step(s)
call = (time.perf_counter() - t0) / {calls} * 1e6
print(min(a), min(b), call, min(c))
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if TINY else None
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    with_hb, without, call, bare = (float(v) for v in out)
    print(
        f"  in that loop a beat adds {with_hb - without:.1f} us; one bare 192-byte pwrite adds "
        f"{bare - without:.1f} us (a beat is one pwrite: issue 38)",
        flush=True,
    )
    figure(
        "heartbeat: training step with / without",
        with_hb,
        without,
        "<= 1.02 (noisy: see the next line)",
        unit="us",
    )
    figure("heartbeat: one call / the step alone", call, without, "< 0.01 (1%)", unit="us")
    figure("heartbeat: one call / a 0.5 ms step", call, 500.0, "< 0.01 (1%)", unit="us")


def main() -> None:
    compile_project()
    heartbeat_cost(1, 5, 200) if TINY else heartbeat_cost()
    only = set(filter(None, os.environ.get("BENCH_BACKENDS", "").split(",")))
    backends = {"local": ["local"]} if not only or "local" in only else {}
    if (not only or "ssh" in only) and subprocess.run(
        [os.path.join(ROOT, "clusters", "ssh-hosts.sh"), "status"], capture_output=True
    ).returncode == 0:
        backends["ssh"] = SSH
    if (
        (not only or "slurm" in only)
        and shutil.which("sbatch")
        and subprocess.run(
            [os.path.join(ROOT, "slurm", "dev-cluster.sh"), "status"], capture_output=True
        ).returncode
        == 0
    ):
        backends["slurm"] = ["slurm"]
    if only - set(backends):
        sys.exit(
            f"hang_detection: BENCH_BACKENDS names {','.join(sorted(only - set(backends)))}: not "
            "up or not known; accepted: local, ssh, slurm (their dev cluster up)"
        )
    tmp = tempfile.mkdtemp(prefix="bench-hang-", dir="/tmp")  # /tmp: the dev clusters' nodes see it
    shutil.copy(os.path.join(ROOT, "tests", "data", "hang_worker.py"), tmp)
    counter = iter(range(10_000))
    res = interleaved(
        {k: (lambda b=b: latency(b, tmp, next(counter))) for k, b in backends.items()},
        rounds=rounds(2),
        warmup=0,
    )
    for k, v in res.items():
        figure(
            f"hang: end of run after a SIGSTOP, {k}",
            median(v),
            TIMEOUT,
            f"<= {(TIMEOUT + 15) / TIMEOUT:.2f} (timeout + 15 s)",
            unit="s",
        )
    for k in ("ssh", "slurm"):
        if k not in backends and (not only or k in only):
            print(
                f"hang: {k}: the dev cluster is not up (make clusters-up); not measured", flush=True
            )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
