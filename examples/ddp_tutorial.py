"""The PyTorch DDP tutorial's plain script under `launch` (recipe: docs/FRAMEWORKS.md), with a
cleanup in `finally`.

    launch local --nodes 2 --gpus-per-node 2 -- examples/ddp_tutorial.py --steps 20
    --cleanup-seconds 3

ToyModel (Linear 10 -> 10 -> 5) on generated data, init_process_group from torchrun's environment
(env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) with the backend launch decided
(LAUNCH_DIST_BACKEND: with nccl the model and data go on GPU cuda:LOCAL_RANK, each rank its own;
gloo: the CPU); every rank prints "DEVICE rank R device D backend B" (bench/gpu_check.sh reads it).
The `finally:` cleanup stands for what real programs do on the way out (flush a tracker, save a last
checkpoint, close files): rank 0 saves $LAUNCH_CHECKPOINT_DIR/step-<N>/model.pt and moves `latest`,
every rank waits --cleanup-seconds, writes $LAUNCH_RUN_DIR/cleanup/rank<R>.done and prints "CLEANUP
done". Stops: Python turns SIGINT (Ctrl-C) into KeyboardInterrupt, so `finally` runs; SIGTERM
(`launch cancel`) kills Python outright unless a handler is installed, so this script installs one
that raises SystemExit(143). Every signal received is printed ("SIGNAL SIGTERM rank R"); a repeated
one is ignored so that it cannot cut the cleanup short.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from launchers.ckptptr import commit

STOPPED: list[str] = []


def on_signal(signum, _frame):
    name = signal.Signals(signum).name
    print(f"SIGNAL {name} rank {os.environ.get('RANK')} at {time.time():.3f}", flush=True)
    if STOPPED:
        return  # already stopping: let the cleanup finish
    STOPPED.append(name)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


class ToyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net1, self.relu, self.net2 = (
            torch.nn.Linear(10, 10),
            torch.nn.ReLU(),
            torch.nn.Linear(10, 5),
        )

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def cleanup(model, step: int, seconds: float, run_dir: str, ckpt_dir: str) -> None:
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    print(
        f"CLEANUP start rank {rank} step {step} ({STOPPED[0] if STOPPED else 'normal end'})",
        flush=True,
    )
    if rank == 0 and model is not None:
        name = f"step-{step:08d}"
        os.makedirs(os.path.join(ckpt_dir, name), exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(ckpt_dir, name, "model.pt"))
        commit(ckpt_dir, name)  # its manifest (sizes, sha256), then `latest`
    time.sleep(seconds)  # a tracker's flush, an upload: takes a while
    os.makedirs(os.path.join(run_dir, "cleanup"), exist_ok=True)
    with open(os.path.join(run_dir, "cleanup", f"rank{rank}.done"), "w", encoding="utf-8") as f:
        f.write(f"{step} {STOPPED[0] if STOPPED else 'normal'}\n")
    if dist.is_initialized():
        dist.destroy_process_group()
    print(f"CLEANUP done rank {rank} after {seconds:g} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(prog="ddp_tutorial")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--cleanup-seconds", type=float, default=3.0)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    run_dir = os.environ.get("LAUNCH_RUN_DIR", os.path.abspath("ddp_run"))
    ckpt_dir = os.environ.get("LAUNCH_CHECKPOINT_DIR", os.path.join(run_dir, "checkpoints"))
    model, step = None, 0
    backend = os.environ.get("LAUNCH_DIST_BACKEND", "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # this rank's own GPU: NCCL's collectives run on it
    dist.init_process_group(backend)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        print(f"DEVICE rank {rank} device {device} backend {backend}", flush=True)
        t = torch.tensor([float(rank + 1)], device=device)
        dist.all_reduce(t)
        print(
            "REPORT "
            + json.dumps(
                {
                    "framework": "ddp",
                    "rank": rank,
                    "world": world,
                    "sum": t.item(),
                    "node_rank": int(os.environ["NODE_RANK"])
                    if "NODE_RANK" in os.environ
                    else None,
                    "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                    "cwd": os.getcwd(),
                }
            ),
            flush=True,
        )
        torch.manual_seed(0)
        model = DDP(
            ToyModel().to(device), device_ids=[local_rank] if device.type == "cuda" else None
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.001)
        g = torch.Generator().manual_seed(rank)
        for step in range(1, args.steps + 1):
            opt.zero_grad()
            x, y = (
                torch.randn(20, 10, generator=g).to(device),
                torch.randn(20, 5, generator=g).to(device),
            )
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if step == 1:
                print(f"TRAINING rank {rank}", flush=True)
            if rank == 0:
                with open(os.path.join(run_dir, "metrics.jsonl"), "a", encoding="utf-8") as f:
                    f.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
                if step == 1 or step % 10 == 0:
                    print(f"step {step} loss {loss.item():.4f}", flush=True)
            time.sleep(args.step_sleep)
    finally:
        cleanup(model, step, args.cleanup_seconds, run_dir, ckpt_dir)
    print(f"DONE rank {rank} step {step}", flush=True)


if __name__ == "__main__":
    try:
        main()
    # Ctrl-C: the cleanup has run; exit as Python would, without the traceback
    except KeyboardInterrupt:
        sys.exit(130)
