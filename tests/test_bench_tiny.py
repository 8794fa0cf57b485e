"""The bench cannot rot (issue 38 item 6): every script in bench/ runs in its tiny form
(BENCH_TINY=1: one round, no warm-up, the smallest inputs; bench/benchlib.py) and must exit 0 with
each figure line naming the goal it is held to. No timing is asserted: the figures of a tiny run
mean nothing, only that `make bench` would still run through. The scripts that need a dev cluster
run in that cluster's group; bench/gpu_check.sh has its own test (tests/test_gpu_check.py: its
--dry-run on this machine)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

BENCH = ROOT / "bench"
# the helpers and launch_overhead's worker
NOT_SCRIPTS = {"benchlib.py", "first_step.py", "run_all.py"}
COVERED_ELSEWHERE = {"gpu_check.sh": "tests/test_gpu_check.py"}
FIGURE = re.compile(r"^(?P<name>.+?) +ours=.* ref=.* ratio=.*?  goal (?P<goal>.+)$")

# (id, script, extra env, argv, marks)
CASES = [
    ("launch_overhead", "launch_overhead.py", {}, [], []),
    ("log_flood", "log_flood.py", {}, [], []),
    ("snapshot_key", "snapshot_key.py", {}, [], []),
    (
        "hang_detection-local",
        "hang_detection.py",
        {"BENCH_BACKENDS": "local"},
        [],
        [pytest.mark.slow],
    ),
    # 2 launches: ~25 s
    ("detection-local", "detection.py", {"BENCH_BACKENDS": "local"}, [], [pytest.mark.slow]),
    # ~20 s on 2 cores
    ("workloads_checkpoint", "workloads_checkpoint.py", {}, [], [pytest.mark.slow]),
    # two short runs, one kill
    ("chaos", "chaos.py", {}, ["3", "10", "local", "memory+warm"], [pytest.mark.slow]),
    ("hang_detection-ssh", "hang_detection.py", {"BENCH_BACKENDS": "ssh"}, [], [pytest.mark.ssh]),
    ("doctor_time-ssh", "doctor_time.py", {"BENCH_TARGETS": "ssh"}, [], [pytest.mark.ssh]),
    ("ssh_fanout", "ssh_fanout.py", {}, [], [pytest.mark.ssh]),
    ("ssh64_healthy", "ssh64_healthy.py", {}, [], [pytest.mark.ssh]),
    (
        "hang_detection-slurm",
        "hang_detection.py",
        {"BENCH_BACKENDS": "slurm"},
        [],
        [pytest.mark.slurm],
    ),
    ("doctor_time-slurm", "doctor_time.py", {"BENCH_TARGETS": "slurm"}, [], [pytest.mark.slurm]),
    # drains the whole queue between jobs: no other Slurm test meanwhile
    ("slurm_submit", "slurm_submit.py", {}, [], [pytest.mark.slurm, pytest.mark.exclusive]),
]
# Lines a script prints in place of figures (chaos and ssh64_healthy are verdicts, not side-by-side
# figures).
VERDICTS = {
    "chaos.py": "chaos: effective training time",
    "ssh64_healthy.py": "ssh64_healthy: 1 of 1 healthy runs",
}


def test_every_bench_script_has_a_tiny_case():
    scripts = {
        p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh") and not p.name.startswith("_")
    }
    covered = {c[1] for c in CASES} | set(COVERED_ELSEWHERE) | NOT_SCRIPTS
    assert scripts - covered == set(), (
        "a bench script without a tiny case in tests/test_bench_tiny.py"
    )
    assert covered - scripts == set()


@pytest.mark.parametrize(
    "script,env,argv", [pytest.param(s, e, a, id=i, marks=m) for i, s, e, a, m in CASES]
)
def test_bench_script_tiny_form(script, env, argv, tmp_path):
    p = subprocess.run(
        [sys.executable, str(BENCH / script), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env, "BENCH_TINY": "1"},
    )
    assert p.returncode == 0, (
        f"{script} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    )
    figures = [m for m in map(FIGURE.match, p.stdout.splitlines()) if m]
    if script in VERDICTS:
        assert VERDICTS[script] in p.stdout, p.stdout
    else:
        assert figures, f"{script} printed no figure line:\n{p.stdout}"
    for m in figures:
        assert re.match(r"(<=|>=|<|>) ?\S|\(reference\)", m["goal"]), (
            f"{m['name'].strip()}: goal {m['goal']!r}"
        )
