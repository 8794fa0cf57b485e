"""Test worker for preemption: a deterministic step loop that checkpoints and exits on USR2/SIGTERM.

Every step all ranks all_reduce a "stop" flag, so they stop at the same step. Rank 0 writes
checkpoints/step-<N>/state.json and points checkpoints/latest at it
(launchers.records.rundir.write_latest); the next attempt resumes from there. At the end rank 0
writes final.json {step, value, attempt, resumed_from}. Knobs: TEST_STEPS (default 40),
TEST_STEP_SLEEP (seconds per step, attempt 0), TEST_STEP_SLEEP_LATER (seconds per step in later
attempts; default 0.02).
"""

import json
import os
import signal
import sys
import time

stop = []


def on_signal(signum, _frame):
    if not stop:
        print(f"SIGNAL {signal.Signals(signum).name} rank {os.environ.get('RANK')}", flush=True)
    stop.append(signum)


signal.signal(signal.SIGUSR2, on_signal)
# installed before the slow torch import: a signal can come early
signal.signal(signal.SIGTERM, on_signal)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from launchers.ckptptr import read_latest, write_latest  # noqa: E402

dist.init_process_group(os.environ.get("LAUNCH_DIST_BACKEND", "gloo"))
rank = dist.get_rank()
attempt = int(os.environ["LAUNCH_ATTEMPT"])
ckpt = os.environ["LAUNCH_CHECKPOINT_DIR"]
steps = int(os.environ.get("TEST_STEPS", "40"))
pause = float(
    os.environ.get("TEST_STEP_SLEEP", "0.25")
    if attempt == 0
    else os.environ.get("TEST_STEP_SLEEP_LATER", "0.02")
)

start, value, resumed = 0, 1, read_latest(ckpt)
if resumed:
    with open(os.path.join(ckpt, resumed, "state.json"), encoding="utf-8") as f:
        state = json.load(f)
    start, value = state["step"], state["value"]
print(f"START attempt {attempt} rank {rank} from {resumed or 'scratch'} step {start}", flush=True)

for step in range(start, steps):
    flag = torch.tensor([1.0 if stop else 0.0])
    dist.all_reduce(flag)
    if flag.item() > 0:
        if rank == 0:
            name = f"step-{step:08d}"
            os.makedirs(os.path.join(ckpt, name), exist_ok=True)
            with open(os.path.join(ckpt, name, "state.json"), "w", encoding="utf-8") as f:
                json.dump({"step": step, "value": value}, f)
            write_latest(ckpt, name)
        dist.barrier()
        print(f"CHECKPOINT attempt {attempt} rank {rank} step {step}", flush=True)
        dist.destroy_process_group()
        sys.exit(0)
    value = (value * 31 + step) % 1000003
    if rank == 0:
        print(f"STEP {step}", flush=True)
    time.sleep(pause)

if rank == 0:
    with open(os.path.join(os.environ["LAUNCH_RUN_DIR"], "final.json"), "w", encoding="utf-8") as f:
        json.dump({"step": steps, "value": value, "attempt": attempt, "resumed_from": resumed}, f)
print(f"DONE attempt {attempt} rank {rank} value {value}", flush=True)
dist.barrier()
dist.destroy_process_group()
