"""--memory-checkpoint (issue 37 item 1) for the DeepSpeed workload: each rank's memory copy holds
its engine state (workloads/common/dsstate.py: the module's weights, its ZeRO-2 optimizer partition
-- fp32 master partition and Adam moments --, the engine's counters) with its progress and RNG.
Local, 2 simulated nodes x 1, storage checkpoints at steps 4 and 8, --max-restarts 1: node 1 killed
once it reported step 6 resumes from memory, rank 1's partition from the copy node 0 held, at most 1
step lost, and ends with the uninterrupted DeepSpeed run's param_sha256."""

from __future__ import annotations

import signal

import pytest

from conftest import read_json
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
