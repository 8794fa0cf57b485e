"""nccl_tuning.bench: size parsing (pure) and real torchrun runs on gloo at 2 and 4 ranks."""

import csv
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_tuning.bench import OPS, bus_factor, element_count, parse_ops, parse_size, sizes
from nccl_tuning.errors import NcclTuningError

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


@pytest.mark.parametrize(
    "text,value",
    [
        ("1K", 1024),
        ("256M", 256 << 20),
        ("4096", 4096),
        ("1GiB", 1 << 30),
        ("2kb", 2048),
        (" 8 K ", 8192),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["1Q", "", "K", "-1K", "1.5M", "0", "1KK"])
def test_parse_size_rejects(text):
    with pytest.raises(NcclTuningError, match="is not a size"):
        parse_size(text)


def test_sizes_and_ops():
    assert sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert sizes(1000, 5000) == [1000, 2000, 4000]
    with pytest.raises(NcclTuningError, match="larger than --max-bytes"):
        sizes(2048, 1024)
    with pytest.raises(NcclTuningError, match="accepted: all_reduce"):
        parse_ops("all_reduce,alltoall")
    assert element_count("all_gather", 1000, 3) == 249
    assert bus_factor("all_reduce", 4) == 1.5 and bus_factor("broadcast", 4) == 1.0


def test_cli_bad_sizes_exit_2():
    for args in (["--min-bytes", "1Q"], ["--min-bytes", "1M", "--max-bytes", "1K"]):
        out = subprocess.run(
            [sys.executable, "-m", "nccl_tuning.bench", *args], capture_output=True, text=True
        )
        assert out.returncode == 2 and out.stderr.startswith("launch: error: ")
        assert len(out.stderr.strip().splitlines()) == 1


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("nproc", [2, 4])
def test_bench_gloo_verified_and_factors_exact(tmp_path, nproc):
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            TORCHRUN,
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            "-m",
            "nccl_tuning.bench",
            "--ops",
            ",".join(OPS),
            "--min-bytes",
            "1K",
            "--max-bytes",
            "4K",
            "--warmup",
            "1",
            "--iters",
            "3",
            "--backend",
            "gloo",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "0 wrong element(s)" in proc.stdout
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert {r["op"] for r in rows} == set(OPS)
    assert len(rows) == len(OPS) * 3
    for r in rows:
        assert r["backend"] == "gloo" and int(r["ranks"]) == nproc and r["wrong"] == "0"
        algbw, busbw = float(r["algbw_gbps"]), float(r["busbw_gbps"])
        assert algbw > 0
        assert math.isclose(busbw / algbw, bus_factor(r["op"], nproc), rel_tol=1e-12)
        assert math.isclose(
            algbw, int(r["bytes"]) / (float(r["time_us"]) * 1e-6) / 1e9, rel_tol=1e-9
        )
