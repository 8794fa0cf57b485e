"""The one submission pipeline (launchers/pipeline.py): its stages run in order for any verb, a dry
run stops after the plan, and each per-run concern is called from the pipeline only."""

from __future__ import annotations

import ast
import errno
import io
import os
from pathlib import Path

import pytest

from conftest import ROOT
from launchers import api, pipeline
from launchers.errors import LaunchError
from launchers.spec import RunSpec, build_spec

# a per-run concern -> the one module that may call it (its stage)
CONCERNS = {
    ("snapshot", "take"),
    ("snapshot", "commit"),
    ("extcache", "settle"),
    ("extcache", "make"),
    ("manifest", "write_launcher"),
    (None, "resolve_job_env"),
    (None, "gate"),
}


class Plan:
    def __init__(self, spec):
        self.spec, self.attempt, self.dist_backend, self.script = spec, 0, "gloo", None


class Recorder:
    """A verb that records which stage ran; its run dir is a stand-in the pipeline only hands to
    record()."""

    def __init__(self):
        self.calls = []

    def plan(self, spec):
        self.calls.append("plan")
        return [Plan(spec)]

    def dry_text(self, plans):
        self.calls.append("dry_text")
        return "would run\n"

    def preflight(self, plans):
        self.calls.append("preflight")
        return plans, None

    def open(self, plans, record):
        self.calls.append("open")
        self.record = record
        return ["rd"]

    def start(self, rds, plans):
        self.calls.append(("start", rds))
        return 7


def spec(tmp_path) -> RunSpec:
    return RunSpec(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=("p.py",),
        program_args=(),
        run_dir=str(tmp_path / "r"),
        name="r",
    )


def test_a_dry_run_stops_after_the_plan_and_a_launch_runs_every_stage_in_order(tmp_path):
    v, out, plans = Recorder(), io.StringIO(), []
    assert pipeline.run(v, spec(tmp_path), dry_run=True, out=out, plans=plans) == 0
    assert v.calls == ["plan", "dry_text"] and out.getvalue() == "would run\n" and len(plans) == 1
    v = Recorder()
    assert pipeline.run(v, spec(tmp_path)) == 7
    assert v.calls == ["plan", "preflight", "open", ("start", ["rd"])]
    assert not (tmp_path / "r").exists()  # nothing of the run written by the pipeline itself


def test_each_per_run_concern_is_called_from_the_pipeline_only():
    """snapshot, extension cache, job env, GPU gate and manifest: one stage each, nowhere else in
    launchers."""
    found = []
    for path in sorted((ROOT / "launchers").rglob("*.py")):
        if (
            path.name == "pipeline.py"
            or path.parent.name == "doctor"
            and path.name == "preflight.py"
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                key = (
                    (f.value.id if isinstance(f.value, ast.Name) else "?", f.attr)
                    if isinstance(f, ast.Attribute)
                    else (None, f.id)
                    if isinstance(f, ast.Name)
                    else None
                )
                if key in CONCERNS:
                    found.append(f"{Path(path).relative_to(ROOT)}:{node.lineno} {key}")
    assert found == [], found


def test_a_flush_that_fails_is_one_line_and_leaves_no_new_run_dir(tmp_path, monkeypatch):
    """The run dir's durable writes are flushed together as `open` ends
    (backends.base.synced_together): a flush that fails (an I/O error at fsync; a quota on NFS) is
    the one-line error a failed write gives, nothing starts, and the new run dir is gone (a resumed
    one would keep what its job wrote). os.fsync fails here: no file system on this machine fails a
    flush on demand."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text("print('x')\n")
    spec = build_spec("local", {"run_dir": str(tmp_path / "runs" / "r")}, ["ok.py"])

    def fails(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fails)
    with pytest.raises(
        LaunchError,
        match=(
            r"runs/r/.* cannot be flushed to disk \(Input/output error\); nothing was "
            r"started; accepted: a run dir on a file system that takes writes"
        ),
    ):
        api.submit(spec)
    assert not (tmp_path / "runs" / "r").exists()
