"""--memory-checkpoint (issue 37 item 1): every rank's state kept in host memory every M steps and
copied to the next node; after a loss the survivors restore from their own copy, the replacement
from its peer's copy, storage only when both are gone. Pure: the step choice
(launchers.memplan.choose) and cadence (auto: every step unless a copy costs more than 0.25% of a
step; then every M steps, agreed by every rank), the option -> the ranks' environment (each
simulated node, each Slurm node by its name, its own store), a store's copies (newest 2 kept). Real
runs (local, 2 simulated nodes x 1, --max-restarts 1, a 1 s step delay, storage checkpoints at steps
4 and 8): node 1 killed at step 6 resumes from memory with at most M = 1 step lost and the
uninterrupted run's param_sha256; both nodes killed (the node holding node 0's peer copy with it)
falls back to storage (step 4), bit-exact too. SSH (the test hosts, one rank each, --spares 1):
sshhost2's agent and rank killed at step 6, the spare host sshhost3 gets rank 1's state from the
copy sshhost1 held, bit-exact. Slurm (the dev cluster, one rank per node, --spares 1): node 1's
agent and rank killed at step 6, the spare node of the same job gets rank 1's state from the copy
node 0 kept (each node's store is its own Slurm node name's: the dev cluster's nodes share one
/dev/shm), bit-exact; at the job's end no store of the run is left. FSDP2 on local (DTensor state:
each rank's copy holds its local shards): node 1 killed at step 6 resumes from memory, rank 1's
shards from node 0's copy, with the uninterrupted FSDP run's param_sha256."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

import test_recovery
from conftest import LAUNCH, once, read_json, run_launch
from launchers import spec, torchrun
from launchers.errors import LaunchError
from launchers.memckpt import KEEP, listing, private_dir, write_copy
from launchers.memcodec import pack, unpack
from launchers.memplan import BUDGET, WINDOW, Cadence, choose, line, why_storage
from launchers.node import memstore
from launchers.nodeagent import node_pids
from launchers.request import JobSpec
from test_recovery import (
    PROGRAM,
    SSH_STATE,
    gone,
    recovery_row,
    require_slurm,
    require_ssh,
    submit_with_a_spare,
)
from test_recovery_local import ended, signal_node, started_with_a_spare

reference_sha = test_recovery.reference_sha  # the uninterrupted run's weights: a fixture here too
from common import read_json as read_json_or_none  # noqa: E402  (tests/faults: on the path after test_recovery)
from common import run_id, wait_for  # noqa: E402
from test_faults_ssh import tagged  # noqa: E402  (every SSH test host's processes of a run)


def test_the_newest_step_every_rank_can_get_no_older_than_storage():
    own0, own1, peer0, peer1 = (
        [(0, 5), (0, 6)],
        [(1, 5), (1, 6)],
        [(0, 5), (0, 6)],
        [(1, 5), (1, 6)],
    )
    # 2 nodes x 1: node 0 holds rank 0's own and rank 1's peer copy, node 1 the reverse
    assert choose([own0 + peer1, own1 + peer0], 2, 4) == (6, {0: 0, 1: 1})
    assert choose([own0 + peer1, []], 2, 4) == (6, {0: 0, 1: 0})  # node 1 lost: rank 1 from rank 0
    assert choose([[], own1 + peer0], 2, None) == (6, {0: 1, 1: 1})  # node 0 lost
    assert choose([[], []], 2, 4) == (None, {})  # both lost: storage
    # rank 1 died before its own 6
    assert choose([own0 + peer1, own1[:1] + peer0], 2, 4) == (6, {0: 0, 1: 0})
    assert choose([[(0, 5)], [(1, 6)]], 2, None) == (None, {})  # no step whole
    assert choose([own0, own1], 2, 8) == (None, {})  # storage newer than memory
    assert choose([own0, own1], 2, 6) == (6, {0: 0, 1: 1})  # as new: memory, storage not read
    assert why_storage([[], []], 2, 4) == "no memory checkpoint on any node"
    assert why_storage([own0, own1], 2, 8) == "memory's newest step 6 is older than storage's 8"
    assert "rank(s) [1] is gone" in why_storage([own0, []], 2, 4)


def test_auto_copies_every_step_unless_a_copy_costs_more_than_its_budget():
    """--memory-checkpoint alone: every step while copies 1..WINDOW-1 are measured (copy 0, with
    the budget check, is not), then the smallest M that keeps a copy's cost (training thread +
    copying thread's CPU) within BUDGET of a step; a fixed M stays M."""
    fixed = Cadence(3)
    assert [s for s in range(1, 10) if fixed.due(s)] == [3, 6, 9]
    assert not fixed.measuring(1) and not fixed.deciding(WINDOW)

    def measured(main_s: float, background_s: float, step_s: float = 0.1) -> Cadence:
        c = Cadence(None)
        for copy in range(WINDOW):
            assert c.due(copy + 1)  # every step meanwhile
            c.add(copy, copy + 1, copy * step_s, 5.0 if copy == 0 else main_s)
            c.add_background(copy, 5.0 if copy == 0 else background_s)
        assert c.deciding(WINDOW) and not c.deciding(WINDOW - 1)
        return c

    costly = measured(0.0021, 0.001)  # 3.1 ms of a 100 ms step: 3.1%
    m, cost, step_s = costly.propose(WINDOW + 1, WINDOW * 0.1)
    assert m == math.ceil(0.0031 / (BUDGET * 0.1)) == 13
    assert cost == pytest.approx(0.0031) and step_s == pytest.approx(0.1)
    costly.agreed(15)  # another rank's larger M
    assert [s for s in range(20, 50) if costly.due(s)] == [30, 45] and not costly.deciding(WINDOW)
    assert "from step 11 every 15 steps (auto: a copy costs 3.1 ms, 3.1% of a 100 ms step" in (
        said := line(15, 11, cost, step_s)
    ) and said.endswith("a loss rolls back at most 15 steps; --memory-checkpoint-every M to choose")
    assert measured(0.0001, 0.0001).propose(WINDOW + 1, WINDOW * 0.1)[0] == 1  # 0.2%: every step


def test_a_packed_state_comes_back_equal_and_shares_nothing():
    import numpy as np
    import torch

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    state = {
        "m": {
            "w": t,
            "b": torch.tensor(3.5, dtype=torch.float64),
            "mask": torch.tensor([True, False, True]),
            "e": torch.empty(0, 4),
            "i": torch.tensor([7], dtype=torch.int64),
        },
        "opt": [({"lr": 0.1}, torch.ones(5, dtype=torch.bfloat16))],
        "rng": np.random.get_state(),
        "n": 3,
    }
    data = pack(state)
    t += 1  # training goes on: the packed copy does not move
    got = unpack(data)
    assert (
        torch.equal(got["m"]["w"], t - 1)
        and got["m"]["b"].dtype == torch.float64
        and got["m"]["b"].item() == 3.5
    )
    assert got["m"]["mask"].tolist() == [True, False, True] and got["m"]["e"].shape == (0, 4)
    assert got["m"]["i"].tolist() == [7] and got["opt"][0][0] == {"lr": 0.1} and got["n"] == 3
    assert torch.equal(got["opt"][0][1], torch.ones(5, dtype=torch.bfloat16)) and isinstance(
        got["opt"], list
    )
    assert (got["rng"][1] == state["rng"][1]).all()


def test_a_store_keeps_the_newest_two_of_each_copy(tmp_path):
    for step in (1, 2, 3):
        write_copy(str(tmp_path), 2, 0, step, "own", b"x")
        write_copy(str(tmp_path), 2, 1, step, "peer", b"y")
    write_copy(str(tmp_path), 4, 0, 9, "own", b"z")  # another world size: not this run's shape
    assert sorted(listing(str(tmp_path), 2)) == [
        (0, 2, "own"),
        (0, 3, "own"),
        (1, 2, "peer"),
        (1, 3, "peer"),
    ]
    assert KEEP == 2 and not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    store = tmp_path / "u" / "run" / "slot0"
    assert private_dir(str(store)) == "" and oct((tmp_path / "u").stat().st_mode & 0o777) == "0o700"
    os.chmod(store, 0o777)
    assert "is not this user's own directory" in private_dir(str(store))
    # what the store holds is unpickled: a directory on the way that others may write (swap the
    # store in) is refused, also when a planted link leads there
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o700)
    open_dir.chmod(0o777)
    assert "may be written by others" in private_dir(str(open_dir / "launch-u" / "mem-r"))
    (tmp_path / "launch-v").symlink_to(open_dir)
    assert "may be written by others" in private_dir(str(tmp_path / "launch-v" / "mem-r"))


def test_the_option_tells_each_node_its_own_store(tmp_path):
    s = spec.build_spec(
        "local", {"nodes": 2, "memory_checkpoint": True}, ["-m", "workloads.convnet"]
    )
    assert s.memory_checkpoint == memstore.AUTO
    env = [
        dict(
            torchrun.node_command(
                s,
                node_rank=k,
                master_addr="127.0.0.1",
                master_port=1,
                run_id="r1",
                attempt=0,
                one_machine=True,
                slot=k,
            ).env
        )
        for k in (0, 1)
    ]
    assert [e[memstore.ENV_EVERY] for e in env] == ["auto", "auto"]
    assert env[0][memstore.ENV_DIR].endswith("/mem-r1/slot0") and env[1][memstore.ENV_DIR].endswith(
        "/mem-r1/slot1"
    )
    assert env[0][memstore.ENV_DIR].startswith("/dev/shm/launch-")
    off = spec.build_spec("local", {"nodes": 2}, ["-m", "workloads.convnet"])
    assert off.memory_checkpoint == 0 and memstore.ENV_EVERY not in dict(
        torchrun.node_command(
            off, node_rank=0, master_addr="x", master_port=1, run_id="r1", attempt=0
        ).env
    )
    assert (
        spec.build_spec(
            "local", {"memory_checkpoint_every": "5"}, ["-m", "workloads.convnet"]
        ).memory_checkpoint
        == 5
    )
    with pytest.raises(LaunchError, match="--memory-checkpoint-every '0' is out of range"):
        spec.build_spec("local", {"memory_checkpoint_every": "0"}, ["-m", "workloads.convnet"])
    api = JobSpec(
        backend="local", program=("-m", "workloads.convnet"), memory_checkpoint=True, nodes=2
    )
    assert spec.build_spec("local", api.flags(), list(api.program)).memory_checkpoint == -1
    (tmp_path / "p.yaml").write_text("memory_checkpoint_every: 3\n")
    assert (
        spec.build_spec(
            "local", {}, ["-m", "workloads.convnet"], str(tmp_path / "p.yaml")
        ).memory_checkpoint
        == 3
    )
    with pytest.raises(TypeError, match="JobSpec.memory_checkpoint must be a bool"):
        JobSpec(backend="local", program=("x.py",), memory_checkpoint=1)
    store = Path(memstore.node_store("r1", 1, True, str(tmp_path)))
    store.mkdir(parents=True)
    assert memstore.forget_nodes("r1", [0, 1], str(tmp_path)) == [1] and not store.exists()
    # Slurm: each node's store is its Slurm node name's (the dev cluster's nodes share one /dev/shm;
    # a spare that replaces a lost node is another name), whatever its slot; the dry-run names the
    # placeholder
    from launchers.backends.slurm.nodecmd import NODE_SHOWN, slurm_node_command

    s = spec.build_spec(
        "slurm", {"nodes": 2, "spares": 1, "memory_checkpoint": True}, ["-m", "workloads.convnet"]
    )
    dirs = [
        dict(slurm_node_command(s, 1, "a", 1, "r1", 0, "gloo", {}, slot=2, host=h).env)[
            memstore.ENV_DIR
        ]
        for h in ("lnode3", None)
    ]
    assert dirs == [
        memstore.run_store("r1") + "/lnode3",
        memstore.run_store("r1") + "/" + NODE_SHOWN,
    ]


MEMORY = ("--memory-checkpoint", "--max-restarts", "1")
STORAGE_AT_4_AND_8 = ("--checkpoint-every", "4")


def started(run_dir: str):
    """`launch local` of PROGRAM on 2 simulated nodes x 1, --memory-checkpoint --max-restarts 1, in
    the background."""
    return started_with_a_spare(run_dir, MEMORY, STORAGE_AT_4_AND_8)


def attempt1(run_dir: str) -> str:
    """Rank 0's log of attempt 1."""
    return Path(run_dir, "logs/node0/rank0.log").read_text().split("launch attempt 1")[-1]


@pytest.mark.slow
def test_node_killed_between_storage_checkpoints_resumes_from_memory_bit_exact(
    workdir, reference_sha
):
    """Node 1 (its agent, rank wrapper and program) SIGKILLed once it reported step 6 (storage holds
    step 4): its memory goes with it; attempt 1 on the same slots restores step >= 5 from memory --
    rank 0 from its own copy, rank 1 from the copy node 0 held -- with at most M = 1 step lost, and
    ends with the uninterrupted weights."""
    with recovery_row(
        "local",
        "node killed between storage checkpoints, --memory-checkpoint",
        "runs/m",
        "resumed from memory (at most 1 step lost), storage not read; COMPLETED, exit 0",
    ) as row:
        with started("runs/m") as p:
            signal_node(p, "runs/m", 1, signal.SIGKILL, step=6)
            run = ended(p, "runs/m")
        log, err = attempt1("runs/m"), Path("runs/m.err").read_text()
        assert "node 1 (slot 1) lost: its memory checkpoints are gone with it" in err, err[-2000:]
        m = re.search(
            r"restored step (\d+) from memory \(rank 0: own copy; ranks restored from a peer's "
            r"copy: \[1\].*rollback: (\d+) step",
            log,
        )
        assert m and int(m.group(1)) >= 5 and int(m.group(2)) <= 1, log[-3000:]
        assert (
            f"resumed from memory step {m.group(1)}" in log and "resumed from step-" not in log
        ), log[-3000:]
        row["user_sees"] += f" (restored step {m.group(1)}, {m.group(2)} step(s) lost)"
        assert Path("runs/m/final.json").is_file()
        assert read_json("runs/m/final.json")["param_sha256"] == reference_sha
        row["orphans"] = len(gone(run["run_id"]))
        assert row["orphans"] == 0 and not Path(memstore.run_store(run["run_id"])).exists()


@pytest.mark.slow
def test_both_copies_gone_falls_back_to_storage_bit_exact(workdir, reference_sha):
    """Node 1 and node 0 (which held node 1's peer copy, and whose own copy node 1 held) killed
    together after step 6: no step is whole in memory, storage's step 4 is read, said in one line;
    bit-exact."""
    with recovery_row(
        "local",
        "both nodes killed (a copy and its peer), --memory-checkpoint",
        "runs/b",
        "memory gone on both: resumed from storage (step-00000004); COMPLETED, exit 0",
    ) as row:
        with started("runs/b") as p:
            signal_node(p, "runs/b", 1, signal.SIGKILL, step=6)
            signal_node(p, "runs/b", 0, signal.SIGKILL, step=6)
            run = ended(p, "runs/b")
        log = attempt1("runs/b")
        m = re.search(
            r"memory checkpoint: storage read: no memory checkpoint on any node; rollback: (\d+) "
            r"step",
            log,
        )
        # storage's cadence: up to --checkpoint-every
        assert m and int(m.group(1)) >= 2, log[-3000:]
        row["user_sees"] += f" ({m.group(1)} step(s) lost)"
        assert "resumed from step-00000004" in log, log[-3000:]
        assert read_json("runs/b/final.json")["param_sha256"] == reference_sha
        row["orphans"] = len(gone(run["run_id"]))
        assert row["orphans"] == 0


@pytest.mark.ssh
@pytest.mark.slow
def test_ssh_a_killed_node_is_replaced_by_a_spare_host_that_resumes_from_its_peers_copy(
    workdir, reference_sha
):
    """sshhost1 and sshhost2 train (sshhost3 the spare); sshhost2's agent, rank wrapper and program
    SIGKILLed once rank 1 reported step 6 (storage holds step 4): the spare host replaces it and has
    nothing in memory, so rank 1's state comes from the peer copy sshhost1 kept, rank 0's from its
    own; at most 1 step lost, bit-exact."""
    require_ssh()
    with recovery_row(
        "ssh",
        "one node's agent and rank killed, --memory-checkpoint --spares 1",
        "runs/ms",
        "the spare host resumes rank 1 from the peer's copy in memory; COMPLETED, exit 0",
    ) as row:
        p = subprocess.Popen(
            [
                LAUNCH,
                "ssh",
                "--hosts",
                "sshhost1,sshhost2,sshhost3",
                "--ssh-config",
                str(SSH_STATE / "ssh_config"),
                "--known-hosts",
                str(SSH_STATE / "known_hosts"),
                "--nodes",
                "2",
                "--gpus-per-node",
                "1",
                "--spares",
                "1",
                *MEMORY,
                "--run-dir",
                "runs/ms",
                "--",
                *PROGRAM,
                "--step-delay",
                "1",
                *STORAGE_AT_4_AND_8,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(
                lambda: (
                    p.poll() is not None
                    or (read_json_or_none("runs/ms/progress/rank1.json") or {}).get("step", 0) >= 6
                ),
                240,
                "rank 1 at step 6",
            )
            for pid, role, _ in tagged(run_id("runs/ms")).get("sshhost2", []):
                if role != "host-agent":
                    os.kill(pid, signal.SIGKILL)
            _, err = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
            held = forget_on_hosts(run_id("runs/ms")) if Path("runs/ms/run.yaml").is_file() else []
        assert p.returncode == 0, err[-3000:]
        assert held == [], f"the run's in-memory checkpoints were left on {held}"
        run = yaml.safe_load(Path("runs/ms/run.yaml").read_text())
        assert [a["hosts"] for a in run["attempts"]] == [
            ["sshhost1", "sshhost2"],
            ["sshhost1", "sshhost3"],
        ], run
        from_the_peers_copy("runs/ms", row, reference_sha, run["run_id"])


def from_the_peers_copy(run_dir: str, row: dict, reference_sha: str, rid: str) -> None:
    """Attempt 1 restored rank 0 from its own copy and rank 1 from the copy node 0 held, with at
    most M = 1 step lost (in the row), and ended with the uninterrupted weights; no process of the
    run left."""
    log = attempt1(run_dir)
    m = re.search(
        r"restored step (\d+) from memory \(rank 0: own copy; ranks restored from a peer's copy: "
        r"\[1\].*rollback: (\d+) step",
        log,
    )
    assert m and int(m.group(1)) >= 5 and int(m.group(2)) <= 1, log[-3000:]
    row["user_sees"] += f" (restored step {m.group(1)}, {m.group(2)} step(s) lost)"
    assert read_json(Path(run_dir, "final.json"))["param_sha256"] == reference_sha
    row["orphans"] = len(gone(rid))
    assert row["orphans"] == 0


def forget_on_hosts(rid: str) -> list[str]:
    """The hosts that still hold a store of the run (the launcher removes them from every host of
    the pool at the run's end: the killed node's too), each then removed so that a failed test
    leaves none behind."""
    held = []
    for host in ("sshhost1", "sshhost2", "sshhost3"):
        p = subprocess.run(
            [
                "ssh",
                "-F",
                str(SSH_STATE / "ssh_config"),
                "-o",
                f"UserKnownHostsFile={SSH_STATE}/known_hosts",
                "-o",
                "BatchMode=yes",
                "-i",
                str(SSH_STATE / "client_key"),
                host,
                f"test -e {memstore.run_store(rid)} && echo held; rm -rf {memstore.run_store(rid)}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if "held" in p.stdout:
            held.append(host)
    return held


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_a_killed_node_is_replaced_by_a_spare_that_resumes_from_its_peers_copy(
    workdir, reference_sha
):
    """2 nodes x 1 and a spare node in one job: node 1's agent, rank wrapper and program SIGKILLed
    once rank 1 reported step 6 (storage holds step 4); the batch step's loop replaces its node by
    the spare, whose store (its own node name's) holds nothing, so rank 1's state comes from the
    peer copy node 0 kept: at most 1 step lost, bit-exact. Once the job has left the queue no node
    keeps a store of the run."""
    require_slurm()
    with recovery_row(
        "slurm",
        "one node's agent and rank killed, --memory-checkpoint --spares 1",
        "runs/mslurm",
        "the spare node resumes rank 1 from the peer's copy in memory, same job; COMPLETED",
    ) as row:
        submit_with_a_spare(
            "runs/mslurm", *PROGRAM, "--step-delay", "1", *STORAGE_AT_4_AND_8, flags=MEMORY
        )
        rid = run_id("runs/mslurm")
        wait_for(
            lambda: (
                (read_json_or_none("runs/mslurm/progress/rank1.json") or {}).get("step", 0) >= 6
            ),
            300,
            "rank 1 at step 6",
        )
        for pid in node_pids(rid, 1, attempt=0):
            os.kill(pid, signal.SIGKILL)
        p = subprocess.run(
            [LAUNCH, "wait", "runs/mslurm"], capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr[-3000:]
        job = Path("runs/mslurm/slurm/jobs").read_text().split()[-1]
        wait_for(
            lambda: (
                not subprocess.run(
                    ["squeue", "-h", "-j", job], capture_output=True, text=True
                ).stdout.strip()
            ),
            90,
            f"job {job} out of the queue",
        )
        assert not Path(memstore.run_store(rid)).exists(), os.listdir(memstore.run_store(rid))
        run = yaml.safe_load(Path("runs/mslurm/run.yaml").read_text())
        (a, b), (c, d) = [x["hosts"] for x in run["attempts"]]
        assert (
            a == c and d not in (a, b) and len({x["slurm_job_id"] for x in run["attempts"]}) == 1
        ), run["attempts"]
        from_the_peers_copy("runs/mslurm", row, reference_sha, rid)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_a_node_and_its_peer_lost_together_fall_back_to_storage(workdir, reference_sha):
    """2 nodes x 1 and a spare in one job: both nodes' agents, rank wrappers and programs SIGKILLed
    once rank 1 reported step 6 (storage holds step 4), and both nodes' memory lost with them (their
    stores removed: a process kill on the dev cluster's nodes leaves tmpfs as it was, a node's loss
    does not). No step is whole in memory: attempt 1 reads storage's step 4, says why in one line,
    and ends with the uninterrupted weights."""
    require_slurm()
    with recovery_row(
        "slurm",
        "both nodes killed (a copy and its peer) with their memory, --memory-checkpoint",
        "runs/bslurm",
        "memory gone on both: resumed from storage (step-00000004); COMPLETED",
    ) as row:
        submit_with_a_spare(
            "runs/bslurm", *PROGRAM, "--step-delay", "1", *STORAGE_AT_4_AND_8, flags=MEMORY
        )
        rid = run_id("runs/bslurm")
        wait_for(
            lambda: (
                (read_json_or_none("runs/bslurm/progress/rank1.json") or {}).get("step", 0) >= 6
            ),
            300,
            "rank 1 at step 6",
        )
        for pid in node_pids(rid, 1, attempt=0) + node_pids(rid, 0, attempt=0):
            os.kill(pid, signal.SIGKILL)
        # every node's store of the run: the two nodes' memory
        shutil.rmtree(memstore.run_store(rid))
        p = subprocess.run(
            [LAUNCH, "wait", "runs/bslurm"], capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr[-3000:]
        log = attempt1("runs/bslurm")
        m = re.search(
            r"memory checkpoint: storage read: no memory checkpoint on any node; rollback: (\d+) "
            r"step",
            log,
        )
        assert m and int(m.group(1)) >= 2, log[-3000:]
        assert "resumed from step-00000004" in log, log[-3000:]
        row["user_sees"] += f" ({m.group(1)} step(s) lost)"
        assert read_json("runs/bslurm/final.json")["param_sha256"] == reference_sha
        row["orphans"] = len(gone(rid))
        assert row["orphans"] == 0


FSDP = (
    "-m",
    "workloads.fsdp",
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


def uninterrupted_sha(request, key: str, program: tuple) -> str:
    """The param_sha256 of `program`'s uninterrupted run (local, 2 nodes x 1), made once per test
    run (`key`)."""

    def make(d):
        ref = run_launch(
            "local",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--run-dir",
            "runs/ref",
            "--",
            *program,
            cwd=d,
        )
        assert ref.returncode == 0, ref.stderr[-3000:]
        return read_json(Path(d, "runs/ref/final.json"))["param_sha256"]

    return once(request, key, make)


@pytest.fixture(scope="module")
def fsdp_reference(request) -> str:
    """The uninterrupted FSDP run (local, 2 nodes x 1): its param_sha256 (of the full, gathered
    weights)."""
    return uninterrupted_sha(request, "memckpt-fsdp-ref", FSDP)


@pytest.mark.slow
def test_fsdp_node_killed_between_storage_checkpoints_resumes_its_shards_from_memory(
    workdir, fsdp_reference
):
    """FSDP2 (parameters and optimizer state DTensors, sharded over the 2 ranks): each rank's memory
    copy holds its local shards. Node 1 killed once it reported step 6 (storage holds step 4): rank
    1's shards come from the copy node 0 held, at most 1 step lost, and the run ends with the
    uninterrupted run's (gathered) param_sha256."""
    with recovery_row(
        "local",
        "FSDP: node killed between storage checkpoints, --memory-checkpoint",
        "runs/f",
        "resumed each rank's shards from memory; COMPLETED, exit 0",
    ) as row:
        with started_with_a_spare("runs/f", MEMORY, base=FSDP) as p:
            signal_node(p, "runs/f", 1, signal.SIGKILL, step=6)
            run = ended(p, "runs/f")
        assert "resumed from step-" not in attempt1("runs/f")
        from_the_peers_copy("runs/f", row, fsdp_reference, run["run_id"])
