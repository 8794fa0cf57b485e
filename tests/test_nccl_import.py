"""nccl-tests importer on real outputs pasted in public nccl-tests / NCCL threads.

Each fixture in tests/data/nccltests/real/ names its source thread on its first line (the lines are
as the thread shows them; where the thread is cut, so is the fixture). The output format is
nccl-tests' src/common.cu (v2.13.3 and v2.19.6, read in NVIDIA/nccl-tests).
"""

import csv
import json
import math
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import LAUNCH
from nccl_tuning import nccltests, results
from nccl_tuning.cli import nccl
from nccl_tuning.errors import NcclTuningError

REAL = Path(__file__).parent / "data" / "nccltests" / "real"


def test_every_fixture_names_its_source_thread():
    files = sorted(REAL.iterdir())
    assert len(files) == 23
    for f in files:
        first = f.read_text().splitlines()[0]
        assert first.startswith("# source: ") and "https://github.com/" in first, f.name


def test_mpirun_tag_output_prefix_is_stripped():
    (run,) = nccltests.parse_runs_file(str(REAL / "tagged_output.txt"), op="all_reduce")
    assert [r["bytes"] for r in run.rows] == [8, 16, 32] and not run.errors
    assert run.rows[2]["time_us"] == 22.25 and run.rows[2]["inplace_time_us"] == 13.34
    assert run.rows[0]["wrong"] == 0 and run.checked


def test_header_without_hash_is_found_and_a_cut_row_is_one_error_line():
    text = (REAL / "no_hash_all_reduce_perf.txt").read_text()
    (run,) = nccltests.parse_runs(text, filename="f.txt")  # op from 'all_reduce_perf'
    assert run.cols[:5] == ["size", "count", "type", "redop", "root"] and run.ranks == 1
    assert run.rows == [] and len(run.errors) == 1
    assert "line 13: the 8-byte row has 4 fields, less than the header's 13" in run.errors[0]
    with pytest.raises(NcclTuningError, match="no complete data row: f.txt line 13"):
        nccltests.parse(text, filename="f.txt")


def test_two_runs_are_both_imported_with_a_run_column():
    runs = nccltests.parse_runs_file(str(REAL / "two_runs.txt"), op="all_reduce")
    assert [(r.index, len(r.rows)) for r in runs] == [(1, 5), (2, 5)]
    rows = nccltests.parse_file(str(REAL / "two_runs.txt"), op="all_reduce")
    assert [r["run"] for r in rows] == [1] * 5 + [2] * 5
    assert rows[5]["busbw_gbps"] == 586.06 and rows[5]["ranks"] == 72  # '#  Rank 71'


def test_footer_average_is_the_mean_of_out_of_place_and_in_place():
    """nccl-tests adds busBw of both BenchTime calls (src/common.cu v2.13.3:538-539) and divides
    by their count (:995). The files' own footers agree to the 2-decimal rounding of the rows;
    the out-of-place-only mean the importer used to print does not."""
    for run in nccltests.parse_runs_file(str(REAL / "two_runs.txt"), op="all_reduce"):
        assert math.isclose(run.avg_busbw, run.printed_avg, abs_tol=0.005)
        out_only = sum(r["busbw_gbps"] for r in run.rows) / len(run.rows)
        assert abs(out_only - run.printed_avg) > 0.5
        assert math.isclose(results.avg_busbw(run.rows), run.printed_avg, abs_tol=0.005)


def test_concurrent_runs_are_refused_with_one_line():
    with pytest.raises(NcclTuningError) as e:
        nccltests.parse_file(str(REAL / "concurrent_runs.txt"))
    msg = str(e.value)
    assert "\n" not in msg and "line 17" in msg and "2 '# nThread' banners" in msg
    assert "without MPI" in msg


def test_broken_row_is_a_per_row_error_and_good_rows_stay():
    (run,) = nccltests.parse_runs_file(str(REAL / "broken_row.txt"), op="all_reduce")
    assert [r["bytes"] for r in run.rows] == [8, 16, 32]  # rows without leading spaces
    assert run.errors == [
        f"{REAL / 'broken_row.txt'} line 15: the 64-byte row has 5 fields, less "
        f"than the header's 13 (the test stopped, or other output was printed "
        f"into the row): '64            16     float     sum      -1'"
    ]


def test_empty_redop_rows_are_realigned():
    """nccl-tests v2.13.3 src/alltoall.cu passes an empty redop: the rows have one field less."""
    (run,) = nccltests.parse_runs_file(str(REAL / "alltoall_empty_redop.txt"), op="all_to_all")
    r = run.rows[0]
    assert (r["time_us"], r["algbw_gbps"], r["busbw_gbps"], r["redop"]) == (
        520935.0,
        0.52,
        0.51,
        "",
    )
    assert (r["wrong"], r["max_error"], r["inplace_max_error"]) == ("", 0.0, 1.0)  # not counts
    assert (r["inplace_time_us"], r["inplace_busbw_gbps"]) == (519562.0, 0.51)
    assert math.isclose(run.avg_busbw, run.printed_avg, abs_tol=0.005)


def test_not_checked_is_na_not_zero_ok():
    (run,) = nccltests.parse_runs_file(str(REAL / "not_checked_broadcast_perf.txt"))
    assert run.rows[0]["op"] == "broadcast" and run.rows[0]["wrong"] == "" and not run.checked
    table = results.format_table(run.rows)
    assert "Out of bounds values : N/A (not checked)" in table and " 0 OK" not in table
    assert table.splitlines()[-3].split()[-1] == "N/A"


def test_cputime_column_is_mapped():
    """`-C 1` (nccl-tests v2.19.6 src/common.cu:858 reports cputimeSec in the time column). No
    public paste of a -C table was found; the header here follows the issue's report."""
    text = (
        "# all_reduce_perf -C 1\n"
        "#       size         count      type   redop    root  cputime   algbw   busbw #wrong"
        "  cputime   algbw   busbw #wrong\n"
        "        1024           256     float     sum      -1    12.50    0.08    0.14      0"
        "    12.40    0.08    0.14      0\n"
    )
    (run,) = nccltests.parse_runs(text)
    assert run.rows[0]["time_us"] == 12.5 and run.rows[0]["time_kind"] == "cputime"
    assert run.rows[0]["inplace_time_us"] == 12.4
    assert "cputime" in results.format_table(run.rows).splitlines()[2]


def test_import_command_reports_rows_and_writes_run_column(tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(
        nccl, ["import", str(REAL / "two_runs.txt"), "--op", "all_reduce", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert (
        "average bus bandwidth 745.53 GB/s" in res.output and "the file says 745.53" in res.output
    )
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["1"] * 5 + ["2"] * 5


def test_import_command_broken_row_exits_1_and_writes_nothing(tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(
        nccl, ["import", str(REAL / "broken_row.txt"), "--op", "all_reduce", "--out", str(out)]
    )
    assert res.exit_code == 1 and not out.exists()
    assert "line 15: the 64-byte row has 5 fields" in res.output
    assert "Traceback" not in res.output


def test_import_command_refusal_is_one_line_exit_2():
    res = CliRunner().invoke(nccl, ["import", str(REAL / "concurrent_runs.txt")])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith("launch: error: ") and "nThread" in res.output


@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", "[0] ", "0: ", ""])
def test_each_launcher_prefix_gives_the_same_rows(prefix):
    """The tagged fixture re-prefixed the way mpiexec -prepend-rank and srun --label tag lines."""
    lines = (REAL / "tagged_output.txt").read_text().splitlines()[1:]
    text = "\n".join(prefix + ln[len("[1,0]<stdout>:") :] for ln in lines)
    rows = nccltests.parse(text, op="all_reduce")
    assert [(r["bytes"], r["time_us"]) for r in rows] == [(8, 12.9), (16, 12.88), (32, 22.25)]


def test_import_json_is_one_object_scripts_can_read(tmp_path):
    """--json (issue 36): every run of the file with its rows and average, nothing else on stdout; a
    broken row is in `errors` and the exit code stays 1."""
    res = subprocess.run(
        [LAUNCH, "nccl", "import", str(REAL / "two_runs.txt"), "--op", "all_reduce", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert [(r["run"], r["op"], len(r["rows"])) for r in got["runs"]] == [
        (1, "all_reduce", 5),
        (2, "all_reduce", 5),
    ]
    assert round(got["runs"][1]["avg_busbw"], 2) == 745.53 and got["errors"] == []
    bad = subprocess.run(
        [LAUNCH, "nccl", "import", str(REAL / "broken_row.txt"), "--op", "all_reduce", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and any(
        "the 64-byte row has 5 fields" in e for e in json.loads(bad.stdout)["errors"]
    )
