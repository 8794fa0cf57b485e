"""Issue 25 items 3-4: `launch top` (launchers.diagnosis.top) over fake run dirs written by the real
writers (RunDir, launchers.heartbeat), the heartbeat's total and checkpoint, the frameworks'
callbacks (launchers.integrations) driven with stand-ins for the attributes they read, and one tmux
session driving `launch top` live."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import LAUNCH, ROOT
from launchers import heartbeat, integrations
from launchers.diagnosis import explain, top
from launchers.records.rundir import RunDir
from launchers.spec import RunSpec

NOW = 1_800_000_000.0


@pytest.fixture(autouse=True)
def own_index(monkeypatch, tmp_path):
    """These fake runs stay RUNNING: kept out of the shared runs index (other tests' `launch
    list`)."""
    monkeypatch.setenv("LAUNCH_STATE_DIR", str(tmp_path / "state"))


def fake_run(where: Path, nodes: int, gpus: int, **status) -> RunDir:
    rd = RunDir.create(
        RunSpec("local", nodes, gpus, ("t.py",), (), str(where), where.name), f"{where.name}-1", {}
    )
    rd.update_status(state="RUNNING", attempt=0, **status)
    return rd


def beat(
    rd: RunDir, rank: int, steps: range, last: float, step_s: float = 0.1, total: int | None = None
) -> None:
    """Rank `rank` reports `steps`, step_s apart, the last one at `last` (the program's own
    writer)."""
    r = heartbeat.Reporter(rd.path, rank, 0)
    for i, s in enumerate(steps):
        r.beat(s, last - (len(steps) - 1 - i) * step_s, total=total)
    r.close()


def test_top_per_rank_step_rate_eta_last_seen_flags(tmp_path):
    rd = fake_run(
        tmp_path / "r", 1, 4, hang={"stalled_ranks": [1], "waiting_ranks": [0], "ranks": {}}
    )
    beat(rd, 0, range(0, 11), NOW - 0.2, total=100)
    beat(rd, 1, range(0, 11), NOW - 0.1, total=100)
    beat(rd, 2, range(0, 6), NOW - 9.0, total=100)  # stopped 9 s ago while the others went on
    view = top.look(rd.path, now=NOW)  # rank 3 never reported
    rows = {r["rank"]: r for r in view["rows"]}
    assert [rows[r]["flags"] for r in range(4)] == [["waiting"], ["STALLED"], ["silent"], []]
    assert rows[0]["total"] == 100 and rows[0]["step"] == 10 and not rows[3]["reported"]
    lines = top.render(view)
    assert lines[0].endswith("RUNNING  attempt 0  1x4 (4 ranks, 3 flagged)")
    cells = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert (
        cells["0"][:6] == ["0", "0", "10/100", "10.00", "0:09", "1.00"]
        and cells["0"][-1] == "waiting"
    )
    assert cells["2"][-3:] == ["9.0s", "ago", "silent"]
    assert lines[-1].split() == ["3", "0", "-", "-", "-", "-", *explain.NO_REPORT.split()]
    # `launch status --ranks` shares the rows (and its table says the same for a rank that never
    # reported)
    table = explain.format_ranks(view["rows"])
    assert table[0].split()[-1] == "FLAGS" and table[-1].split() == [
        "3",
        "0",
        "-",
        "-",
        "-",
        "-",
        *explain.NO_REPORT.split(),
    ]
    assert explain.last_step(rd, 0) == 10  # no metrics.jsonl: rank 0's reported step
    quiet = fake_run(tmp_path / "q", 1, 2)
    assert top.render(top.look(quiet.path, now=NOW))[1:] == [f"  {explain.NO_REPORT}"]
    for rank in (0, 1):  # every rank still: nobody singled out, said once
        beat(quiet, rank, range(0, 5), NOW - 20.0)
    lines = top.render(top.look(quiet.path, now=NOW))
    assert lines[0].endswith("(2 ranks, 0 flagged)  -- no rank advanced for 20.0s"), lines


@pytest.mark.parametrize("nodes,gpus", [(128, 8), (4, 256)])
def test_top_at_1024_ranks_is_a_bounded_view_listing_the_flagged(tmp_path, nodes, gpus):
    rd = fake_run(tmp_path / "big", nodes, gpus)
    for rank in range(nodes * gpus):
        if rank != 1000:  # 1000: never reports
            beat(
                rd,
                rank,
                range(40 + rank % 3, 43 + rank % 3),
                NOW - (30.0 if rank == 517 else 0.05),
                total=500,
            )
    started = time.process_time()
    lines = top.render(top.look(rd.path, now=NOW))
    cost = time.process_time() - started
    print(f"{nodes}x{gpus}: {len(lines)} lines, {cost:.3f} s CPU per refresh")
    assert len(lines) <= 4 + top.NODE_LINES + top.FLAGGED_SHOWN + 2
    node = lines[2].split()  # flagged nodes first: 517's
    assert (
        node[:3] == [str(517 // gpus), str(gpus), "42/43/44"]
        if gpus == 8
        else node[:2] == ["2", "256"]
    )
    flagged = [ln.split() for ln in lines[lines.index("flagged ranks (1):") + 2 :]]
    assert [f[0] for f in flagged] == ["517"] and flagged[0][-1] == "silent"
    assert [ln.split()[0] for ln in lines if ln.endswith(f"0; 1 with {explain.NO_REPORT}")] == [
        str(1000 // gpus)
    ]
    if nodes > top.NODE_LINES:
        assert lines[-4] == f"  +{nodes - top.NODE_LINES} nodes more, none flagged"


def test_gpu_line_from_nvidia_smi_and_nothing_without_it(monkeypatch, tmp_path):
    text = "0, 37, 1024, 81920\n1, 100, 40960, 81920\n"
    assert top.gpu_lines(text, "n1") == ["gpus on n1: 0: 37% 1.0/80.0 GiB  1: 100% 40.0/80.0 GiB"]
    assert top.gpu_lines("[N/A], [N/A], 0, 0\n", "n1") == []
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: nothing shown, no error
    assert top.gpus() == []


@pytest.fixture
def reporter(monkeypatch, tmp_path):
    """This process as rank 0 of a fake run (launchers.heartbeat reads its environment once)."""
    rd = fake_run(tmp_path / "job", 1, 2)
    monkeypatch.setenv("LAUNCH_RUN_DIR", rd.path)
    monkeypatch.setenv("LAUNCH_CHECKPOINT_DIR", rd.checkpoint_dir)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(heartbeat, "_beat", None)
    yield rd
    if heartbeat._beat is not None:
        heartbeat._beat.close()


def test_heartbeat_total_and_checkpoint(reporter):
    rd = reporter
    heartbeat.step(3, total=10)
    heartbeat.step()  # the total stays
    assert {k: heartbeat.read(rd.path, 0)[k] for k in ("step", "total")} == {"step": 4, "total": 10}
    os.makedirs(os.path.join(rd.checkpoint_dir, "step-4"))
    elsewhere = os.path.join(rd.path, "elsewhere", "step-4")
    os.makedirs(elsewhere)
    assert heartbeat.checkpoint(elsewhere) is False and rd.latest_checkpoint() is None
    assert heartbeat.checkpoint(os.path.join(rd.checkpoint_dir, "missing")) is False
    assert heartbeat.checkpoint(os.path.join(rd.checkpoint_dir, "step-4")) is True
    assert rd.latest_checkpoint() == "step-4"
    assert explain.format_checkpoint(explain.checkpoint(rd)).startswith(
        "checkpoint: step-4 (unverified"
    )


def test_framework_callbacks_report_steps_totals_and_checkpoints(reporter):
    rd, ck = reporter, reporter.checkpoint_dir
    light = integrations.LightningProgress()
    saver = SimpleNamespace(last_model_path="", best_model_path="")
    trainer = SimpleNamespace(
        max_steps=-1,
        estimated_stepping_batches=float("inf"),
        global_step=7,
        is_global_zero=True,
        checkpoint_callbacks=[saver],
    )
    light.on_train_start(trainer, None)
    assert light.total is None  # -1 and inf: unknown
    trainer.max_steps = 40
    light.on_train_start(trainer, None)
    Path(ck, "step-00000007.ckpt").write_bytes(b"x")
    saver.last_model_path = os.path.join(ck, "step-00000007.ckpt")
    light.on_train_batch_end(trainer, None, None, None, 6)
    assert (heartbeat.read(rd.path, 0)["total"], rd.latest_checkpoint()) == (
        40,
        "step-00000007.ckpt",
    )
    hf = integrations.HFProgress()
    args, state = (
        SimpleNamespace(output_dir=ck),
        SimpleNamespace(global_step=30, max_steps=100, is_world_process_zero=True),
    )
    hf.on_step_end(args, state, None)
    os.makedirs(os.path.join(ck, "checkpoint-30"))
    hf.on_save(args, state, None)
    assert (heartbeat.read(rd.path, 0)["step"], rd.latest_checkpoint()) == (30, "checkpoint-30")
    ds, engine = integrations.DeepSpeedProgress(total=50), SimpleNamespace(global_steps=45)
    ds.step(engine)
    os.makedirs(os.path.join(ck, "global_step45"))
    assert ds.saved(engine, ck) is True and rd.latest_checkpoint() == "global_step45"
    assert heartbeat.read(rd.path, 0)["total"] == 50
    other = SimpleNamespace(global_step=31, max_steps=100, is_world_process_zero=False)
    os.makedirs(os.path.join(ck, "checkpoint-31"))
    hf.on_save(args, other, None)  # only the world's rank 0 moves the pointer
    assert rd.latest_checkpoint() == "global_step45"
    # (lightning_callback() with Lightning's own base class: examples/lightning_ddp.py,
    # tests/test_frameworks.py)


WRITER = """
import os, sys, time
from launchers import heartbeat
run, world = sys.argv[1], int(sys.argv[2])
beats, step = [heartbeat.Reporter(run, r, 0) for r in range(world)], 0
while not os.path.exists(run + '.end'):
    for r, b in enumerate(beats):
        if not (r == 1 and os.path.exists(run + '.stop')):
            b.beat(step, time.time(), total=100000)
    step += 1
    time.sleep(0.05)
"""


def tree(path: str) -> dict[str, str]:
    out = {}
    for d, dirs, files in os.walk(path):
        for f in dirs + files:
            p = os.path.join(d, f)
            out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest() if f in files else "dir"
    return out


def test_top_live_in_tmux_flags_a_stopped_rank_and_q_quits_touching_nothing(tmp_path):
    rd = fake_run(tmp_path / "live", 1, 4)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, rd.path, "4"], env=env)
    sock = str(tmp_path / "tmux.sock")
    tmux = ["tmux", "-S", sock]
    cmd = (
        f"{shlex.quote(LAUNCH)} top --interval 0.5 {shlex.quote(rd.path)}; echo TOP-EXIT=$?; "
        "sleep 60"
    )
    subprocess.run(tmux + ["new-session", "-d", "-x", "150", "-y", "40", cmd], check=True, env=env)

    def screen(until, what):
        deadline = time.monotonic() + 30
        while True:
            text = subprocess.run(
                tmux + ["capture-pane", "-p"], capture_output=True, text=True
            ).stdout
            rows = {
                ln.split()[0]: ln.split()
                for ln in text.splitlines()
                if ln.split()[:1] in (["0"], ["1"], ["2"], ["3"])
            }
            if until(text, rows):
                return text, rows
            assert time.monotonic() < deadline, f"`launch top` never showed {what}:\n{text}"
            time.sleep(0.2)

    try:
        screen(
            lambda t, rows: len(rows) == 4 and all(r[2] != "-" for r in rows.values()),
            "the four ranks",
        )
        Path(rd.path + ".stop").touch()  # rank 1 stops reporting, the others go on
        _, rows = screen(lambda t, rows: rows.get("1", [""])[-1] == "silent", "rank 1 flagged")
        assert [rows[r][-1] for r in "023"] == ["ago"] * 3
        Path(rd.path + ".end").touch()
        writer.wait(timeout=30)
        before = tree(rd.path)
        subprocess.run(tmux + ["send-keys", "q"], check=True)
        screen(lambda t, rows: "TOP-EXIT=0" in t, "its exit after q")
        assert tree(rd.path) == before  # read-only: nothing written, added or removed
    finally:
        writer.kill()
        subprocess.run(tmux + ["kill-server"], capture_output=True)
