"""workloads.fsdp (FSDP2 fully_shard + DCP) through `launch local`: crash + resume at the same world
size reproduces param_sha256; a checkpoint written by 4 ranks resumes on 2 (launch resume with a new
shape) and continues the uninterrupted 4-rank loss trajectory within tolerance."""

import json
from pathlib import Path

import pytest  # noqa: E402
import yaml

from conftest import read_json, run_launch

# real training runs of tens of seconds each: `make test` runs them, `make test-fast` (the inner
# loop) does not
pytestmark = pytest.mark.slow

ARGS = [
    "-m",
    "workloads.fsdp",
    "--dataset",
    "digits",
    "--max-steps",
    "30",
    "--checkpoint-every",
    "10",
    "--log-every",
    "5",
    "--seed",
    "5",
    "--no-tensorboard",
]


def losses(run_dir, attempt=None):
    rows = [
        json.loads(ln)
        for ln in Path(run_dir, "metrics.jsonl").read_text().splitlines()
        if ln.strip()
    ]
    return {
        r["step"]: r["loss"]
        for r in rows
        if r.get("kind") != "eval" and attempt in (None, r["attempt"])
    }


def launch4(run_dir, *extra):
    return run_launch(
        "local", "--nodes", "1", "--gpus-per-node", "4", "--run-dir", run_dir, "--", *ARGS, *extra
    )


def test_fsdp_crash_resume_bit_exact_and_reshard_4_to_2(workdir):
    ref = launch4("runs/ref")
    assert ref.returncode == 0, ref.stderr[-3000:] + ref.stdout[-3000:]
    ref_final, ref_loss = read_json("runs/ref/final.json"), losses("runs/ref")
    # really sharded
    assert ref_final["step"] == 30 and ref_final["local_params_per_rank"][0] < 38282 / 2
    assert ref_loss[30] < 0.6 * ref_loss[5]

    # crash + resume at the same world size: bit-identical final parameters
    crash = launch4("runs/crash", "--crash-at-step", "15", "--crash-rank", "2")
    assert crash.returncode != 0
    assert (workdir / "runs/crash/checkpoints/latest").read_text().strip() == "step-00000010"
    res = run_launch("resume", "runs/crash", "--", *ARGS)
    assert res.returncode == 0, res.stderr[-3000:]
    assert read_json("runs/crash/final.json")["param_sha256"] == ref_final["param_sha256"]
    assert losses("runs/crash", attempt=1) == {s: ref_loss[s] for s in (15, 20, 25, 30)}

    # reshard: the 4-rank checkpoint of step 10 resumes on 2 ranks with the same global batch
    cut = launch4("runs/rs", "--crash-at-step", "15", "--crash-rank", "0")
    assert cut.returncode != 0
    rs = run_launch(
        "resume",
        "runs/rs",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--",
        *ARGS,
        "--batch-size",
        "64",
    )
    assert rs.returncode == 0, rs.stderr[-3000:]
    final = read_json("runs/rs/final.json")
    assert final["world_size"] == 2 and final["step"] == 30
    got = losses("runs/rs", attempt=1)
    assert sorted(got) == [15, 20, 25, 30]
    # not bit-exact (float sums in another order; the padded last batch of an epoch differs by 2
    # samples), but the same trajectory: measured within 4.5% per logged step, far from a fresh
    # start
    for s, v in got.items():
        assert abs(v - ref_loss[s]) <= 0.1 * ref_loss[s] + 0.01, (s, v, ref_loss[s])
    assert abs(final["accuracy"] - ref_final["accuracy"]) <= 0.03
    log0 = (workdir / "runs/rs/logs/node0/rank0.log").read_text()
    assert (
        "resumed from step-00000010 (step 10" in log0 and "saved with world size 4, now 2" in log0
    )
    attempts = yaml.safe_load(Path("runs/rs/run.yaml").read_text())["attempts"]
    assert [(a.get("nodes"), a.get("gpus_per_node")) for a in attempts][-1] == (1, 2)
    assert len(attempts) == 2
