"""Tiny multi-node check: every rank all-reduces (rank + 1); the sum must be W * (W + 1) / 2.

Prints one line per rank, starting with ALLREDUCE, in a single write() (ranks of a node may share a
stream). Exits 1 if the sum is wrong.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist

dist.init_process_group(os.environ.get("LAUNCH_DIST_BACKEND", "gloo"))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world * (world + 1) / 2
sys.stdout.write(
    f"ALLREDUCE rank={rank} world_size={world} local_rank={os.environ.get('LOCAL_RANK')} "
    f"node_rank={os.environ.get('NODE_RANK')} host={socket.gethostname()} "
    f"netns={os.readlink('/proc/self/ns/net')} "
    f"cuda_visible={os.environ.get('CUDA_VISIBLE_DEVICES')} python={sys.executable} "
    f"sum={t.item():g} expected={expected:g} ok={t.item() == expected}\n"
)
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if t.item() == expected else 1)
