"""Test worker for hang detection: steps of all_reduce, one line per step; one rank can hang at a step.

TEST_HANG_RANK / TEST_HANG_STEP: that rank hangs before its all_reduce of that step, the way TEST_HANG_MODE
says: `stop` (SIGSTOP itself) or `sleep` (sleeps forever outside any collective). TEST_HEARTBEAT=0: never
call launchers.heartbeat. TEST_SILENT_S: a silent pause (no output, no CPU) before the first step.
TEST_STEPS: number of steps (default 1000); TEST_STEP_S: sleep per step (default 0.2).
"""
import os
import signal
import time

import torch
import torch.distributed as dist

from launchers import heartbeat

dist.init_process_group(os.environ.get("LAUNCH_DIST_BACKEND", "gloo"))
rank = dist.get_rank()
hang_rank, hang_step = int(os.environ.get("TEST_HANG_RANK", "-1")), int(os.environ.get("TEST_HANG_STEP", "-1"))
beats = os.environ.get("TEST_HEARTBEAT", "1") == "1"
time.sleep(float(os.environ.get("TEST_SILENT_S", "0")))
for step in range(int(os.environ.get("TEST_STEPS", "1000"))):
    if rank == hang_rank and step == hang_step:
        print(f"HANGING rank {rank} step {step} at {time.time():.3f}", flush=True)
        if os.environ.get("TEST_HANG_MODE", "stop") == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        while True:
            time.sleep(3600)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"STEP {step} sum {t.item():.0f}", flush=True)
    if beats:
        heartbeat.step(step)
    time.sleep(float(os.environ.get("TEST_STEP_S", "0.2")))
dist.destroy_process_group()
