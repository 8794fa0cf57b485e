"""--memory-checkpoint (issue 37 item 1) for DeepSpeed, through the one call a user's DeepSpeed loop
makes (launchers.integrations.deepspeed_memory_checkpoints, which the DeepSpeed workload uses too):
each rank's memory copy holds its engine state (launchers/dsmemory.py: the module's weights, its
ZeRO-2 optimizer partition -- fp32 master partition and Adam moments --, the engine's counters)
with its progress and RNG. Pure: an engine it cannot restore exactly gets a falsy no-op handle and
one line. Local, 2 simulated nodes x 1, storage checkpoints at steps 4 and 8, --max-restarts 1: node
1 killed once it reported step 6 resumes from memory, rank 1's partition from the copy node 0 held,
at most 1 step lost, and ends with the uninterrupted DeepSpeed run's param_sha256."""

from __future__ import annotations

import signal

import pytest

from conftest import read_json
from launchers import dsmemory, integrations
from launchers.node import memstore
from test_memckpt import (
    MEMORY,
    STORAGE_AT_4_AND_8,
    attempt1,
    from_the_peers_copy,
    uninterrupted_sha,
)
from test_recovery import recovery_row
from test_recovery_local import ended, signal_node, started_with_a_spare

DS = (
    "-m",
    "workloads.deepspeed_zero",
    "--zero-stage",
    "2",
    "--dataset",
    "digits",
    "--seed",
    "7",
    "--batch-size",
    "8",
    "--no-tensorboard",
    "--max-steps",
    "8",
    "--log-every",
    "1",
    *STORAGE_AT_4_AND_8,
)


class Engine:
    """The two questions dsmemory.unsupported asks a DeepSpeed engine."""

    def __init__(self, stage: int, elastic: bool) -> None:
        self.stage, self.elastic = stage, elastic

    def zero_optimization_stage(self) -> int:
        return self.stage

    def zero_elastic_checkpoint(self) -> bool:
        return self.elastic


def test_the_one_call_is_off_and_says_so_for_an_engine_it_cannot_restore_exactly(monkeypatch):
    """With --memory-checkpoint: an elastic checkpoint's engine gets a falsy handle whose every call
    is a no-op, and one line; a ZeRO-2 engine a live one over its EngineState. Without the option:
    falsy, nothing said."""
    lines: list = []
    monkeypatch.setenv(memstore.ENV_EVERY, "1")
    monkeypatch.setenv(memstore.ENV_DIR, "/dev/shm/launch-test-none")
    off = integrations.deepspeed_memory_checkpoints(Engine(2, True), lines.append)
    assert not off and off.restore(4) is None and off.save(1) is False
    off.close()
    assert lines == [
        "memory checkpoint: off (DeepSpeed zero_optimization.elastic_checkpoint is on (its load "
        "merges every rank's partitions)); storage checkpoints only"
    ]
    on = integrations.deepspeed_memory_checkpoints(Engine(2, False), lines.append)
    assert on and on.mem.every == 1 and isinstance(on.states["engine"], dsmemory.EngineState)
    monkeypatch.delenv(memstore.ENV_EVERY)
    assert not integrations.deepspeed_memory_checkpoints(Engine(0, False), lines.append)
    assert len(lines) == 1


@pytest.fixture(scope="module")
def ds_reference(request) -> str:
    """The uninterrupted DeepSpeed ZeRO-2 run (local, 2 nodes x 1): its param_sha256."""
    return uninterrupted_sha(request, "memckpt-deepspeed-ref", DS)


@pytest.mark.slow
def test_deepspeed_node_killed_between_storage_checkpoints_resumes_its_partition_from_memory(
    workdir, ds_reference
):
    """ZeRO-2: node 1 killed once it reported step 6 (storage holds step 4); attempt 1 restores step
    >= 5 from memory -- rank 0 its own copy, rank 1 the copy node 0 held -- at most 1 step lost,
    DeepSpeed's storage checkpoint not read, and the run ends with the uninterrupted run's
    weights."""
    with recovery_row(
        "local",
        "DeepSpeed ZeRO-2: node killed between storage checkpoints, --memory-checkpoint",
        "runs/d",
        "resumed each rank's ZeRO partition from memory; COMPLETED, exit 0",
    ) as row:
        with started_with_a_spare("runs/d", MEMORY, base=DS) as p:
            signal_node(p, "runs/d", 1, signal.SIGKILL, step=6)
            run = ended(p, "runs/d")
        log = attempt1("runs/d")
        assert "resumed from step-" not in log and "memory checkpoint: off" not in log, log[-3000:]
        from_the_peers_copy("runs/d", row, ds_reference, run["run_id"])
        mem = read_json("runs/d/final.json")["memory_checkpoint"]
        assert mem["on"] and mem["copies"] >= 2 and mem["bytes_per_copy"] > 0, mem
