"""ruff over the whole project (the rules in pyproject.toml's [tool.ruff]): `ruff format --check`
and `ruff check`, what `make lint` runs, inside make test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

RUFF = Path(sys.executable).with_name("ruff")
LINTED = (
    "launchers",
    "workloads",
    "nccl_tuning",
    "slurm",
    "bench",
    "tests",
    "examples",
    "clusters",
)


def test_ruff_passes_on_every_package():
    assert RUFF.exists(), f"{RUFF} missing: make venv installs ruff from requirements.txt"
    r = subprocess.run(
        [str(RUFF), "check", "--no-cache", "--output-format", "concise", *LINTED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_leaves_every_package_as_it_is():
    """`ruff format --check`: every file is as the formatter writes it (100 columns)."""
    r = subprocess.run(
        [str(RUFF), "format", "--check", "--no-cache", *LINTED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_would_catch_an_unused_import_and_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f() -> None:\n    return undefined_name\n")
    r = subprocess.run(
        [
            str(RUFF),
            "check",
            "--no-cache",
            "--config",
            str(Path(ROOT) / "pyproject.toml"),
            "--output-format",
            "concise",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "F401" in r.stdout and "F821" in r.stdout, r.stdout + r.stderr
