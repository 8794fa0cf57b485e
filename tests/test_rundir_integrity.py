"""A run dir is only itself (issue 21, item 1): nothing the launcher writes goes through a symlink out of the run dir."""
import os

import pytest

from launchers import ckptptr, layout
from launchers.errors import LaunchError
from launchers.rundir import RunDir


def _link_out(rd, rel, outside, as_dir=True):
    target = os.path.join(rd, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.makedirs(outside, exist_ok=True)
    os.symlink(outside if as_dir else os.path.join(outside, "f"), target)


WRITES = {      # what the launcher writes -> (the planted link, how it is written)
    "agent_log": ("logs/node0", lambda rd: RunDir(rd).start_agent_log(0, 0, "cmd")),
    "status": ("status.json", lambda rd: RunDir(rd).update_status(state="RUNNING")),
    "records": ("status", lambda rd: RunDir(rd).write_rank_record({"rank": 0})),
    "node_record": ("status/node0.json", lambda rd: RunDir(rd).write_node_record(0, {"node": 0})),
    "run_yaml": ("run.yaml", lambda rd: RunDir(rd).write_run_yaml({"run_id": "x"})),
    "latest": ("checkpoints/latest", lambda rd: ckptptr.write_latest(os.path.join(rd, "checkpoints"), "step-1")),
    "own_dirs": ("checkpoints", layout.check_own_dirs),
    "node_dir": ("logs/node3", layout.check_own_dirs),
    "rank_log": ("logs/node0/rank0.log", layout.check_own_dirs),
    "heartbeat": ("progress/rank1.json", layout.check_own_dirs),
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
    assert "\n" not in msg and f"{os.path.basename(rel)}' in the run dir" in msg and "symbolic link" in msg, msg
    assert os.listdir(outside) == []                                      # nothing written out of the run dir


def test_no_symlink_passes_plain_paths_and_refuses_outside(tmp_path):
    rd = str(tmp_path)
    assert layout.own_path(rd, "rank_log", node=1, rank=2) == os.path.join(rd, "logs/node1/rank2.log")
    with pytest.raises(LaunchError, match="outside the run dir"):
        layout.no_symlink(rd, os.path.join(rd, "..", "x"))
