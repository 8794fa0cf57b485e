"""--sweep: one normal run per combination of values, all under one sweep dir (pure expansion and
naming).

    launch slurm ... --sweep lr=1e-3,3e-4 --sweep seed=1,2      -> 4 runs, run k's program args + `--lr V --seed W`
    <sweep dir>/sweep.json            the sweep record: the axes, and per run its index, label, args
                                      and run dir
    <sweep dir>/<k>-<label>/          run k: a normal run dir (run.yaml, status.json, logs,
                                      checkpoints, ...)
    <sweep dir>/slurm/                the Slurm array's own files (script output, submitit's
                                      pickles)

Combinations go in order: the first --sweep varies slowest. A Slurm array task finds its run dir by
its index (SLURM_ARRAY_TASK_ID, read through SlurmEnv) in the record. Stdlib only: the Slurm node
side reads it.
"""  # noqa: E501

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable

from . import layout
from .errors import LaunchError, brief

SWEEP_FILE = "sweep.json"
MAX_RUNS = 1000  # a Slurm array holds at most MaxArraySize - 1 (default 1001) tasks
_KEY = re.compile(r"^(?:--)?([A-Za-z][A-Za-z0-9_-]*)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]+")
ACCEPTED = (
    "KEY=V1,V2,... with KEY a program flag's name (lr, --lr, warmup_steps) and non-empty values"
)


@dataclass(frozen=True)
class Combo:
    index: int
    values: tuple[tuple[str, str], ...]  # (key, value) per axis, in the order of the --sweep flags

    @property
    def args(self) -> tuple[str, ...]:
        """What the run's program args get appended: ('--lr', '1e-3', '--seed', '1')."""
        return tuple(w for k, v in self.values for w in (f"--{k}", v))

    def label(self, width: int = 1) -> str:
        """The run dir's name: '<k>-lr-1e-3_seed-1' (the index keeps it unique; odd characters
        become '-')."""
        parts = "_".join(f"{k}-{_UNSAFE.sub('-', v).strip('-') or 'x'}" for k, v in self.values)
        return f"{self.index:0{width}d}-{parts}"[:120].rstrip("-_")


def parse_axes(items: Iterable[str]) -> list[tuple[str, list[str]]]:
    """`--sweep KEY=V1,V2` flags (repeatable) -> [(key, values)]; bad ones raise LaunchError naming
    them."""
    axes: list[tuple[str, list[str]]] = []
    for item in items:
        key, eq, rest = str(item).partition("=")
        m = _KEY.match(key.strip())
        if not eq:
            raise LaunchError(f"--sweep {brief(item)} has no '=' and values; accepted: {ACCEPTED}")
        if not m:
            raise LaunchError(
                f"--sweep {brief(item)} is not accepted: {brief(key)} is not a program flag's "
                f"name; accepted: {ACCEPTED}"
            )
        values = rest.split(",")
        if not rest or any(v == "" for v in values):
            raise LaunchError(
                f"--sweep {brief(item)} has an empty list or an empty value; accepted: {ACCEPTED}"
            )
        if any(c in v for v in values for c in "\n\r\0"):
            raise LaunchError(
                f"--sweep {brief(item)} has a value with a control character; accepted: {ACCEPTED}"
            )
        name = m.group(1)
        if name in (k for k, _ in axes):
            raise LaunchError(
                f"--sweep key {name!r} is given twice; give each key once, with all its values "
                f"(e.g. --sweep {name}=1,2)"
            )
        dup = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if dup is not None:
            raise LaunchError(
                f"--sweep {brief(item)} lists the value {dup!r} twice; give each value once"
            )
        axes.append((name, values))
    count = 1
    for _, values in axes:
        count *= len(values)
    if count > MAX_RUNS:
        raise LaunchError(f"--sweep makes {count} runs; accepted: at most {MAX_RUNS} combinations")
    return axes


def expand(axes: list[tuple[str, list[str]]]) -> list[Combo]:
    """Every combination, the first axis varying slowest."""
    keys = [k for k, _ in axes]
    return [
        Combo(i, tuple(zip(keys, vals)))
        for i, vals in enumerate(itertools.product(*(v for _, v in axes)))
    ]


def run_dirs(sweep_dir: str, combos: list[Combo]) -> list[str]:
    width = len(str(max(len(combos) - 1, 0)))
    return [os.path.join(sweep_dir, c.label(width)) for c in combos]


def record(
    sweep_dir: str,
    backend: str,
    axes: list[tuple[str, list[str]]],
    combos: list[Combo],
    **extra: Any,
) -> dict[str, Any]:
    """The sweep record (sweep.json): what was swept and where each run lives."""
    return {
        "sweep_dir": sweep_dir,
        "backend": backend,
        "axes": [[k, list(v)] for k, v in axes],
        "runs": [
            {"index": c.index, "args": list(c.args), "run_dir": d}
            for c, d in zip(combos, run_dirs(sweep_dir, combos))
        ],
        **extra,
    }


def write_record(sweep_dir: str, rec: dict[str, Any]) -> None:
    layout.atomic_write(os.path.join(sweep_dir, SWEEP_FILE), json.dumps(rec, indent=1) + "\n")


def is_sweep_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, SWEEP_FILE))


def read_record(sweep_dir: str) -> dict[str, Any]:
    rec = layout.read_json(os.path.join(sweep_dir, SWEEP_FILE))
    if rec is None or not isinstance(rec.get("runs"), list):
        raise LaunchError(f"{brief(sweep_dir)} is not a sweep dir (no readable {SWEEP_FILE})")
    return rec


def member_dirs(sweep_dir: str) -> list[str]:
    """The run dirs of a sweep that exist (local and SSH sweeps make each one when its turn
    comes)."""
    return [r["run_dir"] for r in read_record(sweep_dir)["runs"] if layout.is_run_dir(r["run_dir"])]


def array_run_dir(sweep_dir: str, task_id: str) -> str:
    """A Slurm array task's run dir: run number SLURM_ARRAY_TASK_ID of the sweep."""
    runs = read_record(sweep_dir)["runs"]
    if not task_id.isdigit() or int(task_id) >= len(runs):
        raise LaunchError(f"array task {task_id!r} has no run in {sweep_dir} ({len(runs)} runs)")
    return runs[int(task_id)]["run_dir"]


def sweep_of(run_dir: str) -> str | None:
    """The sweep dir holding run_dir, or None for a run of its own."""
    parent = os.path.dirname(os.path.abspath(run_dir))
    return parent if is_sweep_dir(parent) else None


def group_rows(rows: list[dict[str, Any]], root: str) -> list[dict[str, Any]]:
    """`launch list`: each row gets its sweep dir ("sweep", None for a run of its own); a sweep's
    runs follow each other (where its newest run is), named <sweep>/<run> when the sweep is in the
    runs root."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        owner = sweep_of(row["path"])
        row = dict(row, sweep=owner)
        if owner and os.path.dirname(owner) == root:
            row["name"] = os.path.join(os.path.basename(owner), os.path.basename(row["path"]))
        groups.setdefault(owner or row["path"], []).append(row)
    return [row for members in groups.values() for row in sorted(members, key=lambda r: r["path"])]
