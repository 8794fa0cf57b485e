"""--sweep (one run per combination, a Slurm job array) and --after (sbatch --dependency): the pure
parts (expansion, naming, bad input, golden scripts), a local sweep of 2, and on the real Slurm dev
cluster a dependent job that starts only after its parent and an array of 4 runs that `launch list`
shows grouped."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, rank_lines, read_json, require_cluster, run_launch
from launchers import sweep
from launchers.backends.slurm.options import dependency, split_after
from launchers.backends.slurm.render import render_sbatch
from launchers.errors import LaunchError
from test_slurm_render import GOLDEN, HEADER, spec

# ------------------------------------------------------------------------------------------ pure


def test_expansion_order_args_and_labels():
    axes = sweep.parse_axes(["lr=1e-3,3e-4", "--seed=1,2", "opt=adam w"])
    combos = sweep.expand(axes)
    assert [c.args for c in combos][:2] == [
        ("--lr", "1e-3", "--seed", "1", "--opt", "adam w"),
        ("--lr", "1e-3", "--seed", "2", "--opt", "adam w"),
    ]
    assert len(combos) == 4 and combos[3].args[:4] == ("--lr", "3e-4", "--seed", "2")
    dirs = sweep.run_dirs("/s", combos)
    assert dirs[0] == "/s/0-lr-1e-3_seed-1_opt-adam-w" and len(set(dirs)) == 4
    many = sweep.expand(sweep.parse_axes(["a=" + ",".join(map(str, range(12)))]))
    names = [os.path.basename(d) for d in sweep.run_dirs("/s", many)]
    # padded: sorted = run order
    assert names[:2] == ["00-a-0", "01-a-1"] and names == sorted(names)
    odd = sweep.expand(sweep.parse_axes(["p=../x/$(y),/"]))
    assert all("/" not in os.path.basename(d) for d in sweep.run_dirs("/s", odd))


@pytest.mark.parametrize(
    "items,msg",
    [
        (["lr="], "'lr=' has an empty list"),
        (["lr=1,,2"], "empty value"),
        (["lr"], "has no '='"),
        (["-l=1"], "'-l' is not a program flag's name"),
        (["1x=2"], "'1x' is not"),
        (["l r=1"], "'l r' is not"),
        (["lr=1", "--lr=2"], "key 'lr' is given twice"),
        (["lr=1,1"], "lists the value '1' twice"),
        (
            ["a=" + ",".join(map(str, range(40))), "b=" + ",".join(map(str, range(40)))],
            "makes 1600 runs",
        ),
    ],
)
def test_bad_sweeps(items, msg):
    with pytest.raises(LaunchError, match=re.escape(msg)):
        sweep.parse_axes(items)


def test_after_forms():
    assert split_after("123") == ("123", "afterok") and split_after("9_2:afterany") == (
        "9_2",
        "afterany",
    )
    assert split_after("/runs/a:b:afternotok") == ("/runs/a:b", "afternotok")
    assert dependency(spec(after="77:afterany")) == "afterany:77" and dependency(spec()) is None
    with pytest.raises(LaunchError, match="dependency type 'afterwards'"):
        split_after("12:afterwards")


@pytest.mark.parametrize(
    "name,kw",
    [
        ("slurm_after", dict(options=dict(after="1234:afterany", partition="gpu"))),
        ("slurm_array", dict(options=dict(partition="gpu", time="30"), array=(4, 2))),
    ],
)
def test_golden_after_and_array(name, kw):
    sp = spec(**kw["options"])
    if "array" in kw:
        sp = sp.replace(run_dir="/shared/runs/sweep1")
    text = render_sbatch(sp, base_attempt=0, header=HEADER, array=kw.get("array"))
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("runs,parallel", [(4, 2), (3, 3), (1, 1)])
def test_array_script_is_submitits_array_layout(runs, parallel):
    from submitit.slurm.slurm import _make_sbatch_string

    from launchers.backends.slurm.render import (
        finalize_command,
        node_task_command,
        sbatch_parameters,
    )

    sp = spec(after="5:afterok").replace(run_dir="/shared/sw")
    theirs = _make_sbatch_string(
        command=node_task_command(sp.python, sp.run_dir, 0, array=True),
        folder="/shared/sw/slurm",
        teardown=[finalize_command(sp.python, sp.run_dir, 0, True)],
        map_count=runs,
        array_parallelism=parallel,
        **sbatch_parameters(sp),
    )
    shebang, rest = theirs.split("\n", 1)
    assert (
        render_sbatch(sp, base_attempt=0, header="h", array=(runs, parallel))
        == f"{shebang}\n# h\n{rest}\n"
    )


def test_array_task_finds_its_run_dir(tmp_path):
    from launchers.backends.slurm import task

    axes = sweep.parse_axes(["lr=1,2"])
    rec = sweep.record(str(tmp_path), "slurm", axes, sweep.expand(axes))
    sweep.write_record(str(tmp_path), rec)
    os.environ["SLURM_ARRAY_TASK_ID"] = "1"
    try:
        a = task.parse_args(["task", str(tmp_path), "--base-attempt", "0", "--array"])
    finally:
        del os.environ["SLURM_ARRAY_TASK_ID"]
    assert a["run_dir"] == str(tmp_path / "1-lr-2")
    with pytest.raises(LaunchError, match="array task '2' has no run"):
        sweep.array_run_dir(str(tmp_path), "2")


# ---------------------------------------------------------------------------------- CLI, no cluster


@pytest.mark.parametrize(
    "args,msg",
    [
        (["local", "--sweep", "lr="], "--sweep 'lr=' has an empty list"),
        (["local", "--sweep", "lr=1", "--sweep", "lr=2"], "--sweep key 'lr' is given twice"),
        (["ssh", "--hosts", "h1", "--sweep", "x.y=1"], "'x.y' is not a program flag's name"),
        (
            ["slurm", "--after", "runs_x/none"],
            "--after 'runs_x/none' is neither a run dir nor a Slurm job id",
        ),
        (["slurm", "--after", "12:afterall"], "dependency type 'afterall' is not accepted"),
        (["slurm", "--max-parallel", "2"], "--max-parallel 2 applies to a --sweep only"),
        (["slurm", "--sweep", "a=1,2", "--max-parallel", "0"], "--max-parallel 0 is out of range"),
    ],
)
def test_bad_input_one_line_nothing_made(workdir, args, msg):
    p = run_launch(*args, "--run-dir", "runs/b", "--dry-run", "--", "report.py")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and msg in p.stderr, p.stderr
    assert not (workdir / "runs").exists()


def test_dry_run_shows_every_run(workdir):
    env = {"PATH": "/nonexistent-bin", "SLURM_JOB_ID": ""}
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--sweep",
        "lr=1,2",
        "--sweep",
        "seed=7,8",
        "--max-parallel",
        "3",
        "--after",
        "42",
        "--run-dir",
        "runs/sw",
        "--dry-run",
        "--",
        "report.py",
        "--x",
        "1",
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("#!/bin/bash") == 1 and "#SBATCH --array=0-3%3" in p.stdout
    assert "#SBATCH --dependency=afterok:42" in p.stdout and "--base-attempt 0 --array" in p.stdout
    for args in ("--lr 1 --seed 7", "--lr 1 --seed 8", "--lr 2 --seed 7", "--lr 2 --seed 8"):
        assert p.stdout.count(f"report.py --x 1 {args}\n") == 2, args  # one command per node
    loc = run_launch(
        "local", "--sweep", "lr=1,2", "--run-dir", "runs/l", "--dry-run", "--", "report.py"
    )
    assert (
        loc.returncode == 0
        and loc.stdout.count("# ==== run ") == 2
        and "report.py --lr 2" in loc.stdout
    )
    assert not (workdir / "runs").exists()


def test_local_sweep_of_two_one_after_another(workdir):
    p = run_launch(
        "local", "--sweep", "tag=a,b", "--run-dir", "runs/sw", "--", "report.py", env=STATE
    )
    assert p.returncode == 0, p.stderr
    rec = read_json(workdir / "runs/sw/sweep.json")
    dirs = [r["run_dir"] for r in rec["runs"]]
    assert [os.path.basename(d) for d in dirs] == ["0-tag-a", "1-tag-b"]
    reports = [json.loads(rank_lines(d, "REPORT ")[0][7:]) for d in dirs]
    assert [r["argv"] for r in reports] == [["--tag", "a"], ["--tag", "b"]]
    ends = [read_json(Path(d, "status.json")) for d in dirs]
    assert [e["state"] for e in ends] == ["COMPLETED"] * 2
    starts = [os.path.getmtime(Path(d, "run.yaml")) for d in dirs]
    # one after another
    assert starts[1] >= read_json(Path(dirs[0], "status", "rank0.json"))["time"] - 1
    assert_listed_together(workdir, "sw", 2)
    p = run_launch(
        "slurm", "--after", dirs[0], "--run-dir", "runs/c", "--dry-run", "--", "report.py"
    )
    assert p.returncode == 2 and "is a local run, not a submitted Slurm run" in p.stderr, p.stderr
    assert sorted(os.listdir(workdir / "runs")) == [".torch_extensions", "sw"]  # runs/c: none
    st = run_launch("status", "runs/sw")
    assert (
        st.returncode == 2
        and "is a sweep dir, not a run dir; give one of its runs: 0-tag-a, 1-tag-b" in st.stderr
    )


STATE = {"LAUNCH_STATE_DIR": "state"}  # the runs index (when there is one) stays in the test's dir


@pytest.mark.ssh
def test_ssh_sweep_of_two_one_after_another(workdir):
    """The same --sweep on SSH: one run after another on the real SSH test hosts, each with its own
    args."""
    state = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
    st = subprocess.run(
        [str(ROOT / "clusters/ssh-hosts.sh"), "status"], capture_output=True, text=True, timeout=60
    )
    require_cluster(
        "the SSH test hosts sshhost1..4",
        st.returncode == 0 and (state / "known_hosts").exists(),
        "make ssh-up",
    )
    opts = ["--ssh-config", str(state / "ssh_config"), "--known-hosts", str(state / "known_hosts")]
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,sshhost2",
        *opts,
        "--sweep",
        "tag=a,b",
        "--run-dir",
        str(workdir / "runs/ss"),
        "--",
        "report.py",
        env=STATE,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    dirs = [r["run_dir"] for r in read_json(workdir / "runs/ss/sweep.json")["runs"]]
    for d, tag in zip(dirs, "ab"):
        reports = [json.loads(ln[7:]) for ln in rank_lines(d, "REPORT ")]
        assert len(reports) == 2 and all(r["argv"] == ["--tag", tag] for r in reports), reports
        assert read_json(Path(d, "status.json"))["state"] == "COMPLETED"
    assert (
        os.path.getmtime(Path(dirs[1], "run.yaml"))
        >= read_json(Path(dirs[0], "status", "rank1.json"))["time"] - 1
    )
    assert_listed_together(workdir, "ss", 2)


def assert_listed_together(workdir, sweep_name, count):
    out = run_launch(
        "list", "--root", str(workdir / "runs"), env=STATE, check=True
    ).stdout.splitlines()
    rows = [i for i, ln in enumerate(out) if ln.startswith(f"{sweep_name}/")]
    assert len(rows) == count and rows == list(range(rows[0], rows[0] + count)), out
    assert all("COMPLETED" in out[i] for i in rows), out


# ---------------------------------------------------------------------------- the Slurm dev cluster


def need_slurm():
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")


def job_times(job_id):
    """StartTime/EndTime/JobState of a job (scontrol keeps ended jobs MinJobAge=300 s; the jobcomp
    log after)."""
    p = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30
    )
    f = dict(re.findall(r"(\w+)=(\S*)", p.stdout))
    if "StartTime" not in f:
        p = subprocess.run(
            ["sacct", "-c", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State,Start,End"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        row = p.stdout.strip().splitlines()[-1].split("|")
        f = {"JobState": row[1], "StartTime": row[2], "EndTime": row[3]}
    return f


@pytest.mark.slurm
def test_dependent_job_starts_only_after_its_parent(workdir):
    need_slurm()
    run_launch(
        "slurm",
        "--time",
        "5",
        "--env",
        "TEST_SLEEP=6",
        "--run-dir",
        "runs/parent",
        "--",
        "report.py",
        check=True,
    )
    child = run_launch(
        "slurm",
        "--time",
        "5",
        "--after",
        "runs/parent",
        "--run-dir",
        "runs/child",
        "--wait",
        "--",
        "report.py",
        check=True,
        timeout=240,
    )
    assert "COMPLETED" in child.stderr, child.stderr
    pjob = read_json(workdir / "runs/parent/status.json")["slurm_job_id"]
    script = next((workdir / "runs/child/slurm").glob("*_submission.sh")).read_text()
    assert f"#SBATCH --dependency=afterok:{pjob}" in script, script  # the run dir became its job id
    cjob, deadline = (
        read_json(workdir / "runs/child/status.json")["slurm_job_id"],
        time.monotonic() + 60,
    )
    while (c := job_times(cjob))["JobState"] in (
        "RUNNING",
        "COMPLETING",
    ) and time.monotonic() < deadline:
        # the run ended (launch wait) while the batch script's teardown still runs (CI, loaded)
        time.sleep(0.5)
    p = job_times(pjob)
    assert p["JobState"] == "COMPLETED" and c["JobState"] == "COMPLETED", (p, c)
    assert c["StartTime"] >= p["EndTime"], (p, c)  # ISO times: text order = time order
    assert (
        rank_lines("runs/child", "REPORT ")
        and read_json(workdir / "runs/parent/status.json")["state"] == "COMPLETED"
    )
    # the parent COMPLETED: a child that waits for its failure would never start -> refused, nothing
    # made
    bad = run_launch(
        "slurm", "--after", "runs/parent:afternotok", "--run-dir", "runs/never", "--", "report.py"
    )
    assert bad.returncode == 2 and "afternotok would never start this job" in bad.stderr, bad.stderr
    gone = run_launch("slurm", "--after", "987654321", "--run-dir", "runs/never", "--", "report.py")
    assert gone.returncode == 2 and "Slurm job 987654321 does not exist" in gone.stderr, gone.stderr
    assert not (workdir / "runs/never").exists()


@pytest.mark.slurm
def test_array_of_four_runs_completes_grouped(workdir):
    need_slurm()
    t0 = time.time()
    p = run_launch(
        "slurm",
        "--time",
        "5",
        "--sweep",
        "lr=1e-3,3e-4",
        "--sweep",
        "seed=1,2",
        "--max-parallel",
        "2",
        "--run-dir",
        "runs/sw",
        "--wait",
        "--",
        "report.py",
        env=STATE,
        timeout=400,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rec = read_json(workdir / "runs/sw/sweep.json")
    job = rec["slurm_array_job"]
    assert f"slurm array job {job} queued: 4 runs" in p.stdout
    dirs = [r["run_dir"] for r in rec["runs"]]
    assert sorted(os.listdir(workdir / "runs/sw")) == sorted(
        [*map(os.path.basename, dirs), "slurm", "sweep.json"]
    )
    argvs = [json.loads(rank_lines(d, "REPORT ")[0][7:])["argv"] for d in dirs]
    assert argvs == [["--lr", a, "--seed", b] for a in ("1e-3", "3e-4") for b in ("1", "2")]
    for k, d in enumerate(dirs):
        st = json.loads(run_launch("status", d, "--json", check=True).stdout)
        assert st["state"] == "COMPLETED" and st["nodes"] == {"0": 0}, st
        assert Path(d, "slurm", "jobs").read_text() == f"0 {job}_{k}\n"
        assert Path(d, "logs", "node0", "rank0.log").is_file() and Path(d, "run.yaml").is_file()
    assert_listed_together(workdir, "sw", 4)
    print(f"array of 4 (1 node each, 2 at once): {time.time() - t0:.1f} s")


def test_status_knows_an_array_task_by_its_array_id():
    from launchers.backends.slurm.status import parse_scontrol

    out = (
        "JobId=6 ArrayJobId=5 ArrayTaskId=0 JobState=COMPLETED Reason=None Restarts=0 "
        "ExitCode=0:0 NodeList=n1\n"
    )
    assert (
        parse_scontrol(out, "5_0").state == "COMPLETED"
        and parse_scontrol(out, "6").state == "COMPLETED"
    )
    assert parse_scontrol(out, "5_1") is None


@pytest.mark.slurm
def test_cancel_a_sweep_dir_cancels_every_run(workdir):
    need_slurm()
    run_launch(
        "slurm",
        "--time",
        "5",
        "--stop-grace",
        "3",
        "--env",
        "TEST_SLEEP=300",
        "--sweep",
        "k=1,2",
        "--max-parallel",
        "1",
        "--run-dir",
        "runs/sw",
        "--",
        "report.py",
        check=True,
    )
    rec = read_json(workdir / "runs/sw/sweep.json")
    dirs, job = [r["run_dir"] for r in rec["runs"]], rec["slurm_array_job"]
    deadline = time.monotonic() + 120
    # task 0 runs, task 1 waits
    while not any("sleeping" in ln for ln in rank_lines(dirs[0], "sleeping")):
        assert time.monotonic() < deadline, "task 0 of the array did not start"
        time.sleep(0.5)
    run_launch("cancel", "runs/sw", check=True, timeout=200)
    assert [read_json(Path(d, "status.json"))["state"] for d in dirs] == ["CANCELLED", "CANCELLED"]
    q = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=30
    ).stdout.split()
    assert not [j for j in q if j.split("_")[0] == job], q


def test_a_resumed_attempt_has_no_dependency(monkeypatch):
    from launchers.backends.slurm.backend import SlurmBackend

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    sp = spec(after="77:afterany")
    first, resumed = (
        SlurmBackend().plan(sp, "r1", attempt=0),
        SlurmBackend().plan(sp, "r1", attempt=1),
    )
    assert (
        "#SBATCH --dependency=afterany:77" in first.script
        and first.spec.opts["after"] == "77:afterany"
    )
    assert "--dependency" not in resumed.script and "after" not in resumed.spec.opts
