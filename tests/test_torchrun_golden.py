"""Golden test of the one per-node torchrun command builder (pure)."""

import pytest

from launchers.ports import derive_port, window
from launchers.spec import RunSpec
from launchers.torchrun import node_command


def spec(**kw):
    base = dict(
        backend="local",
        nodes=2,
        gpus_per_node=4,
        program=("-m", "workloads.convnet"),
        program_args=("--epochs", "2", "a b"),
        run_dir="/shared/runs/r1",
        name="r1",
        env=(("FOO", "bar"), ("OMP_NUM_THREADS", "4")),
        nccl_env=(("NCCL_BUFFSIZE", "8388608"),),
        python="/venv/bin/python",
    )
    base.update(kw)
    return RunSpec(**base)


def test_node_command_golden():
    nc = node_command(
        spec(),
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=29123,
        run_id="r1-abcd",
        attempt=2,
        dist_backend="gloo",
    )
    assert nc.argv == (
        "/venv/bin/python",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29123",
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        "--signals-to-handle",
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2",
        "-m",
        "launchers.rankexec",
        "--",
        "-m",
        "workloads.convnet",
        "--epochs",
        "2",
        "a b",
    )
    assert nc.env == (
        ("OMP_NUM_THREADS", "4"),
        ("NCCL_BUFFSIZE", "8388608"),
        ("FOO", "bar"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29123"),
        ("NODE_RANK", "1"),
        ("NNODES", "2"),
        ("LAUNCH_RUN_DIR", "/shared/runs/r1"),
        ("LAUNCH_RUN_ID", "r1-abcd"),
        ("LAUNCH_CHECKPOINT_DIR", "/shared/runs/r1/checkpoints"),
        ("LAUNCH_ATTEMPT", "2"),
        ("LAUNCH_DIST_BACKEND", "gloo"),
        ("PYTHONUNBUFFERED", "1"),
        ("LAUNCH_STOP_GRACE", "30"),
        ("PET_SHUTDOWN_TIMEOUT", "40"),
        ("LAUNCH_STOP_SIGNAL", "SIGTERM"),
        ("LAUNCH_CPU_BIND", "auto"),
    )
    assert nc.shell().startswith(
        "env OMP_NUM_THREADS=4 NCCL_BUFFSIZE=8388608 FOO=bar MASTER_ADDR=10.0.0.1 "
    )
    assert nc.shell().endswith("-m workloads.convnet --epochs 2 'a b'")


def test_omp_default_and_script_program():
    nc = node_command(
        spec(env=(), program=("/x/train.py",), program_args=()),
        node_rank=0,
        master_addr="h",
        master_port=20001,
        run_id="i",
        attempt=0,
    )
    assert nc.env_dict["OMP_NUM_THREADS"] == "1"
    assert nc.argv[-3:] == ("launchers.rankexec", "--", "/x/train.py")


def test_port_derivation_stable_and_in_range():
    ports = {derive_port(f"run-{i}") for i in range(500)}
    assert all(20000 <= p < 60000 for p in ports) and len(ports) > 450
    assert derive_port("abc") == derive_port("abc")
    lo, hi = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    low, high = window()
    # outside the ephemeral range
    assert not any(lo <= p <= hi for p in ports) or (low, high) == (20000, 60000)
    assert all(low <= p < high for p in ports)


# Linux's default: below it
@pytest.mark.parametrize(
    "ephemeral,expected",
    [
        ((32768, 60999), (20000, 32768)),
        ((1024, 40000), (40001, 60000)),  # above it
        # neither wide enough: all
        ((18000, 58000), (20000, 60000)),
        ((20000, 60000), (20000, 60000)),
    ],
)
def test_port_window_leaves_out_the_ephemeral_range(ephemeral, expected):
    assert window(ephemeral) == expected


def test_nccl_runs_get_the_flight_recorder_unless_turned_off():
    nc = node_command(
        spec(),
        node_rank=0,
        master_addr="h",
        master_port=20001,
        run_id="i",
        attempt=0,
        dist_backend="nccl",
    )
    env = nc.env_dict
    assert (env["TORCH_FR_BUFFER_SIZE"], env["TORCH_NCCL_DUMP_ON_TIMEOUT"]) == ("2000", "1")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/shared/runs/r1/nccl/flight_rank_"
    off = node_command(
        spec(env=(("TORCH_FR_BUFFER_SIZE", "0"),)),
        node_rank=0,
        master_addr="h",
        master_port=20001,
        run_id="i",
        attempt=0,
        dist_backend="nccl",
    )
    assert off.env_dict["TORCH_FR_BUFFER_SIZE"] == "0"
    gloo = node_command(
        spec(), node_rank=0, master_addr="h", master_port=20001, run_id="i", attempt=0
    )
    assert not any(k.startswith("TORCH_FR") for k in gloo.env_dict)


def test_hang_timeout_reaches_the_node_monitors():
    nc = node_command(
        spec(hang_timeout=20.0),
        node_rank=0,
        master_addr="h",
        master_port=20001,
        run_id="i",
        attempt=0,
    )
    assert nc.env_dict["LAUNCH_HANG_TIMEOUT"] == "20"


def test_stop_grace_reaches_the_rank_wrapper_and_the_agent_waits_longer():
    nc = node_command(
        spec(stop_grace=8.5), node_rank=0, master_addr="h", master_port=20001, run_id="i", attempt=0
    )
    assert (nc.env_dict["LAUNCH_STOP_GRACE"], nc.env_dict["PET_SHUTDOWN_TIMEOUT"]) == ("8.5", "18")
