"""--cpu-bind: plan() on synthetic and real 2-socket shapes, the topology and `nvidia-smi topo -m`
readers, and real local runs whose ranks print the CPUs they may use (os.sched_getaffinity)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA, LAUNCH, rank_lines, read_json, run_launch
from launchers.cpubind import (
    Topology,
    check_allowed,
    format_cpulist,
    parse_cpulist,
    parse_gpu_numa,
    plan,
    read_topology,
    sharing,
    synthetic,
)
from launchers.errors import LaunchError


def cl(text):
    return parse_cpulist(text)


def dgx_h100(allowed=None):
    """The 2-socket 8-GPU machine of tests/data/gpu/topo/thunderkittens-issue-167-h100-2socket.txt
    (a real paste; its source on line 1 and in tests/data/gpu/sources.md): CPU Affinity 0-47,96-143
    (NUMA 0) and 48-95,144-191 (NUMA 1), so 48 cores a socket, two threads a core numbered as Linux
    does (core c = CPUs c and c+96)."""
    every = cl("0-191")
    return Topology(
        numa=((0, cl("0-47,96-143")), (1, cl("48-95,144-191"))),
        cores=tuple((c, c + 96) for c in range(96)),
        allowed=frozenset(every if allowed is None else allowed),
    )


GPU_NUMA = parse_gpu_numa(
    (DATA / "gpu" / "topo" / "thunderkittens-issue-167-h100-2socket.txt").read_text()
)

PLANS = [  # (topology, local ranks, mode, gpu_numa, expected CPU lists)
    (synthetic("core:2 pu:1"), 2, "cores", None, ["0", "1"]),
    (synthetic("core:2 pu:1"), 2, "auto", None, []),  # one NUMA node: auto does not bind
    (synthetic("core:2 pu:1"), 2, "numa", None, ["0-1", "0-1"]),
    (synthetic("core:2 pu:1"), 2, "none", None, []),
    # more ranks than cores: shared evenly
    (synthetic("core:2 pu:1"), 3, "cores", None, ["0", "1", "0"]),
    # more ranks than cores: one thread each
    (synthetic("core:2 pu:2"), 4, "cores", None, ["0", "2", "1", "3"]),
    # only what this process may use
    (synthetic("core:2 pu:1", allowed={1}), 2, "cores", None, ["1", "1"]),
    (synthetic("node:2 core:4 pu:2"), 2, "auto", None, ["0-7", "8-15"]),
    (synthetic("package:2 core:8 pu:2"), 4, "cores", None, ["0-7", "8-15", "16-23", "24-31"]),
    (synthetic("package:2 core:8 pu:2"), 4, "numa", None, ["0-15", "0-15", "16-31", "16-31"]),
    (synthetic("package:2 l3:2 core:2 pu:1"), 2, "cores", None, ["0-3", "4-7"]),
    # a step on one socket
    (synthetic("package:2 core:4 pu:1", allowed={0, 1, 2, 3}), 2, "auto", None, []),
    (synthetic("package:2 core:4 pu:1", allowed={2, 3, 4}), 3, "numa", None, ["2-3", "2-3", "4"]),
    # both GPUs on socket 1
    (synthetic("package:2 core:4 pu:1"), 2, "numa", {0: 1, 1: 1}, ["4-7", "4-7"]),
    (synthetic("package:2 core:4 pu:1"), 2, "cores", {0: 1, 1: 1}, ["4-5", "6-7"]),
    (synthetic("package:2 core:4 pu:1"), 2, "numa", {0: 7}, ["0-3", "4-7"]),  # unknown node: blocks
    (dgx_h100(), 8, "auto", GPU_NUMA, ["0-47,96-143"] * 4 + ["48-95,144-191"] * 4),
    (dgx_h100(), 8, "numa", GPU_NUMA, ["0-47,96-143"] * 4 + ["48-95,144-191"] * 4),
    (
        dgx_h100(),
        8,
        "cores",
        GPU_NUMA,
        [f"{a}-{a + 11},{a + 96}-{a + 107}" for a in range(0, 96, 12)],
    ),
    (dgx_h100(), 2, "cores", {0: 1, 1: 0}, ["48-95,144-191", "0-47,96-143"]),
    # a 4-core Slurm step: one node left
    (dgx_h100(allowed=cl("0-3,96-99")), 8, "auto", GPU_NUMA, []),
    (
        dgx_h100(allowed=cl("0-3,96-99")),
        8,
        "cores",
        GPU_NUMA,
        ["0", "1", "2", "3", "96", "97", "98", "99"],
    ),
]


@pytest.mark.parametrize("topo,n,mode,gpu,expected", PLANS)
def test_plan(topo, n, mode, gpu, expected):
    sets = plan(topo, n, mode, gpu)
    assert [format_cpulist(s) for s in sets] == expected
    assert all(set(s) <= topo.allowed for s in sets)  # never outside the CPUs this process may use


@pytest.mark.parametrize(
    "desc,n", [("core:2 pu:1", 2), ("package:2 core:8 pu:2", 8), ("node:4 core:6 pu:2", 16)]
)
def test_cores_are_disjoint_while_there_are_enough(desc, n):
    sets = plan(synthetic(desc), n, "cores")
    assert len(sets) == n and all(sets) and sharing(sets) is None
    assert len({c for s in sets for c in s}) == sum(len(s) for s in sets)


def test_sharing_is_said_and_never_all_on_one_core():
    sets = plan(synthetic("core:2 pu:1"), 4, "cores")
    assert sorted(map(format_cpulist, sets)) == ["0", "0", "1", "1"]
    assert sharing(sets) == "4 ranks share 2 CPU(s) (0-1): fewer allowed cores than ranks"


def test_refusals_are_one_line():
    with pytest.raises(
        LaunchError,
        match=r"^CPU set 0-2 is not allowed here: CPU\(s\) 2 are outside the allowed 0-1$",
    ):
        check_allowed((0, 1, 2), {0, 1})
    with pytest.raises(LaunchError, match="no allowed CPU on this node"):
        plan(synthetic("core:2 pu:1", allowed={9}), 2, "cores")
    with pytest.raises(
        LaunchError, match="--cpu-bind 'sockets' is not accepted; choose one of: auto, none, numa"
    ):
        plan(synthetic("core:2 pu:1"), 2, "sockets")
    with pytest.raises(LaunchError, match="malformed"):
        parse_cpulist("3-1")
    for desc in ("package:2 pu:2", "core:x", "core:0"):
        with pytest.raises(LaunchError, match="synthetic topology"):
            synthetic(desc)


@pytest.mark.parametrize(
    "text,cpus", [("0-3,8,10-11\n", (0, 1, 2, 3, 8, 10, 11)), ("", ()), ("5", (5,))]
)
def test_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus
    assert format_cpulist(cpus) == text.strip()


def test_gpu_numa_from_nvidia_smi():
    # the real paste (tabs turned to spaces by the thread): GPU0-3 on NUMA node 0, GPU4-7 on node 1
    assert GPU_NUMA == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    # the tool's own tab-separated layout (NVIDIA/go-gpuallocator#17, tests/data/gpu/topo): the same
    # reading
    tabbed = (DATA / "gpu" / "topo" / "go-gpuallocator-issue-17-rtx4090-pcie.txt").read_text()
    assert parse_gpu_numa(tabbed) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    # newer drivers underline the header (an ANSI escape), a single-socket machine says 0 for every
    # GPU
    text = (
        "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X "
        "\tPIX\t0-47\t0\t\tN/A\nGPU1\tPIX\t X \t0-47\tN/A\t\tN/A\n"
    )
    assert parse_gpu_numa(text) == {0: 0}
    assert parse_gpu_numa("No devices were found\n") == {}


def test_this_machines_topology():
    topo = read_topology()
    every = {c for _, cpus in topo.numa for c in cpus}
    assert topo.allowed == frozenset(os.sched_getaffinity(0)) and topo.allowed <= every
    assert sorted(c for core in topo.cores for c in core) == sorted(every)


def test_a_two_node_sysfs(tmp_path):
    """The reader over a sysfs tree of two NUMA nodes of one CPU each (two CPUs this process may
    use)."""
    a, b = sorted(os.sched_getaffinity(0))[:2]
    for nid, cpu in ((0, a), (1, b)):
        (tmp_path / "node" / f"node{nid}").mkdir(parents=True)
        (tmp_path / "node" / f"node{nid}" / "cpulist").write_text(f"{cpu}\n")
    (tmp_path / "node" / "online").write_text("0-1\n")
    (tmp_path / "cpu" / f"cpu{a}" / "topology").mkdir(parents=True)
    (tmp_path / "cpu" / f"cpu{a}" / "topology" / "thread_siblings_list").write_text(f"{a}\n")
    (tmp_path / "cpu" / "online").write_text(format_cpulist((a, b)) + "\n")
    topo = read_topology(str(tmp_path))
    assert topo.numa == ((0, (a,)), (1, (b,))) and topo.cores == ((a,), (b,))
    assert plan(topo, 2, "auto") == [(a,), (b,)]


def affinities(run_dir):
    return sorted(
        (json.loads(ln[len("AFFINITY ") :]) for ln in rank_lines(run_dir, "AFFINITY ")),
        key=lambda r: r["rank"],
    )


def test_two_local_ranks_get_disjoint_cpus(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--cpu-bind",
        "cores",
        "--run-dir",
        "runs/b",
        "--",
        "affinity.py",
    )
    assert p.returncode == 0, p.stderr
    reps = affinities("runs/b")
    assert [r["rank"] for r in reps] == [0, 1]
    expected = [list(s) for s in plan(read_topology(), 2, "cores")]
    assert [r["cpus"] for r in reps] == expected and not set(reps[0]["cpus"]) & set(reps[1]["cpus"])
    for r in reps:
        rec = read_json(f"runs/b/status/rank{r['rank']}.json")
        assert rec["cpu_bind"] == "cores" and parse_cpulist(rec["cpus"]) == tuple(r["cpus"])
        assert rec["mempolicy"].startswith("not applied")
        header = Path(f"runs/b/logs/node0/rank{r['rank']}.log").read_text().splitlines()[0]
        assert header.startswith(
            f"===== launch attempt 0 | rank {r['rank']} of 2 | node 0 | cpu-bind cores: CPUs "
            f"{rec['cpus']} | "
        )


def test_more_ranks_than_allowed_cpus_share_and_say_so(workdir):
    """The launcher may use one CPU only (as in a Slurm step of one CPU): both ranks get it, and the
    record says so."""
    p = subprocess.run(
        [
            LAUNCH,
            "local",
            "--gpus-per-node",
            "2",
            "--cpu-bind",
            "cores",
            "--run-dir",
            "runs/s",
            "--",
            "affinity.py",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    assert p.returncode == 0, p.stderr
    one = min(os.sched_getaffinity(0))
    assert [r["cpus"] for r in affinities("runs/s")] == [[one], [one]]
    rec = read_json("runs/s/status/rank1.json")
    assert rec["cpus_note"] == f"2 ranks share 1 CPU(s) ({one}): fewer allowed cores than ranks"


def test_none_leaves_ranks_unbound(workdir):
    p = run_launch(
        "local",
        "--gpus-per-node",
        "2",
        "--cpu-bind",
        "none",
        "--run-dir",
        "runs/n",
        "--",
        "affinity.py",
    )
    assert p.returncode == 0, p.stderr
    every = sorted(os.sched_getaffinity(0))
    assert [r["cpus"] for r in affinities("runs/n")] == [every, every]
    assert read_json("runs/n/status/rank0.json")["cpu_bind"] == "none"


def test_dry_run_shows_each_local_ranks_cpus(workdir):
    out = run_launch(
        "local",
        "--gpus-per-node",
        "2",
        "--cpu-bind",
        "cores",
        "--dry-run",
        "--",
        "affinity.py",
        check=True,
    ).stdout
    sets = plan(read_topology(), 2, "cores")
    assert (
        f"# cpu-bind cores: local rank 0: CPUs {format_cpulist(sets[0])}, local rank 1: CPUs "
        f"{format_cpulist(sets[1])}"
    ) in out
    assert "LAUNCH_CPU_BIND=cores" in out
    ssh = run_launch(
        "ssh",
        "--hosts",
        "a,b",
        "--gpus-per-node",
        "2",
        "--dry-run",
        "--",
        "affinity.py",
        check=True,
    ).stdout
    assert "# cpu-bind auto: decided on each node from its topology" in ssh


def test_bad_mode_is_refused_in_one_line(workdir, tmp_path):
    p = run_launch("local", "--cpu-bind", "sockets", "--run-dir", "runs/x", "--", "affinity.py")
    assert p.returncode == 2 and not Path("runs/x").exists()
    assert p.stderr.strip().count("\n") == 0 and "--cpu-bind 'sockets' is not accepted" in p.stderr
    prof = tmp_path / "p.yaml"
    prof.write_text("cpu_bind: 2\n")
    q = run_launch("local", "--profile", str(prof), "--", "affinity.py")
    assert (
        q.returncode == 2 and f"profile {str(prof)!r}: cpu_bind '2' is not accepted" in q.stderr
    ), q.stderr


def test_local_nodes_share_the_machine_without_sharing_cpus(workdir):
    """--nodes 2 on the local backend: both nodes run here, so their ranks take disjoint slots of
    one plan."""
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--cpu-bind",
        "cores",
        "--run-dir",
        "runs/m",
        "--",
        "affinity.py",
    )
    assert p.returncode == 0, p.stderr
    reps = affinities("runs/m")
    assert [r["cpus"] for r in reps] == [list(s) for s in plan(read_topology(), 2, "cores")]
    assert not set(reps[0]["cpus"]) & set(reps[1]["cpus"])


def test_a_rank_whose_binding_is_refused_exits_2_in_one_line(tmp_path):
    """The rank wrapper itself: a binding it cannot make is refused before the program starts, in
    one line in the rank log and on stderr, and its record says why."""
    env = {
        **os.environ,
        "LAUNCH_RUN_DIR": str(tmp_path),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "LAUNCH_CPU_BIND": "sockets",
    }
    marker = tmp_path / "started"
    p = subprocess.run(
        [sys.executable, "-m", "launchers.rankexec", "--", "-c", f"open({str(marker)!r}, 'w')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    msg = (
        "launch rankexec: rank 0: --cpu-bind 'sockets' is not accepted; choose one of: auto, "
        "none, numa, cores"
    )
    assert p.returncode == 2 and p.stderr == msg + "\n" and not marker.exists()
    assert (tmp_path / "logs/node0/rank0.log").read_text().splitlines()[1] == msg
    rec = read_json(tmp_path / "status/rank0.json")
    assert (
        rec["exit_code"] == 2
        and rec["error"].startswith("--cpu-bind 'sockets'")
        and rec["pid"] is None
    )


def test_one_parser_of_nvidia_smi_topo():
    """`nvidia-smi topo -m` has one reader (launchers.cpubind.parse_topo); the GPU health checks
    judge what it read."""
    from launchers.cpubind import parse_topo
    from launchers.gpuhealth import topo

    assert topo.parse is parse_topo
    read = {
        f.name: parse_topo(f.read_text()) for f in sorted((DATA / "gpu" / "topo").glob("*.txt"))
    }
    assert len(read) == 3 and all(r["affinity"] for r in read.values())
    assert parse_gpu_numa((DATA / "gpu" / "topo" / "nccl-issue-1617-h100-nv6.txt").read_text()) == {
        0: 3,
        1: 1,
        2: 7,
        3: 5,
    }
    with pytest.raises(ValueError, match="no GPU0 header"):
        parse_topo("No devices were found\n")


def test_each_local_rank_binds_near_its_gpu():
    """The rule --cpu-bind auto follows where the topology says: local rank i uses the i-th visible
    GPU and gets the CPUs of that GPU's NUMA node (NVIDIA/nccl#1617's 4 H100s sit on NUMA nodes 3,
    1, 7 and 5 of 8)."""
    gpu_numa = parse_gpu_numa((DATA / "gpu" / "topo" / "nccl-issue-1617-h100-nv6.txt").read_text())
    sets = plan(synthetic("node:8 core:2 pu:1"), 4, "auto", gpu_numa)
    assert [format_cpulist(s) for s in sets] == ["6-7", "2-3", "14-15", "10-11"]


def test_cpu_bind_auto_follows_each_ranks_gpu_on_a_real_run(workdir, tmp_path):
    """launch local, 1 node x 2 ranks, --cpu-bind auto, with the stand-in nvidia-smi on PATH (topo
    -m: NVIDIA/ go-gpuallocator#17, GPU0-3 on NUMA node 0, GPU4-7 on node 1) and
    CUDA_VISIBLE_DEVICES=4,0: local rank 0 uses GPU4, local rank 1 GPU0. This machine may have one
    NUMA node, so the run sees two, of one CPU each (its first two allowed CPUs), through a sysfs
    node dir bound over /sys/devices/system/node in a mount namespace of its own; each rank's CPU is
    then its GPU's node's -- rank 0 on node 1, rank 1 on node 0, the opposite of the block rule used
    without the topology -- so the stand-in was read and the binding recorded."""
    from gpu_standins import TOPO, per_host_tools

    a, b = sorted(os.sched_getaffinity(0))[:2]
    fake = tmp_path / "sysnode"
    for nid, cpu in ((0, a), (1, b)):
        (fake / f"node{nid}").mkdir(parents=True)
        (fake / f"node{nid}" / "cpulist").write_text(f"{cpu}\n")
    bin_dir = per_host_tools(
        tmp_path / "bin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
        topo=TOPO,
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "4,0"}
    p = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount --bind "$0" /sys/devices/system/node && exec "$@"',
            str(fake),
            LAUNCH,
            "local",
            "--gpus-per-node",
            "2",
            "--cpu-bind",
            "auto",
            "--dist-backend",
            "gloo",
            "--run-dir",
            "runs/g",
            "--",
            "affinity.py",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert [r["cpus"] for r in affinities("runs/g")] == [[b], [a]]
    for rank, cpu in ((0, b), (1, a)):
        rec = read_json(f"runs/g/status/rank{rank}.json")
        assert (rec["cpu_bind"], rec["cpus"]) == ("auto", str(cpu))
