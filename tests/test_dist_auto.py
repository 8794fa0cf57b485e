"""`--dist-backend auto` decided on each node, never on the submitting machine (issue 33;
launchers.nodebackend).

The rule (pure, below) and the real thing on every backend: local (simulated nodes), the SSH test
hosts and the dev Slurm cluster (gres gpu:8 on stand-in device files, no driver). The nodes' GPU
tool is the stand-in nvidia-smi of tests/gpu_standins.py (a real `nvidia-smi -q -x` captured
elsewhere: one RTX 4090), put on PATH by a --python wrapper on the nodes chosen by NODE_RANK; this
machine (the submitting side) has no GPU in any case. The program prints its backend and exits
before init_process_group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, rank_lines, read_json, require_cluster, run_launch
from launchers import nodebackend
from launchers.nodebackend import Verdict, dist_backend_decision, visible
from launchers.resilience import recovery

SSH_STATE = Path("/run/launch-ssh-hosts")
BACKENDS = {
    "local": [],
    "ssh": [
        "--hosts",
        "sshhost1,sshhost2",
        "--ssh-config",
        str(SSH_STATE / "ssh_config"),
        "--known-hosts",
        str(SSH_STATE / "known_hosts"),
    ],
    "slurm": ["--time", "10", "--wait"],
}
SAYS = (
    'import os\nprint("BACKEND", os.environ["RANK"], os.environ["LAUNCH_DIST_BACKEND"], '
    "flush=True)\n"
)


def rec(node, gpus, ranks=1, host=None, why="w"):
    return {"node": node, "host": host or f"h{node}", "gpus": gpus, "ranks": ranks, "why": why}


def test_the_rule_one_verdict_for_every_node():
    assert dist_backend_decision({0: rec(0, 0), 1: rec(1, 0)}) == Verdict(
        "gloo", "no GPU on any node: gloo on CPU"
    )
    assert dist_backend_decision({0: rec(0, 8, 8), 1: rec(1, 9, 8)}).backend == "nccl"
    mixed = dist_backend_decision(
        {0: rec(0, 8, 8), 1: rec(1, 0, 8, why="no nvidia-smi on PATH"), 2: rec(2, 8, 8)}
    )
    assert (mixed.backend, list(mixed.failed), mixed.kind) == (None, [1], "gpus")
    assert mixed.failed[1].startswith(
        "node 1 (h1) has 0 usable GPU(s) for 8 rank(s) (no nvidia-smi on PATH) "
        "while node 0 (h0) has 8; accepted"
    ), mixed.failed
    assert mixed.line == "the job stops before training: " + mixed.failed[1]
    # GPUs, but fewer than its ranks
    short = dist_backend_decision({0: rec(0, 8, 8), 1: rec(1, 4, 8)})
    assert (list(short.failed), short.kind) == ([1], "gpus")
    # every node short: no one node's fault
    every = dist_backend_decision({0: rec(0, 4, 8), 1: rec(1, 4, 8)})
    assert (sorted(every.failed), every.kind) == (
        [0, 1],
        None,
    ) and "and 1 more node(s)" in every.line
    # the policy decides on the recorded kind, never on the words of the reason
    assert (
        recovery.kind_of({"node": 1, "rank": 1, "kind": "gpus", "reason": "reworded, hang, lost"})
        == "gpus"
    )
    assert recovery.KINDS["gpus"][0] and "gpus" in recovery.AT_ONCE


@pytest.mark.parametrize(
    "cvd, listed, n",
    [
        (None, 8, 8),
        ("0,1", 8, 2),
        ("", 8, 0),
        ("-1", 8, 0),
        ("0,9,1", 8, 1),
        ("GPU-8a1b", 1, 1),
        ("3", 2, 0),
        ("0", 0, 0),
    ],
)
def test_cuda_visible_devices_narrows_what_the_tool_lists(cvd, listed, n):
    assert visible(cvd, listed)[0] == n


def test_the_nodes_tool_counted_missing_or_failing(tmp_path):
    from gpu_standins import per_host_tools

    bin_dir = per_host_tools(
        tmp_path / "bin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    assert nodebackend.usable_gpus({"PATH": str(bin_dir)}) == (1, "nvidia-smi lists 1")
    assert nodebackend.usable_gpus({"PATH": str(bin_dir), "CUDA_VISIBLE_DEVICES": ""})[0] == 0
    assert nodebackend.usable_gpus({"PATH": str(tmp_path / "none")}) == (0, "no nvidia-smi on PATH")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "nvidia-smi").write_text(
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate "
        'with the NVIDIA driver." ; exit 9\n'
    )
    (broken / "nvidia-smi").chmod(0o755)
    assert nodebackend.usable_gpus({"PATH": str(broken)}) == (
        0,
        "nvidia-smi exit code 9: NVIDIA-SMI has failed because it couldn't communicate with the "
        "NVIDIA driver.",
    )


@pytest.mark.parametrize("backend", ["local", "ssh", "slurm"])
def test_dry_run_says_auto_is_decided_on_each_node(workdir, backend):
    Path("says.py").write_text(SAYS)
    p = run_launch(
        backend,
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        *BACKENDS[backend][:6],
        "--dry-run",
        "--",
        "says.py",
        check=True,
    )
    assert (
        "# world:   2 nodes x 8 processes = 16; auto: decided on each node (nccl where the node "
        "has GPUs, else gloo)"
    ) in p.stdout, p.stdout
    assert (
        p.stdout.count("LAUNCH_DIST_BACKEND=auto") == 2
        and "LAUNCH_DIST_BACKEND=gloo" not in p.stdout
    )


def _cluster_up(backend):
    if backend == "slurm":
        p = subprocess.run(
            [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
        )
        require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")
    elif backend == "ssh":
        p = subprocess.run(
            [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
        )
        require_cluster("the SSH test hosts", p.returncode == 0, "make ssh-up")


CASES = [
    pytest.param(b, gpus, marks=[getattr(pytest.mark, b)] if b != "local" else [], id=f"{b}-{gpus}")
    for b in BACKENDS
    for gpus in ("none", "every", "node0")
]


@pytest.mark.parametrize("backend, gpus", CASES)
def test_each_node_decides_from_what_it_has(workdir, backend, gpus):
    """none: no node has a GPU tool -> gloo everywhere, said in one line; every: each node records
    nccl, with nothing changed on the submitting side; node0: node 1 has none -> the job stops
    before training, naming node 1 and what it has (kind gpus), node 0 never starts its program."""
    from gpu_standins import per_host_tools, python_with_gpus

    _cluster_up(backend)
    Path("says.py").write_text(SAYS)
    bin_dir = per_host_tools(
        workdir / "gpubin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    py = python_with_gpus(
        workdir / "py", bin_dir, {"none": "none", "every": "*", "node0": "0"}[gpus]
    )
    p = run_launch(
        backend,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        *BACKENDS[backend],
        "--python",
        py,
        "--run-dir",
        "runs/a",
        "--",
        "says.py",
        timeout=400,
    )
    recs = [read_json(f"runs/a/status/backend-a0-node{k}.json") for k in range(2)]
    st = json.loads(run_launch("status", "runs/a", "--json", check=True).stdout)
    said = sorted(ln.split()[1:] for ln in rank_lines("runs/a", "BACKEND "))
    if gpus == "node0":
        assert p.returncode != 0 and st["state"] == "FAILED", (p.stdout, p.stderr)
        assert [(r["node"], r["gpus"], r["backend"]) for r in recs] == [
            (0, 1, "nccl"),
            (1, 0, "gloo"),
        ]
        ff = st["first_failure"]
        assert (ff["node"], ff["kind"]) == (1, "gpus") and ff["reason"].startswith(
            f"node 1 ({recs[1]['host']}) has 0 usable GPU(s) for 1 rank(s) (no nvidia-smi on "
            "PATH) while node 0"
        ), ff
        assert said == [] and st["dist_backend"]["verdict"].startswith(
            "the job stops before training: node 1 ("
        )
        return
    assert p.returncode == 0 and st["state"] == "COMPLETED", (p.stdout, p.stderr)
    want = {"none": "gloo", "every": "nccl"}[gpus]
    assert [r["backend"] for r in recs] == [want, want] and said == [["0", want], ["1", want]], (
        recs,
        said,
    )
    line = {
        "none": "no GPU on any node: gloo on CPU",
        "every": "nccl: every node has its GPUs (1 per node)",
    }[gpus]
    assert st["dist_backend"]["verdict"] == line
    if backend != "slurm":  # the launcher watching the nodes says it (a Slurm submit has returned)
        assert f"launch: --dist-backend auto -> {line}\n" in p.stderr, p.stderr
    assert f"dist:       auto -> {line}" in run_launch("status", "runs/a", check=True).stdout


def test_with_a_spare_the_node_short_of_gpus_is_quarantined_and_the_spare_runs(workdir):
    """--spares 1 on launch local: slot 1 has no GPU tool, slots 0 and 2 have one; attempt 0 (slots
    0, 1) stops before training on node 1's fault (kind gpus: quarantined at once, no person),
    attempt 1 runs on slots 0 and 2 with nccl decided on each node."""
    from gpu_standins import per_host_tools, python_with_gpus

    Path("says.py").write_text(SAYS)
    bin_dir = per_host_tools(
        workdir / "gpubin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    py = python_with_gpus(workdir / "py", bin_dir, "0|2", key="LAUNCH_NODE_SLOT")
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--spares",
        "1",
        "--python",
        py,
        "--run-dir",
        "runs/s",
        "--",
        "says.py",
        timeout=300,
    )
    assert p.returncode == 0, (p.stdout, p.stderr)
    led = read_json("runs/s/nodes.json")
    assert led["pool"]["quarantined"] == [1] and [d["action"] for d in led["decisions"]] == [
        "replace"
    ], led
    assert "lacks the GPUs its ranks need" in led["decisions"][0]["why"]
    assert read_json("runs/s/status/backend-a1-node1.json")["backend"] == "nccl"
    assert sorted(ln.split()[1:] for ln in rank_lines("runs/s", "BACKEND ")) == [
        ["0", "nccl"],
        ["1", "nccl"],
    ]


@pytest.mark.ssh
def test_without_shared_storage_the_launcher_asks_every_host_before_anything_starts(workdir):
    """--no-shared-storage: the hosts cannot read each other's records, so the preflight asks each
    host for its usable GPUs over its connection and applies the same rule: node 1 has none while
    node 0 has one -> one line naming node 1, exit 2, nothing started (no run dir)."""
    from gpu_standins import per_host_tools

    _cluster_up("ssh")
    Path("says.py").write_text(SAYS)
    bin_dir = per_host_tools(
        workdir / "gpubin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    py = workdir / "py"
    py.write_text(
        f'#!/bin/sh\ncase "$(hostname)" in sshhost1) PATH={bin_dir}:"$PATH"; export PATH ;; esac\n'
        # the preflight's probe has no NODE_RANK: by host
        f'exec {sys.executable} "$@"\n'
    )
    py.chmod(0o755)
    p = run_launch(
        "ssh",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        *BACKENDS["ssh"],
        "--no-shared-storage",
        "--python",
        str(py),
        "--run-dir",
        "runs/n",
        "--",
        "says.py",
        timeout=300,
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert (
        p.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "launch: error: --dist-backend auto: the job stops before training: node 1 (sshhost2"
        )
    ), p.stderr
    assert "no nvidia-smi on PATH" in p.stderr and not Path("runs/n").exists()


def test_the_node_task_counts_first_and_its_ranks_read_its_answer(tmp_path):
    """Slurm: the node task records the node's answer while torchrun starts (nodebackend.early: an
    answer left for the same attempt goes first); local rank 0 then counts nothing itself. Only
    where the ranks see the task's environment: a --python wrapper or a container around the agent
    may change it."""
    from gpu_standins import per_host_tools
    from launchers.backends.slurm.nodecmd import same_env
    from launchers.spec import RunSpec
    from launchers.torchrun import NodeCommand

    bin_dir = per_host_tools(
        tmp_path / "bin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    run = tmp_path / "run"
    (run / "status").mkdir(parents=True)
    # an earlier task's
    (run / "status" / "backend-a0-node0.json").write_text(json.dumps(rec(0, 5)))
    nodebackend.early(str(run), {"PATH": str(bin_dir)}, 0, 0, 1).join()
    v = nodebackend.settle(str(run), {"PATH": str(tmp_path / "none")}, 0, 0, 1, 0, lambda s: False)
    assert v == Verdict("nccl", "nccl: every node has its GPUs (1 per node)"), v
    assert read_json(run / "status" / "backend-a0-node0.json")["why"] == "nvidia-smi lists 1"
    spec = RunSpec(
        backend="slurm",
        nodes=1,
        gpus_per_node=1,
        program=("/t.py",),
        program_args=(),
        run_dir="/r",
        name="r",
    )
    assert same_env(spec, NodeCommand(0, (sys.executable, "-m", "torch.distributed.run"), ()))
    assert not same_env(
        spec, NodeCommand(0, (str(tmp_path / "py-wrapper"), "-m", "torch.distributed.run"), ())
    )


def test_a_node_that_never_answers_stops_the_rank_in_one_line(tmp_path):
    """A node whose record never comes (its local rank 0 died first): the rank waits WAIT_S at most,
    then fails with one line naming the missing node; a stop meanwhile ends the wait at once."""
    (tmp_path / "status").mkdir()
    v = nodebackend.settle(str(tmp_path), {}, 0, 0, 2, 1, lambda s: False, timeout=0.3)
    assert v.backend is None and v.failed == {
        0: "--dist-backend auto: no answer from node(s) 0, 1 within 0.3 s"
    }
    assert nodebackend.settle(str(tmp_path), {}, 0, 0, 2, 1, lambda s: True).line == "stopped"
