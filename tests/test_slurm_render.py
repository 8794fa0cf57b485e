"""Pure Slurm pieces: the sbatch script (golden files), option validation, dry-run without Slurm."""

import os
from pathlib import Path

import pytest

from conftest import run_launch
from launchers.backends.slurm.options import parse_sbatch_lines, parse_time
from launchers.backends.slurm.render import header_for, render_sbatch
from launchers.errors import LaunchError
from launchers.spec import RunSpec

GOLDEN = Path(__file__).resolve().parent / "golden"
HEADER = header_for(
    ["slurm", "--nodes", "4", "--env", "HF_TOKEN=hunter2", "--", "train.py", "--lr", "3e-4"],
    "0.1.0",
)


def spec(**options):
    return RunSpec(
        backend="slurm",
        nodes=4,
        gpus_per_node=8,
        program=("/shared/train.py",),
        program_args=("--lr", "3e-4"),
        run_dir="/shared/runs/moe1",
        name="train",
        python="/opt/venv/bin/python",
        options=tuple(sorted(options.items())),
    )


CASES = {
    "slurm_minimal": {},
    "slurm_full": dict(
        partition="gpu",
        time="04:00:00",
        account="proj a",
        qos="high",
        constraint="a100&ib",
        exclusive=True,
        mem="64G",
        cpus_per_task=16,
        signal_seconds=300,
        job_name="moe-1",
        sbatch_lines=("--reservation=maint", "#SBATCH --mail-type=END"),
    ),
    "slurm_gres": dict(partition="gpu", time="1-00:00", sbatch_lines=("--gres=gpu:8",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_sbatch(name):
    text = render_sbatch(spec(**CASES[name]), base_attempt=0, header=HEADER)
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


EQUIV = [
    *CASES.values(),
    dict(time="30"),
    dict(time="UNLIMITED", exclusive=True),
    dict(signal_seconds=45),
    dict(sbatch_lines=("--gres=gpu:8", "--comment=a b", "--mail-user=x@y")),
    dict(mem="0", cpus_per_task=1),
    dict(
        setup=("module load cuda", "source env/bin/activate"),
        sbatch_args=("--exclude=n[1-2]",),
        mem_per_gpu="80G",
        cpus_per_gpu=12,
    ),
]


@pytest.mark.parametrize("options", EQUIV)
@pytest.mark.parametrize("attempt", [0, 3])
def test_renderer_is_submitits_layout(options, attempt):
    """render_sbatch (no submitit import on the launcher's start-up) == submitit's own
    _make_sbatch_string."""
    from submitit.slurm.slurm import _make_sbatch_string

    from launchers.backends.slurm.render import (
        finalize_command,
        node_task_command,
        sbatch_parameters,
    )
    from launchers.layout import path

    sp = spec(**options)
    folder = path(sp.run_dir, "slurm")
    theirs = _make_sbatch_string(
        command=node_task_command(sp.python, sp.run_dir, attempt),
        folder=folder,
        teardown=[finalize_command(sp.python, sp.run_dir, attempt)],
        **sbatch_parameters(sp),
    )
    shebang, rest = theirs.split("\n", 1)
    assert (
        render_sbatch(sp, base_attempt=attempt, header="l1\n\nl3")
        == f"{shebang}\n# l1\n#\n# l3\n{rest}\n"
    )


def test_script_properties():
    text = render_sbatch(spec(partition="gpu", time="04:00:00"), base_attempt=2, header=HEADER)
    flags = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert flags == sorted(flags)
    assert "#SBATCH --signal=USR2@120" in flags and "#SBATCH --requeue" in flags
    assert "#SBATCH --open-mode=append" in flags and "#SBATCH --ntasks-per-node=1" in flags
    assert "#SBATCH --output=/shared/runs/moe1/slurm/%j_0_log.out" in flags
    assert text.splitlines()[1].startswith("# produced by: launch slurm --nodes 4")
    assert "hunter2" not in text and "HF_TOKEN=***" in text
    assert "--base-attempt 2" in text and "wckey" not in text
    # no submitit default of 5 min
    assert "--time" not in render_sbatch(spec(), base_attempt=0, header="h")
    gres = render_sbatch(spec(sbatch_lines=("--gres=gpu:8",)), base_attempt=0, header="h")
    assert "--gres=gpu:8" in gres and "--gpus-per-node" not in gres


def test_max_restarts_without_a_loop_over_steps_is_said_not_ignored():
    """--max-restarts restarts a Slurm run inside its job only through the loop over steps
    (--spares, --nodes MIN:MAX); without one it is warned about in one line, not ignored in
    silence."""
    from dataclasses import replace

    from launchers.backends.slurm.render import restarts_warning

    w = restarts_warning(replace(spec(), max_restarts=2))
    assert w.startswith("warning: --max-restarts 2 is not used by this Slurm run") and "\n" not in w
    assert restarts_warning(spec()) is None
    assert restarts_warning(replace(spec(), max_restarts=2, spares=1)) is None
    assert restarts_warning(replace(spec(), max_restarts=2, min_nodes=2)) is None


def test_spares_allocation_and_the_loop_over_steps():
    """--spares K: the allocation holds nodes + K (--no-kill: a lost node does not end it); the
    batch script runs the loop over attempts (one srun step each, recorded by the loop: no teardown
    line); a step runs on the hosts it is given, one task per node, with the same srun flags as the
    one-step script."""
    from dataclasses import replace

    from launchers.backends.slurm.render import node_task_command, step_srun_argv

    sp = replace(spec(partition="gpu"), nodes=2, spares=1)
    text = render_sbatch(sp, base_attempt=3, header="h")
    flags = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --nodes=3" in flags and "#SBATCH --no-kill" in flags and flags == sorted(flags)
    cmd = text.rstrip("\n").splitlines()[-1]
    assert (
        cmd == "/opt/venv/bin/python -u -m launchers.backends.slurm.task steps /shared/runs/moe1 "
        "--base-attempt 3"
    )
    assert "finalize" not in text and "srun" not in text
    argv = step_srun_argv(sp, ["lnode3", "lnode1"], node_task_command(sp.python, sp.run_dir, 3))
    assert argv[:4] == ["srun", "--unbuffered", "--output", "/shared/runs/moe1/slurm/%j_%t_log.out"]
    assert [
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=lnode3,lnode1",
        "--overlap",
    ] == argv[-13:-8]
    assert argv[-8:] == [
        "/opt/venv/bin/python",
        "-u",
        "-m",
        "launchers.backends.slurm.task",
        "task",
        "/shared/runs/moe1",
        "--base-attempt",
        "3",
    ]
    plain = render_sbatch(replace(sp, spares=0), base_attempt=3, header="h")
    assert "#SBATCH --nodes=2" in plain and "--no-kill" not in plain and "finalize" in plain


@pytest.mark.parametrize(
    "value,minutes",
    [
        ("30", 30),
        ("04:00:00", 240),
        ("1-12:00:00", 2160),
        ("2-3", 3060),
        ("10:30", 11),
        ("UNLIMITED", 0),
    ],
)
def test_parse_time(value, minutes):
    assert parse_time(value) == minutes


@pytest.mark.parametrize("value", ["4h", "04:00:00:00", "", "-5", "1-", "0", "ab:cd"])
def test_parse_time_rejects(value):
    with pytest.raises(LaunchError, match="--time"):
        parse_time(value)


def test_sbatch_lines():
    """A profile's sbatch_lines and --sbatch-arg share one validator (launchers.options.sbatchopts):
    sbatch's own options; what launch sets itself (--exclusive, --nodes, ...) is refused naming
    launch's own option."""
    assert parse_sbatch_lines(["--contiguous", "#SBATCH --reservation=x", "--mail-type END"]) == {
        "contiguous": True,
        "reservation": "x",
        "mail_type": "END",
    }
    for bad, needle in (
        (["-x n1"], "'--exclude=...'"),
        (["reservation=x"], "long form"),
        (["--a=b\n--c"], "long form"),
        (["--exclusive"], "give --exclusive instead"),
    ):
        with pytest.raises(LaunchError, match="sbatch_lines") as e:
            parse_sbatch_lines(bad)
        assert needle in str(e.value)


def test_dry_run_without_slurm(workdir):
    """Works with no Slurm on PATH; prints the script and each node's command; writes nothing."""
    env = {"PATH": "/nonexistent-bin", "SLURM_JOB_ID": ""}
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--partition",
        "gpu",
        "--time",
        "10",
        "--signal-seconds",
        "45",
        "--run-dir",
        "runs/d",
        "--dry-run",
        "--",
        "report.py",
        "a b",
        env=env,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert (
        "#SBATCH --signal=USR2@45" in out
        and "#SBATCH --nodes=2" in out
        and "#SBATCH --gpus-per-node=2" in out
    )
    assert f"#SBATCH --output={workdir}/runs/d/slurm/%j_0_log.out" in out
    assert "# produced by: launch slurm --nodes 2" in out
    assert out.count("torch.distributed.run") == 2 and "--node-rank 1" in out
    assert (
        "MASTER_ADDR=<first host of the allocation" in out
        and "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2" in out
        and "PET_SHUTDOWN_TIMEOUT=" in out
    )
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--time", "4h"], "--time '4h' is malformed"),
        (["--mem", "lots"], "--mem 'lots' is malformed"),
        (["--signal-seconds", "-3"], "--signal-seconds -3"),
    ],
)
def test_bad_options_one_line(workdir, args, msg):
    p = run_launch(
        "slurm", "--nodes", "2", *args, "--run-dir", "runs/b", "--dry-run", "--", "report.py"
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and msg in p.stderr, p.stderr
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize(
    "argv,env,expected",
    [
        (["launch", "slurm", "--nodes", "2", "--", "train.py"], {}, True),
        (["launch", "slurm", "--dry-run", "--", "train.py"], {}, False),
        (["launch", "slurm", "--help"], {}, False),
        # the login node submits
        (["launch", "slurm", "--cluster", "dev", "--", "train.py"], {}, False),
        (["launch", "slurm", "--cluster=dev", "--", "train.py"], {}, False),
        (["launch", "slurm", "--", "train.py", "--help"], {}, True),  # the program's own flag
        (["launch", "local", "--", "train.py"], {}, False),
        (["launch"], {}, False),
        # in an allocation: srun, no sbatch
        (["launch", "slurm", "--", "train.py"], {"SLURM_JOB_ID": "7"}, False),
    ],
)
def test_warm_submitter_only_for_a_real_submission(argv, env, expected, monkeypatch):
    from launchers.entry import will_submit_to_slurm

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert will_submit_to_slurm(argv) is expected


@pytest.mark.parametrize(
    "mode,srun_binds", [("auto", False), ("cores", False), ("numa", False), ("none", True)]
)
def test_srun_does_not_bind_when_the_ranks_are_bound(mode, srun_binds):
    """--cpu-bind other than none: the rank wrapper binds, so srun is told not to (--cpu-bind=none)
    -- in the sbatch script and in the in-allocation srun; with --cpu-bind none srun keeps its own
    default binding."""
    from launchers.backends.slurm.render import srun_argv

    sp = spec(partition="gpu").replace(cpu_bind=mode)
    srun_line = next(
        ln
        for ln in render_sbatch(sp, base_attempt=0, header="h").splitlines()
        if ln.startswith("srun")
    )
    argv = srun_argv(sp, run_id="r1", job_id="7", base_attempt=0)
    assert ("--cpu-bind=none" not in srun_line.split()) == srun_binds
    assert ("--cpu-bind=none" not in argv) == srun_binds
    assert not any(
        w.startswith("--cpu-bind") and w != "--cpu-bind=none" for w in srun_line.split() + argv
    )


@pytest.mark.parametrize(
    "options,cpus,warned",
    [
        ({}, 8, False),  # default: one CPU per rank
        (dict(cpus_per_gpu=12), 96, False),
        (dict(cpus_per_task=4), 4, True),  # 8 ranks on 4 CPUs
        (dict(exclusive=True), None, False),  # the whole node: no --cpus-per-task
        (dict(exclusive=True, cpus_per_task=4), 4, False),  # the whole node's CPUs anyway
    ],
)
def test_the_node_asks_for_its_ranks_cpus(options, cpus, warned):
    """Issue 33 item 3: the node's one task holds all 8 ranks; it asks --gpus-per-node x
    --cpus-per-gpu CPUs (or --cpus-per-task, or the whole node with --exclusive), and a request
    under one CPU per rank is warned about."""
    from launchers.backends.slurm.options import cpu_warning

    sp = spec(**options)
    flags = [
        ln
        for ln in render_sbatch(sp, base_attempt=0, header="h").splitlines()
        if ln.startswith("#SBATCH")
    ]
    assert [f for f in flags if f.startswith("#SBATCH --cpus")] == (
        [f"#SBATCH --cpus-per-task={cpus}"] if cpus else []
    )
    w = cpu_warning(sp)
    assert bool(w) == warned and (
        not w or "leaves each of a node's 8 ranks less than one CPU (0.5 each)" in w
    )
