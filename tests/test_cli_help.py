"""Issue 36 items 2 and 5: help that shows each option's kind (no TEXT for a number or a choice) in
sections, every option with help text and every verb with examples, bare `launch` and `launch nccl`
print help (exit 0), "did you mean" on every verb, completion of choices, run names and files, one
name per thing (the old spellings accepted with a one-line note), and `launch doctor` honouring the
LAUNCH_* defaults of the verb it checks for."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import click
import pytest
from click.shell_completion import ShellComplete
from click.testing import CliRunner

from conftest import run_launch
from launchers import cpubind
from launchers.cli import main
from launchers.containers import containeropts
from launchers.options import opthelp, specvalues
from launchers.runopts import BACKEND_OPTIONS, COMMON

SLURM_METAVARS = [
    ("--nodes", "N|MIN:MAX"),
    ("--gpus-per-node", "INTEGER"),
    ("--master-port", "INTEGER"),
    ("--max-restarts", "INTEGER"),
    ("--spares", "INTEGER"),
    ("--quarantine-after", "INTEGER"),
    ("--stop-grace", "SECONDS"),
    ("--hang-timeout", "SECONDS"),
    ("--dist-backend", "[auto|gloo|nccl]"),
    ("--cpu-bind", "[auto|none|numa|cores]"),
    ("--stop-signal", "[SIGTERM|SIGINT|SIGHUP|SIGQUIT]"),
    ("--container-runtime", "[auto|pyxis|apptainer|podman|oci]"),
    ("--preflight", "[gpu]"),
    ("--cpus-per-task", "INTEGER"),
    ("--cpus-per-gpu", "INTEGER"),
    ("--signal-seconds", "INTEGER"),
    ("--max-requeues", "INTEGER"),
    ("--max-parallel", "INTEGER"),
    ("--time", "[D-]H:M:S"),
    ("--mem", "SIZE"),
    ("--profile", "FILE"),
    ("--run-dir", "DIR"),
    ("--partition", "NAME"),
]
GROUPS = {
    "slurm": [
        "Slurm options:",
        "Job shape:",
        "Run options:",
        "Recovery options:",
        "Container options:",
        "Diagnosis options:",
    ],
    "ssh": [
        "SSH options:",
        "Job shape:",
        "Run options:",
        "Recovery options:",
        "Container options:",
        "Diagnosis options:",
    ],
}


def invoke(*args, **kw):
    return CliRunner().invoke(main, list(args), **kw)


def test_slurm_help_shows_each_kind_and_no_text():
    out = invoke("slurm", "--help").output
    for flag, metavar in SLURM_METAVARS:
        assert f"{flag} {metavar}" in out, flag
    assert "TEXT" not in out


@pytest.mark.parametrize("verb", ["slurm", "ssh"])
def test_groups_in_order_the_backends_own_first(verb):
    out = invoke(verb, "--help").output
    at = [out.index("\n" + g) for g in GROUPS[verb]]
    assert at == sorted(at) and out.index("Other options:") > at[-1]


def commands(cmd: click.Command, ctx: click.Context):
    yield cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            yield from commands(sub, click.Context(sub, info_name=name, parent=ctx))


def test_every_option_has_help_and_every_verb_examples():
    no_help, no_examples = [], []
    for cmd, ctx in commands(main, click.Context(main, info_name="launch")):
        no_help += [
            f"{ctx.command_path} {p.opts[0]}"
            for p in cmd.params
            if isinstance(p, click.Option) and not p.hidden and not p.help
        ]
        if (
            ctx.command_path.count(" ") == 1
            and ctx.info_name != "nccl"
            and "Examples:" not in (cmd.epilog or "")
        ):
            no_examples.append(ctx.command_path)
    assert no_help == [] and no_examples == []


def test_help_and_look_are_given_for_the_declared_options_only():
    declared = {o.key for o in (*COMMON, *(o for opts in BACKEND_OPTIONS.values() for o in opts))}
    assert set(opthelp.HELP) == set(opthelp.LOOK) == declared


def test_the_choices_shown_are_the_ones_the_parsers_accept():
    shown = {o.key: o.choices for o in (*COMMON, *BACKEND_OPTIONS["slurm"]) if o.choices}
    assert shown == {
        "dist_backend": specvalues.DIST_BACKENDS,
        "stop_signal": specvalues.STOP_SIGNALS,
        "cpu_bind": cpubind.MODES,
        "container_runtime": containeropts.RUNTIMES,
        "preflight": specvalues.PREFLIGHTS,
    }


@pytest.mark.parametrize("args", [[], ["nccl"]])
def test_bare_launch_and_launch_nccl_print_help(args):
    p = run_launch(*args)
    assert p.returncode == 0 and p.stdout.startswith("Usage: launch") and p.stderr == ""


@pytest.mark.parametrize("verb", ["slurm", "ssh", "local"])
def test_a_typo_suggests_the_option(tmp_path, verb):
    p = run_launch(verb, "--nodse", "2", "--", "x.py", cwd=tmp_path)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "did you mean --nodes?" in err[0], p.stderr
    assert os.listdir(tmp_path) == []


def test_a_typo_of_resume_and_an_sbatch_option_keep_their_pointers(tmp_path):
    assert (
        "Did you mean '--nodes'?" in run_launch("resume", "--nodse", "2", "x", cwd=tmp_path).stderr
    )
    p = run_launch("slurm", "--gres", "gpu:8", "--", "x.py", cwd=tmp_path)
    assert p.returncode == 2 and "--sbatch-arg '--gres=gpu:8'" in p.stderr


def completions(args, incomplete):
    return [
        (c.value, c.type)
        for c in ShellComplete(main, {}, "launch", "_LAUNCH_COMPLETE").get_completions(
            args, incomplete
        )
    ]


def test_completion_of_choices_runs_and_files(tmp_path, monkeypatch):
    assert completions(["slurm", "--dist-backend"], "") == [
        ("auto", "plain"),
        ("gloo", "plain"),
        ("nccl", "plain"),
    ]
    assert completions(["local", "--container-runtime"], "p") == [
        ("pyxis", "plain"),
        ("podman", "plain"),
    ]
    for name in ("demo-1", "demo-2", "other"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "run.yaml").write_text("{}\n")
    (tmp_path / "runs" / "demo-not-a-run").mkdir()
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path / "runs"))
    for verb in ("status", "logs", "resume", "cancel", "wait"):
        assert completions([verb], "de") == [("demo-1", "plain"), ("demo-2", "plain")]
    assert completions(["status"], "./r") == [("./r", "dir")]
    assert completions(["ssh", "--hostfile"], "h") == [("h", "file")]
    (tmp_path / "site.yaml").write_text("nodes: 2\n")
    monkeypatch.chdir(tmp_path)
    assert completions(["slurm", "--profile"], "s") == [("site.yaml", "plain")]


def test_completion_through_the_shell_protocol(tmp_path):
    env = {
        "_LAUNCH_COMPLETE": "bash_complete",
        "COMP_WORDS": "launch slurm --stop-signal SIGT",
        "COMP_CWORD": "3",
    }
    assert run_launch(cwd=tmp_path, env=env).stdout.split() == ["plain,SIGTERM"]
    assert "_LAUNCH_COMPLETE=bash_complete" in run_launch("completion", "bash").stdout


NOTE = "launch: note: {} is renamed {}; {} will be refused in the next release"


def test_list_root_is_runs_root_and_the_old_spelling_says_so(tmp_path):
    (tmp_path / "runs").mkdir()
    # not the runs index other tests add to meanwhile
    own = {"LAUNCH_STATE_DIR": str(tmp_path / "state")}
    new = run_launch("list", "--runs-root", "runs", "--json", cwd=tmp_path, env=own)
    old = run_launch("list", "--root", "runs", "--json", cwd=tmp_path, env=own)
    assert new.returncode == old.returncode == 0 and new.stdout == old.stdout and new.stderr == ""
    assert old.stderr.strip() == NOTE.format("--root", "--runs-root", "--root")


def test_doctor_run_root_is_runs_root():
    p = run_launch("doctor", "--run-root", "x")
    assert p.stderr.splitlines()[0] == NOTE.format("--run-root", "--runs-root", "--run-root")
    assert "--runs-root DIR" in invoke("doctor", "--help").output


def test_nccl_old_spellings_work_with_a_note(tmp_path):
    p = run_launch("nccl", "bench", "--preset", "mo", cwd=tmp_path)
    assert p.stderr.splitlines()[0] == NOTE.format("--preset", "--nccl-preset", "--preset")
    assert "unknown NCCL preset 'mo'" in p.stderr
    p = run_launch("nccl", "sweep", "--presets", "moe+bogus", "--out", "s", cwd=tmp_path)
    assert (
        "--presets is renamed --nccl-preset, given once per candidate" in p.stderr.splitlines()[0]
    )
    assert (
        "unknown NCCL preset 'bogus'" in p.stderr
        and p.returncode == 2
        and os.listdir(tmp_path) == []
    )
    fix = Path(__file__).parent / "data" / "nccltests" / "all_reduce_perf_8gpu.txt"
    p = run_launch(
        "nccl", "import", str(fix), "--preset", "a", "--out", "r.csv", cwd=tmp_path, check=True
    )
    assert p.stderr.splitlines() == [
        NOTE.format("--out", "--csv", "--out"),
        NOTE.format("--preset", "--nccl-preset", "--preset"),
    ]
    assert {r["preset"] for r in csv.DictReader(open(tmp_path / "r.csv"))} == {"a"}


def test_doctor_takes_the_ssh_defaults_only_for_ssh_hosts(tmp_path):
    (tmp_path / "hf").write_text("sshhost1\nsshhost2 slots=x\n")
    env = {"LAUNCH_SSH_HOSTFILE": "hf", "LAUNCH_NODES": "3"}
    # the hostfile is read (nothing reached): SSH hosts
    p = run_launch("doctor", cwd=tmp_path, env=env)
    assert p.returncode == 2 and "hostfile 'hf' line 2" in p.stderr, p.stderr
    # not another target's, not LAUNCH_NODES for this one machine
    for target in ("--slurm", "--local"):
        p = run_launch("doctor", target, "--timeout", "0", cwd=tmp_path, env=env)
        assert p.returncode == 2 and "--timeout 0.0 is not accepted" in p.stderr, p.stderr
    p = run_launch(
        "doctor", "--hosts", "sshhost1", cwd=tmp_path, env={"LAUNCH_SSH_CONNECT_TIMEOUT": "0"}
    )
    assert (
        p.returncode == 2 and "--connect-timeout (from $LAUNCH_SSH_CONNECT_TIMEOUT)" in p.stderr
    ), p.stderr
