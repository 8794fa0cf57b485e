"""Helpers for models whose parameters are not replicated on every rank (FSDP2 DTensors).

full_param_sha256(model) is the sharded twin of metrics.param_sha256: every DTensor parameter is
gathered with full_tensor() (a collective: call it on every rank), then hashed exactly like
param_sha256 does, so the hash of an FSDP model equals the hash of the same weights unsharded and
does not depend on how many ranks hold the shards.
"""

from __future__ import annotations

import hashlib


def full_param_sha256(module) -> str:
    import torch

    h = hashlib.sha256()
    for name, p in module.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        h.update(name.encode())
        h.update(t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def local_numel(module) -> int:
    """Elements of the parameters this rank actually stores (the local shard of a DTensor)."""
    n = 0
    for p in module.parameters():
        n += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return n
