"""Preemption: SIGUSR2 (Slurm's warning before the time limit or a preemption) or SIGTERM asks the
job to write a checkpoint at the next step boundary and leave cleanly (exit 0); the next attempt
resumes from it.

Ranks receive the signal at slightly different moments, so they agree on it once per step with a
one-element all_reduce (MAX) and all stop after the same step.

A hang's stop (--hang-timeout) is no preemption: the launcher wrote hang/attempt<A>/stop.json and
ended the hung ranks (SIGKILL) before the stop reached this one (launchers.heartbeat.hang_stop), so
an agreement with them cannot happen -- a collective under way fails at once. Then no checkpoint is
agreed or written: the last good one stands; the loop cleans up (fit: HangStop) and the rank leaves
with exit 0.
"""

from __future__ import annotations

import signal

SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
_requested: list[int] = []


class HangStop(Exception):
    """This rank's part of a hang's stop: leave without the agreed checkpoint (dist.run_worker exits
    0)."""


def hang_stop() -> dict | None:
    """The launcher's record of this attempt's hang stop (its `hung_ranks`), None for any other stop
    or none."""
    from launchers import heartbeat

    return heartbeat.hang_stop()


def _on_signal(signum, _frame) -> None:
    if not _requested:
        name = signal.Signals(signum).name
        stop = hang_stop() if signum == signal.SIGTERM else None
        print(
            f"hang stop: got {name}; hung rank(s) {stop.get('hung_ranks')} ended, no agreed "
            "checkpoint"
            if stop
            else f"preemption: got {name}; checkpointing at the next step boundary",
            flush=True,
        )
    _requested.append(signum)


def install() -> None:
    """Call before importing torch: a signal may come while the worker is still starting."""
    for s in SIGNALS:
        signal.signal(s, _on_signal)


def agreed(device) -> bool:
    """True on every rank once any rank has been asked to stop (collective: all ranks must call it).
    HangStop on a hang's stop: no agreement (the hung ranks are gone)."""
    if _requested and hang_stop() is not None:
        raise HangStop("hang stop")
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if _requested else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0
