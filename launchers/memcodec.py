"""A rank's state as one byte string for the in-memory checkpoints (--memory-checkpoint:
launchers.memckpt).

pack() copies a state (nested dicts, lists and tuples of tensors and small python data) into bytes:
its skeleton pickled, each tensor replaced by where its bytes lie, then every tensor's bytes in CPU
memory, aligned -- one copy, where torch.save spends ~3 ms per 0.5 MB of small tensors (its zip
records). A DTensor (FSDP2's sharded parameters and optimizer state) is packed as this rank's local
shard only: a memory checkpoint is loaded by the same world size, each rank its own shards. unpack()
is the inverse, every tensor its own copy; a shard becomes a DTensor again on the mesh and
placements of the tensor at the same place in the state it is loaded into (template).
get_rng_state()/set_rng_state(): a rank's RNG streams, kept with its state (the workloads' storage
checkpoints too). load_file()/write_file(): a state as a torch.save file (the Lightning and Trainer
integrations' checkpoints).
"""

from __future__ import annotations

import math
import os
import pickle
import random
import struct
from typing import Callable, NamedTuple

ALIGN = 16
PLAIN = frozenset({int, float, str, bool, bytes, type(None)})  # never holds a tensor


class _T(NamedTuple):
    """Where a tensor of a packed state lies in its body."""

    offset: int
    dtype: object
    shape: tuple


class _D(NamedTuple):
    """A DTensor of a packed state: its local shard (rebuilt on the template's mesh and
    placements)."""

    local: _T


def get_rng_state() -> dict:
    """This rank's RNG streams: python's, numpy's (when installed), torch's CPU and, once
    initialized, CUDA's."""
    import torch

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def is_dtensor(o) -> bool:
    return hasattr(o, "to_local") and hasattr(o, "device_mesh") and hasattr(o, "placements")


def pack(payload) -> bytes:
    """A state as bytes, a copy that shares nothing with training (see the module doc)."""
    import torch

    parts: list = []
    at = [0]

    def tensor(o) -> _T:
        raw = (
            o.detach().to("cpu").reshape(-1).view(torch.uint8)
            if o.numel()
            else torch.empty(0, dtype=torch.uint8)
        )
        pad = -raw.numel() % ALIGN
        parts.extend([memoryview(raw.numpy()), b"\0" * pad])  # join() below: the one copy
        at[0] += raw.numel() + pad
        return _T(at[0] - raw.numel() - pad, o.dtype, tuple(o.shape))

    def strip(o):
        if type(o) in PLAIN:  # first: python's RNG state alone is 625 ints
            return o
        if isinstance(o, torch.Tensor):
            return _D(tensor(o.to_local())) if is_dtensor(o) else tensor(o)
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)) and not hasattr(o, "_fields"):
            if set(map(type, o)) <= PLAIN:
                return o
            return type(o)(strip(v) for v in o)
        return o

    head = pickle.dumps(strip(payload), protocol=5)
    body = b"".join(parts)  # (torch.cat of many small uint8 tensors: ~40 ms for 0.5 MB)
    pad = -(8 + len(head)) % ALIGN
    return struct.pack("<Q", len(head)) + head + b"\0" * pad + body


def unpack(data: bytes, template: Callable[[], object] | None = None):
    """pack()'s inverse; every tensor its own copy. template(): the state loaded into (called once,
    at the first DTensor shard): its DTensor at the shard's place gives the mesh, placements, global
    shape and device."""
    import torch

    (n,) = struct.unpack_from("<Q", data)
    start = 8 + n + (-(8 + n) % ALIGN)
    body = (
        torch.frombuffer(bytearray(data[start:]), dtype=torch.uint8) if len(data) > start else None
    )
    root: list = []

    def tensor(o: _T):
        size = math.prod(o.shape) * torch.empty(0, dtype=o.dtype).element_size()
        return body[o.offset : o.offset + size].view(o.dtype).reshape(o.shape).clone()

    def fill(o, path: tuple):
        if isinstance(o, _D):
            return shard(tensor(o.local), path, root, template)
        if isinstance(o, _T):
            return tensor(o)
        if isinstance(o, dict):
            return {k: fill(v, path + (k,)) for k, v in o.items()}
        if isinstance(o, (list, tuple)) and not hasattr(o, "_fields"):
            return type(o)(fill(v, path + (i,)) for i, v in enumerate(o))
        return o

    return fill(pickle.loads(data[8 : 8 + n]), ())


def shard(local, path: tuple, root: list, template: Callable[[], object] | None):
    """A packed local shard as a DTensor like the template's at `path` (same local shape: the same
    sharding)."""
    if not root:
        root.append(template() if template else None)
    like = root[0]
    for key in path:
        try:
            like = like[key]
        except (KeyError, IndexError, TypeError):
            like = None
            break
    where = "/".join(map(str, path))
    if not is_dtensor(like):
        raise ValueError(
            f"memory checkpoint: {where} is a DTensor shard, the state it is loaded into has "
            "none there"
        )
    mine = like.to_local()
    if tuple(mine.shape) != tuple(local.shape):
        raise ValueError(
            f"memory checkpoint: {where}'s shard has shape {tuple(local.shape)}, this rank's "
            f"{tuple(mine.shape)} (sharded otherwise)"
        )
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local.to(mine.device),
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def load_file(path: str):
    """A torch.save file's object (memory-mapped: reading its step costs little); write_file() the
    inverse."""
    import torch

    return torch.load(path, map_location="cpu", mmap=True, weights_only=False)


def write_file(obj, path: str) -> None:
    import torch

    torch.save(obj, f"{path}.tmp-{os.getpid()}")
    os.replace(f"{path}.tmp-{os.getpid()}", path)
