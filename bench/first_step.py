"""Benchmark worker: prints the time from T0_NS (set by the driver) to the first barrier, then
exits."""

import json
import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
t = time.time_ns()
if dist.get_rank() == 0:
    with open(os.environ["RESULT_FILE"], "w") as f:
        json.dump({"first_step_ms": (t - int(os.environ["T0_NS"])) / 1e6}, f)
dist.destroy_process_group()
