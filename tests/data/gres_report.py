"""Test worker: gloo all_reduce, then one JSON line with what Slurm and the launcher set for this
rank."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "NODE_RANK",
    "SLURM_NODEID",
    "SLURM_JOB_ID",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_GPUS_ON_NODE",
    "LAUNCH_ATTEMPT",
    "MASTER_ADDR",
    "MASTER_PORT",
)
rec = {k: os.environ.get(k) for k in keys}
rec.update(sum=t.item(), host=os.uname().nodename, netns=os.readlink("/proc/self/ns/net"))
print("GRES " + json.dumps(rec), flush=True)
dist.barrier()
dist.destroy_process_group()
