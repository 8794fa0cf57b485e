"""Phase 2 end to end through the real launcher (`launch local`, torchrun, gloo): bench at 2 and 4
ranks, a preset's env in every worker, the sweep's outputs, bad input refused before anything
starts."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from conftest import rank_lines, run_launch
from nccl_tuning import presets
from nccl_tuning.bench import OPS, bus_factor
from nccl_tuning.sweep import TUNER_COLUMNS

FAST = ["--min-bytes", "1K", "--max-bytes", "2K", "--warmup", "1", "--iters", "2"]


@pytest.mark.parametrize("nodes,gpn", [(1, 2), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_bench_through_launch_local(tmp_path, nodes, gpn):
    rd = tmp_path / "bench"
    as_json = nodes == 1  # --json: one object on stdout, the job's output on stderr
    p = run_launch(
        "nccl",
        "bench",
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        str(gpn),
        "--ops",
        ",".join(OPS),
        *FAST,
        "--nccl-preset",
        "dense",
        "--run-dir",
        str(rd),
        *(["--json"] if as_json else []),
        cwd=tmp_path,
        check=True,
    )
    n = nodes * gpn
    if as_json:  # the job's own lines on stderr, no table
        assert (
            "[n0 r0] #             op         size      count   time(us)" in p.stderr
            and "#wrong" not in p.stdout
        )
    else:
        assert (
            "#       size         count      type   redop    root     time   algbw   busbw #wrong"
            in p.stdout
        )
        assert "# Out of bounds values : 0 OK" in p.stdout
    rows = list(csv.DictReader(open(rd / "results.csv")))
    if as_json:
        obj = json.loads(p.stdout)
        assert (obj["run_dir"], obj["results"], obj["exit_code"]) == (
            str(rd),
            str(rd / "results.csv"),
            0,
        )
        assert [(r["op"], int(r["bytes"])) for r in obj["rows"]] == [
            (r["op"], int(r["bytes"])) for r in rows
        ]
    assert sorted({r["op"] for r in rows}) == sorted(OPS) and len(rows) == len(OPS) * 2
    for r in rows:
        assert (r["backend"], int(r["ranks"]), r["wrong"]) == ("gloo", n, "0")
        algbw, busbw = float(r["algbw_gbps"]), float(r["busbw_gbps"])
        assert busbw / algbw == pytest.approx(bus_factor(r["op"], n), rel=1e-12)
        assert algbw == pytest.approx(
            int(r["bytes"]) / (float(r["time_us"]) * 1e-6) / 1e9, rel=1e-9
        )
    run = yaml.safe_load((rd / "run.yaml").read_text())
    assert "nccl_tuning.bench" in json.dumps(run) and "NCCL_CROSS_NIC" in json.dumps(run)


def test_preset_env_reaches_every_worker(workdir):
    run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--nccl-preset",
        "moe,tcp",
        "--run-dir",
        "runs/env",
        "--",
        "report.py",
        cwd=workdir,
        check=True,
    )
    reports = [
        json.loads(line.split(" ", 1)[1]) for line in rank_lines(workdir / "runs/env", "REPORT ")
    ]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    want = presets.combine("moe,tcp")[1]
    assert want and all(k.startswith("NCCL_") for k in want)
    for r in reports:
        got = {k: v for k, v in r["env"].items() if k.startswith("NCCL_")}
        assert got == want, f"rank {r['rank']}"


@pytest.mark.slow
def test_sweep_end_to_end(tmp_path):
    mine = tmp_path / "ringsimple.yaml"
    mine.write_text(
        "name: ringsimple\ndescription: force Ring/Simple (tuner-plugin candidate)\n"
        "affects: [all_reduce]\nvars:\n"
        "  NCCL_ALGO: {value: Ring, reason: candidate}\n"
        "  NCCL_PROTO: {value: Simple, reason: candidate}\n"
    )
    out = tmp_path / "sweep1"
    p = run_launch(
        "nccl",
        "sweep",
        "--gpus-per-node",
        "2",
        "--nccl-preset",
        "default",
        "--nccl-preset",
        str(mine),
        "--ops",
        "all_reduce,all_to_all",
        *FAST,
        "--repeats",
        "2",
        "--workload",
        "dense",
        "--out",
        str(out),
        "--json",
        cwd=tmp_path,
        check=True,
    )
    assert (
        "[1/2] preset default" in p.stderr and "[2/2] preset ringsimple: 4 results, ok" in p.stderr
    )
    # progress + verdict, beside --json's
    assert "ringsimple | " in p.stderr and "recommended: " in p.stderr
    said = json.loads(p.stdout)  # one object on stdout
    assert said["out"] == str(out) and said["recommended"] in ("default", "ringsimple")
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert list(rows[0])[:2] == ["preset", "op"] and len(rows) == 8
    assert {r["preset"] for r in rows} == {"default", "ringsimple"}
    assert all(r["wrong"] == "0" for r in rows)
    for op in ("all_reduce", "all_to_all"):
        assert (out / "plots" / f"busbw_{op}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for lab in ("default", "ringsimple"):
        assert (out / "runs" / lab / "results.csv").is_file()
    worker_env = yaml.safe_load((out / "runs/ringsimple/run.yaml").read_text())
    assert "NCCL_PROTO" in json.dumps(worker_env)
    rec = yaml.safe_load((out / "recommendation.yaml").read_text())
    assert rec["recommended"] in ("default", "ringsimple") and rec["dominant_ops"] == ["all_reduce"]
    assert rec["backend"] == "gloo" and "caveat_backend" in rec and rec["failed_presets"] == []
    bands = rec["ops"]["all_reduce"]["bands"]
    assert bands[0]["min_bytes"] == 1024 and bands[-1]["max_bytes"] == 2048
    lines = (out / "tuner.csv").read_text().splitlines()
    assert any(ln.startswith("# columns: " + ",".join(TUNER_COLUMNS)) for ln in lines)
    data = [ln.split(",") for ln in lines if ln and not ln.startswith("#")]
    won = [b for b in bands if b["best"] == "ringsimple"]
    assert len(data) == len(won) == rec["tuner_rows"]
    for d, b in zip(data, won):
        assert d == [
            "allreduce",
            str(b["min_bytes"]),
            str(b["max_bytes"]),
            "ring",
            "simple",
            "-1",
            "1",
            "2",
        ]
    # the same --out again is refused and nothing is touched
    before = sorted(str(x) for x in out.rglob("*"))
    again = run_launch(
        "nccl",
        "sweep",
        "--gpus-per-node",
        "2",
        "--nccl-preset",
        "moe",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert again.returncode == 2 and "exists" in again.stderr
    assert sorted(str(x) for x in out.rglob("*")) == before


@pytest.mark.parametrize(
    "args,msg",
    [
        (["bench", "--min-bytes", "1Q"], "'1Q' is not a size"),
        (["bench", "--min-bytes", "1M", "--max-bytes", "1K"], "is larger than --max-bytes"),
        (["bench", "--ops", "all_reduce,alltoall"], "unknown op(s) alltoall"),
        (["bench", "--backend", "k8s"], "'k8s' is not one of local, ssh, slurm"),
        (["bench", "--nccl-preset", "mo"], "unknown NCCL preset 'mo'"),
        (["bench", "--nodes", "0"], "--nodes '0'"),
        (["bench", "--bogus", "1"], "option '--bogus' is neither a bench option"),
        (["bench", "--dry-run"], "option '--dry-run' is neither"),
        # a bench is one run, never a sweep
        (["bench", "--sweep", "lr=1,2"], "option '--sweep' is neither"),
        (
            ["sweep", "--nccl-preset", "moe", "--out", "s", "--backend", "slurm", "--after", "7"],
            "option '--after' is neither",
        ),
        (
            ["sweep", "--nccl-preset", "default", "--nccl-preset", "bogus", "--out", "s"],
            "unknown NCCL preset 'bogus'",
        ),
        (
            ["sweep", "--nccl-preset", "moe", "--out", "s", "--max-bytes", "1Q"],
            "'1Q' is not a size",
        ),
        (
            ["sweep", "--nccl-preset", "moe", "--out", "s", "--workload", "sparse"],
            "--workload 'sparse'",
        ),
        (["sweep", "--nccl-preset", "moe", "--out", "s", "--noise", "-1"], "--noise -1.0"),
    ],
)
def test_bad_input_starts_nothing(tmp_path, args, msg):
    p = run_launch("nccl", *args, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("launch: error: ") and msg in err[0]
    assert list(Path(tmp_path).iterdir()) == []


def test_import_nccl_tests_output(tmp_path):
    fix = Path(__file__).parent / "data" / "nccltests"
    p = run_launch(
        "nccl",
        "import",
        str(fix / "all_reduce_perf_8gpu.txt"),
        str(fix / "alltoall_8gpu.log"),
        "--nccl-preset",
        "cluster-a",
        "--csv",
        str(tmp_path / "r.csv"),
        check=True,
    )
    assert (
        "# all_reduce  (nccl-tests, 8 ranks)" in p.stdout
        and "# all_to_all  (nccl-tests, 8 ranks)" in p.stdout
    )
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert len(rows) == 5 and rows[0]["preset"] == "cluster-a" and rows[2]["busbw_gbps"] == "402.4"
    again = run_launch(
        "nccl", "import", str(fix / "alltoall_8gpu.log"), "--csv", str(tmp_path / "r.csv")
    )
    assert again.returncode == 2 and "never overwritten" in again.stderr
    info = run_launch("nccl", "infolog", str(fix / "nccl_info.log"))
    assert info.returncode == 1 and "RING/SIMPLE  (2 calls)" in info.stdout
    assert "refused: " in info.stdout and "NCCL 2.21.5  network IB  channels 16" in info.stdout
