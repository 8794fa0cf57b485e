"""Helpers for bench scripts: timing side by side in one run, and the one output line per figure."""

from __future__ import annotations

import compileall
import os
import statistics
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# BENCH_TINY=1: the tiny form `make test` runs (tests/test_bench_tiny.py): every code path of the
# script once, on the smallest inputs, one round and no warm-up; its figures mean nothing, only that
# the script still works.
TINY = os.environ.get("BENCH_TINY") == "1"


def rounds(n: int, env: str = "BENCH_ROUNDS") -> int:
    """How many interleaved rounds: BENCH_ROUNDS when set, else n; 1 in the tiny form."""
    return 1 if TINY else int(os.environ.get(env, str(n)))


def compile_project() -> None:
    """Write the project's bytecode first. pip writes it for installed packages (torch, submitit,
    ...), but not for this editable checkout, and under PYTHONDONTWRITEBYTECODE=1 every `launch`
    would compile its modules again (~30-40 ms): the figures are for an installed launcher, as users
    run it."""
    for pkg in ("launchers", "workloads", "nccl_tuning"):
        compileall.compile_dir(os.path.join(ROOT, pkg), quiet=1)


def figure(name: str, ours: float, reference: float, goal: str, unit: str = "ms") -> None:
    """One line per figure: name, ours, reference, ratio, goal (ratio = ours / reference): the goal
    it is held to, from the table of issue 38 where it has a line (e.g. "<= 1.05")."""
    ratio = ours / reference if reference else float("inf")
    # a 1% goal needs more than 2 decimals
    shown = f"{ratio:5.2f}" if ratio >= 0.1 else f"{ratio:.4f}"
    print(
        f"{name:44s} ours={ours:9.1f}{unit}  ref={reference:9.1f}{unit}  ratio={shown}  goal "
        f"{goal}",
        flush=True,
    )


def interleaved(
    cases: dict[str, Callable[[], float]], rounds: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Run each case once per round, round-robin, so drift on a noisy machine hits all cases alike
    (no warm-up round in the tiny form)."""
    warmup = 0 if TINY else warmup
    out: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(warmup + rounds):
        for name, fn in cases.items():
            v = fn()
            if r >= warmup:
                out[name].append(v)
        print(f"  round {r + 1}/{warmup + rounds} done", file=sys.stderr, flush=True)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
