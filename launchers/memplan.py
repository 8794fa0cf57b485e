"""The plan of the in-memory checkpoints (--memory-checkpoint, launchers.memckpt): how often they
copy (Cadence), and which step a restore loads from whom (choose, why_storage).

--memory-checkpoint-every M: every M-th step, fixed. --memory-checkpoint alone (auto): every step
while the first copies are measured, then every step still when a copy costs at most BUDGET of a
step, else every M steps, the smallest M that keeps the copies within BUDGET of the training time.
A copy's cost: the training thread's time in it (the pack, a wait for the previous copy's transfer)
plus the copying thread's CPU (it takes a core training could use: on a CPU-bound step directly, on
a GPU node the host's). Measured on the copies after the first (whose budget check and first
allocations are not a copy's cost) up to the WINDOW-th; every rank proposes its M, the largest is
agreed (memckpt: collective, the same step on every rank), so a lost node rolls back at most M
steps, said in one line. Pure: no torch (the tests drive it with numbers).
"""

from __future__ import annotations

import math

BUDGET = 0.0025  # auto: the copies' share of the training time, at most
WINDOW = 10  # auto: copies 1..WINDOW-1 (0-based) measured; the agreement at copy WINDOW


class Cadence:
    """One rank's cadence: every = M (fixed), or None (auto, see the module doc)."""

    def __init__(self, every: int | None) -> None:
        self.auto = every is None
        self.every = every or 1
        # the measured copies' cost: the training thread's part, the copying thread's (two sums:
        # two threads add to them)
        self.main_s, self.background_s = 0.0, 0.0
        self.start: tuple[int, float] | None = None  # (step, time) at the first measured copy

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def measuring(self, copy: int) -> bool:
        """Copy number `copy` (0-based) counts toward the auto decision."""
        return self.auto and 1 <= copy < WINDOW

    def add(self, copy: int, step: int, began: float, spent_s: float) -> None:
        """The training thread's part of copy `copy` (begun at `began`, at step `step`)."""
        if self.measuring(copy):
            self.start = self.start or (step, began)
            self.main_s += spent_s

    def add_background(self, copy: int, cpu_s: float) -> None:
        """The copying thread's CPU for copy `copy`."""
        if self.measuring(copy):
            self.background_s += cpu_s

    def deciding(self, copy: int) -> bool:
        """Copy `copy` is where every rank agrees on M (auto only, once)."""
        return self.auto and copy == WINDOW and self.start is not None

    def propose(self, step: int, now: float) -> tuple[int, float, float]:
        """At copy WINDOW (step `step`, time `now`): -> (this rank's M, a copy's mean cost, a step's
        mean time) over the measured copies."""
        first_step, first_t = self.start or (step, now)
        steps = max(step - first_step, 1)
        step_s = max(now - first_t, 1e-9) / steps
        cost = (self.main_s + self.background_s) / (WINDOW - 1)
        return max(1, math.ceil(cost / (BUDGET * step_s))), cost, step_s

    def agreed(self, every: int) -> None:
        """Every rank's largest proposal: the cadence from now on (auto ends)."""
        self.every, self.auto = every, False


def line(every: int, step: int, cost_s: float, step_s: float) -> str:
    """Rank 0's line when auto chose M."""
    steps = "step" if every == 1 else f"{every} steps"
    return (
        f"memory checkpoint: from step {step} every {steps} (auto: a copy costs "
        f"{cost_s * 1e3:.1f} ms, {cost_s / step_s:.1%} of a {step_s * 1e3:.0f} ms step; copies "
        f"kept within {BUDGET:.2%} of the training time): a loss rolls back at most {steps}; "
        "--memory-checkpoint-every M to choose"
    )


def choose(
    held: list[list[tuple[int, int]]], world: int, storage_step: int | None
) -> tuple[int | None, dict]:
    """Pure: held[q] = the (owner rank, step) copies rank q can read. -> (the newest step, no older
    than storage_step, for which every owner 0..world-1 is held somewhere; {owner: the rank that
    reads it}: the owner itself when it holds its own state, else the lowest rank holding it).
    (None, {}): storage (or a fresh start)."""
    holders: dict[tuple[int, int], list[int]] = {}
    for q, pairs in enumerate(held):
        for owner, step in pairs:
            holders.setdefault((owner, step), []).append(q)
    steps = sorted({s for _, s in holders}, reverse=True)
    for step in steps:
        if storage_step is not None and step < storage_step:
            break
        if all((r, step) in holders for r in range(world)):
            return step, {
                r: r if r in holders[(r, step)] else min(holders[(r, step)]) for r in range(world)
            }
    return None, {}


def why_storage(held: list[list[tuple[int, int]]], world: int, storage_step: int | None) -> str:
    """One line: why choose() found nothing in memory."""
    if not any(held):
        return "no memory checkpoint on any node"
    newest = max(s for pairs in held for _, s in pairs)
    if storage_step is not None and newest < storage_step:
        return f"memory's newest step {newest} is older than storage's {storage_step}"
    lost = sorted(
        {r for r in range(world) if not any(o == r and s == newest for p in held for o, s in p)}
    )
    return (
        f"step {newest} of rank(s) {lost} is gone from memory (its node and the peer holding "
        "its copy both lost)"
    )
