"""Progress from the frameworks people use, reported through launchers.heartbeat: each step, the
total when the framework knows it (`launch top`'s ETA) and each complete checkpoint
(`checkpoints/latest`, what `launch status` shows as `checkpoint:`; only for checkpoints written
directly into $LAUNCH_CHECKPOINT_DIR).

    # PyTorch Lightning
    trainer = L.Trainer(..., callbacks=[integrations.lightning_callback(), ModelCheckpoint(dirpath=ckpt_dir)])
    # Hugging Face Transformers (output_dir=$LAUNCH_CHECKPOINT_DIR: checkpoint-<N>/ there)
    Trainer(..., args=TrainingArguments(output_dir=ckpt_dir), callbacks=[integrations.hf_callback()])
    # a DeepSpeed loop
    progress = integrations.DeepSpeedProgress(total=steps)
    for batch in loader:
        ...; engine.step(); progress.step(engine)
    engine.save_checkpoint(ckpt_dir, tag); progress.saved(engine, ckpt_dir, tag)

Memory checkpoints (`launch ... --memory-checkpoint [--memory-checkpoint-every M]`,
docs/RECOVERY.md) for a plain PyTorch / DCP loop, one call (torch.distributed initialized first; a
no-op in a run launched without the option):

    mem = integrations.memory_checkpoints({"model": model, "optim": optimizer})   # state_dict/load_state_dict
    start = mem.restore(storage_step)           # newest whole step in memory, no older than storage's, or None
    for step in range(start or 0, total):
        ...; optimizer.step(); mem.save(step + 1)   # every M steps: a copy here, a peer node's copy in the background
    mem.close()
    # DeepSpeed (after deepspeed.initialize): the engine's own state, ZeRO-1/2/3, bit-exact (launchers.dsmemory);
    # an engine it cannot restore exactly: falsy and off, said in one line
    mem = integrations.deepspeed_memory_checkpoints(engine)
    start = mem.restore(storage_step)           # None: engine.load_checkpoint(dir, storage's tag), as before
    for step in range(start or 0, total):
        ...; engine.step(); mem.save(step + 1)
    mem.close()
    # Lightning: Lightning's whole checkpoint every M steps; resumed from memory when it holds a
    newer whole step
    mem = integrations.lightning_memory_callback()               # first in the callbacks list
    trainer = L.Trainer(..., callbacks=[mem, ...]); trainer.fit(model,
    ckpt_path=mem.resume_from(ckpt_path))
    # Transformers: the Trainer's checkpoint (model, optimizer, scheduler, TrainerState, RNG) every
    M steps
    mem = integrations.hf_memory_callback()                      # first in the callbacks list
    trainer = Trainer(..., callbacks=[mem, ...]);
    trainer.train(resume_from_checkpoint=mem.resume_from(ckpt_dir))

The frameworks are imported only when a callback is made (never at `import launchers...`); the hook
methods read only the few attributes named in them, so they are tested with small stand-ins. Outside
a `launch` run every report is a no-op (launchers.heartbeat).
"""  # noqa: E501

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
from typing import Any

from . import dsmemory, heartbeat, memckpt, memcodec


def whole(n: Any) -> int | None:
    """A usable total: a positive finite whole number, else None (Lightning's -1 and inf:
    unknown)."""
    try:
        f = float(n)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f > 0 else None


class LightningProgress:
    """The hooks of the Lightning callback (lightning_callback() mixes in Lightning's Callback)."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.reported: str | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.total = whole(trainer.max_steps) or whole(
            getattr(trainer, "estimated_stepping_batches", None)
        )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        heartbeat.step(trainer.global_step, total=self.total)
        self.report_checkpoints(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.report_checkpoints(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.report_checkpoints(trainer)

    def report_checkpoints(self, trainer: Any) -> None:
        """Rank 0: the newest checkpoint file its ModelCheckpoints wrote (their last and best
        paths), once."""
        if not trainer.is_global_zero:
            return
        paths = [
            p
            for cb in getattr(trainer, "checkpoint_callbacks", None) or []
            for p in (getattr(cb, "last_model_path", ""), getattr(cb, "best_model_path", ""))
            if p
        ]
        paths = [p for p in paths if os.path.exists(p)]
        newest = max(paths, key=os.path.getmtime) if paths else None
        if newest and newest != self.reported:
            heartbeat.checkpoint(newest)
            self.reported = newest


class HFProgress:
    """The hooks of the Transformers callback (hf_callback() mixes in transformers'
    TrainerCallback)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        heartbeat.step(state.global_step, total=whole(state.max_steps))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Trainer's own name for a checkpoint: checkpoint-<global step>
        if state.is_world_process_zero:
            heartbeat.checkpoint(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))


class DeepSpeedProgress:
    """For a plain DeepSpeed loop: step(engine) after engine.step(); saved(engine, dir, tag) after
    engine.save_checkpoint(dir, tag) (tag None: DeepSpeed's own, global_step<N>)."""

    def __init__(self, total: int | None = None) -> None:
        self.total = whole(total)

    def step(self, engine: Any) -> None:
        heartbeat.step(engine.global_steps, total=self.total)

    def saved(self, engine: Any, save_dir: str, tag: str | None = None) -> bool:
        return heartbeat.checkpoint(
            os.path.join(save_dir, str(tag or f"global_step{engine.global_steps}"))
        )


def lightning_callback() -> Any:
    """A Lightning Callback reporting steps, the total and checkpoints (lightning, else
    pytorch_lightning)."""
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback
    return type("LaunchProgress", (LightningProgress, Callback), {})()


def hf_callback() -> Any:
    """A transformers TrainerCallback reporting steps, the total (max_steps) and each saved
    checkpoint."""
    from transformers import TrainerCallback

    return type("LaunchProgress", (HFProgress, TrainerCallback), {})()


class MemoryCheckpoints:
    """A rank's memory checkpoints of `states` (launchers.memckpt.MemCheckpoints, the workloads'
    own) for a user's loop; memory_checkpoints() makes it. Falsy, and every call a no-op, in a run
    launched without --memory-checkpoint. The rank's RNG streams (python, numpy, torch, CUDA) are
    kept and restored with the states."""

    def __init__(self, states: dict, log: Any = None, environ: Any = None) -> None:
        env = memckpt.RankEnv.from_environ(environ)
        self.states, self.progress = states, {}
        self.log = log or (
            functools.partial(print, flush=True) if env.rank == 0 else (lambda line: None)
        )
        self.mem = memckpt.MemCheckpoints.from_env(env, self.log, environ)
        self.ready = False

    def __bool__(self) -> bool:
        return self.mem is not None and self.mem.on

    def _setup(self) -> None:
        if not self.ready:
            self.mem.setup()  # collective: its gloo side group
            self.ready = True

    def restore(self, storage_step: int | None = None) -> int | None:
        """Collective, once, at the start (before storage is read): load the newest step every
        rank's state is held for in memory, no older than storage_step (the storage checkpoint the
        program would resume from; None: none), into the states -> that step; None: resume from
        storage (or start afresh). progress: what save() was given."""
        if self.mem is None:
            return None
        self._setup()
        got = self.mem.restore(storage_step, self.states)
        if got is None:
            return None
        self.progress = {k: v for k, v in got.items() if k not in ("step", "world_size")}
        return got["step"]

    def save(self, step: int, **progress: Any) -> bool:
        """Every rank after each step, `step` the steps done: every M-th keeps a copy (progress:
        small picklable values restored with it, e.g. epoch). True when it did."""
        if self.mem is None or not self.mem.due(step):
            return False
        self._setup()
        if not self.mem.on:
            return False
        self.mem.snapshot(step, self.states, progress)
        return True

    def close(self, finished: bool = True) -> None:
        """Before destroy_process_group: the last copy's transfer done; a finished run's copies
        go."""
        if self.mem is not None:
            self.mem.close(finished)


class _Whole:
    """A framework's memory copy as one state: take() reads the framework's own checkpoint of that
    moment (set by the hook that saves it); a restored one kept."""

    def __init__(self) -> None:
        self.take: Any = dict
        self.loaded: dict | None = None

    def state_dict(self) -> dict:
        return self.take()

    def load_state_dict(self, state: dict) -> None:
        self.loaded = state


class LightningMemory:
    """The hooks of the Lightning memory-checkpoint callback (lightning_memory_callback() mixes in
    Callback): every M steps Lightning's whole checkpoint kept in memory (launchers.memckpt);
    resume_from() restores it."""

    def __init__(self, environ: Any = None) -> None:
        self.whole = _Whole()
        self.handle = MemoryCheckpoints({"lightning": self.whole}, environ=environ)
        self.resume_path: str | None = None
        self.rng: dict | None = None

    def resume_from(self, ckpt_path: str | None = None) -> str | None:
        """Before trainer.fit (collective: every rank): the checkpoint to resume from -- memory's
        newest whole step when it is no older than ckpt_path's (Lightning's own checkpoint, written
        into the node's store for this rank), else ckpt_path. Starts torch.distributed's default
        group when it is not up (Lightning uses it)."""
        if self.handle.mem is None:
            return ckpt_path
        memckpt.init_dist()
        storage = memcodec.load_file(ckpt_path).get("global_step") if ckpt_path else None
        if self.handle.restore(storage) is None:
            return ckpt_path
        self.resume_path = os.path.join(
            self.handle.mem.store, f"resume-r{self.handle.mem.rank}.ckpt"
        )
        memcodec.write_file(self.whole.loaded, self.resume_path)
        self.whole.loaded, self.rng = None, memcodec.get_rng_state()  # set again at the batch start
        return self.resume_path

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.resume_path:  # loaded by now
            os.unlink(self.resume_path)
            self.resume_path = None

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """The copy is taken where a batch starts (the steps before it done, its own batch fetched):
        the point Lightning restarts a batch from; there the restored RNG streams are set once more
        after a restore (Lightning's resume drew from them since resume_from: its loader's iterator,
        fit's setup)."""
        if self.rng is not None:
            memcodec.set_rng_state(self.rng)
            self.rng = None
        elif trainer.global_step:  # Lightning's whole checkpoint: what ModelCheckpoint writes
            self.whole.take = lambda: trainer._checkpoint_connector.dump_checkpoint(
                weights_only=False
            )
            self.handle.save(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.handle.close(finished=True)


class HFMemory:
    """The hooks of the Transformers memory-checkpoint callback (hf_memory_callback() mixes in
    TrainerCallback): every M steps the model's, optimizer's and scheduler's states, the
    TrainerState and the rank's RNG in memory; resume_from() writes the newest whole step as a
    Trainer checkpoint directory into the node's store."""

    def __init__(self, environ: Any = None) -> None:
        self.whole = _Whole()
        self.handle = MemoryCheckpoints({"hf": self.whole}, environ=environ)
        self.resume_dir: str | None = None

    def resume_from(self, ckpt_dir: str | None = None) -> str | None:
        """Before trainer.train (collective): the checkpoint directory to resume from -- memory's
        newest whole step when it is no older than ckpt_dir's (its trainer_state.json's
        global_step), else ckpt_dir."""
        if self.handle.mem is None:
            return ckpt_dir
        memckpt.init_dist()
        storage = None
        if ckpt_dir:
            with open(os.path.join(ckpt_dir, "trainer_state.json"), encoding="utf-8") as f:
                storage = json.load(f)["global_step"]
        step = self.handle.restore(storage)
        if step is None:
            return ckpt_dir
        mem, got = self.handle.mem, self.whole.loaded
        self.resume_dir = os.path.join(mem.store, f"resume-r{mem.rank}")
        out = os.path.join(self.resume_dir, f"checkpoint-{step}")
        os.makedirs(out, exist_ok=True)
        rng = memcodec.get_rng_state()  # the restored streams, in the Trainer's own form (CPU ones)
        rng = {"python": rng["python"], "numpy": rng.get("numpy"), "cpu": rng["torch"]}
        for name, obj in (
            ("pytorch_model.bin", got["model"]),
            ("optimizer.pt", got["optimizer"]),
            ("scheduler.pt", got["scheduler"]),
            (f"rng_state_{mem.rank}.pth" if mem.world > 1 else "rng_state.pth", rng),
        ):
            if obj is not None:
                memcodec.write_file(obj, os.path.join(out, name))
        with open(os.path.join(out, "trainer_state.json"), "w", encoding="utf-8") as f:
            json.dump(got["trainer_state"], f, indent=2, sort_keys=True)
        self.whole.loaded = None
        return out

    def on_step_end(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        self.whole.take = lambda: {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
            "trainer_state": dataclasses.asdict(state),
        }
        self.handle.save(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.handle.close(finished=True)
        if self.resume_dir:
            shutil.rmtree(self.resume_dir, ignore_errors=True)


def memory_checkpoints(states: dict, log: Any = None) -> MemoryCheckpoints:
    """The one call for a plain PyTorch / DCP loop (see the module doc): states maps a name to an
    object with state_dict() and load_state_dict() (a module, an optimizer, a scheduler, a DCP
    Stateful). log: one line's printer (default: print on rank 0)."""
    return MemoryCheckpoints(states, log)


def deepspeed_memory_checkpoints(engine: Any, log: Any = None) -> MemoryCheckpoints:
    """The one call for a DeepSpeed loop (see the module doc), after deepspeed.initialize: the
    handle of memory_checkpoints() over the engine's own state (launchers.dsmemory.EngineState:
    ZeRO-1/2/3, restored bit-exactly at the same world size). An engine it cannot restore exactly
    (dsmemory.unsupported: an elastic checkpoint): falsy, every call a no-op, and one line on rank 0
    says so (storage checkpoints only)."""
    handle = MemoryCheckpoints({"engine": dsmemory.EngineState(engine)}, log)
    return dsmemory.storage_only_unless_exact(handle, engine)


def lightning_memory_callback() -> Any:
    """A Lightning Callback keeping memory checkpoints (--memory-checkpoint) of the whole training
    state every M steps; before fit, `trainer.fit(model,
    ckpt_path=cb.resume_from(storage_ckpt_path))` resumes from memory when it holds a newer whole
    step. A no-op in a run launched without the option."""
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback
    return type("LaunchMemoryCheckpoints", (LightningMemory, Callback), {})()


def hf_memory_callback() -> Any:
    """A transformers TrainerCallback keeping memory checkpoints (--memory-checkpoint) every M
    steps; before train,
    `trainer.train(resume_from_checkpoint=cb.resume_from(storage_checkpoint_dir))` resumes from
    memory when it holds a newer whole step. A no-op in a run launched without the option."""
    from transformers import TrainerCallback

    return type("LaunchMemoryCheckpoints", (HFMemory, TrainerCallback), {})()
