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


# ------------------------------------------------------------------------------------------ (b) cancel

def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@pytest.fixture
def victim(tmp_path):
    """A live process of another run (the victim's run dir at runs/victim, its id in the environment)."""
    vdir = crafted(tmp_path, "victim", state="COMPLETED", launcher={})
    env = {**os.environ, "LAUNCH_RUN_ID": "victim-1234", "LAUNCH_RUN_DIR": str(vdir)}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True)
    time.sleep(0.3)
    yield p
    p.kill()
    p.wait()


def test_cancel_of_a_run_dir_naming_another_runs_id_kills_nothing(tmp_path, victim):
    """A crafted run dir (its recorded run_dir its own path: no copy by the record) with the victim's run id."""
    d = crafted(tmp_path, "fake")
    p = run_launch("cancel", str(d), cwd=tmp_path, timeout=60)
    assert victim.poll() is None, (p.stdout, p.stderr)
    assert p.returncode != 0 and "names run id 'victim-1234' of the live run in" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_cancel_never_signals_the_pid_status_json_names(tmp_path):
    """status.json names a live process of someone else's (pid + its real start time): not the run's launcher."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        time.sleep(0.3)
        rec = {"pid": other.pid, "host": socket.gethostname(), "start": start_ticks(other.pid)}
        d = crafted(tmp_path, "fake", run_id="fake-1", launcher=rec)
        p = run_launch("cancel", str(d), cwd=tmp_path, timeout=60)
        time.sleep(0.3)
        assert other.poll() is None, (p.stdout, p.stderr)
        assert p.returncode != 0 and f"names pid {other.pid}, which is not this run's launcher" in p.stderr, p.stderr
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("where", ["in the run dir", "owned by another user", "writable by others"])
def test_cancel_never_connects_with_ssh_files_it_did_not_choose(tmp_path, where):
    """A crafted SSH run dir naming an ssh config whose ProxyCommand would create a marker."""
    marker = tmp_path / "MARKER"
    cfg = tmp_path / ("runs/fake/ssh_config" if where == "in the run dir" else "ssh_config")
    d = crafted(tmp_path, "fake", run_id="fake-2", backend="ssh",
                options={"hosts": "evilhost", "ssh_config": str(cfg)})
    cfg.write_text(f"Host *\n  ProxyCommand sh -c 'touch {marker}'\n")
    if where == "owned by another user":
        os.chown(cfg, 65534, 65534) if os.getuid() == 0 else pytest.fail("needs root to give a file away")
    cfg.chmod(0o666 if where == "writable by others" else 0o644)
    p = run_launch("cancel", str(d), cwd=tmp_path, timeout=60)
    assert not marker.exists(), (p.stdout, p.stderr)
    assert p.returncode != 0 and f"cancel does not connect with --ssh-config {cfg}" in p.stderr, p.stderr
