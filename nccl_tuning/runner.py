"""Run nccl_tuning.bench as a normal launcher job (`launch <backend> ... -- -m nccl_tuning.bench`),
so the benchmark goes through the same spec -> preset -> torchrun -> backend flow as training, on
every backend, and collect its rows from the run directory. Torch-free.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

from . import results as R
from .bench import parse_ops, parse_size, sizes
from .errors import NcclTuningError

BACKENDS = ("local", "ssh", "slurm")
_ROW = re.compile(
    r"^\s*(?:\[n\d+ r\d+\]\s*)?([a-z_]+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+"
    r"([\d.]+)\s+(\d+)\s*$"
)
_HEAD = re.compile(r"# nccl_tuning\.bench: backend (\w+), (\d+) ranks")


@dataclass
class BenchConfig:
    """Validated benchmark settings; building one checks every value (nothing starts before)."""

    backend: str
    nodes: int
    gpus_per_node: int
    ops: list
    min_bytes: int
    max_bytes: int
    warmup: int = 5
    iters: int = 20
    repeats: int = 1
    launch_args: list = field(default_factory=list)  # backend options passed to `launch <backend>`

    @classmethod
    def build(
        cls,
        backend,
        nodes,
        gpus_per_node,
        ops,
        min_bytes,
        max_bytes,
        warmup=5,
        iters=20,
        repeats=1,
        launch_args=(),
    ):
        if backend not in BACKENDS:
            raise NcclTuningError(f"--backend {backend!r} is not one of {', '.join(BACKENDS)}")
        n = _positive("--nodes", nodes)
        g = _positive("--gpus-per-node", gpus_per_node)
        lo, hi = parse_size(min_bytes), parse_size(max_bytes)
        sizes(lo, hi)
        if int(warmup) < 0 or int(iters) < 1 or int(repeats) < 1:
            raise NcclTuningError(
                f"--warmup {warmup} / --iters {iters} / --repeats {repeats}: "
                f"accepted are warmup >= 0, iters >= 1, repeats >= 1"
            )
        return cls(
            backend,
            n,
            g,
            parse_ops(ops) if isinstance(ops, str) else list(ops),
            lo,
            hi,
            int(warmup),
            int(iters),
            int(repeats),
            list(launch_args),
        )

    def bench_args(self) -> list[str]:
        return [
            "-m",
            "nccl_tuning.bench",
            "--ops",
            ",".join(self.ops),
            "--min-bytes",
            str(self.min_bytes),
            "--max-bytes",
            str(self.max_bytes),
            "--warmup",
            str(self.warmup),
            "--iters",
            str(self.iters),
            "--repeats",
            str(self.repeats),
        ]

    def launch_argv(self, run_dir: str, preset: str | None, dry_run: bool = False) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "launchers.cli",
            self.backend,
            "--nodes",
            str(self.nodes),
            "--gpus-per-node",
            str(self.gpus_per_node),
            "--run-dir",
            run_dir,
        ]
        if preset:
            argv += ["--nccl-preset", preset]
        if self.backend == "slurm" and "--wait" not in self.launch_args and not dry_run:
            argv.append("--wait")  # the results are needed before we go on
        argv += list(self.launch_args)
        if dry_run:
            argv.append("--dry-run")
        return argv + ["--", *self.bench_args()]


def _positive(flag, value) -> int:
    try:
        v = int(str(value))
    except ValueError:
        v = 0
    if v < 1:
        raise NcclTuningError(f"{flag} {value!r} is not a positive integer")
    return v


def default_run_dir(name: str) -> str:
    from launchers.layout import choose_run_dir  # torch-free

    return choose_run_dir(None, name)


def dry_run(cfg: BenchConfig, run_dir: str, preset: str | None) -> None:
    """Let the launcher validate everything (preset, backend options) without starting anything."""
    p = subprocess.run(
        cfg.launch_argv(run_dir, preset, dry_run=True),
        capture_output=True,
        text=True,
        cwd=os.getcwd(),
    )
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise NcclTuningError(
            err.removeprefix("launch: error: ") + (f" [preset {preset}]" if preset else "")
        )


def run(
    cfg: BenchConfig,
    run_dir: str,
    preset: str | None,
    log_path: str | None = None,
    progress=None,
    stdout=None,
) -> tuple[int, list[dict]]:
    """Start the bench job and wait; -> (launcher exit code, rows). With log_path the launcher's
    output goes there and progress(line) gets each result line of rank 0 as it appears; else to
    `stdout` (a file; default ours: --json sends it to stderr, keeping stdout for the object)."""
    argv = cfg.launch_argv(run_dir, preset)
    if log_path is None:
        code = subprocess.call(argv, stdout=stdout)
    else:
        with open(log_path, "w") as log:
            log.write(" ".join(argv) + "\n")
            log.flush()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            seen = 0
            while proc.poll() is None:
                seen = _progress(run_dir, seen, progress)
                time.sleep(0.5)
            _progress(run_dir, seen, progress)
            code = proc.returncode
    return code, collect(run_dir)


def _progress(run_dir, seen, progress) -> int:
    if progress is None:
        return seen
    lines = _rank0_lines(run_dir)
    for line in lines[seen:]:
        if _ROW.match(line):
            progress(line.strip())
    return len(lines)


def _rank0_lines(run_dir) -> list[str]:
    path = os.path.join(run_dir, "logs", "node0", "rank0.log")
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    return text.splitlines()[:-1] if not text.endswith("\n") else text.splitlines()


def collect(run_dir: str) -> list[dict]:
    """results.csv from the run dir; if the nodes could not write it there, rank 0's log table."""
    path = os.path.join(run_dir, "results.csv")
    if os.path.exists(path):
        return R.read_csv(path)
    return parse_log(_rank0_lines(run_dir))


def parse_log(lines) -> list[dict]:
    backend, ranks, rows = "?", 0, []
    for line in lines:
        h = _HEAD.search(line)
        if h:
            backend, ranks, rows = h.group(1), int(h.group(2)), []  # newest attempt wins
            continue
        m = _ROW.match(line)
        if m and ranks:
            op, nbytes, count, t, alg, bus, wrong = m.groups()
            rows.append(
                R.typed(
                    {
                        "op": op,
                        "bytes": nbytes,
                        "ranks": ranks,
                        "time_us": t,
                        "algbw_gbps": alg,
                        "busbw_gbps": bus,
                        "wrong": wrong,
                        "backend": backend,
                        "count": count,
                        "dtype": "float32",
                    }
                )
            )
    return rows
