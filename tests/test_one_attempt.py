"""Issue 21, integrity of a run: one attempt at a time (a second `launch resume` of a running or
starting run is refused in one line, also when two race: the check and the new attempt are one hold
of the run's lock), `launch cancel` of an ended run changes nothing, and `launch list` shows an
unreadable run dir as UNREADABLE.

Pure logic in this process where it can be (the run's lock and status.json held or written from
here, a live record naming this process); one real tiny local run for the refusal while it runs. The
bad-input-style cases (a resume of a starting/running run, a cancel of an ended one, through the
CLI) are in test_bad_input_matrix.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LAUNCH, ROOT, read_json, run_launch
from launchers import LaunchError, Run, api, procs
from launchers.backends.slurm.backend import SlurmBackend
from launchers.records.rundir import RunDir, new_run_id
from launchers.spec import build_spec


def make_run(base: Path, name: str = "r") -> RunDir:
    """A run dir as `launch local` makes it (nothing started), its first attempt ended FAILED."""
    (base / "report.py").write_text("print('x')\n")
    spec = build_spec("local", {"run_dir": str(base / "runs" / name)}, [str(base / "report.py")])
    run_id = new_run_id(spec)
    rd = RunDir.create(spec, run_id, api.get_backend("local").plan(spec, run_id, 0).record())
    rd.update_status(state="FAILED", starting=None)
    return rd


def claim(rd: RunDir) -> None:
    """What `launch resume` does once it planned its attempt: check and add it under the lock."""
    backend = api.get_backend("local")
    spec = rd.spec()
    attempt = len(rd.read_run_yaml()["attempts"])
    rd.claim_attempt(
        spec,
        backend.plan(spec, rd.run_id, attempt).record(),
        attempt,
        lambda st: api._busy_line(backend, rd, st),
    )


def test_two_racing_resumes_one_is_refused_under_the_lock(tmp_path):
    """Both passed the first look (nothing ran); the first to hold the lock adds its attempt and is
    `starting`, the second is refused there, in one line naming the run, `starting` and the
    launcher's pid."""
    rd = make_run(tmp_path)
    claim(rd)
    st = read_json(rd.status_path)
    assert st["starting"]["pid"] == os.getpid() and len(rd.read_run_yaml()["attempts"]) == 2
    before = (Path(rd.status_path).read_bytes(), Path(rd.run_yaml_path).read_bytes())
    with pytest.raises(LaunchError) as e:
        claim(rd)
    line = str(e.value)
    assert (
        "\n" not in line
        and repr(rd.path) in line
        and f"starting (launcher pid {os.getpid()} on " in line
    )
    # nothing added
    assert (Path(rd.status_path).read_bytes(), Path(rd.run_yaml_path).read_bytes()) == before
    # it started: running
    rd.update_status(state="RUNNING", starting=None, launcher=procs.self_record())
    with pytest.raises(LaunchError, match=rf"is running \(launcher pid {os.getpid()} on "):
        claim(rd)
    assert len(rd.read_run_yaml()["attempts"]) == 2


def test_resume_through_the_api_refused_while_starting(tmp_path):
    """api.resume (the CLI's) and Run.resume (the Python API's detached launcher) refuse a starting
    run in one line before planning anything; status.json and run.yaml stay byte-identical."""
    rd = make_run(tmp_path)
    rd.update_status(starting=procs.self_record())  # this process is starting an attempt
    before = (Path(rd.status_path).read_bytes(), Path(rd.run_yaml_path).read_bytes())
    with pytest.raises(
        LaunchError, match=rf"is starting \(launcher pid {os.getpid()} on .*one attempt at a time"
    ):
        api.resume(rd.path, {})
    with pytest.raises(LaunchError, match=rf"is starting \(launcher pid {os.getpid()} on "):
        Run(rd.path).resume()
    assert (Path(rd.status_path).read_bytes(), Path(rd.run_yaml_path).read_bytes()) == before


def test_cancel_while_starting_stops_the_attempt_before_it_runs(tmp_path):
    """`launch cancel` records its request under the lock; the starting launcher, recording its
    start under the same lock, sees it and starts nothing: CANCELLED, a one-line LaunchError."""
    rd = make_run(tmp_path)
    claim(rd)
    rd.update_status(cancel_requested=True)
    with pytest.raises(LaunchError, match="cancelled .* before this attempt started"):
        rd.mark_running(1)
    st = read_json(rd.status_path)
    assert st["state"] == "CANCELLED" and st["starting"] is None and "launcher" not in st


@pytest.mark.parametrize(
    "st, busy",
    [
        ({"state": "PENDING", "slurm_job_id": "77"}, "queued or running as Slurm job 77 (PENDING)"),
        ({"state": "RUNNING", "slurm_job_id": "77"}, "queued or running as Slurm job 77 (RUNNING)"),
        ({"state": "COMPLETED", "slurm_job_id": "77"}, None),
        (
            {
                "state": "FAILED",
                "slurm_job_id": "77",
                "starting": {"pid": 1, "host": "h", "start": 0},
            },
            None,
        ),
        (
            {
                "state": "RUNNING",
                "slurm_job_id": "77",
                "in_allocation": True,  # its launcher died here
                "launcher": {"pid": 2**22 + 1, "host": socket.gethostname(), "start": 1},
            },
            None,
        ),
        (
            {"state": "RUNNING", "launcher": {"pid": 12, "host": "elsewhere", "start": 1}},
            "running (launcher pid 12 on elsewhere)",
        ),
    ],
)
def test_slurm_busy_from_status_alone(st, busy):
    """A Slurm job submitted and not ended counts as running, from status.json's state and job id
    (no Slurm)."""
    assert SlurmBackend().busy(st) == busy


def test_a_local_run_between_attempts_whose_launcher_died_is_failed_not_requeued_forever(tmp_path):
    """Between two attempts a local/SSH run is REQUEUED (its launcher decided a restart); a launcher
    killed then leaves no one to start the next: status shows FAILED (launcher died), as for a
    RUNNING one. On Slurm, REQUEUED is Slurm's to end (a requeued job's batch process is gone by
    design). Seen from another host, a REQUEUED run's launcher counts as running it (a resume there
    is refused)."""
    rd = make_run(tmp_path)
    dead = {"pid": 2**22 + 1, "host": socket.gethostname(), "start": 1}
    rd.update_status(
        state="REQUEUED", launcher=dead, reason="attempt 0 failed (...); restarting from scratch"
    )
    assert rd.check_launcher()["state"] == "REQUEUED"  # the default: RUNNING, PENDING only
    st = api.get_backend("local").refresh(rd)
    assert st["state"] == "FAILED" and st["reason"].startswith("launcher died (pid 4194305"), st
    elsewhere = {"state": "REQUEUED", "launcher": {"pid": 12, "host": "elsewhere", "start": 1}}
    assert api.get_backend("local").busy(elsewhere) == "running (launcher pid 12 on elsewhere)"


def test_list_shows_unreadable_run_dirs(tmp_path, monkeypatch):
    """A run dir whose status.json is truncated, a directory or missing, or whose run.yaml is
    broken: a row UNREADABLE with the reason, never PENDING, never dropped."""
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path / "runs"))
    # the runs index: these runs only
    monkeypatch.setenv("LAUNCH_STATE_DIR", str(tmp_path / "state"))
    make_run(tmp_path, "good")
    bad = {name: make_run(tmp_path, name) for name in ("trunc", "isdir", "nostatus", "badyaml")}
    Path(bad["trunc"].status_path).write_text('{"state": "RUN')
    os.unlink(bad["isdir"].status_path)
    os.mkdir(bad["isdir"].status_path)
    os.unlink(bad["nostatus"].status_path)
    Path(bad["badyaml"].run_yaml_path).write_text("spec: [unclosed\n")
    rows = {r["name"]: r for r in api.list_runs(str(tmp_path / "runs"))}
    assert rows["good"]["state"] == "FAILED" and "reason" not in rows["good"]
    want = {
        "trunc": "status.json is not valid JSON",
        "isdir": "status.json is a directory",
        "nostatus": "status.json is missing",
        "badyaml": "run.yaml cannot be read",
    }
    for name, reason in want.items():
        assert rows[name]["state"] == "UNREADABLE" and rows[name]["reason"].startswith(reason), (
            rows[name]
        )
    assert rows["trunc"]["shape"] == "1x1" and rows["badyaml"]["shape"] == "?"
    p = run_launch("list", "--root", str(tmp_path / "runs"), env={"PYTHONPATH": str(ROOT)})
    lines = {ln.split()[0]: ln for ln in p.stdout.splitlines()[1:]}
    assert p.returncode == 0 and len(lines) == 5, p.stdout + p.stderr
    assert "UNREADABLE (status.json is a directory)" in lines["isdir"] and "PENDING" not in p.stdout


@pytest.mark.slow
def test_second_resume_while_running_is_refused_and_the_run_completes(tmp_path):
    """A real tiny run (1 node x 1 process): `launch resume` while it runs is refused in one line
    naming its launcher's pid; the run completes untouched, with its one attempt."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        [
            LAUNCH,
            "local",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--run-dir",
            "runs/r",
            "--",
            "-m",
            "workloads.convnet",
            "--dataset",
            "digits",
            "--max-steps",
            "40",
            "--step-delay",
            "0.1",
            "--no-tensorboard",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    status = tmp_path / "runs" / "r" / "status.json"
    deadline = time.monotonic() + 120
    while not (status.is_file() and (read_json(status) or {}).get("state") == "RUNNING"):
        assert time.monotonic() < deadline and p.poll() is None, (
            p.stderr.read() if p.poll() is not None else "slow"
        )
        time.sleep(0.1)
    r = run_launch("resume", "runs/r", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert (
        f"is running (launcher pid {p.pid} on " in lines[0] and "one attempt at a time" in lines[0]
    )
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    st = read_json(status)
    assert st["state"] == "COMPLETED" and st["attempt"] == 0
    import yaml

    assert len(yaml.safe_load((tmp_path / "runs" / "r" / "run.yaml").read_text())["attempts"]) == 1
