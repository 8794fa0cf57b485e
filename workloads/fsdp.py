"""FSDP2 (`fully_shard`) ConvNet with DCP sharded checkpoints that reshard on resume.

    launch local --nodes 1 --gpus-per-node 4 --run-dir runs/f -- -m workloads.fsdp --max-steps 40
    launch resume runs/f --nodes 1 --gpus-per-node 2 -- -m workloads.fsdp --max-steps 40
    --batch-size 64

Every Conv/Linear layer and the root are `fully_shard`ed over all ranks (parameters are DTensors,
sharded on dim 0). Checkpoints go through workloads.common (DCP + atomic `latest`); DCP stores the
shards with their global layout, so a checkpoint saved by 4 ranks loads on 2 (or 8). Keep the global
batch (ranks x --batch-size) equal when the world size changes and the loss trajectory continues
where it left off (same samples per step; RNG is re-seeded, so use --dropout 0, the default here).
Same world size: a crashed-and-resumed run ends with the same param_sha256 as an uninterrupted one.
"""

from __future__ import annotations

import sys

from workloads.common import args as common_args
from workloads.common import dist as wdist

PRECISIONS = ("auto", "fp32", "bf16")


def build_parser():
    p = common_args.common_parser(
        "fsdp",
        "FSDP2 ConvNet on digits / synthetic / CIFAR-10, DCP resharding resume.",
        epochs=2,
        batch_size=32,
        checkpoint_every=20,
        log_every=5,
    )
    p.add_argument("--dropout", type=common_args.nonneg_float, default=0.0)
    p.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="parameter dtype in forward/backward (auto: bf16 on CUDA, fp32 on CPU)",
    )
    p.add_argument(
        "--no-reshard-after-forward",
        dest="reshard_after_forward",
        action="store_false",
        help="keep gathered parameters between forward and backward (ZeRO-2-like)",
    )
    return p


def shard(module, device, precision: str, reshard_after_forward: bool):
    """fully_shard every Conv/Linear layer, then the root. Returns the chosen precision."""
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if precision == "bf16"
        else MixedPrecisionPolicy()
    )
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return precision


def train(args, env, device, data, log) -> dict:
    import torch

    from workloads.common.loop import TorchSteps, fit, make_scheduler, total_steps
    from workloads.common.models import convnet
    from workloads.common.sharded import full_param_sha256, local_numel
    from workloads.common.stateful import seed_all

    torch.manual_seed(args.seed)  # same full init on every rank, then sharded
    model = convnet(data.in_shape, data.num_classes, args.dropout).to(device)
    n_full = sum(p.numel() for p in model.parameters())
    precision = shard(model, device, args.precision, args.reshard_after_forward)
    seed_all(args.seed * 1_000_003 + 7919 * (env.rank + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = make_scheduler(
        optimizer, total_steps(args, len(data.train), env.world_size), args.warmup_steps
    )
    mine = local_numel(model)
    counts: list = [None] * env.world_size
    torch.distributed.all_gather_object(counts, mine)
    log(
        f"fsdp: {n_full} parameters, local shards per rank {counts}, precision {precision}, "
        f"reshard_after_forward {args.reshard_after_forward}"
    )

    def extra(kind: str) -> dict:
        return {"local_params_per_rank": counts, "precision": precision} if kind == "final" else {}

    return fit(
        args=args,
        env=env,
        device=device,
        data=data,
        steps=TorchSteps(model, optimizer, scheduler),
        eval_model=model,
        log=log,
        extra_log=extra,
        param_hash=full_param_sha256,
    )


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    env = wdist.read_env(args.run_dir)
    common_args.check(parser, args, env.world_size)  # before the process group: all ranks agree

    return wdist.serve(
        "fsdp", env, args, wdist.load_dataset(args), train, lambda d: f"dataset {d.name} "
    )


if __name__ == "__main__":
    sys.exit(main())
