"""HF Accelerate under `launch` (recipe: docs/FRAMEWORKS.md).

    launch local --nodes 2 --gpus-per-node 2 --env ACCELERATE_USE_CPU=1 --
    examples/accelerate_ddp.py

Started by torchrun (not `accelerate launch`): Accelerate reads RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT from the environment. On a machine without an accelerator it only joins
the other ranks when it is told to use the CPU (ACCELERATE_USE_CPU=1, what `accelerate launch --cpu`
sets, or Accelerator(cpu=True)); without it every rank runs as its own single-process job, trains
alone and exits 0: a false pass. This script checks that the world Accelerate sees is torchrun's and
exits 2 otherwise. Files: tensorboard logs in $LAUNCH_RUN_DIR/accelerate_ddp/, `save_state`
checkpoints in $LAUNCH_CHECKPOINT_DIR/step-<N>/ with `latest` naming the newest complete one, rank
0's metrics.jsonl. A resumed attempt (LAUNCH_ATTEMPT > 0) continues from `checkpoints/latest`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset

from launchers.ckptptr import commit, read_latest


def report(acc: Accelerator) -> None:
    total = acc.reduce(
        torch.tensor([float(acc.process_index + 1)], device=acc.device), reduction="sum"
    )
    rec = {
        "framework": "accelerate",
        "rank": acc.process_index,
        "world": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "node_rank": int(os.environ.get("NODE_RANK", "0")),
        "local_rank": acc.local_process_index,
        "sum": float(total.item()),
        "cwd": os.getcwd(),
    }
    print("REPORT " + json.dumps(rec), flush=True)
    torchrun_world = int(os.environ.get("WORLD_SIZE", "1"))
    if acc.num_processes != torchrun_world:
        print(
            f"accelerate_ddp: error: torchrun started WORLD_SIZE={torchrun_world} processes but "
            f"Accelerate sees {acc.num_processes} ({acc.distributed_type}); on CPU set "
            "ACCELERATE_USE_CPU=1 (launch ... --env ACCELERATE_USE_CPU=1)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)


def save(acc: Accelerator, ckpt_dir: str, step: int) -> None:
    name = f"step-{step:08d}"
    # model/optimizer on the main process, RNG states per rank
    acc.save_state(os.path.join(ckpt_dir, name))
    acc.wait_for_everyone()  # every rank's part is written before `latest` moves
    if acc.is_main_process:
        commit(ckpt_dir, name)  # its manifest (sizes, sha256), then `latest`


def main() -> None:
    ap = argparse.ArgumentParser(prog="accelerate_ddp")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    args = ap.parse_args()
    run_dir = os.environ.get("LAUNCH_RUN_DIR", os.path.abspath("accelerate_run"))
    ckpt_dir = os.environ.get("LAUNCH_CHECKPOINT_DIR", os.path.join(run_dir, "checkpoints"))
    acc = Accelerator(
        log_with="tensorboard", project_config=ProjectConfiguration(project_dir=run_dir)
    )
    report(acc)
    set_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 32, generator=g), torch.randn(256, 2, generator=g))
    model = torch.nn.Linear(32, 2)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, opt, loader = acc.prepare(
        model, opt, DataLoader(data, batch_size=args.batch_size, shuffle=True)
    )
    step, latest = 0, read_latest(ckpt_dir)
    if latest and int(os.environ.get("LAUNCH_ATTEMPT", "0")) > 0:
        acc.load_state(os.path.join(ckpt_dir, latest))
        step = int(latest.split("-")[1])
    acc.init_trackers("accelerate_ddp")  # -> <run dir>/accelerate_ddp/ (main process)
    while step < args.max_steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            step += 1
            acc.log({"loss": loss.item()}, step=step)
            if acc.is_main_process:
                with open(os.path.join(run_dir, "metrics.jsonl"), "a", encoding="utf-8") as f:
                    f.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            if step % args.checkpoint_every == 0 or step == args.max_steps:
                save(acc, ckpt_dir, step)
            time.sleep(args.step_sleep)
            if step >= args.max_steps:
                break
    acc.end_training()
    print(f"DONE rank {acc.process_index} step {step}", flush=True)


if __name__ == "__main__":
    main()
