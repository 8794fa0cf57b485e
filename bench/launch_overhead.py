"""Launch overhead: `launch local --nodes 1 --gpus-per-node 2` vs bare `torchrun --nproc-per-node
2`, same script, time from start to the first barrier (the first training step's collective); and
`launch --help` vs `python -c "import click"`. Interleaved rounds, medians, one line per figure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import compile_project, figure, interleaved, median, ms_since, rounds  # noqa: E402

BIN = os.path.dirname(sys.executable)
HERE = os.path.dirname(os.path.abspath(__file__))
ROUNDS = rounds(7)


def first_step(argv: list[str], tmp: str) -> float:
    result = os.path.join(tmp, "result.json")
    if os.path.exists(result):
        os.remove(result)
    env = {**os.environ, "T0_NS": str(time.time_ns()), "RESULT_FILE": result}
    p = subprocess.run(
        argv, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if p.returncode != 0:
        sys.exit(
            f"launch_overhead: {' '.join(argv[:2])} ... exited {p.returncode}: "
            f"{(p.stderr.strip().splitlines() or ['(no output)'])[-1][:500]}"
        )
    with open(result) as f:
        return json.load(f)["first_step_ms"]


def wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return ms_since(t0)


def main() -> None:
    compile_project()
    tmp = tempfile.mkdtemp(prefix="bench-launch-")
    shutil.copy(os.path.join(HERE, "first_step.py"), tmp)
    n = [0]

    def ours() -> float:
        n[0] += 1
        return first_step(
            [
                f"{BIN}/launch",
                "local",
                "--nodes",
                "1",
                "--gpus-per-node",
                "2",
                "--run-dir",
                f"{tmp}/runs/r{n[0]}",
                "--",
                "first_step.py",
            ],
            tmp,
        )

    def bare() -> float:
        return first_step(
            [
                f"{BIN}/torchrun",
                "--nproc-per-node",
                "2",
                "--master-port",
                str(29400 + n[0] % 50),
                "first_step.py",
            ],
            tmp,
        )

    res = interleaved({"launch": ours, "torchrun": bare}, rounds=ROUNDS)
    figure(
        "launch local 1x2 -> first step (median)",
        median(res["launch"]),
        median(res["torchrun"]),
        "<= 1.05",
    )
    cli = interleaved(
        {
            "help": lambda: wall([f"{BIN}/launch", "--help"]),
            "click": lambda: wall([sys.executable, "-c", "import click"]),
        },
        rounds=rounds(15),
        warmup=2,
    )
    figure(
        "launch --help cold start (median)", median(cli["help"]), median(cli["click"]), "<= 2.00"
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
