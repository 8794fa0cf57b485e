"""A plain DeepSpeed script under `launch` (recipe: docs/FRAMEWORKS.md).

    launch local --nodes 2 --gpus-per-node 1 -- examples/deepspeed_plain.py --max-steps 8

deepspeed.initialize on a small MLP with a ZeRO stage-2 (or --zero-stage 1) config, started by
torchrun (not the `deepspeed` launcher): deepspeed.init_distributed reads RANK, WORLD_SIZE,
LOCAL_RANK and MASTER_* from the environment. On CPU: $LAUNCH_DIST_BACKEND (gloo) as the backend,
torch's Adam ("torch_adam": DeepSpeed's own CPU Adam is compiled at first use) and fp32 (DeepSpeed
has no fp16 on CPU). DeepSpeed compiles its CPU communication op at every initialize unless
TORCH_EXTENSIONS_DIR holds it: the Makefile prebuilds it into <venv>/torch_extensions, used here
unless you set the variable (launch's own default directory gives way to it). Checkpoints:
engine.save_checkpoint into $LAUNCH_CHECKPOINT_DIR, DeepSpeed's own tag (global_step<N>), with
save_latest=False: DeepSpeed's `latest` is the same file as the launcher's, written in place;
launchers.integrations.DeepSpeedProgress.saved() writes it atomically on rank 0 after the save
(whose last act is a barrier). A resumed attempt (LAUNCH_ATTEMPT > 0) calls
engine.load_checkpoint(ckpt dir), which reads `latest` -- unless, launched with --memory-checkpoint,
integrations.deepspeed_memory_checkpoints(engine) restores a newer whole step from host memory (its
own copy or its peer node's, kept every M steps after engine.step()). Each rank prints one REPORT
line: the world DeepSpeed sees.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# before deepspeed: the venv's prebuilt op, unless you set TORCH_EXTENSIONS_DIR yourself (launch's
# own per-runs-root directory, LAUNCH_TORCH_EXTENSIONS_DIR, gives way to the prebuilt one: otherwise
# a 2-minute compile per runs root)
_PREBUILT = os.path.join(sys.prefix, "torch_extensions")
if os.environ.get("TORCH_EXTENSIONS_DIR") in (
    None,
    os.environ.get("LAUNCH_TORCH_EXTENSIONS_DIR"),
) and os.path.isdir(_PREBUILT):
    os.environ["TORCH_EXTENSIONS_DIR"] = _PREBUILT

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from launchers import integrations  # noqa: E402
from launchers.ckptptr import read_latest  # noqa: E402


def config(batch: int, world: int, stage: int) -> dict:
    return {
        "train_batch_size": batch * world,
        "train_micro_batch_size_per_gpu": batch,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "steps_per_print": 1_000_000,
    }


def report(engine) -> None:
    """One line per rank: the world DeepSpeed joined (its process group: an all-reduce of rank + 1).
    No world check as Accelerate's needs: init_distributed takes WORLD_SIZE from torchrun's
    environment or fails."""
    total = torch.tensor([float(engine.global_rank + 1)])
    dist.all_reduce(total)
    world = engine.world_size
    rec = {
        "framework": "deepspeed",
        "rank": engine.global_rank,
        "world": world,
        "node_rank": int(os.environ.get("NODE_RANK", "0")),
        "local_rank": engine.local_rank,
        "sum": float(total.item()),
        "zero_stage": engine.zero_optimization_stage(),
        "cwd": os.getcwd(),
    }
    print("REPORT " + json.dumps(rec), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(prog="deepspeed_plain")
    ap.add_argument(
        "--zero-stage", type=int, choices=(1, 2), default=2, help="ZeRO stage (default 2)"
    )
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()
    ckpt_dir = os.environ.get("LAUNCH_CHECKPOINT_DIR", os.path.abspath("deepspeed_checkpoints"))
    backend = os.environ.get("LAUNCH_DIST_BACKEND") or (
        "nccl" if torch.cuda.is_available() else "gloo"
    )
    deepspeed.init_distributed(dist_backend=backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=model.parameters(),
        config=config(args.batch_size, dist.get_world_size(), args.zero_stage),
    )
    report(engine)
    # --memory-checkpoint: a copy of each rank's engine state in host memory (else a no-op handle)
    mem = integrations.deepspeed_memory_checkpoints(engine)
    tag = read_latest(ckpt_dir) if int(os.environ.get("LAUNCH_ATTEMPT", "0")) > 0 else None
    storage_step = int(tag.removeprefix("global_step")) if tag else None  # `latest`: global_step<N>
    # collective: memory's newest whole step no older than storage's (engine state, counters, RNG)
    if mem.restore(storage_step) is None and tag:
        engine.load_checkpoint(ckpt_dir)  # memory held nothing newer: the tag `latest` names
    progress = integrations.DeepSpeedProgress(total=args.max_steps)
    # each rank its own shard of the data
    g = torch.Generator().manual_seed(1000 + engine.global_rank)
    while engine.global_steps < args.max_steps:
        x = torch.randn(args.batch_size, 16, generator=g)
        y = (x[:, 0] > 0).long()
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        mem.save(engine.global_steps)  # after engine.step(): a copy every M steps
        progress.step(engine)
        if (
            engine.global_steps % args.checkpoint_every == 0
            or engine.global_steps == args.max_steps
        ):
            engine.save_checkpoint(ckpt_dir, save_latest=False)  # every rank: its ZeRO shard
            progress.saved(engine, ckpt_dir)  # rank 0: `latest` -> global_step<N>
    mem.close()
    print(f"DONE rank {engine.global_rank} step {engine.global_steps}", flush=True)


if __name__ == "__main__":
    main()
