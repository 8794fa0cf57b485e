"""Preemption: SIGUSR2 (Slurm's warning before the time limit or a preemption) or SIGTERM asks the job to
write a checkpoint at the next step boundary and leave cleanly (exit 0); the next attempt resumes from it.

Ranks receive the signal at slightly different moments, so they agree on it once per step with a one-element
all_reduce (MAX) and all stop after the same step.
"""
from __future__ import annotations

import signal

SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
_requested: list[int] = []


def _on_signal(signum, _frame) -> None:
    if not _requested:
        print(f"preemption: got {signal.Signals(signum).name}; checkpointing at the next step boundary", flush=True)
    _requested.append(signum)


def install() -> None:
    """Call before importing torch: a signal may come while the worker is still starting."""
    for s in SIGNALS:
        signal.signal(s, _on_signal)


def agreed(device) -> bool:
    """True on every rank once any rank has been asked to stop (collective: all ranks must call it)."""
    import torch
    import torch.distributed as dist
    flag = torch.tensor([1.0 if _requested else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0
