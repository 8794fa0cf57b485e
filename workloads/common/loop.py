"""The one resumable data-parallel training loop of the workloads (DDP, FSDP2, expert parallel,
DeepSpeed).

fit() owns: DistributedSampler positioning by global sample offset, a DataLoader with its own
generator (so iter() never draws from the global torch RNG), logging (stdout on rank 0,
metrics.jsonl, TensorBoard per rank), periodic + final DCP checkpoints, resume from `latest`,
fault injection, evaluation, final.json with param_sha256 (checked equal on all ranks).
"""

from __future__ import annotations

import re
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from launchers import heartbeat
from launchers.ckptptr import step_of
from launchers.layout import stamp
from launchers.memckpt import MemCheckpoints

from .checkpoint import Checkpointer
from .data import resumable_loader, steps_per_epoch
from .faults import FaultInjector
from .metrics import Metrics, evaluate, global_batch_stats, param_sha256
from .preempt import HangStop, hang_stop
from .preempt import agreed as stop_agreed
from .stateful import ModelOptimState, PickledState, seed_all


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
    order afterwards; gloo's sums depend on an element's position in the flat buffer, so without
    this the first step after every restart would be reduced differently (not bit-exact). Eval mode:
    no dropout, so no RNG is consumed.
    """
    ddp_model.eval()
    out = ddp_model(torch.zeros(2, *in_shape, device=device))
    (out.float().sum() * 0.0).backward()
    ddp_model.zero_grad(set_to_none=True)
    ddp_model.train()


def cross_entropy_step(model, xb, yb):
    logits = model(xb)
    return F.cross_entropy(logits, yb), logits


class TorchSteps:
    """fit()'s hooks for a torch model + optimizer + lr scheduler (DDP, FSDP2, expert parallel): the
    training step, DCP checkpoints through Checkpointer, per-epoch evaluation. Another engine plugs
    into fit() by giving the same attributes (DeepSpeed: workloads/common/dsloop.py)."""

    # evaluate on the test set at the end of every epoch (metrics kind "eval")
    eval_each_epoch = True

    def __init__(self, model, optimizer, scheduler, step_fn=cross_entropy_step) -> None:
        self.model, self.optimizer, self.scheduler, self.step_fn = (
            model,
            optimizer,
            scheduler,
            step_fn,
        )

    def train(self) -> None:
        self.model.train()

    def forward(self, xb, yb):
        """(loss, logits) of one batch."""
        return self.step_fn(self.model, xb, yb)

    def backward(self, loss) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()

    def step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def checkpointer(self, env, fault, log) -> Checkpointer:
        return Checkpointer(env, fault=fault, log=log)

    def states(self) -> dict:
        """What the checkpointer saves and loads besides progress and RNG."""
        return {
            "app": ModelOptimState(self.model, self.optimizer),
            "sched": PickledState(self.scheduler),
        }

    def new_budget(self, total: int) -> str | None:
        """The resumed run has another step budget: adapt, and say how (None: nothing to say)."""
        stretch_schedule(self.scheduler, total)
        return "lr schedule stretched"


class Training:
    """The state of one fit() call: position in the data (step, epoch, global sample offset in the
    epoch), the checkpointer, metrics. Collective methods are called by every rank at the same
    step."""

    def __init__(self, *, args, env, device, data, steps, eval_model, log, extra_log) -> None:
        self.args, self.env, self.device, self.data, self.steps = args, env, device, data, steps
        self.eval_model = eval_model
        self.log, self.extra_log = log, extra_log or (lambda kind: {})
        self.t_start = time.time()
        self.sampler, self.gen, self.loader = resumable_loader(data.train, env, args)
        self.total = total_steps(args, len(data.train), env.world_size)
        self.fault = FaultInjector.from_args(args, env)
        self.ckpt = steps.checkpointer(env, self.fault, log)
        self.states = steps.states()
        self.save_periodic = (
            self.ckpt.save_async if getattr(args, "async_checkpoint", False) else self.ckpt.save
        )
        self.metrics = Metrics(env, tensorboard=args.tensorboard)
        # --memory-checkpoint (launchers.memckpt); DeepSpeed's through its public handle (dsloop)
        own = getattr(steps, "memory_checkpoints", None)
        self.mem = own() if own else MemCheckpoints.from_env(env, log)
        self.step, self.epoch, self.offset, self.last_loss = 0, 0, 0, None

    def resume(self) -> None:
        """Continue from memory (--memory-checkpoint: its newest whole step no older than `latest`),
        else from `latest` when there is one (collective)."""
        name = self.ckpt.latest_name()
        t0, W, log = time.perf_counter(), self.env.world_size, self.log
        if self.mem:
            self.mem.setup()
        progress = (
            self.mem.restore(step_of(name) if name else None, self.states) if self.mem else None
        )
        if progress is not None:
            name, rng_restored = f"memory step {progress['step']}", True
        elif not name:
            return
        else:
            # --crash-phase load: the others are loading it
            self.fault.maybe(step_of(name) or 0, "load")
            progress, rng_restored = self.ckpt.load(name, self.states)
        self.step, self.epoch, self.offset = (
            progress["step"],
            progress["epoch"],
            progress["epoch_offset"],
        )
        self.last_loss = progress.get("last_loss")
        if not rng_restored:  # world size changed: per-rank streams cannot be mapped; re-seed
            seed_all(self.args.seed * 1_000_003 + self.step * 1009 + self.env.rank)
            self.offset = min(self.offset // W * W, self.sampler.total_size)
            log(
                f"warning: checkpoint {name} was saved with world size "
                f"{progress.get('world_size')}, now {W}: RNG re-seeded and data offset rounded "
                "(training continues, not bit-exact)"
            )
        if progress.get("threads") not in (None, torch.get_num_threads()):
            log(
                f"warning: intra-op threads {torch.get_num_threads()} differ from the checkpoint's "
                f"{progress.get('threads')}: results will not be bit-identical"
            )
        if progress.get("total_steps") not in (None, self.total):
            note = self.steps.new_budget(self.total)
            if note:
                log(f"note: step budget {progress.get('total_steps')} -> {self.total}: {note}")
        log(
            f"resumed from {name} (step {self.step}, epoch {self.epoch}, load "
            f"{time.perf_counter() - t0:.3f}s, "
            # the recovery timeline's `checkpoint loaded` (launchers.resilience.timeline)
            f"at {stamp()})"
        )

    def progress(self) -> dict:
        return {
            "epoch": self.epoch,
            "epoch_offset": self.offset,
            "last_loss": self.last_loss,
            "batch_size": self.args.batch_size,
            "total_steps": self.total,
            "threads": torch.get_num_threads(),
            "seed": self.args.seed,
        }

    def unfinished(self) -> bool:
        return self.step < self.total and bool(self.args.max_steps or self.epoch < self.args.epochs)

    def run_epoch(self) -> bool:
        """Train from the current position to the end of the epoch or of the budget. True: stopped
        on request."""
        self.sampler.set_position(self.epoch, self.offset)
        self.gen.manual_seed(self.args.seed * 1_000_003 + self.epoch)
        self.steps.train()
        for xb, yb in self.loader:
            self.train_step(
                xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)
            )
            if self.mem and self.mem.due(self.step):
                self.mem.snapshot(self.step, self.states, self.progress())
            if self.args.checkpoint_every and self.step % self.args.checkpoint_every == 0:
                self.save_periodic(self.step, self.states, self.progress())
            if stop_agreed(self.device):
                return True
            if self.step >= self.total:
                break
        if self.offset >= self.sampler.total_size:  # epoch complete
            self.end_epoch()
        return False

    def train_step(self, xb, yb) -> None:
        steps = self.steps
        loss, logits = steps.forward(xb, yb)
        steps.backward(loss)
        self.step += 1
        self.fault.maybe(self.step, "mid")
        steps.step()
        heartbeat.step(self.step)  # progress for `launch status --ranks` and --hang-timeout
        self.offset += self.env.world_size * len(yb)
        if self.step % self.args.log_every == 0 or self.step == self.total:
            self.record_step(loss, logits, yb)

    def record_step(self, loss, logits, yb) -> None:
        step, epoch = self.step, self.epoch
        self.last_loss, acc = global_batch_stats(loss, logits, yb, self.device)
        lr = self.steps.lr()
        extra = self.extra_log("log")
        self.metrics.record(
            step=step, epoch=epoch, loss=self.last_loss, accuracy=acc, lr=lr, **extra
        )
        self.metrics.scalars(
            step,
            {
                "train/loss": loss.item(),
                "train/global_loss": self.last_loss,
                "train/accuracy": acc,
                "train/lr": lr,
            },
        )
        self.log(
            f"step {step}/{self.total} epoch {epoch} loss {self.last_loss:.4f} acc {acc:.3f} lr "
            f"{lr:.2e}"
        )

    def end_epoch(self) -> None:
        if self.steps.eval_each_epoch:
            acc, test_loss = evaluate(self.eval_model, self.data.test, self.env, self.device)
            self.metrics.record(
                step=self.step,
                epoch=self.epoch,
                loss=test_loss,
                eval_accuracy=acc,
                eval_loss=test_loss,
                kind="eval",
            )
            self.metrics.scalars(self.step, {"eval/accuracy": acc, "eval/loss": test_loss})
            self.log(
                f"epoch {self.epoch} done: step {self.step} test_accuracy {acc:.4f} test_loss "
                f"{test_loss:.4f}"
            )
        self.epoch, self.offset = self.epoch + 1, 0

    def save_last(self, always: bool) -> None:
        """Wait for a pending async save, then save this step unless it is saved already
        (collective)."""
        self.ckpt.finalize()
        if (
            (always or self.args.checkpoint_every)
            and self.step > 0
            and self.ckpt.last_saved_step != self.step
        ):
            self.ckpt.save(self.step, self.states, self.progress())
        self.ckpt.close()
        if self.mem:
            self.mem.close(finished=not always)

    def stop(self) -> dict:
        """The agreed stop (preemption): checkpoint this step, leave without evaluating."""
        self.save_last(always=True)
        self.metrics.close()
        self.log(
            f"preempted: checkpoint at step {self.step} written; stopping (the next attempt "
            "resumes here)"
        )
        return {"step": self.step, "preempted": True}

    def after_hang(self, e: BaseException) -> None:
        """A hang's stop (preempt.HangStop, or a collective that failed because the launcher ended
        the hung ranks): no collective, no checkpoint (the last good one stands), this rank's own
        records closed; on every rank."""
        from launchers import ckptptr

        # gloo's [file:line]
        first = re.sub(r"^\[[^]]*\] ", "", (str(e).strip().splitlines() or [type(e).__name__])[0])
        why = "" if isinstance(e, HangStop) else f" (a collective failed: {first[:100]})"
        hung = (hang_stop() or {}).get("hung_ranks")
        latest = ckptptr.read_latest(self.env.checkpoint_dir)
        self.metrics.close()
        print(
            f"hang stop: rank {self.env.rank} at step {self.step}: hung rank(s) {hung} "
            f"ended{why}; no agreed checkpoint, the last good one stands ({latest or 'none'}); "
            "cleanup done",
            flush=True,
        )

    def finish(self, param_hash) -> dict:
        """Final checkpoint, evaluation, parameter hash checked equal on every rank, final.json."""
        self.save_last(always=False)
        acc, test_loss = evaluate(self.eval_model, self.data.test, self.env, self.device)
        sha = param_hash(self.eval_model)
        shas: list = [None] * self.env.world_size
        dist.all_gather_object(shas, sha)
        if len(set(shas)) != 1:
            raise RuntimeError(f"ranks disagree on the final parameters: {shas}")
        final = {
            "step": self.step,
            "loss": self.last_loss,
            "accuracy": acc,
            "test_loss": test_loss,
            "param_sha256": sha,
            "world_size": self.env.world_size,
            "dataset": self.data.name,
            "epoch": self.epoch,
            "total_steps": self.total,
            "checkpoint_save_s": round(self.ckpt.save_seconds, 3),
            "wall_s": round(time.time() - self.t_start, 3),
        }
        final.update(self.extra_log("final"))
        final.update(self.mem.summary() if self.mem else {})
        self.metrics.final(**final)
        self.metrics.close()
        self.log(
            f"done: step {self.step} loss {self.last_loss} accuracy {acc:.4f} param_sha256 {sha}"
        )
        return final


def fit(
    *, args, env, device, data, steps, eval_model, log=print, extra_log=None, param_hash=None
) -> dict:
    """Train with `steps` (TorchSteps or an engine's hooks) from `latest` or from scratch, to the
    step budget or to an agreed stop (preempt.agreed: USR2/SIGTERM on any rank -> checkpoint at this
    step, return {"step", "preempted": True}). extra_log(kind) -> dict ("log" at every logged step,
    "final" once; called on every rank, may be collective) adds fields to metrics.jsonl /
    final.json; param_hash(eval_model) replaces param_sha256 for models whose parameters are sharded
    (FSDP DTensors, expert-parallel experts, ZeRO-3)."""
    run = Training(
        args=args,
        env=env,
        device=device,
        data=data,
        steps=steps,
        eval_model=eval_model,
        log=log,
        extra_log=extra_log,
    )
    try:
        run.resume()
        while run.unfinished():
            if run.run_epoch():
                return run.stop()
        return run.finish(param_hash or param_sha256)
    except Exception as e:  # a hang's stop: the hung ranks are gone, a collective with them failed
        if not isinstance(e, HangStop) and hang_stop() is None:
            raise
        run.after_hang(e)
        raise HangStop("hang stop") from e
