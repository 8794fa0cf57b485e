"""Issue 21 items 4 and 6, the leftovers: causes named before and while a run runs.

- a node whose python cannot import torch is refused before anything starts, one line naming the
  node and the interpreter (local: the check an SSH host runs, launchers.node.nodecheck; SSH:
  tests/test_ssh_backend.py);
- a run dir removed while its run runs stops the launcher: one line (the job is cancelled: its
  records could not be kept), exit 1, no process of the run left, and nothing recreates the run dir;
- the SSH backend's `node K failed` line carries the rank's exception (firstfail.node_failed, pure);
- a secret the job names that a rank's environment lacks, or holds as the placeholder ***, is never
  handed to the program: the rank wrapper refuses to start it, one line naming the variable, exit 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LAUNCH, ROOT, rank_lines, read_json, require_cluster, run_launch
from launchers import api, layout, procs
from launchers.backends.slurm import gone
from launchers.backends.slurm import status as slurm_status
from launchers.backends.slurm import task as slurm_task
from launchers.backends.slurm.node import NodeRun
from launchers.credentials import secretenv
from launchers.diagnosis import firstfail
from launchers.errors import RunDirGone
from launchers.node import nodecheck
from launchers.records.rundir import RunDir, new_run_id, redacted_spec
from launchers.spec import RunSpec, build_spec
from launchers.torchrun import node_command

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n"


def test_python_without_torch_refused_before_anything_starts(workdir):
    # no torch in it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "nv"], check=True)
    py = str(workdir / "nv" / "bin" / "python")
    p = run_launch(
        "local", "--nodes", "2", "--run-dir", "runs/t", "--python", py, "--", "report.py"
    )
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert (
        lines[0].startswith("launch: error: nodes 0-1 (this machine): python ") and py in lines[0]
    ), lines
    assert "cannot import torch" in lines[0] and "Traceback" not in p.stderr, lines
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize(
    "out, err, code, want",
    [
        (
            'CHECK {"host": "h", "errors": ["python /v/py cannot import torch (give --python an '
            'interpreter that can)"]}\n',
            "",
            0,
            ["python /v/py cannot import torch (give --python an interpreter that can)"],
        ),
        ('noise\nCHECK {"host": "h", "errors": [], "port": 29500}\n', "", 0, []),
        (
            "",
            "bash: /no/py: No such file or directory\n",
            127,
            ["python '/no/py' not found (give --python)"],
        ),
        (
            "",
            "Fatal Python error: init_fs_encoding\nModuleNotFoundError: No module named "
            "'encodings'\n",
            1,
            ["ModuleNotFoundError: No module named 'encodings' (give --python)"],
        ),
    ],
)
def test_node_check_answer_read_alike_for_local_and_ssh(out, err, code, want):
    py = "/no/py" if code == 127 else "/v/py"
    assert nodecheck.answer(out, err, code, py)[1] == want


def test_run_dir_removed_mid_run_stops_the_launcher(workdir):
    Path("sleeper.py").write_text(SLEEPER)
    p = subprocess.Popen(
        [LAUNCH, "local", "--run-dir", "runs/g", "--", "sleeper.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not rank_lines("runs/g", "sleeping"):
        assert time.monotonic() < deadline and p.poll() is None, (
            p.communicate() if p.poll() is not None else "timeout"
        )
        time.sleep(0.2)
    run_id = layout.load_run_yaml("runs/g")[0]["run_id"]
    assert procs.tagged_pids(run_id)
    # rm -rf as a user would, again when a writer of the job added a
    deadline = time.monotonic() + 30
    # file meanwhile ("Directory not empty": seen in a clean-clone run)
    while Path("runs/g").exists():
        assert time.monotonic() < deadline, "runs/g could not be removed"
        subprocess.run(["rm", "-rf", "runs/g"], capture_output=True)
    out, err = p.communicate(timeout=60)
    mine = [ln for ln in err.splitlines() if "runs/g" in ln and "launch: run dir" not in ln]
    assert p.returncode == 1 and len(mine) == 1, err
    assert (
        "was removed while the run ran" in mine[0] and "its records could not be kept" in mine[0]
    ), mine
    assert procs.tagged_pids(run_id) == []
    assert not Path("runs/g").exists()


def test_records_never_recreate_a_removed_run_dir(tmp_path):
    d = tmp_path / "r"
    (d / "status").mkdir(parents=True)
    (d / "run.yaml").write_text("run_id: x\n")
    here = layout.Presence(str(d))
    assert not here.gone()
    (d / "run.yaml").unlink()
    assert here.gone()  # emptied
    (d / "status").rmdir()
    d.rmdir()
    assert here.gone()
    rd = RunDir(str(d))
    for write in (
        lambda: rd.write_rank_record({"rank": 0}),
        lambda: rd.write_node_record(0, {}),
        lambda: rd.update_status(state="FAILED"),
    ):
        with pytest.raises(FileNotFoundError):
            write()
    assert not d.exists()


def slurm_run_dir(base: Path) -> tuple[RunDir, str]:
    """A Slurm run dir as the launcher leaves it for its nodes (run.yaml, status PENDING, the node
    spec); nothing submitted."""
    (base / "report.py").write_text("print('x')\n")
    spec = build_spec(
        "slurm",
        {
            "nodes": 2,
            "gpus_per_node": 1,
            "run_dir": str(base / "runs" / "s"),
            "options": {"time": "10"},
        },
        [str(base / "report.py")],
    )
    run_id = new_run_id(spec)
    rd = RunDir.create(spec, run_id, api.get_backend("slurm").plan(spec, run_id, 0).record())
    os.makedirs(layout.path(rd.path, "slurm"), exist_ok=True)
    Path(layout.path(rd.path, "node_spec", attempt=0)).write_text(
        json.dumps({"run_id": run_id, "spec": redacted_spec(spec)})
    )
    return rd, run_id


def test_slurm_side_of_a_removed_run_dir(tmp_path, monkeypatch, capsys):
    """A Slurm node task whose run dir is removed after it started, and the batch side's teardown
    after it: one line naming the run dir each, exit 1, nothing recreated (no SLURM_JOB_ID here:
    nothing to scancel, said so). The node's watch ends when the agent ends or the run dir goes;
    node 0 cancels its job, in an allocation only its step."""
    for k, v in {
        "SLURM_JOB_ID": "",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_STEP_ID": "3",
        "SLURM_RESTART_COUNT": "",
    }.items():
        monkeypatch.setenv(k, v)
    rd, _ = slurm_run_dir(tmp_path)
    node = NodeRun(rd.path, 0, in_allocation=False)
    here = layout.Presence(rd.path)
    assert not gone.watch(here.gone, lambda: True)  # the agent ended first
    shutil.rmtree(rd.path)
    assert gone.watch(
        here.gone, lambda: False, sleep=lambda s: pytest.fail("slept with the run dir gone")
    )
    assert node() == 1
    err = capsys.readouterr().err.splitlines()
    assert [ln for ln in err if rd.path in ln] == [f"launch: node 0: {here.gone_line()}"], err
    assert err[-1] == "launch: node 0: scancel of job  failed: no SLURM_JOB_ID", err
    assert slurm_task.main(["finalize", rd.path, "--base-attempt", "0"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [ln for ln in err if rd.path in ln] == [f"launch: batch side: {here.gone_line()}"], err
    assert not os.path.exists(rd.path)
    assert (
        slurm_status.query("7", layout.path(rd.path, "slurm"), lambda argv: (0, "")).job_id == "7"
    )
    assert not os.path.exists(rd.path)  # the state query's cache neither
    assert [gone.own_job("12", "3", False), gone.own_job("12", "3", True)] == ["12", "12.3"]


def test_waiting_on_a_run_whose_dir_is_removed_says_it_once(tmp_path):
    """`launch wait` (api.wait_status, the API's Run.wait): the run dir removed while waiting is
    RunDirGone (its one line, exit 1), never a traceback nor a recreated dir."""
    rd, _ = slurm_run_dir(tmp_path)
    with pytest.raises(RunDirGone, match="was removed while the run ran"):
        api.wait_status(
            rd.path, interval=0.01, on_poll=lambda st: shutil.rmtree(rd.path, ignore_errors=True)
        )
    assert not os.path.exists(rd.path)


@pytest.mark.slurm
def test_slurm_run_dir_removed_mid_run_cancels_the_job(workdir):
    """2 nodes x 1 on the dev cluster, a program that sleeps; the run dir is removed: the node tasks
    stop their ranks at once and node 0 scancels the job (it leaves squeue), no process of the run
    is left on any node (they share this machine's /proc), `launch wait` says it in one line, exit
    1, and the dir is not recreated."""
    st = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", st.returncode == 0, "make slurm-up")
    Path("sleeper.py").write_text(SLEEPER)
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "10",
        "--run-dir",
        "runs/gs",
        "--",
        "sleeper.py",
    )
    assert p.returncode == 0, p.stderr
    job = read_json("runs/gs/status.json")["slurm_job_id"]
    run_id = layout.load_run_yaml("runs/gs")[0]["run_id"]
    waiter = subprocess.Popen(
        [LAUNCH, "wait", "runs/gs"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:  # the waiter follows from before the ranks start
        deadline = time.monotonic() + 180
        while len(rank_lines("runs/gs", "sleeping")) < 2:
            assert time.monotonic() < deadline and waiter.poll() is None, subprocess.run(
                ["squeue", "-j", job], capture_output=True, text=True
            )
            time.sleep(0.3)
        # rm -rf as a user would, again when a writer of the job added a
        deadline = time.monotonic() + 30
        # file meanwhile ("Directory not empty"): the job must then stop
        while Path("runs/gs").exists():
            subprocess.run(["rm", "-rf", "runs/gs"], capture_output=True)
            assert time.monotonic() < deadline, "runs/gs could not be removed within 30 s"
        out, err = waiter.communicate(timeout=120)
        mine = [ln for ln in err.splitlines() if "runs/gs" in ln]
        assert (
            waiter.returncode == 1 and len(mine) == 1 and "was removed while the run ran" in mine[0]
        ), err
        deadline = time.monotonic() + 60
        while subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip():
            assert time.monotonic() < deadline, (
                f"Slurm job {job} still listed 60 s after its run dir was removed"
            )
            time.sleep(0.5)
        deadline = time.monotonic() + 15
        while procs.tagged_pids(run_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert procs.tagged_pids(run_id) == []
        assert not Path("runs/gs").exists()
    finally:
        if waiter.poll() is None:
            waiter.kill()
        subprocess.run(["scancel", job], capture_output=True)
        for pid in procs.tagged_pids(run_id):
            procs.kill(pid, 9)


@pytest.mark.parametrize(
    "ff, code, want",
    [
        (
            {"node": 1, "rank": 3, "exit_code": 1, "exception": "RuntimeError: boom"},
            1,
            "rank 3, exit code 1: RuntimeError: boom",
        ),
        (
            {
                "node": 1,
                "rank": 3,
                "exit_code": None,
                "signal": "SIGKILL",
                "reason": "out of memory (limit 1 GiB)",
            },
            137,
            "rank 3, signal SIGKILL: out of memory (limit 1 GiB)",
        ),
        ({"node": 1, "rank": 3, "exit_code": 2}, 2, "rank 3, exit code 2"),
        (
            {"node": 1, "rank": None, "exit_code": None, "reason": "connection lost (host gone)"},
            None,
            "connection lost (host gone)",
        ),
        ({"node": 1, "rank": None, "exit_code": None}, 255, "exit code 255"),
    ],
)
def test_node_failed_line_carries_the_cause(ff, code, want):
    assert firstfail.node_failed(ff, code) == want
    assert firstfail.describe(ff).endswith(
        want.split(", ", 1)[-1]
        if ff.get("rank") is not None
        else want
        if ff.get("reason")
        else "no exit code"
    )


def spec_of(**kw) -> RunSpec:
    return RunSpec(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=("/t.py",),
        program_args=(),
        run_dir="/r",
        name="r",
        **kw,
    )


def test_node_command_names_the_secrets_each_rank_checks():
    spec = spec_of(
        env=(("WANDB_API_KEY", "***"), ("A", "1"), ("DATABASE_URL", "***")),
        secrets=(("HF_TOKEN", "env"),),
    )
    nc = node_command(spec, node_rank=0, master_addr="h", master_port=1, run_id="x", attempt=1)
    # names only, never values
    assert nc.env_dict[secretenv.NAMES_ENV] == "DATABASE_URL,HF_TOKEN,WANDB_API_KEY"
    # off command lines
    assert secretenv.NAMES_ENV in nc.secret_env() and "HF_TOKEN" not in " ".join(nc.argv)
    plain = spec_of(env=(("WANDB_API_KEY", "real"),))
    assert (
        secretenv.NAMES_ENV
        not in node_command(
            plain, node_rank=0, master_addr="h", master_port=1, run_id="x", attempt=0
        ).env_dict
    )


@pytest.mark.parametrize(
    "value, refused", [(None, "is not set"), ("***", "is the placeholder ***"), ("tok", None)]
)
def test_rank_wrapper_refuses_a_missing_or_placeholder_secret(tmp_path, value, refused):
    run_dir = tmp_path / "run"
    (run_dir / "logs" / "node0").mkdir(parents=True)
    (tmp_path / "prog.py").write_text(
        "import os, pathlib\npathlib.Path('STARTED').write_text(os.environ['HF_TOKEN'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env.update(
        {
            "LAUNCH_RUN_DIR": str(run_dir),
            "RANK": "0",
            "NODE_RANK": "0",
            "LAUNCH_ATTEMPT": "0",
            "PYTHONPATH": str(ROOT),
            secretenv.NAMES_ENV: "A_SECRET_NAME,HF_TOKEN",
            "A_SECRET_NAME": "x",
        }
    )
    if value is not None:
        env["HF_TOKEN"] = value
    p = subprocess.run(
        [sys.executable, "-m", "launchers.rankexec", "--", "prog.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rec = read_json(run_dir / "status" / "rank0.json")
    if refused is None:
        assert (
            p.returncode == 0
            and (tmp_path / "STARTED").read_text() == "tok"
            and rec["exit_code"] == 0
        ), p.stderr
        return
    assert p.returncode == 2 and not (tmp_path / "STARTED").exists(), p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and f"secret HF_TOKEN {refused}" in lines[0], lines
    assert rec["exit_code"] == 2 and rec["reason"].startswith(f"secret HF_TOKEN {refused}"), rec
    assert "tok" not in json.dumps(rec)
