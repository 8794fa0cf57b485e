"""workloads.moe at 4 ranks (2 nodes x 2) through `launch local`: experts live on different ranks,
the all-to-all round trip preserves every token, loss goes down, a2a time is logged; an expert count
the world size does not divide is refused by every rank."""

import json
import re
from pathlib import Path

import pytest  # noqa: E402

from conftest import assert_ranks_refused, rank_lines, read_json, run_launch

# real training runs of tens of seconds each: `make test` runs them, `make test-fast` (the inner
# loop) does not
pytestmark = pytest.mark.slow


def test_expert_parallel_training(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/moe",
        "--",
        "-m",
        "workloads.moe",
        "--num-experts",
        "8",
        "--max-steps",
        "30",
        "--checkpoint-every",
        "15",
        "--log-every",
        "5",
    )
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    final = read_json("runs/moe/final.json")
    # experts really live on different ranks: disjoint sets covering 0..7, equal parameter counts
    per_rank = final["experts_per_rank"]
    assert per_rank == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert len(set(final["expert_params_per_rank"])) == 1 and final["expert_params_per_rank"][0] > 0
    own = {
        int(m.group(1)): (int(m.group(2)), int(m.group(3)))
        for ln in rank_lines("runs/moe", "moe-rank")
        if (m := re.match(r"moe-rank (\d+): experts (\d+)\.\.(\d+)", ln))
    }
    assert own == {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}
    # round trip: every rank got its rows back bit-identical, nothing lost
    trips = [ln for ln in rank_lines("runs/moe", "moe-rank") if "round trip" in ln]
    assert len(trips) == 4 and all(ln.endswith("identical True") for ln in trips), trips
    rt = final["a2a_roundtrip"]
    assert rt["ok"] and rt["sent"] == rt["received"] > 0
    m = [json.loads(ln) for ln in Path("runs/moe/metrics.jsonl").read_text().splitlines()]
    train = [x for x in m if "a2a_fraction" in x]
    assert train[-1]["loss"] < 0.85 * train[0]["loss"], [x["loss"] for x in train]
    assert all(0 < x["a2a_fraction"] < 1 for x in train) and 0 < final["a2a_fraction"] < 1
    assert (workdir / "runs/moe/checkpoints/latest").read_text().strip() == "step-00000030"


def test_experts_not_divisible_by_world_size(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "4",
        "--run-dir",
        "runs/bad",
        "--",
        "-m",
        "workloads.moe",
        "--num-experts",
        "6",
        timeout=120,
    )
    assert p.returncode != 0
    assert_ranks_refused(
        "runs/bad", "moe: error:", "--num-experts 6 is not divisible by the world size 4", 4
    )
