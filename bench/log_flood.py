"""Log flood: one rank writes 200 MB of numbered lines quickly (tests/data/flood_worker.py). Side by
side, in one run: the rank's own write time under `launch local` (2 nodes x 1, the launcher
streaming every line) vs the same program writing to /dev/null; and the whole job's extra wall time
for the flood (a flood run minus an empty run of the same shape) vs the program alone. The fault
suite (tests/faults/test_faults_local.py) checks that no line is lost and asserts only a generous
bound."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, TINY, compile_project, figure, interleaved, median, rounds

MB = 1 if TINY else 200
LAUNCH = os.path.join(os.path.dirname(sys.executable), "launch")
WORKER = os.path.join(ROOT, "tests", "data", "flood_worker.py")


def direct(tmp: str) -> tuple[float, float]:
    res = os.path.join(tmp, "direct.txt")
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-u", WORKER],
        stdout=subprocess.DEVNULL,
        check=True,
        env={**os.environ, "RANK": "1", "FLOOD_MB": str(MB), "FLOOD_RESULT": res},
    )
    return float(open(res).read().split()[1]), time.perf_counter() - t0


def launched(tmp: str, mb: int) -> tuple[float, float]:
    run_dir, res = tempfile.mkdtemp(dir=tmp), os.path.join(tmp, "launched.txt")
    os.rmdir(run_dir)
    t0 = time.perf_counter()
    subprocess.run(
        [
            LAUNCH,
            "local",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--run-dir",
            run_dir,
            "--env",
            f"FLOOD_MB={mb}",
            "--env",
            f"FLOOD_RESULT={res}",
            "--",
            WORKER,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    wall = time.perf_counter() - t0
    shutil.rmtree(run_dir)
    return (float(open(res).read().split()[1]) if mb else 0.0), wall


def main() -> None:
    compile_project()
    tmp = tempfile.mkdtemp(prefix="log-flood-")
    try:
        runs = interleaved(
            {
                "direct": lambda: direct(tmp),
                "launched": lambda: launched(tmp, MB),
                "empty": lambda: launched(tmp, 0),
            },
            rounds=rounds(3),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    d_write, d_wall = median([r[0] for r in runs["direct"]]), median([r[1] for r in runs["direct"]])
    l_write = median([r[0] for r in runs["launched"]])
    extra = median([r[1] for r in runs["launched"]]) - median([r[1] for r in runs["empty"]])
    figure(f"log flood {MB} MB: rank's write time", l_write, d_write, "<= 2x (/dev/null)", unit="s")
    figure(
        f"log flood {MB} MB: job wall time added",
        extra,
        d_wall,
        "<= 2.5x (program alone)",
        unit="s",
    )


if __name__ == "__main__":
    main()
