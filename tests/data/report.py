"""Test worker: reports what it sees (env, argv, all_reduce) as one JSON line, optionally fails or
sleeps."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("LAUNCH_DIST_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
rec = {
    "rank": rank,
    "world": world,
    "node_rank": os.environ.get("NODE_RANK"),
    "local_rank": os.environ.get("LOCAL_RANK"),
    "sum": t.item(),
    "argv": sys.argv[1:],
    "pid": os.getpid(),
    "host": os.uname().nodename,
    "container": os.path.exists("/run/.containerenv"),
    "mnt_ns": os.readlink("/proc/self/ns/mnt"),
    "env": {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("LAUNCH_", "MASTER_", "NCCL_", "NNODES", "OMP_", "TEST_"))
    },
}
print("REPORT " + json.dumps(rec), flush=True)
fail_rank = int(os.environ.get("TEST_FAIL_RANK", "-1"))
if rank == fail_rank:
    time.sleep(float(os.environ.get("TEST_FAIL_DELAY", "0.5")))
    print("failing on purpose", flush=True)
    os._exit(3)
if os.environ.get("TEST_SLEEP"):
    print("sleeping", flush=True)
    time.sleep(float(os.environ["TEST_SLEEP"]))
dist.barrier()
dist.destroy_process_group()
