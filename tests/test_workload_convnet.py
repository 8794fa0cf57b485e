"""workloads.convnet under real torchrun agents (2 nodes x 2 procs, gloo), plus its shared pieces.

The 2x2 runs are two plain `python -m torch.distributed.run` agents joined through 127.0.0.1, with
the LAUNCH_* environment the launcher would set. They check: training learns on digits, checkpoint
dirs + `latest`, and that a run crashed at step S on one rank and re-run (LAUNCH_ATTEMPT=1) ends
with the same param_sha256 as an uninterrupted run. A teardown deadlock shows up as a timeout.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import signal
import socket
import subprocess
import sys

import pytest

# real training runs of tens of seconds each: `make test` runs them, `make test-fast` (the inner
# loop) does not
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 180
# 40 steps at 4 x 32 samples is ~3.5 epochs of digits (--max-steps overrides the default --epochs 2)
TRAIN_ARGS = [
    "--dataset",
    "digits",
    "--max-steps",
    "40",
    "--batch-size",
    "32",
    "--checkpoint-every",
    "10",
    "--log-every",
    "5",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(run_dir: str, attempt: int, **extra) -> dict:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("LAUNCH_", "TORCHELASTIC_")) or k in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NODE_RANK",
        ):
            del env[k]
    env.update(
        LAUNCH_RUN_DIR=run_dir,
        LAUNCH_RUN_ID="test-convnet",
        LAUNCH_ATTEMPT=str(attempt),
        LAUNCH_CHECKPOINT_DIR=os.path.join(run_dir, "checkpoints"),
        LAUNCH_DIST_BACKEND="gloo",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=REPO,
    )
    env.update(extra)
    return env


def run_2x2(run_dir: str, attempt: int, args: list[str]) -> tuple[list[int], list[str]]:
    """Two torchrun agents (node ranks 0 and 1, 2 procs each). Returns (exit codes, outputs)."""
    port = free_port()
    os.makedirs(run_dir, exist_ok=True)
    procs, logs = [], []
    for node in (0, 1):
        log = open(os.path.join(run_dir, f"agent{node}.attempt{attempt}.log"), "w")
        logs.append(log)
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--node-rank",
            str(node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--max-restarts",
            "0",
            "--monitor-interval",
            "0.1",
            "-m",
            "workloads.convnet",
            *args,
        ]
        procs.append(
            subprocess.Popen(
                argv,
                cwd=REPO,
                env=worker_env(run_dir, attempt, NODE_RANK=str(node)),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()
    outputs = [open(log.name).read() for log in logs]
    assert codes is not None, "2x2 run did not finish within %ss (teardown hang?)\n%s" % (
        TIMEOUT,
        outputs[0][-3000:],
    )
    return codes, outputs


def start_single(run_dir: str, attempt: int, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "workloads.convnet", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=worker_env(run_dir, attempt),
    )


def finish(p: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"workload did not finish within {TIMEOUT}s\n{err[-3000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def final(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "final.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("convnet") / "uninterrupted")
    codes, out = run_2x2(run_dir, 0, TRAIN_ARGS)
    assert codes == [0, 0], out[0][-3000:] + out[1][-3000:]
    return run_dir, out


def test_2x2_learns_digits(uninterrupted):
    run_dir, out = uninterrupted
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    assert all({"step", "loss", "epoch"} <= set(r) for r in rows)
    train = [r for r in rows if r.get("kind") != "eval"]
    assert [r["step"] for r in train] == list(range(5, 41, 5))
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    evals = [r["eval_accuracy"] for r in rows if r.get("kind") == "eval"]
    fin = final(run_dir)
    assert fin["step"] == 40 and fin["world_size"] == 4 and len(fin["param_sha256"]) == 64
    assert evals[0] < fin["accuracy"] and fin["accuracy"] >= 0.93, (evals, fin)
    assert "step 40/40" in out[0]  # rank 0 prints plain lines
    for r in range(4):
        assert glob.glob(os.path.join(run_dir, "tensorboard", f"rank{r}", "events.out.tfevents.*"))


def test_checkpoint_dirs_and_latest(uninterrupted):
    run_dir, _ = uninterrupted
    ckpt = os.path.join(run_dir, "checkpoints")
    names = sorted(n for n in os.listdir(ckpt) if n.startswith("step-"))
    assert names == [f"step-{s:08d}" for s in (10, 20, 30, 40)]
    for n in names:
        assert os.path.isfile(os.path.join(ckpt, n, ".metadata"))
    with open(os.path.join(ckpt, "latest")) as f:
        assert f.read() == "step-00000040\n"


def test_crash_then_resume_is_bit_identical(uninterrupted, tmp_path):
    ref_dir, _ = uninterrupted
    run_dir = str(tmp_path / "crashed")
    args = TRAIN_ARGS + ["--crash-at-step", "27", "--crash-rank", "3"]
    codes, out = run_2x2(run_dir, 0, args)
    assert codes[0] != 0 and codes[1] != 0, codes  # rank 3 lives on node 1; both agents fail
    assert "fault injection: rank 3 exits with code 1 at step 27" in out[1]
    ckpt = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(ckpt, "latest")) as f:
        assert f.read().strip() == "step-00000020"
    assert not os.path.exists(os.path.join(run_dir, "final.json"))

    codes, out = run_2x2(run_dir, 1, args)  # same argv: the crash only fires in attempt 0
    assert codes == [0, 0], out[0][-3000:] + out[1][-3000:]
    assert "resumed from step-00000020" in out[0]
    assert final(run_dir)["param_sha256"] == final(ref_dir)["param_sha256"]
    assert final(run_dir)["loss"] == final(ref_dir)["loss"]
    attempts = {r["attempt"] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))}
    assert attempts == {0, 1}  # metrics.jsonl appended across attempts


def test_async_checkpoints_crash_then_resume_is_bit_identical(uninterrupted, tmp_path):
    """--async-checkpoint: periodic saves written in the background; the crashed-and-resumed run
    ends where the uninterrupted synchronous run ends (the checkpoint content does not depend on the
    write path)."""
    ref_dir, _ = uninterrupted
    run_dir = str(tmp_path / "async")
    args = TRAIN_ARGS + ["--async-checkpoint", "--crash-at-step", "27", "--crash-rank", "3"]
    codes, out = run_2x2(run_dir, 0, args)
    assert codes[0] != 0 and codes[1] != 0, codes
    ckpt = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(ckpt, "latest")) as f:
        resumed_from = f.read().strip()
    # the pointer moves when written
    assert resumed_from in ("step-00000010", "step-00000020"), resumed_from
    assert os.path.isfile(os.path.join(ckpt, resumed_from, ".metadata"))

    codes, out = run_2x2(run_dir, 1, args)
    assert codes == [0, 0], out[0][-3000:] + out[1][-3000:]
    assert f"resumed from {resumed_from}" in out[0]
    fin = final(run_dir)
    assert (
        fin["param_sha256"] == final(ref_dir)["param_sha256"]
        and fin["loss"] == final(ref_dir)["loss"]
    )
    names = sorted(n for n in os.listdir(ckpt) if n.startswith("step-"))
    assert names == [f"step-{s:08d}" for s in (10, 20, 30, 40)]
    with open(os.path.join(ckpt, "latest")) as f:
        assert f.read().strip() == "step-00000040"


def test_crash_inside_save_resumes_from_previous_pointer(tmp_path):
    """1 process: dying after dcp.save(20) but before the pointer moves must resume from step 10.
    Then a second resume (4 more steps) loads the checkpoint that the first resume wrote (its keys
    must be those of attempt 0's, not the DDP-wrapped "module.*" ones) and ends where the reference
    resumed alike ends."""
    args = ["--max-steps", "24", "--checkpoint-every", "10", "--log-every", "4", "--no-tensorboard"]
    crash_args = args + ["--crash-at-step", "20", "--crash-phase", "save"]
    run_dir = str(tmp_path / "crashed")
    ref_p = start_single(str(tmp_path / "ref"), 0, args)  # reference and crash run side by side
    first = finish(start_single(run_dir, 0, crash_args))
    ref = finish(ref_p)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert first.returncode == 1 and "(save)" in first.stdout
    assert os.path.isfile(os.path.join(run_dir, "checkpoints", "step-00000020", ".metadata"))
    with open(os.path.join(run_dir, "checkpoints", "latest")) as f:
        assert f.read().strip() == "step-00000010"
    second = finish(start_single(run_dir, 1, crash_args))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step-00000010" in second.stdout
    assert final(run_dir)["param_sha256"] == final(str(tmp_path / "ref"))["param_sha256"]
    more = ["--max-steps", "28", *args[2:]]
    ref_p = start_single(str(tmp_path / "ref"), 1, more)
    third = finish(start_single(run_dir, 2, more))
    ref = finish(ref_p)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert third.returncode == 0, third.stderr[-3000:]
    assert "resumed from step-00000024" in third.stdout and final(run_dir)["step"] == 28
    assert final(run_dir)["param_sha256"] == final(str(tmp_path / "ref"))["param_sha256"]


@pytest.mark.parametrize(
    "args, world, needle",
    [
        (["--dataset", "imagenet"], 1, "'imagenet'"),
        (["--dataset", "cifar10"], 1, "--data-dir"),
        (["--dataset", "cifar10", "--data-dir", "/nonexistent/cifar"], 1, "/nonexistent/cifar"),
        (["--epochs", "0"], 1, "'0'"),
        (["--lr", "abc"], 1, "'abc'"),
        (["--crash-at-step", "5", "--crash-rank", "4"], 4, "--crash-rank 4"),
        (["--crash-at-step", "5", "--crash-phase", "save"], 1, "--crash-phase save"),
    ],
)
def test_bad_input_is_one_line_error_before_init(tmp_path, args, world, needle):
    env = worker_env(str(tmp_path / "run"), 0, RANK="0", WORLD_SIZE=str(world))
    p = subprocess.run(
        [sys.executable, "-m", "workloads.convnet", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convnet: error: ") and needle in lines[0], (
        p.stderr
    )
    assert not os.path.exists(tmp_path / "run")  # nothing written, no process group


def test_cifar10_missing_batch_named(tmp_path):
    for name in ("data_batch_1", "data_batch_2", "test_batch"):
        (tmp_path / name).write_bytes(b"")
    env = worker_env(str(tmp_path / "run"), 0)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "workloads.convnet",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "data_batch_3, data_batch_4, data_batch_5" in p.stderr, p.stderr


# ---- the shared pieces, in-process -------------------------------------------------------------


def test_pointer_roundtrip(tmp_path):
    from launchers.ckptptr import read_latest, write_latest

    d = str(tmp_path / "ckpt")
    assert read_latest(d) is None
    write_latest(d, "step-00000010")
    write_latest(d, "step-00000020")
    assert read_latest(d) == "step-00000020"
    assert sorted(os.listdir(d)) == ["latest"]  # no temp files left behind
    with pytest.raises(ValueError):
        write_latest(d, "../x")


def test_digits_fast_path_matches_sklearn():
    import numpy as np
    from sklearn.datasets import load_digits

    from workloads.common.data import digits_array

    x, y = digits_array()
    ref = load_digits()
    assert np.array_equal(x, ref.data) and np.array_equal(y, ref.target)


def test_cifar10_reader_and_seed_convnet(tmp_path):
    import numpy as np
    import torch

    from workloads.common import data
    from workloads.common.models import convnet

    rng = np.random.default_rng(0)
    for name in data.CIFAR_FILES:
        batch = {
            b"data": rng.integers(0, 256, (6, 3072), dtype=np.uint8),
            b"labels": list(range(6)),
        }
        with open(tmp_path / name, "wb") as f:
            pickle.dump(batch, f)
    d = data.load("cifar10", str(tmp_path))
    assert len(d.train) == 30 and len(d.test) == 6 and d.in_shape == (3, 32, 32)
    x, y = d.train.__getitems__([0, 1])
    assert (
        x.shape == (2, 3, 32, 32)
        and x.dtype == torch.float32
        and -1.0 <= x.min()
        and x.max() <= 1.0
    )
    net = convnet(d.in_shape, 10, 0.2)
    assert net.fc1.in_features == 64 * 6 * 6 and net(x).shape == (2, 10)
    s = data.load("synthetic")
    assert s.in_shape == (3, 32, 32) and len(s.train) > len(s.test)


def test_resumable_sampler_slices_by_global_offset():
    from workloads.common.data import resumable_sampler

    ds = list(range(103))
    for rank in range(4):
        full = resumable_sampler(ds, 4, rank, seed=5)
        full.set_position(3, 0)
        part = resumable_sampler(ds, 4, rank, seed=5)
        part.set_position(3, 40)  # 40 samples of epoch 3 consumed globally
        assert list(part) == list(full)[10:] and len(part) == len(full) - 10


def test_model_state_dict_reused_only_while_storage_is_the_same():
    """ModelOptimState reuses the model part of the state dict across saves (the time save_async
    blocks); the reused values must still be the live parameters, and new storage must be
    noticed."""
    import torch

    from workloads.common.stateful import ModelOptimState

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)

    def train():
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    train()
    ms = ModelOptimState(model, opt)
    first = ms.state_dict()
    train()  # in-place updates: weights, Adam state, BN running stats
    second = ms.state_dict()
    assert second["model"] is first["model"]
    live = model.state_dict()
    assert all(torch.equal(second["model"][k], live[k]) for k in live)
    assert second["optim"] is not first["optim"]
    with torch.no_grad():
        model[0].weight.data = torch.zeros(3, 4)  # new storage: taken anew
    third = ms.state_dict()
    assert third["model"] is not first["model"] and torch.equal(
        third["model"]["0.weight"], torch.zeros(3, 4)
    )
