"""Fencing (issue 23, item 4): every attempt is a generation (status/generation, written by the
launcher when run.yaml gains an attempt), and a write from an older attempt -- a paused or
partitioned node that comes back -- is refused (nothing written) and said in one line in
launcher.log."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conftest import read_json, run_launch
from launchers.heartbeat import Reporter
from launchers.records import fence


def fenced_lines(run_dir) -> list[str]:
    log = Path(run_dir, "launcher.log")
    return (
        [ln for ln in log.read_text().splitlines() if " launch: fenced: " in ln]
        if log.exists()
        else []
    )


def test_generation_moves_forward_atomically_and_older_writers_are_refused(tmp_path, capsys):
    d = str(tmp_path)
    # no file: attempt 0, nothing older
    assert fence.current(d) == 0 and fence.check(d, 0, "x") is None
    fence.advance(d, 2)
    assert Path(d, "status", "generation").read_text() == "2\n"
    # no temporary left beside it
    assert [p.name for p in Path(d, "status").iterdir()] == ["generation"]
    fence.advance(d, 1)  # never backwards
    fence.advance(d, None)
    assert fence.current(d) == 2
    assert fence.check(d, 2, "the exit record of rank 0") is None and fence.check(d, 3, "y") is None
    assert fence.check(d, None, "a record without an attempt") is None
    assert fenced_lines(d) == [] and capsys.readouterr().err == ""
    said = fence.check(d, 1, "the exit record of rank 3")
    assert (
        said == "launch: fenced: the exit record of rank 3 from attempt 1 refused (the run is at "
        "attempt 2)"
    )
    assert [ln.split(" ", 1)[1] for ln in fenced_lines(d)] == [said]
    assert capsys.readouterr().err == said + "\n"
    with pytest.raises(
        fence.Fenced, match="^launch: fenced: the checkpoint commit of step-1 from attempt 0 "
    ):
        fence.require(d, 0, "the checkpoint commit of step-1")
    Path(d, "status", "generation").write_text("garbage\n")
    assert fence.current(d) == 0


@pytest.mark.parametrize(
    "attempts, newest",
    [
        ([{"attempt": 0}], 0),
        ([{"attempt": 0}, {"attempt": 1}], 1),
        ([{}, {}, {}], 2),
        ([{"attempt": 0}, {"attempt": 3}], 3),  # a Slurm requeue recorded after one that never was
        ([], None),
        (None, None),
        ("text", None),
        ([{"attempt": True}], None),
    ],
)
def test_newest_attempt_of_run_yaml(attempts, newest):
    assert fence.newest(attempts) == newest


def test_watch_refuses_a_woken_zombies_first_beat_and_says_its_refusal_once(tmp_path, capsys):
    d = str(tmp_path)
    fence.advance(d, 0)
    beat = Reporter(d, 1, 0)
    beat.beat(1, 100.0)
    assert read_json(Path(d, "progress", "rank1.json"))["step"] == 1
    before = Path(d, "progress", "rank1.json").read_bytes()
    fence.advance(d, 1)  # a new attempt started: this rank is a zombie now
    for step in (2, 3, 4):
        beat.beat(step, 100.0 + step)
    assert Path(d, "progress", "rank1.json").read_bytes() == before
    assert [ln.split(" ", 1)[1] for ln in fenced_lines(d)] == [
        "launch: fenced: the heartbeat of rank 1 from attempt 0 refused (the run is at attempt 1)"
    ]
    Reporter(d, 1, 1).beat(0, 200.0)  # the new attempt's rank writes
    assert read_json(Path(d, "progress", "rank1.json"))["attempt"] == 1
    assert capsys.readouterr().err.count("fenced") == 1


def test_a_beat_looks_at_the_generation_at_most_once_a_period(tmp_path, capsys):
    """Issue 38: a beat is one pwrite. The generation is looked at on the first beat, then only once
    fence.PERIOD passed (or the clock went back): a zombie that never stopped beating is refused
    within a PERIOD."""
    d = str(tmp_path)
    fence.advance(d, 0)
    beat = Reporter(d, 1, 0)
    beat.beat(1, 100.0)  # the first beat looks
    fence.advance(d, 1)
    beat.beat(2, 100.0 + fence.PERIOD / 2)  # within the period: not looked at, the beat lands
    assert read_json(Path(d, "progress", "rank1.json"))["step"] == 2 and fenced_lines(d) == []
    beat.beat(3, 100.0 + fence.PERIOD)  # a period on: looked at, refused from now on
    beat.beat(4, 100.0 + fence.PERIOD * 1.5)
    assert read_json(Path(d, "progress", "rank1.json"))["step"] == 2 and len(fenced_lines(d)) == 1
    back = Reporter(d, 2, 0)
    back.beat(1, 50.0)  # refused at once: its first beat looks
    assert not Path(d, "progress", "rank2.json").exists()
    fresh = str(tmp_path / "fresh")
    fence.advance(fresh, 0)
    beat = Reporter(fresh, 1, 0)
    beat.beat(1, 100.0)
    fence.advance(fresh, 1)
    beat.beat(2, 99.0)  # the clock went back: looked at again
    assert read_json(Path(fresh, "progress", "rank1.json"))["step"] == 1
    assert capsys.readouterr().err.count("fenced") == 3


def tree(run_dir) -> dict[str, bytes]:
    """Every file of the run dir (launcher.log, where the refusals are said, left out) and its
    bytes."""
    out = {}
    for root, _, names in os.walk(run_dir):
        for n in names:
            p = os.path.join(root, n)
            if os.path.relpath(p, run_dir) != "launcher.log":
                out[os.path.relpath(p, run_dir)] = Path(p).read_bytes()
    return out


def test_a_zombie_of_attempt_0_writes_nothing_into_attempt_1(workdir, monkeypatch):
    """A real run (attempt 0) ends; the launcher starts attempt 1 (RunDir.add_attempt, as its
    restart loop does); then attempt 0's rank-side writers run again, as a paused rank would on
    waking: its heartbeat, its exit record, rank 0's manifest part, the workload's checkpoint save,
    the commit and `latest`. None lands."""
    from launchers import ckptptr, heartbeat, rankexec
    from launchers.records.rundir import RunDir

    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--run-dir",
        "runs/f",
        "--",
        "-m",
        "workloads.convnet",
        "--dataset",
        "digits",
        "--batch-size",
        "8",
        "--no-tensorboard",
        "--max-steps",
        "6",
        "--checkpoint-every",
        "2",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    run = str(workdir / "runs/f")
    ckpt = os.path.join(run, "checkpoints")
    assert Path(run, "status", "generation").read_text() == "0\n" and fenced_lines(run) == []
    assert read_json(Path(run, "status", "rank0.json"))["attempt"] == 0
    assert read_json(Path(run, "progress", "rank0.json"))["attempt"] == 0
    assert read_json(Path(run, "manifest.json"))["node"]["attempt"] == 0
    latest = ckptptr.read_latest(ckpt)
    assert (
        latest == "step-00000006" and read_json(Path(ckpt, latest, "manifest.json"))["attempt"] == 0
    )
    rd = RunDir(run)
    rd.add_attempt(rd.spec(), {"by": "policy"})  # the launcher starts attempt 1
    assert fence.current(run) == 1
    before = tree(run)
    monkeypatch.setenv("LAUNCH_RUN_DIR", run)
    monkeypatch.setenv("LAUNCH_ATTEMPT", "0")
    monkeypatch.setenv("LAUNCH_CHECKPOINT_DIR", ckpt)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(heartbeat, "_beat", None)  # the zombie's own reporter, from its env
    heartbeat.step(7)
    rankexec.record(
        run, dict(rank=0, node=0, attempt=0, time=time.time(), pid=1, exit_code=0, signal=None)
    )
    rankexec.node_manifest(run, 0)
    from workloads.common.checkpoint import Checkpointer
    from workloads.common.dist import read_env

    with pytest.raises(
        fence.Fenced, match="checkpoint save of step-00000008 by rank 0 from attempt 0 refused"
    ):
        Checkpointer(read_env()).save(8, {}, {})
    with pytest.raises(
        fence.Fenced, match="checkpoint commit of step-00000004 from attempt 0 refused"
    ):
        ckptptr.commit(ckpt, "step-00000004")
    with pytest.raises(
        fence.Fenced, match=r"checkpoints/latest -> step-00000004 from attempt 0 refused"
    ):
        heartbeat.checkpoint(os.path.join(ckpt, "step-00000004"))
    assert tree(run) == before  # nothing of the zombie's landed
    assert ckptptr.read_latest(ckpt) == latest
    tail = " from attempt 0 refused (the run is at attempt 1)"
    assert sorted(ln.split(" ", 1)[1] for ln in fenced_lines(run)) == sorted(
        f"launch: fenced: {w}{tail}"
        for w in (
            "the heartbeat of rank 0",
            "the exit record of rank 0",
            "rank 0's part of manifest.json",
            "the checkpoint save of step-00000008 by rank 0",
            "the checkpoint commit of step-00000004",
            "checkpoints/latest -> step-00000004",
        )
    )
