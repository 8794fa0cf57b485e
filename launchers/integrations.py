"""Progress from the frameworks people use, reported through launchers.heartbeat: each step, the total when the
framework knows it (`launch top`'s ETA) and each complete checkpoint (`checkpoints/latest`, what `launch status`
shows as `checkpoint:`; only for checkpoints written directly into $LAUNCH_CHECKPOINT_DIR).

    # PyTorch Lightning
    trainer = L.Trainer(..., callbacks=[integrations.lightning_callback(), ModelCheckpoint(dirpath=ckpt_dir)])
    # Hugging Face Transformers (output_dir=$LAUNCH_CHECKPOINT_DIR: checkpoint-<N>/ there)
    Trainer(..., args=TrainingArguments(output_dir=ckpt_dir), callbacks=[integrations.hf_callback()])
    # a DeepSpeed loop
    progress = integrations.DeepSpeedProgress(total=steps)
    for batch in loader:
        ...; engine.step(); progress.step(engine)
    engine.save_checkpoint(ckpt_dir, tag); progress.saved(engine, ckpt_dir, tag)

The frameworks are imported only when a callback is made (never at `import launchers...`); the hook methods
read only the few attributes named in them, so they are tested with small stand-ins. Outside a `launch` run
every report is a no-op (launchers.heartbeat).
"""
from __future__ import annotations

import math
import os
from typing import Any

from . import heartbeat


def whole(n: Any) -> int | None:
    """A usable total: a positive finite whole number, else None (Lightning's -1 and inf: unknown)."""
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
        self.total = whole(trainer.max_steps) or whole(getattr(trainer, "estimated_stepping_batches", None))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        heartbeat.step(trainer.global_step, total=self.total)
        self.report_checkpoints(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.report_checkpoints(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.report_checkpoints(trainer)

    def report_checkpoints(self, trainer: Any) -> None:
        """Rank 0: the newest checkpoint file its ModelCheckpoints wrote (their last and best paths), once."""
        if not trainer.is_global_zero:
            return
        paths = [p for cb in getattr(trainer, "checkpoint_callbacks", None) or []
                 for p in (getattr(cb, "last_model_path", ""), getattr(cb, "best_model_path", "")) if p]
        paths = [p for p in paths if os.path.exists(p)]
        newest = max(paths, key=os.path.getmtime) if paths else None
        if newest and newest != self.reported:
            heartbeat.checkpoint(newest)
            self.reported = newest


class HFProgress:
    """The hooks of the Transformers callback (hf_callback() mixes in transformers' TrainerCallback)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        heartbeat.step(state.global_step, total=whole(state.max_steps))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:          # Trainer's own name for a checkpoint: checkpoint-<global step>
            heartbeat.checkpoint(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))


class DeepSpeedProgress:
    """For a plain DeepSpeed loop: step(engine) after engine.step(); saved(engine, dir, tag) after
    engine.save_checkpoint(dir, tag) (tag None: DeepSpeed's own, global_step<N>)."""

    def __init__(self, total: int | None = None) -> None:
        self.total = whole(total)

    def step(self, engine: Any) -> None:
        heartbeat.step(engine.global_steps, total=self.total)

    def saved(self, engine: Any, save_dir: str, tag: str | None = None) -> bool:
        return heartbeat.checkpoint(os.path.join(save_dir, str(tag or f"global_step{engine.global_steps}")))


def lightning_callback() -> Any:
    """A Lightning Callback reporting steps, the total and checkpoints (lightning, else pytorch_lightning)."""
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback
    return type("LaunchProgress", (LightningProgress, Callback), {})()


def hf_callback() -> Any:
    """A transformers TrainerCallback reporting steps, the total (max_steps) and each saved checkpoint."""
    from transformers import TrainerCallback
    return type("LaunchProgress", (HFProgress, TrainerCallback), {})()
