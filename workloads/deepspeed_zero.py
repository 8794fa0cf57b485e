"""The seeds' ConvNet trained with DeepSpeed ZeRO (stage 1|2|3), started by `launch` (torchrun env).

    launch local --nodes 1 --gpus-per-node 2 --run-dir runs/ds -- -m workloads.deepspeed_zero
    --zero-stage 2 launch local ... -- -m workloads.deepspeed_zero --dataset cifar10 --data-dir
    /data/cifar-10-batches-py

Config: --ds-config (default workloads/configs/ds_zero.json, the seeds' ds_config: Adam lr 1e-3,
betas 0.8/0.999, 2e8-element allgather/reduce buckets, overlap_comm, contiguous_gradients). Per run
the stage comes from --zero-stage, the batch sizes from --batch-size x world size, the precision
from --precision (auto: fp16 on CUDA; on CPU, where DeepSpeed has no fp16, bf16 if the CPU computes
it natively, else fp32; logged), --lr overrides the config's lr. --weight-decay/--warmup-steps are
the config's business (no lr schedule, as in the seeds). Optimizer: --adam auto = torch.optim.Adam
on CPU ("torch_adam": true; DeepSpeed's CPU FusedAdam is JIT-compiled at first start, minutes on a
small machine, then cached in TORCH_EXTENSIONS_DIR) and DeepSpeed's FusedAdam on CUDA. Training runs
in the workloads' one loop (workloads.common.loop.fit) with the engine's hooks
(workloads.common.dsloop): same logging, fault injection and agreed stop (USR2/SIGTERM -> checkpoint
at the next step, exit 0) as every workload. Checkpoints: engine.save_checkpoint into
$LAUNCH_CHECKPOINT_DIR/step-<N>/ (DeepSpeed's own `latest` is not written); then rank 0 writes
launch_meta.json and the atomic `latest` pointer. A run that finds `latest` resumes from it: exactly
at the same world size; at another one (launch resume RUN --nodes N --gpus-per-node P) from
DeepSpeed's universal format, converted once by rank 0 into `step-<N>-universal/` next to the
original (workloads/common/dsuniversal.py). Keep the global batch (--batch-size x ranks) to continue
the same trajectory. Memory checkpoints (launch --memory-checkpoint): each rank's engine state --
weights, its ZeRO optimizer partition, counters -- with its progress and RNG, restored bit-exactly
at the same world size, through the call a user's DeepSpeed program makes
(launchers.integrations.deepspeed_memory_checkpoints; launchers/dsmemory.py).
"""

from __future__ import annotations

import sys
import time

from workloads.common import args as common_args
from workloads.common import dist as wdist
from workloads.common import dsconfig


def build_parser():
    p = common_args.common_parser(
        "deepspeed_zero",
        "The seeds' ConvNet with DeepSpeed ZeRO, resumable.",
        epochs=2,
        batch_size=32,
        checkpoint_every=20,
        log_every=5,
        async_checkpoint=False,
    )  # DeepSpeed writes its own checkpoints
    g = p.add_argument_group("deepspeed")
    g.add_argument("--zero-stage", default="2", help="ZeRO stage: 1, 2 or 3 (default 2)")
    g.add_argument("--ds-config", default=dsconfig.DEFAULT_CONFIG, help="DeepSpeed JSON config")
    g.add_argument("--precision", default="auto", choices=dsconfig.PRECISIONS)
    g.add_argument(
        "--adam",
        default="auto",
        choices=dsconfig.ADAMS,
        help="auto: torch Adam on CPU, DeepSpeed FusedAdam on CUDA",
    )
    g.add_argument(
        "--dropout", type=common_args.nonneg_float, default=0.0, help="(the seeds' net has none)"
    )
    return p


def parse(argv, env):
    """Parse and check everything that needs no process group (identical verdict on every rank)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.zero_stage not in ("1", "2", "3"):
        parser.error(f"--zero-stage {args.zero_stage!r} is not accepted (accepted: 1, 2, 3)")
    args.zero_stage = int(args.zero_stage)
    args.user_lr = args.lr
    common_args.check(parser, args, env.world_size)
    try:
        args.ds_cfg = dsconfig.load(args.ds_config)
    except dsconfig.ConfigError as e:
        parser.error(str(e))
    return parser, args


def build_engine(args, env, device, data, log):
    """(engine, precision, adam): the seeds' ConvNet under deepspeed.initialize with the resolved
    config."""
    from workloads.common import dsops

    ext_dir = dsops.use_shared_cache()  # prebuilt DeepSpeed ops (see workloads/common/dsops.py)
    t0 = time.perf_counter()
    import deepspeed
    import torch

    from workloads.common.models import convnet

    cuda = device.type == "cuda"
    precision, why = dsconfig.choose_precision(args.precision, cuda)
    adam = args.adam if args.adam != "auto" else ("deepspeed" if cuda else "torch")
    cfg = dsconfig.resolve(
        args.ds_cfg,
        stage=args.zero_stage,
        micro_batch=args.batch_size,
        world_size=env.world_size,
        precision=precision,
        adam=adam,
        lr=args.user_lr,
    )
    log(f"deepspeed import {time.perf_counter() - t0:.1f}s, TORCH_EXTENSIONS_DIR {ext_dir}")
    log(
        f"deepspeed {deepspeed.__version__}: ZeRO stage {args.zero_stage}, precision {precision} "
        f"({why}), adam {adam}, train_batch_size {cfg['train_batch_size']}, lr "
        f"{cfg['optimizer']['params']['lr']}, config {args.ds_config}"
    )
    torch.manual_seed(args.seed)
    module = convnet(data.in_shape, data.num_classes, args.dropout)
    t0 = time.perf_counter()
    engine, _opt, _, _ = deepspeed.initialize(
        model=module, model_parameters=module.parameters(), config=cfg, dist_init_required=False
    )
    log(f"deepspeed.initialize {time.perf_counter() - t0:.1f}s")
    return engine, precision, adam


def param_hash(engine, zero_stage: int) -> str:
    """param_sha256 of the full parameters (ZeRO-3 holds shards: gathered for the hash)."""
    import deepspeed

    from workloads.common.metrics import param_sha256

    if zero_stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            return param_sha256(engine.module)
    return param_sha256(engine.module)


def train(args, env, device, data, log) -> dict:
    """The engine's steps and checkpoints inside the one training loop
    (workloads.common.loop.fit)."""
    import torch

    from launchers import integrations
    from workloads.common.dsloop import DeepSpeedSteps
    from workloads.common.loop import fit
    from workloads.common.models import cast_input
    from workloads.common.stateful import seed_all

    engine, precision, adam = build_engine(args, env, device, data, log)
    # --memory-checkpoint: the public call (ZeRO-1/2/3; else off, said in one line)
    memory = integrations.deepspeed_memory_checkpoints(engine, log)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    seed_all(args.seed * 1_000_003 + 7919 * (env.rank + 1))
    steps = DeepSpeedSteps(
        engine, dtype, meta={"zero_stage": args.zero_stage, "precision": precision}, memory=memory
    )
    t_loop = time.time()

    def extra(kind: str) -> dict:
        if kind == "log":
            return {"zero_stage": args.zero_stage}
        return {
            "zero_stage": args.zero_stage,
            "precision": precision,
            "adam": adam,
            "loop_s": round(time.time() - t_loop, 3),
        }

    return fit(
        args=args,
        env=env,
        device=device,
        data=data,
        steps=steps,
        eval_model=cast_input(engine, dtype),
        log=log,
        extra_log=extra,
        param_hash=lambda _m: param_hash(engine, args.zero_stage),
    )


def main(argv=None) -> int:
    env = wdist.read_env()
    parser, args = parse(argv, env)
    env = wdist.read_env(args.run_dir)

    return wdist.serve(
        "deepspeed_zero", env, args, wdist.load_dataset(args), train, lambda d: f"dataset {d.name} "
    )


if __name__ == "__main__":
    sys.exit(main())
