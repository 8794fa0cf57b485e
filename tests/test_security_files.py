"""Issue 35 items 1 and 3: a file is data, never a command. A crafted run dir (what a colleague can
plant in a shared runs root, or copy) makes no verb run a command, signal a process of another run,
or connect with options it names; the readers (status, list, top, logs) survive hostile files
(symlinks out of the run dir, FIFOs, devices, huge logs, terminal control sequences, bad JSON) with
one line. Every test here is local and small: crafted run dirs, real `launch` verbs, real processes
to (not) signal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, require_cluster, run_launch


def crafted(
    base: Path,
    name: str = "r",
    *,
    run_id: str = "victim-1234",
    state: str = "RUNNING",
    launcher: dict | None = None,
    **spec_extra,
) -> Path:
    """A run dir as a colleague could write it by hand: run.yaml + status.json, a dead launcher on
    this host."""
    d = base / "runs" / name
    for sub in ("status", "logs", "records", "checkpoints"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    spec = {
        "backend": "local",
        "program": ["x.py"],
        "run_dir": str(d),
        "name": name,
        "nodes": 1,
        "gpus_per_node": 1,
        **spec_extra,
    }
    (d / "run.yaml").write_text(
        yaml.safe_dump({"run_id": run_id, "created": 1, "spec": spec, "attempts": [{"attempt": 0}]})
    )
    dead = {"pid": 4194000, "host": socket.gethostname(), "start": 1}
    (d / "status.json").write_text(
        json.dumps(
            {
                "state": state,
                "attempt": 0,
                "nodes": {},
                "launcher": launcher if launcher is not None else dead,
            }
        )
    )
    return d


# --------------------------------------------------------------------------------------- (a) notify


@pytest.mark.parametrize(
    "verb",
    [("status",), ("status", "--json"), ("wait", "--timeout", "20"), ("list",), ("top", "--once")],
)
def test_readers_never_run_the_notify_command_of_a_run_dir(tmp_path, verb):
    """A reader that corrects a dead launcher's RUNNING to FAILED records it, and sends nothing: the
    command run.yaml names is the planter's, not the reader's."""
    marker = tmp_path / "MARKER"
    d = crafted(tmp_path, notify=[f"touch {marker}", f"http://127.0.0.1:9/{marker.name}"])
    args = [*verb, str(d)] if verb[0] != "list" else [*verb, "--root", str(tmp_path / "runs")]
    p = run_launch(*args, cwd=tmp_path, timeout=60)
    time.sleep(0.5)
    assert not marker.exists(), (p.stdout, p.stderr)
    # these correct the dead launcher's state: recorded, nothing sent
    if verb[0] in ("status", "wait"):
        assert json.loads((d / "status.json").read_text())["state"] == "FAILED", p.stderr
        assert (
            "FAILED not sent: the launcher that owned it is gone"
            in (d / "launcher.log").read_text()
        )


@pytest.mark.parametrize("how", ["another user's", "world-writable"])
def test_resume_of_a_run_dir_not_your_own_runs_nothing(tmp_path, how):
    """resume runs the program and --notify a run dir names: only a run dir of the user's own."""
    marker = tmp_path / "MARKER"
    (tmp_path / "x.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    d = crafted(
        tmp_path,
        state="FAILED",
        launcher={},
        program=[str(tmp_path / "x.py")],
        notify=[f"touch {marker}"],
    )
    if how == "world-writable":
        (d / "run.yaml").chmod(0o666)
    else:
        os.chown(d / "run.yaml", 65534, 65534) if os.getuid() == 0 else pytest.fail(
            "needs root to give a file away"
        )
    p = run_launch("resume", str(d), cwd=tmp_path, timeout=120)
    assert not marker.exists(), (p.stdout, p.stderr)
    assert p.returncode == 2 and "resume would run what it names as you" in p.stderr, p.stderr


# --------------------------------------------------------------------------------------- (b) cancel


def start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@pytest.fixture
def victim(tmp_path):
    """A live process of another run (the victim's run dir at runs/victim, its id in the
    environment)."""
    vdir = crafted(tmp_path, "victim", state="COMPLETED", launcher={})
    env = {**os.environ, "LAUNCH_RUN_ID": "victim-1234", "LAUNCH_RUN_DIR": str(vdir)}
    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True
    )
    time.sleep(0.3)
    yield p
    p.kill()
    p.wait()


def test_cancel_of_a_run_dir_naming_another_runs_id_kills_nothing(tmp_path, victim):
    """A crafted run dir (its recorded run_dir its own path: no copy by the record) with the
    victim's run id."""
    d = crafted(tmp_path, "fake")
    p = run_launch("cancel", str(d), cwd=tmp_path, timeout=60)
    assert victim.poll() is None, (p.stdout, p.stderr)
    assert p.returncode != 0 and "names run id 'victim-1234' of the live run in" in p.stderr, (
        p.stderr
    )
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert json.loads((d / "status.json").read_text()).get("surviving_pids") in (None, []), (
        "another run's pids listed"
    )


def test_cancel_never_signals_the_pid_status_json_names(tmp_path):
    """status.json names a live process of someone else's (pid + its real start time): not the run's
    launcher."""
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    try:
        time.sleep(0.3)
        rec = {"pid": other.pid, "host": socket.gethostname(), "start": start_ticks(other.pid)}
        d = crafted(tmp_path, "fake", run_id="fake-1", launcher=rec)
        p = run_launch("cancel", str(d), cwd=tmp_path, timeout=60)
        time.sleep(0.3)
        assert other.poll() is None, (p.stdout, p.stderr)
        assert (
            p.returncode != 0
            and f"names pid {other.pid}, which is not this run's launcher" in p.stderr
        ), p.stderr
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("where", ["in the run dir", "owned by another user", "writable by others"])
def test_cancel_never_connects_with_ssh_files_it_did_not_choose(tmp_path, where):
    """A crafted SSH run dir naming an ssh config whose ProxyCommand would create a marker."""
    marker = tmp_path / "MARKER"
    cfg = tmp_path / ("runs/fake/ssh_config" if where == "in the run dir" else "ssh_config")
    d = crafted(
        tmp_path,
        "fake",
        run_id="fake-2",
        backend="ssh",
        options={"hosts": "evilhost", "ssh_config": str(cfg)},
    )
    cfg.write_text(f"Host *\n  ProxyCommand sh -c 'touch {marker}'\n")
    if where == "owned by another user":
        os.chown(cfg, 65534, 65534) if os.getuid() == 0 else pytest.fail(
            "needs root to give a file away"
        )
    cfg.chmod(0o666 if where == "writable by others" else 0o644)
    p = run_launch("cancel", str(d), cwd=tmp_path, timeout=60)
    assert not marker.exists(), (p.stdout, p.stderr)
    assert p.returncode != 0 and f"cancel does not connect with --ssh-config {cfg}" in p.stderr, (
        p.stderr
    )


@pytest.mark.slurm
def test_cancel_never_scancels_a_job_of_another_run(tmp_path):
    """A crafted Slurm run dir naming a (held, harmless) job of someone else's run: not
    scancelled."""
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--hold",
            "-t",
            "1",
            "-o",
            "/dev/null",
            "-J",
            "stranger",
            "--wrap",
            "true",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        d = crafted(
            tmp_path, "fake", run_id="fake-3", state="PENDING", launcher={}, backend="slurm"
        )
        s = json.loads((d / "status.json").read_text())
        (d / "status.json").write_text(json.dumps(dict(s, slurm_job_id=job)))
        p = run_launch("cancel", str(d), cwd=tmp_path, timeout=120)
        left = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        assert left == "PENDING", (left, p.stdout, p.stderr)
        assert (
            p.returncode == 2
            and f"names Slurm job {job}, whose output and script are not in this run dir"
            in p.stderr
        ), p.stderr
    finally:
        subprocess.run(["scancel", job], capture_output=True)


# -------------------------------------------------------------------------------------- (c) readers


def rank_log(d: Path) -> Path:
    (d / "logs/node0").mkdir(parents=True, exist_ok=True)
    return d / "logs/node0/rank0.log"


def test_logs_never_follow_a_symlink_out_of_the_run_dir(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:SECRET-HASH:19000\n")
    d = crafted(tmp_path, state="COMPLETED", launcher={})
    rank_log(d).symlink_to(secret)
    p = run_launch("logs", str(d), cwd=tmp_path, timeout=30)
    assert "SECRET-HASH" not in p.stdout + p.stderr
    assert "symbolic link" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_logs_never_block_on_a_fifo_or_read_a_device(tmp_path, kind):
    d = crafted(tmp_path, state="COMPLETED", launcher={})
    log = rank_log(d)
    os.mkfifo(log) if kind == "fifo" else log.symlink_to("/dev/zero")
    # a device node in place (mknod needs root: the symlink case is the test above)
    if kind == "device":
        log.unlink()
        os.mknod(log, 0o644 | __import__("stat").S_IFCHR, os.makedev(1, 5))
    # hangs (TimeoutExpired) or reads forever today
    p = run_launch("logs", str(d), cwd=tmp_path, timeout=20)
    assert "not a regular file" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("fifo", ["logs/node0/rank0.log", "metrics.jsonl"])
@pytest.mark.parametrize("verb", [("status",), ("wait", "--timeout", "5"), ("top", "--once")])
def test_status_wait_top_never_block_on_a_fifo_in_the_run_dir(tmp_path, fifo, verb):
    d = crafted(tmp_path, state="FAILED", launcher={})
    rank_log(d)
    os.mkfifo(d / fifo)
    # status and wait hung here (TimeoutExpired)
    p = run_launch(*verb, str(d), cwd=tmp_path, timeout=30)
    assert "Traceback" not in p.stderr, p.stderr


def test_logs_of_a_huge_log_print_its_tail(tmp_path):
    d = crafted(tmp_path, state="COMPLETED", launcher={})
    with open(rank_log(d), "wb") as f:
        f.truncate(200 * 1024 * 1024)  # 200 MB of NULs (sparse), then a last line
        f.seek(0, os.SEEK_END)
        f.write(b"the last line\n")
    p = run_launch("logs", str(d), cwd=tmp_path, timeout=60)
    assert p.stdout.rstrip().endswith("[n0 r0] the last line"), p.stdout[-300:]
    assert len(p.stdout) < 4 * 1024 * 1024 and "earlier bytes not shown" in p.stdout, len(p.stdout)


ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x1b]52;c;ZWNobyBwd25lZA==\x07\x9b31m\x07\x08"


@pytest.mark.parametrize("verb", ["status", "list", "top", "logs", "wait"])
def test_readers_strip_terminal_control_sequences(tmp_path, verb):
    d = crafted(tmp_path, state="FAILED", launcher={})
    st = json.loads((d / "status.json").read_text())
    (d / "status.json").write_text(json.dumps(dict(st, reason=f"bad{ESCAPES}reason")))
    rec = yaml.safe_load((d / "run.yaml").read_text())
    rec["spec"]["name"] = f"n{ESCAPES}ame"
    (d / "run.yaml").write_text(yaml.safe_dump(rec))
    rank_log(d).write_text(f"a log{ESCAPES} line\tok\n")
    args = {
        "status": ["status", str(d)],
        "list": ["list", "--root", str(tmp_path / "runs")],
        "top": ["top", "--once", str(d)],
        "logs": ["logs", str(d)],
        "wait": ["wait", str(d)],
    }[verb]
    p = run_launch(*args, cwd=tmp_path, timeout=60)
    assert p.returncode == (1 if verb == "wait" else 0), p.stderr
    out = p.stdout + p.stderr
    assert not any(c in out for c in "\x1b\x07\x08\x9b"), repr(out)
    if verb == "logs":
        assert "a log" in out and "line\tok" in out, repr(out)
        raw = run_launch("logs", "--raw", str(d), cwd=tmp_path, timeout=60)
        assert ESCAPES in raw.stdout, repr(raw.stdout)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100000 + "]" * 100000,
        '{"state": NaN, "attempt": NaN}',
        '{"state": 3, "attempt": "x", "nodes": "abc", "launcher": [1], "reason": {}}',
        '{"state": "RUNNING", "nodes": {"x": 1}, "first_failure": "oops", "hang": 7}',
        '{"a":' * 100000 + "1" + "}" * 100000,
    ],
)
@pytest.mark.parametrize("verb", ["status", "list"])
def test_readers_of_a_bad_status_json_give_one_line(tmp_path, text, verb):
    d = crafted(tmp_path, state="FAILED", launcher={})
    (d / "status.json").write_text(text)
    args = ["status", str(d)] if verb == "status" else ["list", "--root", str(tmp_path / "runs")]
    p = run_launch(*args, cwd=tmp_path, timeout=60)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.returncode in (0, 2) and len(p.stderr.strip().splitlines()) <= 1, p.stderr


def test_a_hosts_kill_sweep_spares_another_run_dirs_processes(tmp_path):
    """`launchers.remote kill` as SSH cancel runs it on each host, for a crafted run dir with a live
    run's id: neither the tagged sweep nor the pid file's agent (the victim's pid + start) takes the
    victim."""
    vdir = crafted(tmp_path, "victim", state="RUNNING", launcher={})
    fake = crafted(tmp_path, "fake")
    env = {
        **os.environ,
        "LAUNCH_RUN_ID": "victim-1234",
        "LAUNCH_RUN_DIR": str(vdir),
        "NODE_RANK": "0",
    }
    v = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True
    )
    try:
        time.sleep(0.3)
        pid_file = fake / "node0.pid"
        pid_file.write_text(json.dumps({"agent": v.pid, "agent_start": start_ticks(v.pid)}))
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "launchers.remote",
                "kill",
                "victim-1234",
                "--node",
                "0",
                "--run-dir",
                str(fake),
                "--pid-file",
                str(pid_file),
                "--signal",
                "SIGTERM",
                "--wait",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout.splitlines()[-1])["before"] == [] and v.poll() is None, p.stdout
    finally:
        v.kill()
        v.wait()


@pytest.mark.parametrize(
    "verb", [("status", "--ranks"), ("status", "--json", "--ranks"), ("top", "--once")]
)
def test_a_planted_progress_record_of_wrong_types_is_ignored(tmp_path, verb):
    d = crafted(
        tmp_path,
        state="RUNNING",
        launcher={"pid": os.getpid(), "host": socket.gethostname(), "start": 0},
    )
    rank_log(d).write_text("x\n")
    (d / "progress").mkdir()
    (d / "progress/rank0.json").write_text(
        '{"rank": "r", "attempt": 0, "step": "x", "time": [], "pid": "p"}'
    )
    p = run_launch(*verb, str(d), cwd=tmp_path, timeout=60)
    assert "Traceback" not in p.stderr and p.returncode == 0, p.stderr[-2000:]
