"""The Python API as Python users expect it (issue 36 item 6), nothing started: a dry run is a
DryRun (text, run dir, per-node commands); the run dir resolve() names is the one submit uses;
SlurmOptions typed, a typo named with its nearest field; warnings through `warnings`, other notes
through `logging`; errors name JobSpec fields, not flags; submit_sweep; and every python block of
docs/API.md runs (its submits as dry runs).
"""

from __future__ import annotations

import ast
import logging
import re
import warnings

import pytest

import launchers
from conftest import DATA, ROOT
from launchers import (
    DryRun,
    JobSpec,
    LaunchError,
    LaunchWarning,
    SlurmOptions,
    submit,
    submit_sweep,
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "report.py").write_text((DATA / "report.py").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path / "runs"))
    return tmp_path


def test_a_dry_run_is_an_object_with_the_run_dir_submit_uses(workdir):
    spec = JobSpec(backend="local", nodes=2, program=("report.py", "x"))
    dry = submit(spec, dry_run=True)
    assert isinstance(dry, DryRun) and str(dry) == dry.text and len(dry.commands) == 2
    # one run dir, chosen once
    assert dry.run_dir == spec.resolve().run_dir == spec.resolve().run_dir
    assert all(c in dry.text for c in dry.commands) and not (workdir / "runs").exists()


def test_slurm_options_are_typed_and_a_typo_names_the_nearest_field():
    opts = SlurmOptions(
        partition="gpu", time="04:00:00", cpus_per_task=4, sbatch_args=["--gres=gpu:8"]
    )
    assert opts.to_dict() == {
        "partition": "gpu",
        "time": "04:00:00",
        "cpus_per_task": 4,
        "sbatch_args": ["--gres=gpu:8"],
    }
    assert JobSpec(backend="slurm", program=("t.py",), slurm=opts).options == opts.to_dict()
    with pytest.raises(
        TypeError,
        match=(
            r"SlurmOptions has no field 'partiton' \(did you mean 'partition'\?\); "
            r"accepted: partition, time"
        ),
    ):
        SlurmOptions(partiton="gpu")
    with pytest.raises(TypeError, match="SlurmOptions.cpus_per_task must be int, got str '4'"):
        SlurmOptions(cpus_per_task="4")
    with pytest.raises(
        LaunchError, match=r"option 'tiem' is not accepted \(did you mean 'time'\?\)"
    ):
        JobSpec(backend="slurm", program=("t.py",), slurm={"tiem": "1:00:00"})  # the dict form too
    assert {f for f in SlurmOptions.__dataclass_fields__} == {
        o.key for o in launchers.runopts.BACKEND_OPTIONS["slurm"]
    } - set(launchers.request.NOT_IN_API)  # one field per `launch slurm` option


def test_errors_name_api_fields_and_warnings_are_warnings(workdir, caplog):
    with pytest.raises(LaunchError, match=r"^JobSpec.nodes 0 is out of range"):
        JobSpec(backend="local", nodes=0, program=("report.py",)).resolve()
    with pytest.raises(LaunchError, match=r"JobSpec.dist_backend 'mpi'"):
        submit(JobSpec(backend="local", dist_backend="mpi", program=("report.py",)), dry_run=True)
    with (
        warnings.catch_warnings(record=True) as got,
        caplog.at_level(logging.INFO, logger="launchers"),
    ):
        warnings.simplefilter("always")
        submit(JobSpec(backend="local", forward_env=("*",), program=("report.py",)), dry_run=True)
    said = [str(w.message) for w in got if issubclass(w.category, LaunchWarning)]
    assert len(said) == 1 and "JobSpec.forward_env '*' forwards all" in said[0], said


def test_submit_sweep_dry_run(workdir):
    dry = submit_sweep(
        JobSpec(backend="local", program=("report.py",), run_dir="runs/sw"),
        {"lr": [0.1, 0.2]},
        dry_run=True,
    )
    assert (
        dry.run_dir == str(workdir / "runs" / "sw")
        and "--lr 0.1" in dry.text
        and "--lr 0.2" in dry.text
    )
    assert not (workdir / "runs").exists()
    with pytest.raises(TypeError, match="submit_sweep axes must be a non-empty mapping"):
        submit_sweep(JobSpec(backend="local", program=("report.py",)), ["lr=1,2"])


def blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_every_python_block_of_api_md_runs_as_a_dry_run(workdir, monkeypatch):
    """Each block of docs/API.md, top-level statement by statement: a submit is made a dry run (and
    must not be refused); a statement whose comment names an error must raise it; what needs a
    started run (the names a submit without dry_run=True binds, and all that uses them) is left
    out."""
    (workdir / "train.py").write_text("")
    (workdir / "hosts").write_text("sshhost1\n")
    monkeypatch.setattr(launchers.client, "detach", None)  # a real start would fail loudly
    real, made = launchers.client.submit, []

    def as_dry_run(spec, dry_run=False):
        made.append(real(spec, dry_run=True))
        return made[-1]

    found = blocks(ROOT / "docs" / "API.md")
    assert len(found) >= 5
    for block in found:
        ns, started, lines = {}, set(), block.splitlines()
        exec("from launchers import *", ns)  # a block goes on from the ones before it
        ns["submit"] = as_dry_run
        for stmt in ast.parse(block).body:
            src = ast.get_source_segment(block, stmt)
            names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
            bound = {
                n.id
                for n in ast.walk(stmt)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            }
            if (names - bound) & started:
                started |= bound  # uses a started run: left out, and so is what it binds
                continue
            err = re.match(
                r"\s*(TypeError|LaunchError)", lines[stmt.end_lineno - 1].partition("#")[2]
            )
            if err:
                with pytest.raises(TypeError if err.group(1) == "TypeError" else LaunchError):
                    exec(src, ns)
                continue
            exec(src, ns)
            if "submit" in ns:
                ns["submit"] = as_dry_run
            if "submit(" in src and "dry_run=True" not in src:
                started |= bound
    assert len(made) >= 5 and all(isinstance(d, DryRun) and d.commands for d in made)


def test_cli_args_ask_the_cli_for_the_same_job_as_the_spec(workdir):
    """JobSpec.cli_args() (what submit(cluster=) hands the login node's launch): `launch slurm ARGS
    --dry-run` prints the job the spec's own dry run does, option for option (the script's `produced
    by` line aside)."""
    import subprocess

    from conftest import LAUNCH

    spec = JobSpec(
        backend="slurm",
        nodes=2,
        gpus_per_node=4,
        run_dir=str(workdir / "runs/rt"),
        program=("report.py", "--lr", "3e-4"),
        env={"A": "1 2"},
        dist_backend="gloo",
        stop_grace=12.5,
        snapshot=False,
        slurm=SlurmOptions(
            partition="gpu",
            time="10",
            exclusive=True,
            mem="8G",
            sbatch_args=("--comment=x",),
            setup=("module load cuda",),
        ),
    )
    words = spec.cli_args()
    assert (
        words[:4] == ["--nodes", "2", "--gpus-per-node", "4"]
        and "--sbatch-arg=--comment=x" in words
    )
    cli = subprocess.run(
        [LAUNCH, "slurm", *words, "--dry-run", "--", *spec.program],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr

    def same(text):  # the run id's random part, the interpreter's name, sbatch --test-only's answer
        text = re.sub(r"rt-[0-9a-f]{8}", "RUNID", text.split("# sbatch --test-only")[0])
        return [
            ln.replace("/python3 ", "/python ")
            for ln in text.splitlines()
            if "# produced by:" not in ln
        ]

    assert same(cli.stdout) == same(submit(spec, dry_run=True).text)


def test_what_no_flag_says_is_refused_with_cluster(workdir):
    with pytest.raises(
        LaunchError, match=r"^JobSpec.slurm\['job_name'\] has no flag of `launch`; with cluster="
    ):
        JobSpec(backend="slurm", program=("report.py",), slurm={"job_name": "x"}).cli_args()
    with pytest.raises(LaunchError, match=r"^JobSpec.runs_root is this machine's"):
        JobSpec(backend="slurm", program=("report.py",), runs_root="runs").cli_args()
    with pytest.raises(
        LaunchError, match=r"^JobSpec.backend 'local' with cluster='dev': accepted: 'slurm'"
    ):
        submit(JobSpec(backend="local", program=("report.py",)), cluster="dev")
