"""workloads.deepspeed_zero through `launch local`: ZeRO-2 at 2 ranks learns, checkpoints, resumes
(a checkpoint that cannot be converted for another world size: one line naming it; one damaged after
its commit: skipped for the newest complete one); bad input is refused by every rank with one line;
ds_config resolution (pure logic)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest  # noqa: E402

from conftest import ROOT, assert_ranks_refused, read_json, run_launch
from launchers.ckptptr import write_manifest
from workloads.common import dsconfig

# real training runs of tens of seconds each: `make test` runs them, `make test-fast` (the inner
# loop) does not
pytestmark = pytest.mark.slow

ARGS = [
    "-m",
    "workloads.deepspeed_zero",
    "--zero-stage",
    "2",
    "--dataset",
    "digits",
    "--lr",
    "3e-3",
    "--checkpoint-every",
    "10",
    "--log-every",
    "5",
    "--seed",
    "3",
]


def metrics(run_dir):
    return [
        json.loads(ln)
        for ln in Path(run_dir, "metrics.jsonl").read_text().splitlines()
        if ln.strip()
    ]


def optim_files(step_dir, precision: str, world: int) -> tuple[list, list]:
    """(found, expected) ZeRO optimizer shard names of a checkpoint. The rule, from DeepSpeed 0.19.8
    runtime/engine.py:4319-4320 (_get_zero_ckpt_prefix) and :4331-4334 (bf16_mode =
    bfloat16_enabled()): the file prefix is "bf16_" when the engine runs in bf16, else none."""
    prefix = "bf16_" if precision == "bf16" else ""
    found = sorted(x.name for x in Path(step_dir).glob("*zero_pp_rank_*_optim_states.pt"))
    return found, [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]


def test_zero2_learns_checkpoints_and_resumes(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/ds",
        "--",
        *ARGS,
        "--max-steps",
        "20",
    )
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    m = metrics("runs/ds")
    assert m[-1]["loss"] < 0.85 * m[0]["loss"], [x["loss"] for x in m]
    final = read_json("runs/ds/final.json")
    assert final["step"] == 20 and final["zero_stage"] == 2 and final["world_size"] == 2
    # bf16 where the CPU has it natively, else fp32
    auto = dsconfig.choose_precision("auto", cuda=False)[0]
    assert final["precision"] == auto and final["adam"] == "torch"
    ck = workdir / "runs/ds/checkpoints"
    assert (ck / "latest").read_text().strip() == "step-00000020"
    assert read_json(ck / "step-00000020/launch_meta.json")["world_size"] == 2
    found, expected = optim_files(ck / "step-00000020", final["precision"], 2)
    assert found == expected
    assert sorted(x.name for x in (workdir / "runs/ds/tensorboard").iterdir()) == ["rank0", "rank1"]
    log0 = (workdir / "runs/ds/logs/node0/rank0.log").read_text()
    assert "ZeRO stage 2, precision" in log0 and "step 20/20" in log0
    assert "step 20/20" not in (workdir / "runs/ds/logs/node0/rank1.log").read_text()  # rank 0 only

    r = run_launch("resume", "runs/ds", "--", *ARGS, "--max-steps", "30")
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = [x for x in metrics("runs/ds") if x["attempt"] == 1]
    assert [x["step"] for x in resumed] == [25, 30]
    assert read_json("runs/ds/final.json")["step"] == 30
    assert (
        "resumed from step-00000020 (step 20"
        in (workdir / "runs/ds/logs/node0/rank0.log").read_text()
    )
    assert (ck / "latest").read_text().strip() == "step-00000030"
    # another world size reshards (tests/test_workload_deepspeed_reshard.py); a damaged shard cannot
    # be converted: one line on every rank naming the checkpoint, not a hang, a traceback or a
    # silent restart
    step = ck / "step-00000030"
    shard = next(step.glob("*zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    shard.write_bytes(shard.read_bytes()[:100])
    # broken when written (its manifest agrees): only the conversion can tell
    write_manifest(str(step))
    before = {p.name: p.read_bytes() for p in step.iterdir()}
    w = run_launch(
        "resume",
        "runs/ds",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--",
        *ARGS,
        "--max-steps",
        "40",
    )
    assert w.returncode != 0
    log0 = (workdir / "runs/ds/logs/node0/rank0.log").read_text().splitlines()
    errs = [ln for ln in log0 if ln.startswith("error: checkpoint ")]
    assert len(errs) == 1 and errs[0].startswith(
        f"error: checkpoint {step} cannot be converted to DeepSpeed's universal format"
    ), log0[-20:]
    assert errs[0].endswith(
        "resume at its own world size (2 ranks)"
    ) and "step 35/" not in "\n".join(log0)
    assert {p.name: p.read_bytes() for p in step.iterdir()} == before
    assert (
        not (ck / "step-00000030-universal").exists()
        and (ck / "latest").read_text().strip() == "step-00000030"
    )
    # damaged after it was committed (a file no longer as its manifest says): skipped for the newest
    # complete one
    model = step / "mp_rank_00_model_states.pt"
    model.write_bytes(model.read_bytes()[:-1])
    f = run_launch("resume", "runs/ds", "--", *ARGS, "--max-steps", "40")
    assert f.returncode == 0, f.stderr[-3000:]
    log0 = (workdir / "runs/ds/logs/node0/rank0.log").read_text()
    assert (
        f"skipped damaged checkpoint step-00000030 ({model} is {len(before[model.name]) - 1} "
        f"bytes, {len(before[model.name])} when written (truncated)); resuming from step-00000020"
    ) in log0
    assert (
        "resumed from step-00000020 (step 20" in log0
        and (ck / "latest").read_text().strip() == "step-00000040"
    )


def test_forced_precision_names_the_checkpoint_files(workdir):
    """--precision forces the engine's dtype whatever the CPU has (DeepSpeed's CPU accelerator
    accepts bf16 everywhere, emulated where not native); the one auto did not choose here, so every
    machine checks both prefixes (auto's in the test above)."""
    forced = "fp32" if dsconfig.choose_precision("auto", cuda=False)[0] == "bf16" else "bf16"
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--run-dir",
        "runs/p",
        "--",
        *ARGS,
        "--max-steps",
        "2",
        "--precision",
        forced,
    )
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    final = read_json("runs/p/final.json")
    assert final["precision"] == forced and final["step"] == 2
    assert (
        f"precision {forced} (requested with --precision)"
        in (workdir / "runs/p/logs/node0/rank0.log").read_text()
    )
    found, expected = optim_files(workdir / "runs/p/checkpoints/step-00000002", forced, 1)
    assert found == expected


def test_bad_input_every_rank_refuses(workdir):
    bad = workdir / "bad.json"
    bad.write_text(
        '{"optimizer": {"type": "Adam", "params": {"lr": 0.001}}, '
        '"zero_optimization": {"stage": 2, "reduce_bucket_size": -5}}'
    )
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/bad",
        "--",
        "-m",
        "workloads.deepspeed_zero",
        "--ds-config",
        str(bad),
        timeout=120,
    )
    assert p.returncode != 0
    assert_ranks_refused(
        "runs/bad", "deepspeed_zero: error:", "'zero_optimization.reduce_bucket_size' is -5", 2
    )
    for argv, needle in (
        (["--zero-stage", "4"], "--zero-stage '4' is not accepted (accepted: 1, 2, 3)"),
        (["--ds-config", "nope.json"], "--ds-config 'nope.json' is not a file"),
    ):
        q = subprocess.run(
            [sys.executable, "-m", "workloads.deepspeed_zero", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (
            q.returncode == 2 and needle in q.stderr and len(q.stderr.strip().splitlines()) == 1
        ), q.stderr


def test_shipped_config_matches_seeds_and_resolves():
    cfg = dsconfig.load(dsconfig.DEFAULT_CONFIG)
    assert cfg["optimizer"]["params"]["lr"] == 1e-3 and cfg["optimizer"]["params"]["betas"] == [
        0.8,
        0.999,
    ]
    z = cfg["zero_optimization"]
    assert z["stage"] == 2 and z["overlap_comm"] and z["contiguous_gradients"]
    assert (
        z["allgather_bucket_size"] == z["reduce_bucket_size"] == 200_000_000
        and cfg["fp16"]["enabled"]
    )
    r = dsconfig.resolve(
        cfg, stage=3, micro_batch=16, world_size=4, precision="fp32", adam="torch", lr=None
    )
    assert r["zero_optimization"]["stage"] == 3 and r["train_batch_size"] == 64
    assert r["fp16"] == {"enabled": False} and r["bf16"] == {"enabled": False}
    assert r["optimizer"]["params"]["torch_adam"] is True and cfg["zero_optimization"]["stage"] == 2
    assert dsconfig.choose_precision("auto", cuda=True)[0] == "fp16"
    assert dsconfig.choose_precision("auto", cuda=False)[0] in ("bf16", "fp32")
