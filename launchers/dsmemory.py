"""A DeepSpeed engine's state for the memory checkpoints (--memory-checkpoint: launchers.memckpt),
through integrations.deepspeed_memory_checkpoints(engine) -- the one call of a user's DeepSpeed
loop, and the DeepSpeed workload's (workloads.deepspeed_zero): what engine.save_checkpoint writes
for this rank and engine.load_checkpoint reads back at the same world size, without files. Rank
side: torch is imported inside the functions that use it, never when the launcher is imported
(tests/test_layers.py: RANK_SIDE); deepspeed itself is not imported (the engine's own methods).

EngineState is one Stateful (state_dict/load_state_dict): the module's state dict (ZeRO-1/2: every
rank's weights whole; ZeRO-3: its buffers only, the parameters being the partitions the optimizer
restores), this rank's ZeRO optimizer partition as DeepSpeed's optimizer.state_dict() gives it (the
fp32 master partition and the base optimizer's moments; loss scaler, paddings), the LR scheduler
when the engine has one, and the engine's counters (global_steps, global_samples, skipped_steps).
Loading is engine.load_checkpoint's own sequence for a rigid checkpoint (runtime/engine.py
load_checkpoint: ZeRO-3's checkpoint_event_prologue, _load_checkpoint's module state dict, scheduler
and counters, _load_zero_checkpoint, the epilogue) with a state-dict list in which only this rank's
entry is set -- the rigid load reads state_dict_list[dp rank] alone (runtime/zero/stage_1_and_2.py
_load_legacy_checkpoint, stage3.py _rigid_load_state_dict, bf16_optimizer.py) -- and the fp32
partition copied as it was (load_from_fp32_weights: no rounding through the module's weights). So
the resumed run is bit-identical to an uninterrupted one.

unsupported(engine): why a memory checkpoint of this engine cannot be restored exactly (an elastic
checkpoint, whose load merges every rank's partitions), or "" -- storage_only_unless_exact then
turns the handle off (falsy, every call a no-op): storage checkpoints only, said in one line.
"""

from __future__ import annotations

import pickle
from typing import Any


def unsupported(engine: Any) -> str:
    """ "" when EngineState restores this engine bit-exactly, else why not (one clause)."""
    stage = engine.zero_optimization_stage()
    if stage not in (1, 2, 3):
        return f"DeepSpeed ZeRO stage {stage}: memory restore is done for stages 1, 2 and 3 only"
    if engine.zero_elastic_checkpoint():
        return (
            "DeepSpeed zero_optimization.elastic_checkpoint is on (its load merges every "
            "rank's partitions)"
        )
    return ""


def storage_only_unless_exact(handle: Any, engine: Any) -> Any:
    """--memory-checkpoint on an engine EngineState cannot restore exactly: the handle
    (integrations.MemoryCheckpoints) turned off before the loop takes a copy -- falsy, every call a
    no-op --, said in one line at start (its log: rank 0); storage checkpoints go on. Every rank
    decides alike (the same config). -> the handle."""
    why = unsupported(engine)
    if why and handle.mem is not None:
        handle.mem = None
        handle.log(f"memory checkpoint: off ({why}); storage checkpoints only")
    return handle


class EngineState:
    """This rank's engine state (module doc) as a Stateful for launchers.memckpt."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def state_dict(self) -> dict:
        e = self.engine
        sched = e.lr_scheduler
        module = e.module_state_dict()
        # ZeRO-3: the parameters are the optimizer's partitions
        if e.zero_optimization_partition_weights():
            params = {name for name, _ in e.module.named_parameters()}
            module = {k: v for k, v in module.items() if k not in params}
        return {
            "module": module,
            "optimizer": e.optimizer.state_dict(),
            "lr_scheduler": pickle.dumps(sched.state_dict()) if sched is not None else None,
            "global_steps": e.global_steps,
            "global_samples": e.global_samples,
            "skipped_steps": e.skipped_steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        """engine.load_checkpoint's sequence (module doc); collective under ZeRO-3 (its epilogue
        gathers the persistent parameters), as the handle's restore is."""
        import torch.distributed as dist

        e = self.engine
        if e._optimizer_has_ckpt_event_prologue():  # ZeRO-3: every parameter partitioned
            e.optimizer.checkpoint_event_prologue()
        e.module.load_state_dict(sd["module"], strict=not e.zero_optimization_partition_weights())
        if sd["lr_scheduler"] is not None and e.lr_scheduler is not None:
            e.lr_scheduler.load_state_dict(pickle.loads(sd["lr_scheduler"]))
        e.global_steps, e.global_samples, e.skipped_steps = (
            sd["global_steps"],
            sd["global_samples"],
            sd["skipped_steps"],
        )
        group = e.optimizer.dp_process_group
        mine: list = [None] * dist.get_world_size(group=group)
        mine[dist.get_rank(group=group)] = sd["optimizer"]
        e.optimizer.load_state_dict(
            state_dict_list=mine,
            load_optimizer_states=True,
            load_from_fp32_weights=True,
            checkpoint_folder=None,
        )
        if e._optimizer_has_ckpt_event_epilogue():
            e.optimizer.checkpoint_event_epilogue()
