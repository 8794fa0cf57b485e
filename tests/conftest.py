"""Shared test helpers: run the real `launch` CLI as a subprocess, in a scratch cwd."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LAUNCH = str(BIN / "launch")
DATA = Path(__file__).resolve().parent / "data"
# the runs index (launchers.runindex) of the runs the tests start: a scratch state dir, not ~/.local/state
os.environ.setdefault("LAUNCH_STATE_DIR", tempfile.mkdtemp(prefix="launch-test-state-"))


def run_launch(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 300, env: dict | None = None,
               check: bool | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    p = subprocess.run([LAUNCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)
    if check and p.returncode != 0:
        raise AssertionError(f"launch {' '.join(args)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def read_json(path: str | os.PathLike) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def rank_lines(run_dir: str | os.PathLike, marker: str) -> list[str]:
    """Lines starting with `marker` from every rank log of a run."""
    out = []
    for log in sorted(Path(run_dir, "logs").glob("node*/rank*.log")):
        out += [ln for ln in log.read_text().splitlines() if ln.startswith(marker)]
    return out


def assert_ranks_refused(run_dir: str | os.PathLike, marker: str, needle: str, world: int) -> None:
    """Bad input: every rank decides the same before any process group exists and exits 2; the agent ends
    the others as soon as the first one is out (fail-fast), so a rank still starting may be stopped (SIGTERM)
    before it prints. No rank may succeed or fail otherwise; at least one says why, all in the same words."""
    lines = rank_lines(run_dir, marker)
    assert lines and all(needle in ln for ln in lines), lines
    ends = [read_json(Path(run_dir, "status", f"rank{r}.json")) for r in range(world)]
    assert any(e["exit_code"] == 2 for e in ends), ends
    assert all(e["exit_code"] == 2 or (e["exit_code"] is None and e["signal"] in ("SIGTERM", "SIGKILL"))
               for e in ends), ends


def require_cluster(what: str, ok: bool, how: str) -> None:
    """A test that needs a cluster fails (never skips) when the cluster is not up."""
    if not ok:
        pytest.fail(f"{what} is not up: run `{how}` first (make test does it)", pytrace=False)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A scratch cwd holding the tests' helper programs; runs go under ./runs."""
    for f in DATA.glob("*.py"):
        (tmp_path / f.name).write_text(f.read_text())
    monkeypatch.chdir(tmp_path)
    return tmp_path
