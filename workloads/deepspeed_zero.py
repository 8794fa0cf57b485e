"""The seeds' ConvNet trained with DeepSpeed ZeRO (stage 1|2|3), started by `launch` (torchrun env).

    launch local --nodes 1 --gpus-per-node 2 --run-dir runs/ds -- -m workloads.deepspeed_zero --zero-stage 2
    launch local ... -- -m workloads.deepspeed_zero --dataset cifar10 --data-dir /data/cifar-10-batches-py

Config: --ds-config (default workloads/configs/ds_zero.json, the seeds' ds_config: Adam lr 1e-3, betas
0.8/0.999, 2e8-element allgather/reduce buckets, overlap_comm, contiguous_gradients). Per run the
stage comes from --zero-stage, the batch sizes from --batch-size x world size, the precision from
--precision (auto: fp16 on CUDA; on CPU, where DeepSpeed has no fp16, bf16 if the CPU computes it
natively, else fp32; logged), --lr overrides the config's lr. --weight-decay/--warmup-steps are the
config's business (no lr schedule, as in the seeds).
Optimizer: --adam auto = torch.optim.Adam on CPU ("torch_adam": true; DeepSpeed's CPU FusedAdam is
JIT-compiled at first start, minutes on a small machine, then cached in TORCH_EXTENSIONS_DIR) and
DeepSpeed's FusedAdam on CUDA.
Checkpoints: engine.save_checkpoint into $LAUNCH_CHECKPOINT_DIR/step-<N>/ (DeepSpeed's own `latest`
is not written); then rank 0 writes launch_meta.json and the atomic `latest` pointer. A run that
finds `latest` resumes from it (same world size; otherwise a one-line error saying how to convert).
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import time

from workloads.common import args as common_args
from workloads.common import dist as wdist
from workloads.common import dsconfig

META = "launch_meta.json"


def build_parser():
    p = common_args.common_parser("deepspeed_zero", "The seeds' ConvNet with DeepSpeed ZeRO, resumable.",
                                  epochs=2, batch_size=32, checkpoint_every=20, log_every=5,
                                  async_checkpoint=False)     # DeepSpeed writes its own checkpoints
    g = p.add_argument_group("deepspeed")
    g.add_argument("--zero-stage", default="2", help="ZeRO stage: 1, 2 or 3 (default 2)")
    g.add_argument("--ds-config", default=dsconfig.DEFAULT_CONFIG, help="DeepSpeed JSON config")
    g.add_argument("--precision", default="auto", choices=dsconfig.PRECISIONS)
    g.add_argument("--adam", default="auto", choices=dsconfig.ADAMS,
                   help="auto: torch Adam on CPU, DeepSpeed FusedAdam on CUDA")
    g.add_argument("--dropout", type=common_args.nonneg_float, default=0.0, help="(the seeds' net has none)")
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


class _CastIn:
    """Wrap the engine so loop.evaluate (float32 inputs) feeds it the engine's dtype."""

    @staticmethod
    def build(engine, dtype):
        import torch.nn as nn

        class CastIn(nn.Module):
            def __init__(self):
                super().__init__()
                self.engine = engine

            def forward(self, x):
                return self.engine(x.to(dtype)).float()

        return CastIn()


def train(args, env, device, data, log) -> dict:
    from workloads.common import dsops
    ext_dir = dsops.use_shared_cache()          # prebuilt DeepSpeed ops (see workloads/common/dsops.py)
    t0 = time.perf_counter()
    import deepspeed
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from launchers.ckptptr import read_latest, write_latest
    from workloads.common.checkpoint import get_rng_state, seed_all, set_rng_state, step_name
    from workloads.common.data import resumable_loader
    from workloads.common.faults import FaultInjector
    from workloads.common.loop import evaluate, global_batch_stats, total_steps
    from workloads.common.metrics import Metrics, param_sha256
    from workloads.convnet import _Nets

    W, cuda = env.world_size, device.type == "cuda"
    precision, why = dsconfig.choose_precision(args.precision, cuda)
    adam = args.adam if args.adam != "auto" else ("deepspeed" if cuda else "torch")
    cfg = dsconfig.resolve(args.ds_cfg, stage=args.zero_stage, micro_batch=args.batch_size, world_size=W,
                           precision=precision, adam=adam, lr=args.user_lr)
    log(f"deepspeed import {time.perf_counter() - t0:.1f}s, TORCH_EXTENSIONS_DIR {ext_dir}")
    log(f"deepspeed {deepspeed.__version__}: ZeRO stage {args.zero_stage}, precision {precision} ({why}), "
        f"adam {adam}, train_batch_size {cfg['train_batch_size']}, lr {cfg['optimizer']['params']['lr']}, config {args.ds_config}")
    torch.manual_seed(args.seed)
    module = _Nets.build(data.in_shape, data.num_classes, args.dropout)
    t0 = time.perf_counter()
    engine, _opt, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=cfg,
                                              dist_init_required=False)
    log(f"deepspeed.initialize {time.perf_counter() - t0:.1f}s")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    seed_all(args.seed * 1_000_003 + 7919 * (env.rank + 1))

    sampler, gen, loader = resumable_loader(data.train, env, args)
    total = total_steps(args, len(data.train), W)
    fault = FaultInjector.from_args(args, env)
    metrics = Metrics(env, tensorboard=args.tensorboard)
    ckpt_dir = env.checkpoint_dir
    step, epoch, offset, last_loss, save_s = 0, 0, 0, None, 0.0

    box = [None]
    if env.rank == 0:
        name = read_latest(ckpt_dir)
        meta_path = os.path.join(ckpt_dir, name or "", META)
        if name and not os.path.isfile(meta_path):
            box[0] = ("error", f"checkpoints/latest names {name!r} but {meta_path} is missing (incomplete checkpoint)")
        elif name:
            with open(meta_path, encoding="utf-8") as f:
                box[0] = (name, json.load(f))
    dist.broadcast_object_list(box, src=0)
    if box[0] and box[0][0] == "error":
        raise SystemExit(f"error: {box[0][1]}")
    if box[0]:
        name, meta = box[0]
        path = os.path.join(ckpt_dir, name)
        if meta["world_size"] != W:
            raise SystemExit(
                f"error: checkpoint {name} was written by {meta['world_size']} ranks and this attempt has {W}; "
                f"DeepSpeed ZeRO checkpoints load only at their own world size: resume with {meta['world_size']} "
                f"ranks (launch resume RUN --nodes N --gpus-per-node P with N x P = {meta['world_size']}); resharding "
                f"needs DeepSpeed's universal format (python -m deepspeed.checkpoint.ds_to_universal --input_folder "
                f"{path} --output_folder {path}-universal), which this workload does not load yet")
        t0 = time.perf_counter()
        loaded, client = engine.load_checkpoint(ckpt_dir, tag=name)
        if loaded is None:
            raise SystemExit(f"error: DeepSpeed could not load checkpoint {path}")
        progress = client["progress"]
        step, epoch, offset, last_loss = progress["step"], progress["epoch"], progress["epoch_offset"], progress["last_loss"]
        set_rng_state(pickle.loads(client["rng"][env.rank]))
        log(f"resumed from {name} (step {step}, epoch {epoch}, load {time.perf_counter() - t0:.3f}s)")

    def save(step: int) -> None:
        nonlocal save_s
        t0 = time.perf_counter()
        name = step_name(step)
        rngs: list = [None] * W
        dist.all_gather_object(rngs, pickle.dumps(get_rng_state()))
        progress = {"step": step, "epoch": epoch, "epoch_offset": offset, "last_loss": last_loss,
                    "world_size": W, "total_steps": total}
        fault.maybe(step, "pre_save")
        engine.save_checkpoint(ckpt_dir, tag=name, client_state={"progress": progress, "rng": rngs},
                               save_latest=False)
        fault.maybe(step, "save")
        dist.barrier()
        if env.rank == 0:
            from workloads.common.metrics import write_json_atomic
            write_json_atomic(os.path.join(ckpt_dir, name, META),
                              {"world_size": W, "step": step, "zero_stage": args.zero_stage, "precision": precision})
            write_latest(ckpt_dir, name)
        dist.barrier()
        fault.maybe(step, "after_save")
        save_s += time.perf_counter() - t0
        return name

    last_saved = step
    t_loop = time.time()
    while step < total and (args.max_steps or epoch < args.epochs):
        sampler.set_position(epoch, offset)
        gen.manual_seed(args.seed * 1_000_003 + epoch)
        engine.train()
        for xb, yb in loader:
            xb, yb = xb.to(device, dtype), yb.to(device)
            logits = engine(xb).float()
            loss = F.cross_entropy(logits, yb)
            engine.backward(loss)
            step += 1
            fault.maybe(step, "mid")
            engine.step()
            offset += W * len(yb)
            if step % args.log_every == 0 or step == total:
                last_loss, acc = global_batch_stats(loss, logits, yb, device)
                metrics.record(step=step, epoch=epoch, loss=last_loss, accuracy=acc, zero_stage=args.zero_stage)
                metrics.scalars(step, {"train/loss": loss.item(), "train/global_loss": last_loss, "train/accuracy": acc})
                log(f"step {step}/{total} epoch {epoch} loss {last_loss:.4f} acc {acc:.3f}")
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save(step)
                last_saved = step
            if step >= total:
                break
        if offset >= sampler.total_size:
            epoch, offset = epoch + 1, 0

    if args.checkpoint_every and step > 0 and last_saved != step:
        save(step)
    acc, test_loss = evaluate(_CastIn.build(engine, dtype), data.test, env, device)
    if args.zero_stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            sha = param_sha256(engine.module)
    else:
        sha = param_sha256(engine.module)
    shas: list = [None] * W
    dist.all_gather_object(shas, sha)
    if len(set(shas)) != 1:
        raise RuntimeError(f"ranks disagree on the final parameters: {shas}")
    final = {"step": step, "loss": last_loss, "accuracy": acc, "test_loss": test_loss, "param_sha256": sha,
             "world_size": W, "dataset": data.name, "zero_stage": args.zero_stage, "precision": precision,
             "adam": adam, "checkpoint_save_s": round(save_s, 3), "loop_s": round(time.time() - t_loop, 3)}
    metrics.final(**final)
    metrics.close()
    log(f"done: step {step} loss {last_loss} accuracy {acc:.4f} param_sha256 {sha}")
    return final


def main(argv=None) -> int:
    env = wdist.read_env()
    parser, args = parse(argv, env)
    env = wdist.read_env(args.run_dir)

    return wdist.serve("deepspeed_zero", env, args, wdist.load_dataset(args), train,
                       lambda d: f"dataset {d.name} ")


if __name__ == "__main__":
    sys.exit(main())
