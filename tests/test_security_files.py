"""Issue 35 items 1 and 3: a file is data, never a command. A crafted run dir (what a colleague can plant in a
shared runs root, or copy) makes no verb run a command, signal a process of another run, or connect with options
it names; the readers (status, list, top, logs) survive hostile files (symlinks out of the run dir, FIFOs,
devices, huge logs, terminal control sequences, bad JSON) with one line.
Every test here is local and small: crafted run dirs, real `launch` verbs, real processes to (not) signal."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_launch


def crafted(base: Path, name: str = "r", *, run_id: str = "victim-1234", state: str = "RUNNING",
            launcher: dict | None = None, **spec_extra) -> Path:
    """A run dir as a colleague could write it by hand: run.yaml + status.json, a dead launcher on this host."""
    d = base / "runs" / name
    for sub in ("status", "logs", "records", "checkpoints"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    spec = {"backend": "local", "program": ["x.py"], "run_dir": str(d), "name": name, "nodes": 1,
            "gpus_per_node": 1, **spec_extra}
    (d / "run.yaml").write_text(yaml.safe_dump({"run_id": run_id, "created": 1, "spec": spec,
                                                "attempts": [{"attempt": 0}]}))
    dead = {"pid": 4194000, "host": socket.gethostname(), "start": 1}
    (d / "status.json").write_text(json.dumps({"state": state, "attempt": 0, "nodes": {},
                                               "launcher": launcher if launcher is not None else dead}))
    return d


# ------------------------------------------------------------------------------------------ (a) notify

@pytest.mark.parametrize("verb", [("status",), ("status", "--json"), ("wait", "--timeout", "20"), ("list",),
                                  ("top", "--once")])
def test_readers_never_run_the_notify_command_of_a_run_dir(tmp_path, verb):
    """A reader that corrects a dead launcher's RUNNING to FAILED records it, and sends nothing: the command
    run.yaml names is the planter's, not the reader's."""
    marker = tmp_path / "MARKER"
    d = crafted(tmp_path, notify=[f"touch {marker}", f"http://127.0.0.1:9/{marker.name}"])
    args = [*verb, str(d)] if verb[0] != "list" else [*verb, "--root", str(tmp_path / "runs")]
    p = run_launch(*args, cwd=tmp_path, timeout=60)
    time.sleep(0.5)
    assert not marker.exists(), (p.stdout, p.stderr)
    if verb[0] in ("status", "wait"):          # these correct the dead launcher's state: recorded, nothing sent
        assert json.loads((d / "status.json").read_text())["state"] == "FAILED", p.stderr
        assert "FAILED not sent: the launcher that owned it is gone" in (d / "launcher.log").read_text()
