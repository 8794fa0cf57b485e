"""A resumable data-parallel training loop shared by the workloads (DDP today; FSDP2 fits the same API).

fit() owns: DistributedSampler positioning by global sample offset, a DataLoader with its own
generator (so iter() never draws from the global torch RNG), logging (stdout on rank 0,
metrics.jsonl, TensorBoard per rank), periodic + final DCP checkpoints, resume from `latest`,
fault injection, evaluation, final.json with param_sha256 (checked equal on all ranks).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .checkpoint import Checkpointer, ModelOptimState, PickledState, seed_all
from .data import resumable_loader, steps_per_epoch
from .faults import FaultInjector
from .metrics import Metrics, param_sha256
from .preempt import agreed as stop_agreed


def total_steps(args, n_train: int, world_size: int) -> int:
    """--max-steps when given (it overrides --epochs), else epochs x steps per epoch."""
    return args.max_steps or args.epochs * steps_per_epoch(n_train, world_size, args.batch_size)


def make_scheduler(optimizer, total: int, warmup: int | None):
    """Linear warm-up then cosine decay, stepped once per optimizer step."""
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
    warmup = min(10, max(1, total // 10)) if warmup is None else warmup
    warmup = min(warmup, max(total - 1, 0))
    base_lr = optimizer.param_groups[0]["lr"]
    cosine = CosineAnnealingLR(optimizer, T_max=max(1, total - warmup), eta_min=base_lr * 0.05)
    if warmup == 0:
        return cosine
    linear = LinearLR(optimizer, start_factor=0.1, total_iters=warmup)
    return SequentialLR(optimizer, [linear, cosine], milestones=[warmup])


def stretch_schedule(scheduler, total: int) -> None:
    """After resuming with a different step budget: let the cosine part end at the new total."""
    from torch.optim.lr_scheduler import CosineAnnealingLR
    warmup = (getattr(scheduler, "_milestones", None) or [0])[0]
    for s in getattr(scheduler, "_schedulers", [scheduler]):
        if isinstance(s, CosineAnnealingLR):
            s.T_max = max(1, total - warmup)


def ddp_warmup(ddp_model, in_shape, device) -> None:
    """One zero-weighted forward/backward right after DDP(), in every attempt (fresh or resumed).

    DDP reduces its first iteration with buckets in parameter order and rebuilds them in backward
    order afterwards; gloo's sums depend on an element's position in the flat buffer, so without this
    the first step after every restart would be reduced differently (not bit-exact).
    Eval mode: no dropout, so no RNG is consumed.
    """
    ddp_model.eval()
    out = ddp_model(torch.zeros(2, *in_shape, device=device))
    (out.float().sum() * 0.0).backward()
    ddp_model.zero_grad(set_to_none=True)
    ddp_model.train()


def cross_entropy_step(model, xb, yb):
    logits = model(xb)
    return F.cross_entropy(logits, yb), logits


def global_batch_stats(loss, logits, yb, device) -> tuple[float, float]:
    """(mean loss, accuracy) of this step's batch over all ranks (collective)."""
    stats = torch.tensor([loss.item() * len(yb), (logits.argmax(1) == yb).sum().item(), len(yb)],
                         dtype=torch.float64, device=device)
    dist.all_reduce(stats)
    return stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()


@torch.no_grad()
def evaluate(model, dataset, env, device, batch: int = 512) -> tuple[float, float]:
    """(accuracy, mean loss) over `dataset`, each rank taking indices rank::W, summed over ranks."""
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0.0
    idx = list(range(env.rank, len(dataset), env.world_size))
    for i in range(0, len(idx), batch):
        xb, yb = dataset.__getitems__(idx[i:i + batch])
        logits = model(xb.to(device))
        yb = yb.to(device)
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
        correct += (logits.argmax(1) == yb).sum().item()
    t = torch.tensor([loss_sum, correct, float(len(idx))], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    model.train(was_training)
    return t[1].item() / t[2].item(), t[0].item() / t[2].item()


def fit(*, args, env, device, data, model, eval_model, optimizer, scheduler, step_fn=cross_entropy_step,
        log=print, extra_log=None, param_hash=None) -> dict:
    """extra_log(kind) -> dict ("log" at every logged step, "final" once; called on every rank, may be
    collective) adds fields to metrics.jsonl / final.json; param_hash(eval_model) replaces param_sha256
    for models whose parameters are sharded (FSDP DTensors, expert-parallel experts)."""
    W = env.world_size
    t_start = time.time()
    sampler, gen, loader = resumable_loader(data.train, env, args)
    total = total_steps(args, len(data.train), W)
    fault = FaultInjector.from_args(args, env)
    ckpt = Checkpointer(env, fault=fault, log=log)
    states = {"app": ModelOptimState(model, optimizer), "sched": PickledState(scheduler)}
    save_periodic = ckpt.save_async if getattr(args, "async_checkpoint", False) else ckpt.save
    metrics = Metrics(env, tensorboard=args.tensorboard)
    step, epoch, offset, last_loss = 0, 0, 0, None

    name = ckpt.latest_name()
    if name:
        t0 = time.perf_counter()
        progress, rng_restored = ckpt.load(name, states)
        step, epoch, offset = progress["step"], progress["epoch"], progress["epoch_offset"]
        last_loss = progress.get("last_loss")
        if not rng_restored:  # world size changed: per-rank streams cannot be mapped; re-seed
            seed_all(args.seed * 1_000_003 + step * 1009 + env.rank)
            offset = min(offset // W * W, sampler.total_size)
            log(f"warning: checkpoint {name} was saved with world size {progress.get('world_size')}, now {W}: "
                "RNG re-seeded and data offset rounded (training continues, not bit-exact)")
        if progress.get("threads") not in (None, torch.get_num_threads()):
            log(f"warning: intra-op threads {torch.get_num_threads()} differ from the checkpoint's "
                f"{progress.get('threads')}: results will not be bit-identical")
        if progress.get("total_steps") not in (None, total):
            stretch_schedule(scheduler, total)
            log(f"note: step budget {progress.get('total_steps')} -> {total}: lr schedule stretched")
        log(f"resumed from {name} (step {step}, epoch {epoch}, load {time.perf_counter() - t0:.3f}s)")

    def progress_now() -> dict:
        return {"epoch": epoch, "epoch_offset": offset, "last_loss": last_loss, "batch_size": args.batch_size,
                "total_steps": total,
                "threads": torch.get_num_threads(), "seed": args.seed}

    while step < total and (args.max_steps or epoch < args.epochs):
        sampler.set_position(epoch, offset)
        gen.manual_seed(args.seed * 1_000_003 + epoch)
        model.train()
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss, logits = step_fn(model, xb, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            step += 1
            fault.maybe(step, "mid")
            optimizer.step()
            scheduler.step()
            offset += W * len(yb)
            if step % args.log_every == 0 or step == total:
                last_loss, acc = global_batch_stats(loss, logits, yb, device)
                lr = optimizer.param_groups[0]["lr"]
                extra = extra_log("log") if extra_log else {}
                metrics.record(step=step, epoch=epoch, loss=last_loss, accuracy=acc, lr=lr, **extra)
                metrics.scalars(step, {"train/loss": loss.item(), "train/global_loss": last_loss,
                                       "train/accuracy": acc, "train/lr": lr})
                log(f"step {step}/{total} epoch {epoch} loss {last_loss:.4f} acc {acc:.3f} lr {lr:.2e}")
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save_periodic(step, states, progress_now())
            if stop_agreed(device):
                ckpt.finalize()
                if ckpt.last_saved_step != step:
                    ckpt.save(step, states, progress_now())
                ckpt.close()
                metrics.close()
                log(f"preempted: checkpoint at step {step} written; stopping (the next attempt resumes here)")
                return {"step": step, "preempted": True}
            if step >= total:
                break
        if offset >= sampler.total_size:   # epoch complete
            acc, test_loss = evaluate(eval_model, data.test, env, device)
            metrics.record(step=step, epoch=epoch, loss=test_loss, eval_accuracy=acc, eval_loss=test_loss,
                           kind="eval")
            metrics.scalars(step, {"eval/accuracy": acc, "eval/loss": test_loss})
            log(f"epoch {epoch} done: step {step} test_accuracy {acc:.4f} test_loss {test_loss:.4f}")
            epoch, offset = epoch + 1, 0

    ckpt.finalize()
    if args.checkpoint_every and step > 0 and ckpt.last_saved_step != step:
        ckpt.save(step, states, progress_now())
    ckpt.close()
    acc, test_loss = evaluate(eval_model, data.test, env, device)
    sha = (param_hash or param_sha256)(eval_model)
    shas: list = [None] * W
    dist.all_gather_object(shas, sha)
    if len(set(shas)) != 1:
        raise RuntimeError(f"ranks disagree on the final parameters: {shas}")
    final = {"step": step, "loss": last_loss, "accuracy": acc, "test_loss": test_loss, "param_sha256": sha,
             "world_size": W, "dataset": data.name, "epoch": epoch, "total_steps": total,
             "checkpoint_save_s": round(ckpt.save_seconds, 3), "wall_s": round(time.time() - t_start, 3)}
    if extra_log:
        final.update(extra_log("final"))
    metrics.final(**final)
    metrics.close()
    log(f"done: step {step} loss {last_loss} accuracy {acc:.4f} param_sha256 {sha}")
    return final
