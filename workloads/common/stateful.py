"""The Stateful objects the workloads' checkpoints save and load (workloads.common.checkpoint, and
the memory checkpoints: launchers.memckpt): a model and its optimizer(s) through torch's distributed
state-dict API (ModelOptimState), any object whose state is small python data (PickledState: an lr
scheduler); seed_all. They satisfy DCP's runtime-checkable Stateful protocol (state_dict +
load_state_dict) without importing DCP (~1.7 s: it is imported at the first save or load)."""

from __future__ import annotations

import pickle
import random

import numpy as np
import torch


class ModelOptimState:
    """Model (DDP/FSDP/plain) + optimizer(s) through the distributed state-dict API.

    A plain opt.state_dict() as load target is silently wrong: a fresh optimizer has no `state`
    entries, DCP only fills keys present in the target, so exp_avg/exp_avg_sq/step never load.
    """

    def __init__(self, model, optimizers) -> None:
        self.model, self.optimizers = model, optimizers
        self._model_sd = None  # the model's state dict of the last save, and what it was taken from
        self._model_key = None

    def state_dict(self):
        """The model part is reused from the previous save while every parameter and buffer is still
        the same storage with the same shape: its values are views of that storage, so they are
        current (optimizers and buffers update in place). Taking it anew costs ~1 ms per DTensor
        (detach through DTensor dispatch), which is most of the time save_async blocks training. The
        optimizer part is always new (param_groups hold plain numbers such as the scheduled lr)."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        key = _storage_key(self.model)
        if key is None or key != self._model_key:
            self._model_sd, self._model_key = get_model_state_dict(self.model), key
        return {
            "model": self._model_sd,
            "optim": get_optimizer_state_dict(self.model, self.optimizers),
        }

    def load_state_dict(self, state_dict) -> None:
        """dcp.load hands back the dict state_dict() returned, i.e. the cached model part.
        set_state_dict renames a wrapped model's keys in that dict in place (DDP: "conv1.weight" ->
        "module.conv1.weight", torch/distributed/checkpoint/state_dict.py _load_model_state_dict),
        so it gets a copy: the cache keeps the wrapper-free keys every checkpoint has, whichever
        attempt writes it."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(
            self.model,
            self.optimizers,
            model_state_dict=dict(state_dict["model"]),
            optim_state_dict=state_dict["optim"],
        )


def _storage_key(model) -> tuple | None:
    """(name, storage address, offset, shape, stride) of every tensor in
    model.state_dict(keep_vars=True); None (never reuse) when the state dict holds anything else
    (extra state)."""
    out = []
    for name, v in model.state_dict(keep_vars=True).items():
        # a DTensor's local shard (FSDP2), else the tensor itself
        t = getattr(v, "_local_tensor", v)
        if not isinstance(t, torch.Tensor):
            return None
        out.append(
            (name, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        )
    return tuple(out)


class PickledState:
    """Any object with state_dict()/load_state_dict() whose state is small python data (lr
    scheduler)."""

    def __init__(self, obj) -> None:
        self.obj = obj

    def state_dict(self):
        return {"pickle": pickle.dumps(self.obj.state_dict())}

    def load_state_dict(self, state_dict) -> None:
        self.obj.load_state_dict(pickle.loads(state_dict["pickle"]))


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
