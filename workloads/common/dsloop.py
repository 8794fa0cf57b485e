"""DeepSpeed's engine plugged into loop.fit(): its forward/backward/step and its own checkpoints.

DeepSpeedSteps is fit()'s `steps` (the attributes of loop.TorchSteps) and DeepSpeedCheckpointer its
checkpointer (the interface of checkpoint.Checkpointer that fit uses). So a DeepSpeed run gets what
every workload gets from the one loop: sampler position, logging, fault injection, resume from
`latest`, and the agreed stop (USR2/SIGTERM -> checkpoint at the next step, exit 0, the next attempt
resumes).

Checkpoints: engine.save_checkpoint into `<checkpoint dir>/step-<N>/` (DeepSpeed's own `latest` is
not written), client state = progress + every rank's RNG state (gathered); then rank 0 writes
launch_meta.json, the manifest and the atomic `latest` pointer (launchers.ckptptr.commit; a resume
verifies it, as checkpoint.resolved does for DCP). A ZeRO checkpoint loads as is only at its own
world size; at another one rank 0 first converts it to DeepSpeed's universal format next to it
(workloads/common/dsuniversal.py) and every rank loads that (RNG re-seeded, data offset rounded, as
the loop does for any resharded resume); a checkpoint that cannot be converted is a one-line error
on every rank naming its path.
"""

from __future__ import annotations

import json
import os
import pickle
import time

import torch.distributed as dist
import torch.nn.functional as F

from launchers.ckptptr import commit
from launchers.records import fence

from .checkpoint import get_rng_state, resolved, set_rng_state, step_name
from .dsuniversal import convert
from .metrics import write_json_atomic

META = "launch_meta.json"


class DeepSpeedSteps:
    """fit()'s hooks for a DeepSpeed engine (see loop.TorchSteps). `meta` goes into
    launch_meta.json."""

    eval_each_epoch = False  # DeepSpeed runs evaluate once, at the end

    def __init__(self, engine, dtype, meta: dict, memory=None) -> None:
        self.engine, self.dtype, self.meta = engine, dtype, meta
        # --memory-checkpoint: integrations.deepspeed_memory_checkpoints(engine)'s handle
        self.memory = memory

    def train(self) -> None:
        self.engine.train()

    def forward(self, xb, yb):
        logits = self.engine(xb.to(self.dtype)).float()
        return F.cross_entropy(logits, yb), logits

    def backward(self, loss) -> None:
        self.engine.backward(loss)  # the engine zeroes the gradients in its step

    def step(self) -> None:
        self.engine.step()

    def lr(self) -> float:
        return self.engine.get_lr()[0]

    def checkpointer(self, env, fault, log) -> "DeepSpeedCheckpointer":
        return DeepSpeedCheckpointer(self.engine, env, fault=fault, meta=self.meta, log=log)

    def states(self) -> dict:
        """The engine saves model, optimizer and its own state into its storage checkpoints itself,
        and the memory checkpoints keep this rank's part of it through their handle
        (memory_checkpoints)."""
        return {}

    def memory_checkpoints(self) -> "HandleMemory | None":
        """The loop's memory checkpoints over the handle a user's DeepSpeed program has too
        (launchers.integrations.deepspeed_memory_checkpoints: launchers.dsmemory.EngineState);
        None when it is off (launched without --memory-checkpoint, or an engine it cannot restore
        exactly)."""
        if self.memory is None or self.memory.mem is None:
            return None
        return HandleMemory(self.memory)

    def new_budget(self, total: int) -> str | None:
        return None  # no lr schedule to stretch


class HandleMemory:
    """What the loop calls on its memory checkpoints (launchers.memckpt.MemCheckpoints: setup,
    restore, due, snapshot, close, summary), done through the public handle's restore, save and
    close as a user's loop calls them; the state kept is the handle's (the engine's), not the
    loop's `states`."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def setup(self) -> None:
        """Nothing: the handle's restore sets up (collective)."""

    def restore(self, storage_step: int | None, states: dict) -> dict | None:
        step = self.handle.restore(storage_step)
        if step is None:
            return None
        return dict(self.handle.progress, step=step, world_size=self.handle.mem.world)

    def due(self, step: int) -> bool:
        return self.handle.mem.due(step)

    def snapshot(self, step: int, states: dict, progress: dict) -> None:
        self.handle.save(step, **progress)

    def close(self, finished: bool) -> None:
        self.handle.close(finished)

    def summary(self) -> dict:
        return self.handle.mem.summary()


def read_meta(path: str) -> dict:
    with open(os.path.join(path, META), encoding="utf-8") as f:
        return json.load(f)


class DeepSpeedCheckpointer:
    """What fit() calls on a checkpointer, over engine.save_checkpoint / load_checkpoint (module
    doc). Periodic saves are synchronous: there is no save_async (--async-checkpoint is not
    offered)."""

    def __init__(self, engine, env, *, fault, meta: dict, log=print) -> None:
        self.engine, self.env, self.dir, self.fault, self.meta = (
            engine,
            env,
            env.checkpoint_dir,
            fault,
            meta,
        )
        self.log = log
        self.last_saved_step: int | None = None
        self.save_seconds = 0.0
        self.universal: str | None = None  # the universal checkpoint to load instead (resharding)

    def latest_name(self) -> str | None:
        """`latest` as verified by rank 0 (checkpoint.resolved: a damaged one is skipped for the
        newest complete earlier one, or every rank stops naming the damaged file), broadcast.
        Written at another world size: rank 0 converts it to the universal format (dsuniversal)
        while the others wait in the broadcast; a failure stops every rank."""
        name, meta = resolved(self.dir, self.env.rank, (META,), self.log, read=read_meta)
        if name is None:
            return None
        if meta["world_size"] != self.env.world_size:
            self.universal = self.reshard(name, meta)
        return name

    def reshard(self, name: str, meta: dict) -> str:
        """The universal checkpoint's name for `name` (converted by rank 0 unless done before).
        Collective."""
        box = [convert(self.dir, name, meta) if self.env.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        if isinstance(box[0], str):
            raise SystemExit(f"error: {box[0]}")
        target, seconds = box[0]
        how = f"converted in {seconds:.1f}s" if seconds else "converted before, reused"
        self.log(
            f"reshard: checkpoint {name} was written by {meta['world_size']} ranks, this attempt "
            f"has {self.env.world_size}: loading DeepSpeed universal checkpoint {target} ({how})"
        )
        return target

    def load(self, name: str, states: dict) -> tuple[dict, bool]:
        """Engine state and progress; this rank's RNG only at the same world size (else the loop
        re-seeds). A resharded load reads the universal folder with the engine's `load_universal`
        switch on. Collective."""
        tag = self.universal or name
        cfg = self.engine._config  # DeepSpeed reads its load_universal switch at load time only
        before, cfg.load_universal_checkpoint = cfg.load_universal_checkpoint, bool(self.universal)
        try:
            loaded, client = self.engine.load_checkpoint(self.dir, tag=tag)
        finally:
            cfg.load_universal_checkpoint = before
        if loaded is None:
            raise SystemExit(
                f"error: DeepSpeed could not load checkpoint {os.path.join(self.dir, tag)}"
            )
        progress = client["progress"]
        self.last_saved_step = progress["step"]
        if self.universal:
            return progress, False
        set_rng_state(pickle.loads(client["rng"][self.env.rank]))
        return progress, True

    def save(self, step: int, states: dict, progress: dict) -> str:
        """engine.save_checkpoint, then launch_meta.json and `latest` (rank 0) between barriers.
        Collective."""
        t0 = time.perf_counter()
        name, W = step_name(step), self.env.world_size
        # an older attempt: Fenced
        fence.require_env(f"the checkpoint save of {name} by rank {self.env.rank}")
        rngs: list = [None] * W
        dist.all_gather_object(rngs, pickle.dumps(get_rng_state()))
        progress = dict(progress, step=step, world_size=W)
        self.fault.maybe(step, "pre_save")
        self.engine.save_checkpoint(
            self.dir, tag=name, client_state={"progress": progress, "rng": rngs}, save_latest=False
        )
        self.fault.maybe(step, "save")
        dist.barrier()
        if self.env.rank == 0:
            write_json_atomic(
                os.path.join(self.dir, name, META), {"world_size": W, "step": step, **self.meta}
            )
            commit(self.dir, name)  # the manifest (launch_meta.json included), then `latest`
        dist.barrier()
        self.fault.maybe(step, "after_save")
        self.last_saved_step = step
        self.save_seconds += time.perf_counter() - t0
        return name

    def finalize(self) -> None:
        """Nothing pending: every save is synchronous."""

    def close(self) -> None:
        """Nothing to release."""
