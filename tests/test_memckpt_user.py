"""--memory-checkpoint for a user's own program (issue 37 item 1): the one call of launchers.integrations
(memory_checkpoints(states) -> restore(storage step) at the start, save(step) after each step) over the launcher's
implementation (launchers.memckpt, the workloads' too). Pure: without --memory-checkpoint the handle is falsy and
every call a no-op. Real run (local, 2 simulated nodes x 1, --max-restarts 1, a 1 s step delay, the program's own
storage checkpoints at steps 4 and 8): tests/data/memckpt_user.py, a plain PyTorch loop (Adam, its batches from
each rank's global RNG); node 1 killed at step 6 resumes from memory (rank 1 from the copy node 0 held), at most
M = 1 step lost, and ends with the uninterrupted run's weights (sha256)."""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from conftest import read_json, run_launch
from launchers import integrations, memstore
from test_memckpt import MEMORY, attempt1
from test_recovery import gone, recovery_row
from test_recovery_local import ended, signal_node, started_with_a_spare

USER = ("memckpt_user.py",)


def test_without_the_option_the_handle_does_nothing():
    class Stateful:
        def state_dict(self):
            raise AssertionError("read without --memory-checkpoint")
    mem = integrations.MemoryCheckpoints({"s": Stateful()}, environ={"RANK": "0", "WORLD_SIZE": "2"})
    assert not mem and mem.restore(4) is None and mem.save(1) is False and mem.progress == {}
    mem.close()
    on = integrations.MemoryCheckpoints({}, environ={memstore.ENV_EVERY: "3", memstore.ENV_DIR: "/dev/shm/x"})
    assert on and on.mem.every == 3 and not on.mem.due(2)


@pytest.mark.slow
def test_a_users_program_resumes_from_memory_bit_exact(workdir):
    """The uninterrupted run (2 nodes x 1, no option) gives the weights; then node 1 (its agent, rank wrapper and
    program) SIGKILLed once it reported step 6 (storage holds step 4): attempt 1 restores step >= 5 from memory --
    rank 0 from its own copy, rank 1 from the copy node 0 held -- and ends with the same weights."""
    ref = run_launch("local", "--nodes", "2", "--gpus-per-node", "1", "--run-dir", "runs/ref", "--", *USER)
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = read_json("runs/ref/final.json")["param_sha256"]
    with recovery_row("local", "a user's program (integrations.memory_checkpoints): node killed between storage "
                      "checkpoints", "runs/u", "resumed from memory (at most 1 step lost); COMPLETED, exit 0") as row:
        with started_with_a_spare("runs/u", MEMORY, base=USER) as p:
            signal_node(p, "runs/u", 1, signal.SIGKILL, step=6)
            run = ended(p, "runs/u")
        log = attempt1("runs/u")
        m = re.search(r"restored step (\d+) from memory \(rank 0: own copy; ranks restored from a peer's copy: "
                      r"\[1\].*rollback: (\d+) step", log)
        assert m and int(m.group(1)) >= 5 and int(m.group(2)) <= 1, log[-3000:]
        assert f"rank 0: starting at step {m.group(1)}" in log, log[-3000:]
        row["user_sees"] += f" (restored step {m.group(1)}, {m.group(2)} step(s) lost)"
        assert read_json("runs/u/final.json")["param_sha256"] == reference
        row["orphans"] = len(gone(run["run_id"]))
        assert row["orphans"] == 0 and not Path(memstore.run_store(run["run_id"])).exists()
