"""Test worker for hang detection: steps of all_reduce, one line per step; one rank can hang at a
step.

TEST_HANG_RANK / TEST_HANG_STEP: that rank hangs before its all_reduce of that step, the way
TEST_HANG_MODE says: `stop` (SIGSTOP itself) or `sleep` (sleeps forever outside any collective).
TEST_HEARTBEAT=0: never call launchers.heartbeat. TEST_SILENT_S: a silent pause (no output, no CPU)
before the first step. TEST_STEPS: number of steps (default 1000); TEST_STEP_S: sleep per step
(default 0.2). TEST_AGREED=1: the workloads' preemption pattern -- SIGTERM only notes the request,
and every rank agrees on it after each step (an all_reduce) before leaving; on a hang stop
(launchers.heartbeat.hang_stop(): the launcher ended the hung ranks, so the collective fails) a rank
skips the agreement, prints CLEANUP DONE and exits 0.
"""

import os
import signal
import time

import torch
import torch.distributed as dist

from launchers import heartbeat

asked = []
agreed = os.environ.get("TEST_AGREED") == "1"
if agreed:
    signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
dist.init_process_group(os.environ.get("LAUNCH_DIST_BACKEND", "gloo"))
rank = dist.get_rank()


def agree():
    """1 when any rank was asked to stop; on a hang stop, the cleanup without the agreement (its
    peers are gone)."""
    try:
        if heartbeat.hang_stop() is None:
            flag = torch.tensor([float(bool(asked))])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return flag.item() > 0
    except RuntimeError as e:
        if heartbeat.hang_stop() is None:
            raise
        print(f"collective failed: {str(e).splitlines()[0][:100]}", flush=True)
    print(f"CLEANUP DONE rank {rank} at {time.time():.3f}", flush=True)
    os._exit(0)


hang_rank, hang_step = (
    int(os.environ.get("TEST_HANG_RANK", "-1")),
    int(os.environ.get("TEST_HANG_STEP", "-1")),
)
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
    if agreed:
        try:
            dist.all_reduce(t)
        except RuntimeError:
            agree()
            raise
    else:
        dist.all_reduce(t)
    print(f"STEP {step} sum {t.item():.0f}", flush=True)
    if agreed and agree():
        print(f"AGREED STOP rank {rank} step {step}", flush=True)
        break
    if beats:
        heartbeat.step(step)
    time.sleep(float(os.environ.get("TEST_STEP_S", "0.2")))
dist.destroy_process_group()
