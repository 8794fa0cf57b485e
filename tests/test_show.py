"""What `launch` shows: tables (plain text in a pipe, rich on a terminal, --json unchanged), the
runs index (runs made with --run-dir outside the runs root), LAUNCH_* defaults, shell completion,
and progress lines (Slurm's pending reason and nodes starting, SSH per-host preflight)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import LAUNCH, ROOT, require_cluster, run_launch

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HELLO = "print('hello from', __import__('os').environ['RANK'], flush=True)\n"
ROW_KEYS = {"name", "backend", "shape", "state", "age", "path"}


@pytest.fixture
def state(tmp_path):
    """A private state dir for the runs index (LAUNCH_STATE_DIR), passed to every launch of the
    test."""
    d = tmp_path / "state"
    return {
        "LAUNCH_STATE_DIR": str(d),
        "TERM": "xterm",
        "PYTHONIOENCODING": "utf-8",
        "COLUMNS": "200",
    }


def in_pty(args, cwd, env, timeout=180.0) -> tuple[int, str]:
    """Run `launch ARGS` with stdin/stdout/stderr on a pseudo-terminal; (exit code, what it
    printed)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    p = subprocess.Popen(
        [LAUNCH, *args],
        cwd=cwd,
        env={**os.environ, **env},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if p.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child side is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    code = p.wait(timeout=30)
    return code, ANSI.sub("", out.decode("utf-8", "replace")).replace("\r", "")


def test_list_plain_tty_json_and_the_runs_index(workdir, tmp_path, state):
    (workdir / "hello.py").write_text(HELLO)
    outside = tmp_path / "elsewhere" / "exp1"
    run_launch("local", "--run-dir", "runs/inside", "--", "hello.py", env=state, check=True)
    run_launch("local", "--run-dir", str(outside), "--", "hello.py", env=state, check=True)
    index = Path(state["LAUNCH_STATE_DIR"], "runs.jsonl").read_text().splitlines()
    # only the run outside the root
    assert [json.loads(ln)["path"] for ln in index] == [str(outside)]

    plain = run_launch("list", env=state, check=True).stdout.splitlines()
    head = plain[0]
    assert head.split() == ["NAME", "BACKEND", "SHAPE", "STATE", "AGE"] and len(plain) == 3, plain
    for row in plain[1:]:  # aligned: every column starts where its header does
        assert row[head.index("BACKEND") :].startswith("local ") and row[
            head.index("STATE") :
        ].startswith("COMPLETED")
    assert {r.split()[0] for r in plain[1:]} == {"inside", str(outside)}
    assert not any(c in "\n".join(plain) for c in "│┃━\x1b")

    rows = json.loads(run_launch("list", "--json", env=state, check=True).stdout)
    assert {r["path"] for r in rows} == {str(workdir / "runs/inside"), str(outside)}
    assert all(
        ROW_KEYS <= set(r) and r["state"] == "COMPLETED" and r["shape"] == "1x1" for r in rows
    )

    code, shown = in_pty(["list"], workdir, state)
    lines = [ln for ln in shown.splitlines() if ln.strip()]
    assert code == 0 and "│" in shown and "NAME" in shown and str(outside) in shown, shown
    assert len({len(ln) for ln in lines}) == 1, lines  # a table: every line as wide as the others
    code, shown = in_pty(["status", str(outside), "--ranks"], workdir, state)
    assert code == 0 and re.search(r"state\s+COMPLETED", shown) and "state:" not in shown, shown
    assert re.search(r"│\s*0\s*│\s*0\s*│", shown) and "RANK" in shown, shown  # the per-rank table

    shutil.rmtree(outside)  # a run dir that is gone drops out of the list and the index
    rows = json.loads(run_launch("list", "--json", env=state, check=True).stdout)
    assert [r["name"] for r in rows] == ["inside"]
    assert Path(state["LAUNCH_STATE_DIR"], "runs.jsonl").read_text() == ""


def test_rich_is_imported_only_for_a_terminal(workdir, state):
    code = (
        "import sys\nfrom launchers.cli import main\ntry:\n    main(['list'])\nexcept "
        "SystemExit:\n    pass\nassert 'rich' not in sys.modules, 'rich imported for a "
        "pipe'\nprint('OK')\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **state},
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout + p.stderr


def test_launch_env_defaults_flags_win_and_bad_values_name_the_variable(workdir):
    (workdir / "hello.py").write_text(HELLO)
    dry = run_launch(
        "local",
        "--dry-run",
        "--",
        "hello.py",
        env={"LAUNCH_NODES": "2", "LAUNCH_GPUS_PER_NODE": "3"},
        check=True,
    ).stdout
    assert "2 nodes x 3 processes = 6" in dry, dry
    dry = run_launch(
        "local",
        "--nodes",
        "1",
        "--dry-run",
        "--",
        "hello.py",
        env={"LAUNCH_NODES": "2"},
        check=True,
    ).stdout
    assert "1 nodes x 1 processes = 1" in dry, dry
    for var, value, backend in (
        ("LAUNCH_NODES", "two", "local"),
        ("LAUNCH_MAX_RESTARTS", "-1", "local"),
        ("LAUNCH_SSH_CONNECT_TIMEOUT", "soon", "ssh"),
    ):
        p = (
            run_launch(backend, "--hosts", "a", "--", "hello.py", env={var: value})
            if backend == "ssh"
            else run_launch(backend, "--", "hello.py", env={var: value})
        )
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("launch: error: "), (
            p.stderr
        )
        assert f"${var}" in lines[0] and repr(value) in lines[0], lines[0]
        assert not (workdir / "runs").exists()  # nothing started or written
    helptext = run_launch("slurm", "--help", check=True).stdout
    assert all(
        v in helptext for v in ("LAUNCH_NODES", "LAUNCH_GPUS_PER_NODE", "LAUNCH_SLURM_PARTITION")
    )


def test_completion_scripts(workdir):
    script = workdir / "launch.bash"
    script.write_text(run_launch("completion", "bash", check=True).stdout)
    p = subprocess.run(
        ["bash", "-c", f"set -e; source {script}; complete -p launch"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0 and p.stderr == "" and "_launch_completion" in p.stdout, (
        p.stdout + p.stderr
    )
    env = {"COMP_WORDS": "launch sl", "COMP_CWORD": "1", "_LAUNCH_COMPLETE": "bash_complete"}
    assert "plain,slurm" in run_launch(env=env).stdout.split()  # click's completion of the script
    env = {
        "COMP_WORDS": "launch local --gpus",
        "COMP_CWORD": "2",
        "_LAUNCH_COMPLETE": "bash_complete",
    }
    assert "plain,--gpus-per-node" in run_launch(env=env).stdout.split()
    assert "compdef" in run_launch("completion", "zsh", check=True).stdout
    assert "complete" in run_launch("completion", "fish", check=True).stdout
    p = run_launch("completion", "tcsh")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "'tcsh'" in p.stderr, (
        p.stderr
    )


@pytest.mark.slurm
def test_slurm_wait_shows_the_pending_reason_then_each_node(workdir):
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    # each node runs > 2 polls
    (workdir / "hello.py").write_text(HELLO + "__import__('time').sleep(6)\n")
    # pends: BeginTime
    (workdir / "later.yaml").write_text("slurm:\n  sbatch_lines: ['--begin=now+15']\n")
    base = ["slurm", "--nodes", "2", "--time", "5", "--profile", "later.yaml"]
    follow = subprocess.Popen(
        [LAUNCH, *base, "--wait", "--run-dir", "runs/w", "--", "hello.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_launch(*base, "--run-dir", "runs/q", "--", "hello.py", check=True)
    waited = run_launch("wait", "runs/q", timeout=300)
    out, err = follow.communicate(timeout=300)
    for code, text in ((follow.returncode, err), (waited.returncode, waited.stderr)):
        lines = [ln for ln in text.splitlines() if ln.startswith("launch: ")]
        assert code == 0 and lines[-1] == "launch: run COMPLETED", text
        pending = [i for i, ln in enumerate(lines) if "PENDING" in ln]
        assert pending and "reason: BeginTime" in lines[pending[0]], lines
        assert len(pending) == len({lines[i] for i in pending}), lines  # one line per change
        started = [
            i for i, ln in enumerate(lines) if re.fullmatch(r"launch: node [01] started on \S+", ln)
        ]
        assert len(started) == 2 and min(started) > pending[0], lines
    assert "hello from 1" in out


@pytest.mark.ssh
def test_ssh_preflight_per_host_progress_on_a_terminal(workdir, state):
    ssh_state = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the SSH test hosts", st.returncode == 0, "make ssh-up")
    (workdir / "hello.py").write_text(HELLO)
    code, shown = in_pty(
        [
            "ssh",
            "--hosts",
            "sshhost1,sshhost2",
            "--ssh-config",
            str(ssh_state / "ssh_config"),
            "--known-hosts",
            str(ssh_state / "known_hosts"),
            "--run-dir",
            "runs/s",
            "--",
            "hello.py",
        ],
        workdir,
        state,
    )
    assert code == 0, shown
    for what in ("preflight", "reach"):
        got = re.findall(rf"launch: {what} ([12])/2: host (sshhost[12])", shown)
        assert sorted(n for n, _ in got) == ["1", "2"] and sorted(h for _, h in got) == [
            "sshhost1",
            "sshhost2",
        ], shown
    assert shown.index("launch: reach 2/2") < shown.index("hello from")


def test_runs_index_rules_and_concurrent_appends_while_pruning(tmp_path, monkeypatch):
    """Pure logic (no launch): only run dirs outside the root are indexed; appends from several
    processes while another prunes lose nothing."""
    from launchers.records import runindex

    monkeypatch.setenv("LAUNCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path / "runs"))
    assert not runindex.note(str(tmp_path / "runs" / "a"))  # in the root
    # a sweep's run in the root
    assert not runindex.note(str(tmp_path / "runs" / "sweep1" / "0-lr-1"))
    live = tmp_path / "live"
    live.mkdir()
    (live / "run.yaml").write_text("run_id: x\n")
    assert runindex.note(str(live)) and runindex.note(str(tmp_path / "gone"))
    with open(runindex.index_path(), "a") as f:
        f.write('not json\n{"path": 3}\n')  # torn/foreign lines: skipped
    assert runindex.paths() == [str(live)]
    code = (
        "import sys\nfrom launchers.records import runindex\n"
        "for i in range(40):\n    runindex.note(f'{sys.argv[1]}/w{sys.argv[2]}-{i}')\n"
        "    runindex.note(f'{sys.argv[1]}/gone-{i}')\n"
    )
    for i in range(3):  # 3 writers x (40 live + 40 gone) while the parent prunes the gone ones
        (tmp_path / f"w{i}").mkdir()
        for j in range(40):
            (tmp_path / f"w{i}" / f"w{i}-{j}").mkdir()
            (tmp_path / f"w{i}" / f"w{i}-{j}" / "run.yaml").write_text("run_id: x\n")
    runindex.note(str(tmp_path / "gone2"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / f"w{i}"), str(i)], env=dict(os.environ)
        )
        for i in range(3)
    ]
    while any(p.poll() is None for p in procs):
        runindex.paths()  # prunes the gone ones under the lock, concurrently
    assert all(p.returncode == 0 for p in procs)
    assert (
        len(runindex.paths()) == 1 + 120 and "gone" not in Path(runindex.index_path()).read_text()
    )
