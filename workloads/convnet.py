"""DDP ConvNet: the seeds' CIFAR-10 network (an analogous small net for 8x8 digits), resumable.

    python -m workloads.convnet --dataset digits --epochs 2          # 1 process
    torchrun --nproc-per-node 2 -m workloads.convnet --max-steps 60  # plain torchrun
    launch local --nodes 2 --gpus-per-node 2 -- -m workloads.convnet --epochs 2

Outputs go to $LAUNCH_RUN_DIR (or --run-dir, default ./run-local): metrics.jsonl, final.json,
tensorboard/rank<R>/, and checkpoints in $LAUNCH_CHECKPOINT_DIR (default <run dir>/checkpoints).
A run that finds checkpoints/latest resumes from it; crash + resume is bit-identical on CPU.
"""

from __future__ import annotations

import sys

from workloads.common import args as common_args
from workloads.common import dist as wdist


def build_parser():
    p = common_args.common_parser(
        "convnet",
        "DDP ConvNet on digits / synthetic / CIFAR-10, resumable.",
        epochs=2,
        batch_size=32,
        checkpoint_every=20,
        log_every=5,
    )
    p.add_argument("--dropout", type=common_args.nonneg_float, default=0.2)
    return p


def train(args, env, device, data, log) -> dict:
    """Everything that references the process group lives (and dies) inside this function."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workloads.common.loop import TorchSteps, ddp_warmup, fit, make_scheduler, total_steps
    from workloads.common.models import convnet
    from workloads.common.stateful import seed_all

    torch.manual_seed(args.seed)  # identical init on every rank (DDP also broadcasts)
    module = convnet(data.in_shape, data.num_classes, args.dropout).to(device)
    model = DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
    ddp_warmup(model, data.in_shape, device)
    seed_all(args.seed * 1_000_003 + 7919 * (env.rank + 1))  # per-rank streams (dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = make_scheduler(
        optimizer, total_steps(args, len(data.train), env.world_size), args.warmup_steps
    )
    n_params = sum(p.numel() for p in module.parameters())
    log(f"convnet: {type(module).__name__} {n_params} parameters")
    return fit(
        args=args,
        env=env,
        device=device,
        data=data,
        steps=TorchSteps(model, optimizer, scheduler),
        eval_model=module,
        log=log,
    )


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    env = wdist.read_env(args.run_dir)
    common_args.check(parser, args, env.world_size)  # before the process group: all ranks agree
    return wdist.serve(
        "convnet",
        env,
        args,
        wdist.load_dataset(args),
        train,
        lambda d: f"dataset {d.name} train {len(d.train)} test {len(d.test)} ",
    )


if __name__ == "__main__":
    sys.exit(main())
