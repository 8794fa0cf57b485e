"""--memory-checkpoint for a user's own program (issue 37 item 1): the one call of
launchers.integrations (memory_checkpoints(states) -> restore(storage step) at the start, save(step)
after each step) over the launcher's implementation (launchers.memckpt, the workloads' too). Pure:
without --memory-checkpoint the handle is falsy and every call a no-op. Real run (local, 2 simulated
nodes x 1, --max-restarts 1, a 1 s step delay, the program's own storage checkpoints at steps 4 and
8): tests/data/memckpt_user.py, a plain PyTorch loop (Adam, its batches from each rank's global
RNG); node 1 killed at step 6 resumes from memory (rank 1 from the copy node 0 held), at most M = 1
step lost, and ends with the uninterrupted run's weights (sha256). The same for a Lightning program
through integrations.lightning_memory_callback (tests/data/memckpt_lightning.py: Lightning's whole
checkpoint in memory, resumed through fit's ckpt_path, the RNG streams set again where the copy was
taken) and for a Transformers Trainer program through integrations.hf_memory_callback
(tests/data/memckpt_hf.py: memory's step mid-epoch, written as the Trainer's checkpoint directory;
the Trainer skips the batches done and sets the RNG streams itself)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from conftest import read_json, run_launch
from launchers import integrations
from launchers.node import memstore
from test_recovery import gone, recovery_row
from test_recovery_local import ended, signal_node, started_with_a_spare

MEMORY = ("--memory-checkpoint", "--max-restarts", "1")
USER = ("memckpt_user.py",)
LIGHTNING = ("memckpt_lightning.py",)
HF = ("memckpt_hf.py",)


def test_without_the_option_the_handle_does_nothing():
    class Stateful:
        def state_dict(self):
            raise AssertionError("read without --memory-checkpoint")

    mem = integrations.MemoryCheckpoints(
        {"s": Stateful()}, environ={"RANK": "0", "WORLD_SIZE": "2"}
    )
    assert not mem and mem.restore(4) is None and mem.save(1) is False and mem.progress == {}
    mem.close()
    on = integrations.MemoryCheckpoints(
        {}, environ={memstore.ENV_EVERY: "3", memstore.ENV_DIR: "/dev/shm/x"}
    )
    assert on and on.mem.every == 3 and not on.mem.due(2)
    assert integrations.LightningMemory(environ={}).resume_from("step-4.ckpt") == "step-4.ckpt"
    assert integrations.HFMemory(environ={}).resume_from("checkpoint-4") == "checkpoint-4"


def resumed_from_memory(program: tuple[str, ...], run_dir: str, fault: str) -> tuple[str, str]:
    """The uninterrupted run (2 nodes x 1, no option) gives the weights; then node 1 (its agent,
    rank wrapper and program) SIGKILLed once it reported step 6 (storage holds step 4): attempt 1
    restores step >= 5 from memory -- rank 0 from its own copy, rank 1 from the copy node 0 held --
    with at most 1 step lost, and ends with the same weights at step 8, nothing of the run left. ->
    (rank 0's log of attempt 1, the step restored)."""
    ref = run_launch(
        "local", "--nodes", "2", "--gpus-per-node", "1", "--run-dir", "runs/ref", "--", *program
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = read_json("runs/ref/final.json")["param_sha256"]
    with recovery_row(
        "local",
        f"{fault}: node killed between storage checkpoints",
        run_dir,
        "resumed from memory (at most 1 step lost); COMPLETED, exit 0",
    ) as row:
        with started_with_a_spare(run_dir, MEMORY, base=program) as p:
            signal_node(p, run_dir, 1, signal.SIGKILL, step=6)
            run = ended(p, run_dir)
        log = Path(run_dir, "logs/node0/rank0.log").read_text().split("launch attempt 1")[-1]
        m = re.search(
            r"restored step (\d+) from memory \(rank 0: own copy; ranks restored from a peer's "
            r"copy: \[1\].*rollback: (\d+) step",
            log,
        )
        assert m and int(m.group(1)) >= 5 and int(m.group(2)) <= 1, log[-3000:]
        row["user_sees"] += f" (restored step {m.group(1)}, {m.group(2)} step(s) lost)"
        assert read_json(Path(run_dir, "final.json")) == {"step": 8, "param_sha256": reference}
        row["orphans"] = len(gone(run["run_id"]))
        assert row["orphans"] == 0 and not Path(memstore.run_store(run["run_id"])).exists()
    return log, m.group(1)


@pytest.mark.slow
def test_a_users_program_resumes_from_memory_bit_exact(workdir):
    """tests/data/memckpt_user.py (resumed_from_memory): it starts at the step memory held."""
    log, step = resumed_from_memory(
        USER, "runs/u", "a user's program (integrations.memory_checkpoints)"
    )
    assert f"rank 0: starting at step {step}" in log, log[-3000:]


@pytest.mark.slow
def test_a_lightning_program_resumes_from_memory_bit_exact(workdir):
    """The same through the Lightning callback (tests/data/memckpt_lightning.py: one step an epoch,
    each step's noise from the global RNG, Lightning's own checkpoints at steps 4 and 8): Lightning
    resumes from memory's copy of its whole checkpoint, written into the node's store."""
    log, _ = resumed_from_memory(
        LIGHTNING, "runs/l", "a Lightning program (integrations.lightning_memory_callback)"
    )
    assert "rank 0: resuming from /dev/shm/" in log, log[-3000:]


@pytest.mark.slow
def test_a_transformers_trainer_program_resumes_from_memory_bit_exact(workdir):
    """The same through the Transformers callback (tests/data/memckpt_hf.py: 8 steps an epoch, so
    memory's step is mid-epoch and the Trainer skips the batches done; each step's noise from the
    global RNG; the Trainer's own checkpoints at steps 4 and 8): the Trainer resumes from memory's
    copy, written as its checkpoint directory."""
    log, step = resumed_from_memory(
        HF, "runs/h", "a Trainer program (integrations.hf_memory_callback)"
    )
    assert "rank 0: resuming from /dev/shm/" in log and f"/checkpoint-{step}\n" in log, log[-3000:]
