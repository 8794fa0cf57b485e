"""A run dir is only itself (issue 21, item 1): a copied run dir resumes into itself and leaves the
original untouched; nothing the launcher writes goes through a symlink out of the run dir."""

import hashlib
import json
import os
import shutil

import pytest
import yaml

from conftest import read_json, run_launch
from launchers import api, ckptptr, layout
from launchers.errors import LaunchError
from launchers.records import rundircheck
from launchers.records.rundir import RunDir
from launchers.spec import RunSpec

TINY = [
    "-m",
    "workloads.convnet",
    "--dataset",
    "digits",
    "--checkpoint-every",
    "2",
    "--no-tensorboard",
]


def hashes(root):
    """Every file under root (links as their target text, never followed) -> its sha256."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            p = os.path.join(d, name)
            data = os.readlink(p).encode() if os.path.islink(p) else open(p, "rb").read()
            out[os.path.relpath(p, root)] = hashlib.sha256(data).hexdigest()
    return out


@pytest.mark.slow
def test_resume_of_a_copy_writes_only_the_copy_and_a_moved_one_itself(workdir):
    r = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--run-dir",
        "runs/done",
        "--",
        *TINY,
        "--max-steps",
        "4",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    shutil.copytree("runs/done", "copy", symlinks=True)
    before, copied = hashes("runs/done"), hashes("copy")
    # a copy still holds the original's run id: refused in one line naming the original, nothing
    # written
    refused = run_launch("resume", "copy", "--", *TINY, "--max-steps", "6")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "is a copy of" in refused.stderr and str(workdir / "runs/done") in refused.stderr
    assert "--adopt" in refused.stderr and hashes("copy") == copied
    r = run_launch("resume", "--adopt", "copy", "--", *TINY, "--max-steps", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert hashes("runs/done") == before  # the original: byte for byte
    assert read_json("copy/final.json")["step"] == 6  # the new work is the copy's
    assert (workdir / "copy/checkpoints/latest").read_text().strip() == "step-00000006"
    assert "resumed from step-00000004" in (workdir / "copy/logs/node0/rank0.log").read_text()
    assert read_json("copy/status.json")["state"] == "COMPLETED"
    rec, old = yaml.safe_load(open("copy/run.yaml")), yaml.safe_load(open("runs/done/run.yaml"))
    assert rec["run_id"] != old["run_id"] and rec["adopted_from"] == {
        "run_id": old["run_id"],
        "run_dir": str(workdir / "runs/done"),
    }
    assert rec["spec"]["run_dir"] == str(workdir / "copy")
    # its commands: the copy's paths
    assert str(workdir / "runs/done") not in yaml.safe_dump(rec["attempts"][-1])
    # moved (nothing left where run.yaml says): resumes into itself, same run id, its new place
    # recorded
    os.rename("runs/done", "moved")
    r = run_launch("resume", "moved", "--", *TINY, "--max-steps", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_json("moved/final.json")["step"] == 6 and not os.path.exists("runs/done")
    moved = yaml.safe_load(open("moved/run.yaml"))
    assert moved["run_id"] == old["run_id"] and moved["spec"]["run_dir"] == str(workdir / "moved")


def _link_out(rd, rel, outside, as_dir=True):
    target = os.path.join(rd, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.makedirs(outside, exist_ok=True)
    os.symlink(outside if as_dir else os.path.join(outside, "f"), target)


WRITES = {  # what the launcher writes -> (the planted link, how it is written)
    "agent_log": ("logs/node0", lambda rd: RunDir(rd).start_agent_log(0, 0, "cmd")),
    "status": ("status.json", lambda rd: RunDir(rd).update_status(state="RUNNING")),
    "records": ("status", lambda rd: RunDir(rd).write_rank_record({"rank": 0})),
    "node_record": ("status/node0.json", lambda rd: RunDir(rd).write_node_record(0, {"node": 0})),
    "run_yaml": ("run.yaml", lambda rd: RunDir(rd).write_run_yaml({"run_id": "x"})),
    "latest": (
        "checkpoints/latest",
        lambda rd: ckptptr.write_latest(os.path.join(rd, "checkpoints"), "step-1"),
    ),
    "own_dirs": ("checkpoints", rundircheck.check_own_dirs),
    "node_dir": ("logs/node3", rundircheck.check_own_dirs),
    "rank_log": ("logs/node0/rank0.log", rundircheck.check_own_dirs),
    "heartbeat": ("progress/rank1.json", rundircheck.check_own_dirs),
}


@pytest.mark.parametrize("what", sorted(WRITES))
def test_a_symlink_in_the_run_dir_is_refused(tmp_path, what):
    rel, write = WRITES[what]
    rd, outside = str(tmp_path / "run"), str(tmp_path / "elsewhere")
    os.makedirs(rd)
    _link_out(rd, rel, outside, as_dir=not rel.endswith((".json", ".yaml", ".log", "latest")))
    with pytest.raises(LaunchError) as e:
        write(rd)
    msg = str(e.value)
    assert (
        "\n" not in msg
        and f"{os.path.basename(rel)}' in the run dir" in msg
        and "symbolic link" in msg
    ), msg
    assert os.listdir(outside) == []  # nothing written out of the run dir


def test_no_symlink_passes_plain_paths_and_refuses_outside(tmp_path):
    rd = str(tmp_path)
    assert layout.own_path(rd, "rank_log", node=1, rank=2) == os.path.join(
        rd, "logs/node1/rank2.log"
    )
    with pytest.raises(LaunchError, match="outside the run dir"):
        layout.no_symlink(rd, os.path.join(rd, "..", "x"))


def test_a_copy_is_told_from_a_moved_run_dir_and_adopt_is_only_for_a_copy(tmp_path):
    made = str(tmp_path / "made")
    RunDir.create(RunSpec("local", 1, 1, ("t.py",), (), made, "made"), "made-1234", {})
    shutil.copytree(made, tmp_path / "copy", symlinks=True)
    copy = RunDir.open(str(tmp_path / "copy"))
    assert api.copy_of(copy, copy.read_run_yaml()) == made
    assert api.copy_of(RunDir.open(made), RunDir.open(made).read_run_yaml()) is None
    with pytest.raises(
        LaunchError, match=r"^--adopt is only for a copy of another run dir; .*made'"
    ):
        api.resume(made, {}, adopt=True)
    os.rename(made, tmp_path / "gone")  # moved away: the copy is the run now, not a copy
    assert api.copy_of(copy, copy.read_run_yaml()) is None


BAD_LEDGERS = {
    "pool of words": {"pool": {"active": ["zero"], "spares": [], "quarantined": []}},
    "slot not a number": {"slots": {"x": {}}},
    "attempts not records": {"slots": {"0": {"attempts": ["boom"]}}},
    "node a word": {"slots": {"0": {"attempts": [{"attempt": 1, "node": "n"}]}}},
    "strikes a word": {"slots": {"0": {"strikes": "many"}}},
    "decisions a dict": {"decisions": {"a": 1}},
}


def test_a_damaged_node_ledger_is_ignored_with_one_line_never_a_traceback(tmp_path):
    """nodes.json is data: a shape launch never writes is left out of status, --ranks, --json and a
    resume's pool with one warning line naming the file, and nothing tracebacks (it did: status
    --ranks on a slot's word node)."""
    from launchers.ledgers import nodeledger

    spec = RunSpec(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=("t.py",),
        program_args=(),
        run_dir=str(tmp_path / "r"),
        name="r",
    )
    rd = RunDir.create(spec, "r-1", {})
    rd.update_status(state="FAILED", attempt=0)
    path = tmp_path / "r" / "nodes.json"
    for name, led in BAD_LEDGERS.items():
        path.write_text(json.dumps(led))
        assert nodeledger.problem(led), name
        for args in (
            ["status", str(tmp_path / "r")],
            ["status", "--ranks", str(tmp_path / "r")],
            ["status", "--json", str(tmp_path / "r")],
        ):
            p = run_launch(*args)
            assert p.returncode == 0 and "Traceback" not in p.stderr, (name, args, p.stderr)
            assert p.stderr.count(f"{path} is ignored") == 1, (name, args, p.stderr)
    path.write_text(
        json.dumps({"pool": {"active": [0], "spares": [], "quarantined": []}, "slots": {}})
    )
    assert nodeledger.problem(json.loads(path.read_text())) is None and nodeledger.read(rd.path)[
        "pool"
    ]["active"] == [0]
