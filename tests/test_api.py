"""The Python API (docs/API.md) driving every backend: `from launchers import JobSpec, submit, Run,
runs`.

Real runs (local; 2 SSH hosts; 2 Slurm nodes), small shapes: submit returns once started, status
while running, logs(rank=1), wait; on local also cancel and resume with a new shape. Bad input:
TypeError / ValueError (LaunchError) naming the field, nothing created.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, require_cluster
from launchers import JobSpec, LaunchError, Run, procs, runs, submit

STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH = {
    "hosts": ["sshhost1", "sshhost2"],
    "ssh_config": str(STATE / "ssh_config"),
    "known_hosts": str(STATE / "known_hosts"),
}
WORKER = """\
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"API rank={dist.get_rank()} world={dist.get_world_size()} node={os.environ['NODE_RANK']} "
      f"attempt={os.environ['LAUNCH_ATTEMPT']}", flush=True)
if "--sleep" in sys.argv:
    print("sleeping", flush=True)
    time.sleep(300)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture
def started():
    """Runs a test started: any still going when it ends (a failed assertion) is cancelled."""
    out: list[Run] = []
    yield out
    for run in out:
        if not run.status().done:
            run.cancel()


def until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.3)


def check_finished(run: Run, world: int) -> None:
    """Ended COMPLETED; rank 1's log (unprefixed) holds its report; nothing of the run is left
    alive."""
    st = run.wait(timeout=300)
    assert (st.state, st.ok, st.done) == ("COMPLETED", True, True), st.data
    assert st.end_line == "launch: run COMPLETED"
    one = run.logs(rank=1)
    assert "REPORT {" in one and f'"world": {world}' in one and "[n" not in one
    assert procs.tagged_pids(run.run_id) == []


@pytest.mark.slow
def test_local_submit_status_logs_cancel_resume_wait(workdir, started):
    (workdir / "api_worker.py").write_text(WORKER)
    t0 = time.monotonic()
    run = submit(
        JobSpec(
            backend="local",
            nodes=2,
            gpus_per_node=1,
            program=("api_worker.py", "--sleep"),
            run_dir="runs/l",
            stop_grace=5,
        )
    )
    started.append(run)
    assert (
        time.monotonic() - t0 < 60
        and run.backend == "local"
        and run.path == str(workdir / "runs/l")
    )
    assert run.status().state == "RUNNING"  # returned once started, not at the end
    until(lambda: run.logs().count("sleeping") == 2, 120, "2 sleeping ranks")
    assert "[n1 r1] API rank=1 world=2 node=1 attempt=0" in run.logs()
    one = run.logs(rank=1).splitlines()
    assert "API rank=1 world=2 node=1 attempt=0" in one and not any(
        ln.startswith("[n") for ln in one
    ), one
    with pytest.raises(LaunchError, match=r"--rank 7 has no log .*world size 2.*accepted: 0, 1"):
        run.logs(rank=7)
    with pytest.raises(TimeoutError, match="still RUNNING"):
        run.wait(timeout=0.5)
    with pytest.raises(
        LaunchError, match=r"is running \(launcher pid \d+ on .*one attempt at a time"
    ):
        run.resume()
    launcher = run.status().data["launcher"]["pid"]
    run.cancel()
    st = run.status()
    assert st.state == "CANCELLED" and st.done and not st.ok, st.data
    assert procs.tagged_pids(run.run_id) == [] and not procs.alive(launcher)

    # the new shape, without --sleep
    assert run.resume(nodes=1, gpus_per_node=2, program_args=[]) is run
    lines = list(run.logs(follow=True))  # ends when the run ends
    assert "[n0 r1] API rank=1 world=2 node=0 attempt=1" in lines, lines
    st = run.wait(timeout=60)
    assert (st.state, st.attempt, st.attempts) == ("COMPLETED", 1, 2), st.data
    assert procs.tagged_pids(run.run_id) == []
    log = Path(run.launcher_log).read_text()
    assert "launch: run CANCELLED" in log and log.rstrip().endswith("launch: run COMPLETED"), log
    assert Run("runs/l") == run and run in runs("runs") and run.spec.nodes == 1


@pytest.mark.ssh
def test_ssh_submit_status_logs_wait(workdir, started):
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the SSH test hosts", st.returncode == 0, "make ssh-up")
    run = submit(
        JobSpec(
            backend="ssh",
            program=("report.py", "a b"),
            env={"TEST_SLEEP": "4"},
            run_dir="runs/s",
            ssh=SSH,
        )
    )
    started.append(run)
    assert run.backend == "ssh" and run.status().state == "RUNNING"
    check_finished(run, world=2)
    assert '"argv": ["a b"]' in run.logs(rank=1)


@pytest.mark.slurm
def test_slurm_submit_status_logs_wait(workdir, started):
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    run = submit(
        JobSpec(
            backend="slurm",
            nodes=2,
            gpus_per_node=1,
            program=("report.py",),
            env={"TEST_SLEEP": "6"},
            run_dir="runs/sl",
            slurm={"time": "10"},
        )
    )
    started.append(run)
    first = run.status()
    # submitted, not waited on
    assert first.state in ("PENDING", "RUNNING") and first.slurm_job_id, first.data
    until(
        lambda: run.status().state == "RUNNING",
        600,
        "the job to run (the shared cluster may be busy)",
    )
    check_finished(run, world=2)
    assert run.status().slurm_job_id == first.slurm_job_id


TYPE_ERRORS = [
    (dict(backend="local", program=("t.py",), nodes="4"), "JobSpec.nodes must be an int"),
    (
        dict(backend="local", program=("t.py",), gpus_per_node=2.0),
        "JobSpec.gpus_per_node must be an int",
    ),
    (dict(backend="local", program=("t.py",), nodes=True), "JobSpec.nodes must be an int"),
    (dict(backend="local", program="t.py"), "JobSpec.program must be a tuple or list of str"),
    (dict(backend="local", program=("t.py", 3)), "JobSpec.program must be a tuple or list of str"),
    (dict(backend=1, program=("t.py",)), "JobSpec.backend must be a str"),
    (
        dict(backend="local", program=("t.py",), env={"A": 1}),
        "JobSpec.env['A'] must map a str to a str",
    ),
    (dict(backend="local", program=("t.py",), env=["A=1"]), "JobSpec.env must be a mapping"),
    (
        dict(backend="local", program=("t.py",), stop_grace="30"),
        "JobSpec.stop_grace must be a number",
    ),
    (dict(backend="local", program=("t.py",), stop_signal=2), "JobSpec.stop_signal must be a str"),
    (dict(backend="local", program=("t.py",), cpu_bind=True), "JobSpec.cpu_bind must be a str"),
    (
        dict(backend="local", program=("t.py",), forward_env="NCCL_*"),
        "JobSpec.forward_env must be a tuple",
    ),
    (
        dict(backend="slurm", program=("t.py",), slurm={"partition": 3}),
        "JobSpec.slurm['partition'] must be str",
    ),
    (
        dict(backend="slurm", program=("t.py",), slurm={"cpus_per_task": True}),
        "JobSpec.slurm['cpus_per_task']",
    ),
    (
        dict(backend="slurm", program=("t.py",), slurm=["partition"]),
        "JobSpec.slurm must be a mapping",
    ),
]
VALUE_ERRORS = [
    (
        dict(backend="k8s", program=("t.py",)),
        "JobSpec.backend 'k8s' is not accepted; choose one of: local, ssh, slurm",
    ),
    (dict(backend="local", program=()), "JobSpec.program is empty"),
    (
        dict(backend="slurm", program=("t.py",), slurm={"partiton": "gpu"}),
        "option 'partiton' is not accepted (did you mean 'partition'?); accepted: partition",
    ),
    (
        dict(backend="slurm", program=("t.py",), slurm={"wait": True}),
        "submit never blocks; use run.wait()",
    ),
    (
        dict(backend="local", program=("t.py",), slurm={"partition": "gpu"}),
        "JobSpec.slurm is given but the backend",
    ),
]
# found by the CLI's checks when the spec is resolved (submit), naming the JobSpec's fields
SUBMIT_ERRORS = [
    (
        dict(backend="local", program=("report.py",), nodes=0),
        "JobSpec.nodes 0 is out of range; give an integer 1-65536",
    ),
    (dict(backend="local", program=("missing.py",)), "program file 'missing.py' does not exist"),
    (
        dict(backend="local", program=("report.py",), dist_backend="mpi"),
        "JobSpec.dist_backend 'mpi' is not accepted",
    ),
    (
        dict(backend="local", program=("report.py",), name="a b"),
        "JobSpec.name 'a b' is not accepted",
    ),
    # launcher
    (dict(backend="local", program=("report.py",), env={"NCCL_PROTO": "shm"}), "NCCL_PROTO='shm'"),
]


@pytest.mark.parametrize("kw,words", TYPE_ERRORS)
def test_wrong_types_are_type_errors_naming_the_field(kw, words):
    with pytest.raises(TypeError) as e:
        JobSpec(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw,words", VALUE_ERRORS)
def test_bad_values_are_value_errors_naming_the_field(kw, words):
    with pytest.raises(ValueError) as e:
        JobSpec(**kw)
    assert isinstance(e.value, LaunchError) and words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw,words", SUBMIT_ERRORS)
def test_refused_at_submit_with_the_cli_error_and_nothing_created(workdir, kw, words, monkeypatch):
    (workdir / "tmp").mkdir()
    # this test's own: other workers' consoles not seen
    monkeypatch.setattr(tempfile, "tempdir", str(workdir / "tmp"))
    with pytest.raises(LaunchError) as e:
        submit(JobSpec(**kw))
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not (workdir / "runs").exists()
    # no console left behind
    assert glob.glob(os.path.join(tempfile.gettempdir(), "launch-api-*")) == []


def test_other_misuse_and_dry_run(workdir):
    with pytest.raises(TypeError, match="submit takes a launchers.JobSpec, got dict"):
        submit({"backend": "local"})
    with pytest.raises(TypeError, match="dry_run must be a bool"):
        submit(JobSpec(backend="local", program=("report.py",)), dry_run="yes")
    with pytest.raises(LaunchError, match="is not a run dir"):
        Run(workdir)
    with pytest.raises(TypeError, match="runs root must be a str or a path"):
        runs(5)
    dry = submit(
        JobSpec(backend="local", nodes=2, program=("report.py", "x"), run_dir="runs/d"),
        dry_run=True,
    )
    text = str(dry)
    assert "launchers.rankexec" in text and f"{workdir / 'report.py'} x" in text
    assert (
        dry.run_dir == str(workdir / "runs" / "d")
        and len(dry.commands) == 2
        and dry.commands[1] in text
    )
    assert not (workdir / "runs").exists()


def test_import_launchers_stays_light():
    code = (
        "import sys, launchers; assert not any(m.startswith(('launchers.', 'click', 'yaml')) for "
        "m in sys.modules); from launchers import JobSpec, submit, Run, runs, RunStatus, "
        "LaunchError; assert 'torch' not in sys.modules and issubclass(LaunchError, ValueError)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
