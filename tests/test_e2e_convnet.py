"""The convnet workload through `launch local`: learning, checkpoints, resume, bit-exact
crash/resume."""

import json

import pytest

from conftest import read_json, run_launch

# real training runs of tens of seconds each: `make test` runs them, `make test-fast` (the inner
# loop) does not
pytestmark = pytest.mark.slow

COMMON = [
    "-m",
    "workloads.convnet",
    "--dataset",
    "digits",
    "--checkpoint-every",
    "10",
    "--seed",
    "7",
]


def metrics(run_dir):
    with open(f"{run_dir}/metrics.jsonl") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def test_learns_checkpoints_and_resume_continues(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/a",
        "--",
        *COMMON,
        "--max-steps",
        "30",
    )
    assert p.returncode == 0, p.stderr + p.stdout[-3000:]
    m = metrics("runs/a")
    first, last = m[0]["loss"], m[-1]["loss"]
    assert last < 0.6 * first, (first, last)
    final = read_json("runs/a/final.json")
    assert final["step"] == 30 and final["world_size"] == 4 and len(final["param_sha256"]) == 64
    assert (workdir / "runs/a/checkpoints/latest").read_text().strip() == "step-00000030"
    assert sorted(p.name for p in (workdir / "runs/a/tensorboard").iterdir()) == [
        f"rank{r}" for r in range(4)
    ]
    # resume with more steps: continues from step 30, not from scratch
    r = run_launch("resume", "runs/a", "--", *COMMON, "--max-steps", "50")
    assert r.returncode == 0, r.stderr
    m2 = metrics("runs/a")
    resumed = [x for x in m2 if x.get("attempt") == 1] or m2[len(m) :]
    assert resumed and min(x["step"] for x in resumed) > 30
    assert read_json("runs/a/final.json")["step"] == 50
    assert "resumed from step-00000030" in (workdir / "runs/a/logs/node0/rank0.log").read_text()
    assert final["accuracy"] <= read_json("runs/a/final.json")["accuracy"] + 0.05
    st = run_launch("status", "runs/a", check=True).stdout
    assert "COMPLETED" in st and "last step:  50" in st
    ranks = json.loads(run_launch("status", "runs/a", "--ranks", "--json", check=True).stdout)[
        "ranks"
    ]
    # every rank's heartbeat (workloads call it per step)
    assert [r["step"] for r in ranks] == [50] * 4


def test_crash_and_resume_is_bit_exact(workdir):
    args = [*COMMON, "--max-steps", "40"]
    # 2 nodes x 1: the crash is on the second node (the 2x2 shape is
    # test_learns_checkpoints_and_resume_continues)
    ok = run_launch(
        "local", "--nodes", "2", "--gpus-per-node", "1", "--run-dir", "runs/ref", "--", *args
    )
    assert ok.returncode == 0, ok.stderr
    crash = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--run-dir",
        "runs/crash",
        "--",
        *args,
        "--crash-at-step",
        "25",
        "--crash-rank",
        "1",
    )
    assert crash.returncode == 1
    st = read_json("runs/crash/status.json")
    assert (
        st["state"] == "FAILED"
        and st["first_failure"]["rank"] == 1
        and st["first_failure"]["node"] == 1
    )
    assert (workdir / "runs/crash/checkpoints/latest").read_text().strip() == "step-00000020"
    res = run_launch("resume", "runs/crash", "--", *args)  # same args without the crash
    assert res.returncode == 0, res.stderr
    assert (
        read_json("runs/crash/final.json")["param_sha256"]
        == read_json("runs/ref/final.json")["param_sha256"]
    )


def test_max_restarts_recovers_from_crash(workdir):
    # the crash flag only fires in attempt 0, so one launcher-owned restart completes the run
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/mr",
        "--max-restarts",
        "1",
        "--",
        *COMMON,
        "--max-steps",
        "20",
        "--crash-at-step",
        "15",
        "--crash-rank",
        "0",
    )
    assert p.returncode == 0, p.stderr
    st = read_json("runs/mr/status.json")
    assert st["state"] == "COMPLETED" and st["attempt"] == 1
    assert read_json("runs/mr/final.json")["step"] == 20


@pytest.mark.slow
def test_full_4x8_shape(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--run-dir",
        "runs/big",
        "--",
        "-m",
        "workloads.convnet",
        "--dataset",
        "synthetic",
        "--max-steps",
        "4",
        "--batch-size",
        "4",
        "--checkpoint-every",
        "2",
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    final = read_json("runs/big/final.json")
    assert final["world_size"] == 32 and final["step"] == 4
    logs = sorted((workdir / "runs/big/logs").glob("node*/rank*.log"))
    assert len(logs) == 32
    assert read_json("runs/big/status.json")["nodes"] == {str(k): 0 for k in range(4)}
