"""Pure logic of phase 2: nccl-tests / NCCL INFO parsers, the table, the sweep's recommendation and
tuner rows, input validation (no processes started)."""

import math
from pathlib import Path

import pytest

from nccl_tuning import nccltests, results, runner, sweep
from nccl_tuning.bench import bus_factor
from nccl_tuning.errors import NcclTuningError

FIX = Path(__file__).parent / "data" / "nccltests"


def test_parse_all_reduce_perf_new_format():
    rows = nccltests.parse_file(str(FIX / "all_reduce_perf_8gpu.txt"))
    assert [r["bytes"] for r in rows] == [8, 1048576, 134217728]
    big = rows[-1]
    assert big == {
        **big,
        "op": "all_reduce",
        "ranks": 8,
        "count": 33554432,
        "dtype": "float",
        "time_us": 583.7,
        "algbw_gbps": 229.94,
        "busbw_gbps": 402.40,
        "wrong": 0,
        "backend": "nccl-tests",
        "inplace_time_us": 582.9,
        "inplace_busbw_gbps": 402.95,
    }
    # the printed figures carry nccl-tests' factor 2(n-1)/n (to their 2-decimal rounding)
    assert math.isclose(
        big["busbw_gbps"] / big["algbw_gbps"], bus_factor("all_reduce", 8), rel_tol=1e-4
    )
    assert math.isclose(big["bytes"] / big["time_us"] / 1e3, big["algbw_gbps"], rel_tol=1e-4)


def test_parse_alltoall_na_inplace_and_op_from_command_line():
    rows = nccltests.parse_file(str(FIX / "alltoall_8gpu.log"))
    assert {r["op"] for r in rows} == {"all_to_all"} and len(rows) == 2
    assert rows[0]["ranks"] == 8 and rows[0]["inplace_time_us"] is None
    assert math.isclose(rows[1]["busbw_gbps"] / rows[1]["algbw_gbps"], 7 / 8, rel_tol=1e-3)


def test_parse_old_format_error_column():
    rows = nccltests.parse_file(str(FIX / "old_format_4gpu.txt"), op="all_reduce")
    assert rows[1]["ranks"] == 4 and rows[1]["busbw_gbps"] == 19.66
    assert rows[1]["wrong"] == "" and rows[1]["max_error"] == 0.0  # a largest error, not a count
    assert math.isclose(rows[1]["busbw_gbps"] / rows[1]["algbw_gbps"], 1.5, rel_tol=1e-3)


def test_parse_refuses_unknown_op_and_non_tables(tmp_path):
    with pytest.raises(NcclTuningError, match="cannot tell which collective"):
        nccltests.parse_file(str(FIX / "old_format_4gpu.txt"))
    junk = tmp_path / "all_reduce_perf.out"
    junk.write_text("hello\n")
    with pytest.raises(NcclTuningError, match="no nccl-tests table header"):
        nccltests.parse_file(str(junk))
    with pytest.raises(NcclTuningError, match="cannot read it"):
        nccltests.parse_file(str(tmp_path / "missing_all_reduce_perf.txt"))


def test_our_table_parses_as_nccl_tests():
    rows = [
        results.typed(
            {
                "op": "all_reduce",
                "bytes": b,
                "ranks": 4,
                "time_us": t,
                "algbw_gbps": b / t / 1e3,
                "busbw_gbps": b / t / 1e3 * 1.5,
                "wrong": 0,
                "backend": "gloo",
                "count": b // 4,
                "dtype": "float32",
            }
        )
        for b, t in ((1024, 100.0), (2048, 150.0))
    ]
    back = nccltests.parse(results.format_table(rows), op="all_reduce")
    assert [(r["bytes"], r["count"], r["time_us"]) for r in back] == [
        (1024, 256, 100.0),
        (2048, 512, 150.0),
    ]


def test_info_log():
    info = nccltests.parse_info_log((FIX / "nccl_info.log").read_text())
    assert (info["version"], info["network"], info["channels"]) == ("2.21.5", "IB", 16)
    assert (info["coll_channels"], info["p2p_channels"]) == (16, 16)
    assert info["choices"][0] == {
        "collective": "AllReduce",
        "bytes": 1048576,
        "algo": "RING",
        "proto": "SIMPLE",
        "channels": 16,
    }
    assert info["choices"][2]["algo"] == "TREE" and info["choices"][2]["proto"] == "LL"
    assert len(info["refusals"]) == 2
    summary = nccltests.summarize_choices(info["choices"])
    assert {(s["algo"], s["min_bytes"], s["max_bytes"], s["calls"]) for s in summary} == {
        ("RING", 1048576, 2097152, 2),
        ("TREE", 4096, 4096, 1),
    }


def _rows(times: dict, op="all_to_all", spread=1.0):
    """times: {preset: [time_us per size]} over sizes 1K, 2K, 4K."""
    return [
        results.typed(
            {
                "preset": p,
                "op": op,
                "bytes": 1024 << i,
                "ranks": 8,
                "time_us": t,
                "algbw_gbps": 1.0,
                "busbw_gbps": 1.0,
                "wrong": 0,
                "backend": "nccl",
                "spread_pct": spread,
            }
        )
        for p, ts in times.items()
        for i, t in enumerate(ts)
    ]


def test_recommend_winner_margin_and_within_noise_caveat():
    rows = _rows({"default": [100, 100, 100], "moe": [80, 80, 80], "other": [78, 79, 80]})
    rec = sweep.recommend(rows, ["all_to_all"], 5.0, "moe")
    assert rec["recommended"] == "other" and math.isclose(rec["gain_pct"], 26.6, abs_tol=0.1)
    assert "moe is within noise" in rec["caveat"]
    band = rec["ops"]["all_to_all"]["bands"]
    assert band[0]["best"] == "other" and band[-1]["best"] == "moe"  # tie at 4K keeps the first


def test_recommend_never_slower_than_default():
    rows = _rows({"default": [100, 100, 100], "slow": [120, 130, 103]})
    rec = sweep.recommend(rows, ["all_to_all"], 5.0)
    assert rec["recommended"] == "default" and "within noise" in rec["caveat"]
    assert [b["best"] for b in rec["ops"]["all_to_all"]["bands"]] == ["default"]
    # a gain smaller than the measured spread is noise too
    rec = sweep.recommend(_rows({"default": [100] * 3, "moe": [90] * 3}, spread=20.0), [], 5.0)
    assert rec["recommended"] == "default" and rec["ops"]["all_to_all"]["bands"][0]["within_noise"]


def test_recommend_bands_and_tuner_rows():
    rows = _rows({"default": [100, 100, 100], "ring": [100, 70, 60]}, op="all_reduce")
    rec = sweep.recommend(rows, ["all_reduce"], 5.0, "dense")
    bands = rec["ops"]["all_reduce"]["bands"]
    assert [(b["min_bytes"], b["max_bytes"], b["best"]) for b in bands] == [
        (1024, 1024, "default"),
        (2048, 4096, "ring"),
    ]
    envs = {
        "default": {},
        "ring": {
            "NCCL_ALGO": "Ring",
            "NCCL_PROTO": "Simple",
            "NCCL_MIN_NCHANNELS": "8",
            "NCCL_MAX_NCHANNELS": "8",
        },
    }
    assert sweep.tuner_rows(rec, envs, nodes=1) == [
        {
            "collective": "allreduce",
            "min_bytes": 2048,
            "max_bytes": 4096,
            "algorithm": "ring",
            "protocol": "simple",
            "channels": "8",
            "nNodes": 1,
            "nRanks": 8,
        }
    ]
    envs["ring"] = {"NCCL_BUFFSIZE": "8388608"}  # not an ALGO/PROTO preset: no tuner row
    assert sweep.tuner_rows(rec, envs, nodes=1) == []


def test_recommend_needs_baseline():
    with pytest.raises(NcclTuningError, match="baseline"):
        sweep.recommend(_rows({"moe": [1, 2, 3]}), [], 5.0)


def test_sweep_plan_validation(tmp_path):
    out = str(tmp_path / "new")
    names, dom, envs = sweep.plan("moe,dense", out, "moe", None)
    assert names == ["default", "moe", "dense"] and dom == ["all_to_all"] and envs["default"] == {}
    assert sweep.plan("moe+roce", out, None, "all_reduce")[0] == ["default", "moe+roce"]
    for args, match in [
        (("nope", out, None, None), "unknown NCCL preset 'nope'"),
        (("moe,moe", out, None, None), "twice"),
        (("moe", out, "sparse", None), "--workload 'sparse'"),
        (("moe", out, None, "alltoall"), "unknown op"),
        (("moe", out, "moe", None, (), ["all_reduce"]), "not benchmarked"),
        (("moe", str(tmp_path), None, None), "never overwrites"),
        (("", out, None, None), "no candidate preset"),
    ]:
        with pytest.raises(NcclTuningError, match=match):
            sweep.plan(*args)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"min_bytes": "1Q"}, "'1Q' is not a size"),
        ({"min_bytes": "1M", "max_bytes": "1K"}, "larger"),
        ({"backend": "k8s"}, "'k8s' is not one of local, ssh, slurm"),
        ({"nodes": "0"}, "--nodes '0'"),
        ({"gpus_per_node": "x"}, "--gpus-per-node 'x'"),
        ({"ops": "allreduce"}, "unknown op"),
        ({"iters": 0}, "iters >= 1"),
    ],
)
def test_bench_config_rejects(kw, match):
    args = {
        "backend": "local",
        "nodes": "1",
        "gpus_per_node": "2",
        "ops": "all_reduce",
        "min_bytes": "1K",
        "max_bytes": "4K",
        **kw,
    }
    with pytest.raises(NcclTuningError, match=match):
        runner.BenchConfig.build(**args)


def test_launch_argv_and_log_fallback():
    cfg = runner.BenchConfig.build(
        "slurm", 2, 4, "all_reduce", "1K", "2K", launch_args=["--partition", "gpu"]
    )
    argv = cfg.launch_argv("/r", "moe")
    i = argv.index("--")
    assert argv[2:4] == ["launchers.cli", "slurm"] and "--wait" in argv[:i]
    assert argv[i + 1 : i + 3] == ["-m", "nccl_tuning.bench"] and "--out" not in argv
    log = [
        "# nccl_tuning.bench: backend gloo, 2 ranks, float32, sum, warmup 1, iters 3",
        "#             op         size      count   time(us)    algbw    busbw  #wrong",
        "      all_reduce         1024        256      483.5    0.002    0.002       0",
    ]
    assert runner.parse_log(log)[0] == {
        **runner.parse_log(log)[0],
        "op": "all_reduce",
        "bytes": 1024,
        "ranks": 2,
        "time_us": 483.5,
    }
