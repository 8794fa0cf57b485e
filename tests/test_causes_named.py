"""Issue 21 items 4 and 6, the leftovers: causes named before and while a run runs.

- a node whose python cannot import torch is refused before anything starts, one line naming the node and the
  interpreter (local: the check an SSH host runs, launchers.nodecheck; SSH: tests/test_ssh_backend.py);
- a run dir removed while its run runs stops the launcher: one line (the job is cancelled: its records could
  not be kept), exit 1, no process of the run left, and nothing recreates the run dir;
- the SSH backend's `node K failed` line carries the rank's exception (firstfail.node_failed, pure);
- a secret the job names that a rank's environment lacks, or holds as the placeholder ***, is never handed
  to the program: the rank wrapper refuses to start it, one line naming the variable, exit 2.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LAUNCH, ROOT, rank_lines, read_json, run_launch
from launchers import firstfail, layout, nodecheck, procs, secretenv
from launchers.rundir import RunDir
from launchers.spec import JobSpec
from launchers.torchrun import node_command

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n"


def test_python_without_torch_refused_before_anything_starts(workdir):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "nv"], check=True)     # no torch in it
    py = str(workdir / "nv" / "bin" / "python")
    p = run_launch("local", "--nodes", "2", "--run-dir", "runs/t", "--python", py, "--", "report.py")
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("launch: error: nodes 0-1 (this machine): python ") and py in lines[0], lines
    assert "cannot import torch" in lines[0] and "Traceback" not in p.stderr, lines
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize("out, err, code, want", [
    ('CHECK {"host": "h", "errors": ["python /v/py cannot import torch (give --python an interpreter that can)"]}\n',
     "", 0, ["python /v/py cannot import torch (give --python an interpreter that can)"]),
    ('noise\nCHECK {"host": "h", "errors": [], "port": 29500}\n', "", 0, []),
    ("", "bash: /no/py: No such file or directory\n", 127, ["python '/no/py' not found (give --python)"]),
    ("", "Fatal Python error: init_fs_encoding\nModuleNotFoundError: No module named 'encodings'\n", 1,
     ["ModuleNotFoundError: No module named 'encodings' (give --python)"]),
])
def test_node_check_answer_read_alike_for_local_and_ssh(out, err, code, want):
    py = "/no/py" if code == 127 else "/v/py"
    assert nodecheck.answer(out, err, code, py)[1] == want


def test_run_dir_removed_mid_run_stops_the_launcher(workdir):
    Path("sleeper.py").write_text(SLEEPER)
    p = subprocess.Popen([LAUNCH, "local", "--run-dir", "runs/g", "--", "sleeper.py"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not rank_lines("runs/g", "sleeping"):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate() if p.poll() is not None else "timeout"
        time.sleep(0.2)
    run_id = layout.load_run_yaml("runs/g")[0]["run_id"]
    assert procs.tagged_pids(run_id)
    subprocess.run(["rm", "-rf", "runs/g"], check=True)
    out, err = p.communicate(timeout=60)
    mine = [ln for ln in err.splitlines() if "runs/g" in ln and "launch: run dir" not in ln]
    assert p.returncode == 1 and len(mine) == 1, err
    assert "was removed while the run ran" in mine[0] and "its records could not be kept" in mine[0], mine
    assert procs.tagged_pids(run_id) == []
    assert not Path("runs/g").exists()


def test_records_never_recreate_a_removed_run_dir(tmp_path):
    d = tmp_path / "r"
    (d / "status").mkdir(parents=True)
    (d / "run.yaml").write_text("run_id: x\n")
    here = layout.Presence(str(d))
    assert not here.gone()
    (d / "run.yaml").unlink()
    assert here.gone()                       # emptied
    (d / "status").rmdir()
    d.rmdir()
    assert here.gone()
    rd = RunDir(str(d))
    for write in (lambda: rd.write_rank_record({"rank": 0}), lambda: rd.write_node_record(0, {}),
                  lambda: rd.update_status(state="FAILED")):
        with pytest.raises(FileNotFoundError):
            write()
    assert not d.exists()


@pytest.mark.parametrize("ff, code, want", [
    ({"node": 1, "rank": 3, "exit_code": 1, "exception": "RuntimeError: boom"}, 1, "rank 3, exit code 1: RuntimeError: boom"),
    ({"node": 1, "rank": 3, "exit_code": None, "signal": "SIGKILL", "reason": "out of memory (limit 1 GiB)"}, 137,
     "rank 3, signal SIGKILL: out of memory (limit 1 GiB)"),
    ({"node": 1, "rank": 3, "exit_code": 2}, 2, "rank 3, exit code 2"),
    ({"node": 1, "rank": None, "exit_code": None, "reason": "connection lost (host gone)"}, None,
     "connection lost (host gone)"),
    ({"node": 1, "rank": None, "exit_code": None}, 255, "exit code 255"),
])
def test_node_failed_line_carries_the_cause(ff, code, want):
    assert firstfail.node_failed(ff, code) == want
    assert firstfail.describe(ff).endswith(want.split(", ", 1)[-1] if ff.get("rank") is not None else
                                           want if ff.get("reason") else "no exit code")


def spec_of(**kw) -> JobSpec:
    return JobSpec(backend="local", nodes=1, gpus_per_node=1, program=("/t.py",), program_args=(), run_dir="/r",
                   name="r", **kw)


def test_node_command_names_the_secrets_each_rank_checks():
    spec = spec_of(env=(("WANDB_API_KEY", "***"), ("A", "1"), ("DATABASE_URL", "***")), secrets=(("HF_TOKEN", "v"),))
    nc = node_command(spec, node_rank=0, master_addr="h", master_port=1, run_id="x", attempt=1)
    assert nc.env_dict[secretenv.NAMES_ENV] == "DATABASE_URL,HF_TOKEN,WANDB_API_KEY"       # names only, never values
    assert secretenv.NAMES_ENV in nc.secret_env() and "HF_TOKEN" not in " ".join(nc.argv)   # off command lines
    plain = spec_of(env=(("WANDB_API_KEY", "real"),))
    assert secretenv.NAMES_ENV not in node_command(plain, node_rank=0, master_addr="h", master_port=1, run_id="x",
                                                   attempt=0).env_dict


@pytest.mark.parametrize("value, refused", [(None, "is not set"), ("***", "is the placeholder ***"), ("tok", None)])
def test_rank_wrapper_refuses_a_missing_or_placeholder_secret(tmp_path, value, refused):
    run_dir = tmp_path / "run"
    (run_dir / "logs" / "node0").mkdir(parents=True)
    (tmp_path / "prog.py").write_text("import os, pathlib\npathlib.Path('STARTED').write_text(os.environ['HF_TOKEN'])\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env.update({"LAUNCH_RUN_DIR": str(run_dir), "RANK": "0", "NODE_RANK": "0", "LAUNCH_ATTEMPT": "0",
                "PYTHONPATH": str(ROOT), secretenv.NAMES_ENV: "A_SECRET_NAME,HF_TOKEN", "A_SECRET_NAME": "x"})
    if value is not None:
        env["HF_TOKEN"] = value
    p = subprocess.run([sys.executable, "-m", "launchers.rankexec", "--", "prog.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    rec = read_json(run_dir / "status" / "rank0.json")
    if refused is None:
        assert p.returncode == 0 and (tmp_path / "STARTED").read_text() == "tok" and rec["exit_code"] == 0, p.stderr
        return
    assert p.returncode == 2 and not (tmp_path / "STARTED").exists(), p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and f"secret HF_TOKEN {refused}" in lines[0], lines
    assert rec["exit_code"] == 2 and rec["reason"].startswith(f"secret HF_TOKEN {refused}"), rec
    assert "tok" not in json.dumps(rec)
