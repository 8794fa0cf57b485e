"""Issue 24 item 4: nccl-tests outputs and NCCL logs as people paste them.

Every fixture is a real paste from a public thread, named on its first line
(tests/data/nccltests/real/). Rules cite nccl-tests' src/common.cu (read at v2.11.0, v2.13.3,
v2.19.6) and NCCL's code read at the tags in nccl_tuning/infolog.py.
"""

import csv
from pathlib import Path

import pytest
from click.testing import CliRunner

from nccl_tuning import infolog, nccltable, nccltests, results
from nccl_tuning.cli import nccl
from nccl_tuning.errors import NcclTuningError

REAL = Path(__file__).parent / "data" / "nccltests" / "real"


def _run(name, op=None):
    runs = nccltests.parse_runs_file(str(REAL / name), op)
    assert len(runs) == 1
    return runs[0]


# ---- old `error` column: the largest deviation (v2.11.0 src/common.cu:737), not a count -----


def test_old_error_column_is_the_largest_error_not_a_count():
    run = _run("old_error_column_128gpu.txt", "all_reduce")
    assert len(run.rows) == 6 and not run.errors
    assert {(r["wrong"], r["max_error"], r["inplace_max_error"]) for r in run.rows} == {
        ("", 1e-06, 1e-06)
    }
    table = results.format_table(run.rows)
    assert "WRONG" not in table and " OK" not in table
    assert table.splitlines()[-1] == (
        "# Out of bounds values : N/A (an 'error' column: the largest "
        "deviation, max 1e-06, not a count)"
    )
    assert table.splitlines()[2].split()[-1] == "error"  # the column keeps its name


def test_error_column_with_check_off_is_not_checked():
    run = nccltests.parse_runs_file(str(REAL / "two_collectives.txt"))[0]  # -c 0: error N/A
    assert {(r["wrong"], r["max_error"]) for r in run.rows} == {("", None)}
    assert results.out_of_bounds(run.rows) == "N/A (not checked)"


# ---- each table is labelled with the collective its text names ------------------------------


def test_each_table_gets_the_collective_its_text_names():
    runs = nccltests.parse_runs_file(str(REAL / "two_collectives.txt"))
    assert [(r.op, len(r.rows), r.errors) for r in runs] == [
        ("all_reduce", 6, []),
        ("all_gather", 5, []),
    ]
    assert {r["redop"] for r in runs[0].rows} == {"sum"} and {r["redop"] for r in runs[1].rows} == {
        "none"
    }
    assert runs[1].rows[0]["time_us"] == 107.5  # srun --label pads the rank: ' 0: '
    # --op only fills in where the text names nothing: it never relabels a named table
    again = nccltests.parse_runs_file(str(REAL / "two_collectives.txt"), op="broadcast")
    assert [r.op for r in again] == ["all_reduce", "all_gather"]


def test_import_command_prints_each_table_under_its_own_collective():
    res = CliRunner().invoke(nccl, ["import", str(REAL / "two_collectives.txt")])
    assert res.exit_code == 0, res.output
    assert "# all_reduce  (nccl-tests, ranks unknown)" in res.output
    assert "# all_gather  (nccl-tests, ranks unknown)" in res.output
    assert "# run 2 (all_gather): 5 row(s)" in res.output


# ---- sendrecv prints 'sum'; type names stay the file's ------------------------------------------


def test_sendrecv_keeps_its_redop_and_the_files_type_name():
    run = _run("sendrecv_sum.txt", "sendrecv")
    assert run.ranks == 2 and run.sizes == 23 and not run.notes()
    assert {(r["redop"], r["root"], r["dtype"]) for r in run.rows} == {("sum", "-1", "float")}
    assert {r["inplace_wrong"] for r in run.rows} == {None}  # in-place N/A
    row = results.format_table(run.rows).splitlines()[4].split()
    assert row[:5] == ["256", "64", "float", "sum", "-1"]


def test_half_stays_half_and_a_markdown_pasted_table_is_read():
    """'\\#' header lines and '1024 | 512 | half | ...' rows, as the thread renders them."""
    run = _run("markdown_table_half.txt", "all_reduce")
    assert len(run.rows) == 9 and not run.errors
    assert {r["dtype"] for r in run.rows} == {"half"}
    assert (run.rows[6]["bytes"], run.rows[6]["busbw_gbps"], run.rows[6]["inplace_busbw_gbps"]) == (
        65536,
        13.07,
        13.0,
    )
    assert results.format_table(run.rows).splitlines()[4].split()[2] == "half"


# ---- a piece of a row between log lines is named, never dropped --------------------------------


def test_row_split_by_log_lines_is_one_error_line_each():
    run = _run("row_split_by_log_lines.txt", "all_reduce")  # mpiexec -prepend-rank '[0] ' stripped
    assert run.rows == [] and len(run.errors) == 2
    assert "line 20: a piece of a row between other output" in run.errors[0]
    assert "'75.38    0.05    0.10      0'" in run.errors[0]
    assert "line 21: the 8192-byte row has 18 fields, more than the header's 13" in run.errors[1]


def test_import_command_names_every_unreadable_row_when_none_is_left():
    res = CliRunner().invoke(
        nccl, ["import", str(REAL / "row_split_by_log_lines.txt"), "--op", "all_reduce"]
    )
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    err = res.stderr.splitlines()
    assert len(err) == 3 and "line 20" in err[0] and "line 21" in err[1]
    assert "no complete nccl-tests row (2 row(s) could not be read, above)" in err[2]


# ---- line prefixes: indentation, stacked and timestamp prefixes are stripped ----------------


@pytest.mark.parametrize(
    "line, rest",
    [
        # aws/aws-ofi-nccl#1020 (description, 2025-10-16): a '[date time] ' stamp
        (
            "[2025-10-16 22:16:08] ip-172-31-3-90:1929:1937 [0] nccl_net_ofi_rdma_init:7978 NCCL "
            "WARN NET/OFI OFI fi_getinfo() call failed: No data available",
            "ip-172-31-3-90:1929:1937 [0] nccl_net_ofi_rdma_init:7978",
        ),
        # aws/aws-ofi-nccl#889 (turn 16): lines copied from the AWS console's log table
        (
            "  | 2025-05-22T14:26:33.405-07:00 | ip-10-36-22-140:80:2500 [0] NCCL INFO NET/OFI "
            "Using Libfabric version 2.1",
            "ip-10-36-22-140:80:2500 [0] NCCL INFO",
        ),
        # bottlerocket-os/bottlerocket-kernel-kit#313: an indented mpirun --tag-output row
        (
            "        [1,0]<stdout>:        2048            32     float    none      -1   "
            "106.88    0.02    0.02       0   111.25    0.02    0.02    N/A",
            "2048            32     float    none",
        ),
    ],
)
def test_real_line_prefixes_are_stripped(line, rest):
    assert nccltests.strip_prefix(line).strip().startswith(rest)


# ---- what the paste lacks is said: ranks, rows left out, the footer's rows ------------------


def test_no_rank_lines_leave_ranks_empty_with_a_note(tmp_path):
    run = _run("old_error_column_128gpu.txt", "all_reduce")
    assert run.ranks is None and {r["ranks"] for r in run.rows} == {""}
    assert run.notes() == [
        "run 1: ranks unknown (no '#  Rank N' lines before the table at line 3); "
        "the ranks column is left empty"
    ]
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(
        nccl,
        [
            "import",
            str(REAL / "old_error_column_128gpu.txt"),
            "--op",
            "all_reduce",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0 and "note: run 1: ranks unknown" in res.output
    rows = list(csv.DictReader(out.open()))
    assert rows[0]["ranks"] == "" and rows[0]["max_error"] == "1e-06" and rows[0]["wrong"] == ""


def test_rows_left_out_with_dots_are_said():
    run = _run("rows_left_out.txt", "all_reduce")
    assert [r["bytes"] for r in run.rows] == [8, 262144, 524288] and not run.errors
    assert (
        "run 1: rows were left out of the paste at line(s) 6 ('...'); the table is not whole"
        in run.notes()
    )
    assert (run.rows[2]["wrong"], run.rows[2]["inplace_wrong"]) == (237858, 238038)


def test_footers_of_whole_tables_match_and_raise_no_note():
    """The check that the file's own footer agrees (to the rows' 2-decimal rounding) must stay
    silent on real whole tables: the mean nccl-tests prints (v2.13.3 src/common.cu:538-539, 995)."""
    for name, op in (("two_runs.txt", "all_reduce"), ("alltoall_empty_redop.txt", "all_to_all")):
        for run in nccltests.parse_runs_file(str(REAL / name), op):
            assert run.printed_avg is not None and not run.footer_differs(), (name, run.index)


# ---- in-place figures and the file's words reach the CSV --------------------------------------


def test_csv_has_in_place_columns_redop_root_and_type(tmp_path):
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(
        nccl, ["import", str(REAL / "sendrecv_sum.txt"), "--op", "sendrecv", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(out.open()))
    assert tuple(rows[0]) == nccltable.CSV_COLUMNS
    first = {
        k: rows[0][k]
        for k in (
            "op",
            "redop",
            "root",
            "dtype",
            "inplace_time_us",
            "inplace_busbw_gbps",
            "inplace_wrong",
            "wrong",
        )
    }
    assert first == {
        "op": "sendrecv",
        "redop": "sum",
        "root": "-1",
        "dtype": "float",
        "inplace_time_us": "33.65",
        "inplace_busbw_gbps": "0.01",
        "inplace_wrong": "",
        "wrong": "0",
    }
    back = results.read_csv(str(out))  # typed again, in-place figures included
    assert back[2]["inplace_time_us"] == 31.11 and back[2]["run"] == 1


# ---- infolog -------------------------------------------------------------------------------


def test_infolog_reads_the_bare_version_line():
    """nccl-2.21.5/src/init.cc:476 prints 'NCCL version X' bare to stdout."""
    text = (REAL / "concurrent_runs.txt").read_text()
    assert infolog.parse_info_log(text)["version"] == "2.19.3"
    assert infolog.parse_info_log((REAL / "two_collectives.txt").read_text())["version"] == "2.8.4"


def test_infolog_keeps_a_network_name_with_a_space():
    info = infolog.parse_info_log((REAL / "aws_libfabric_info.log").read_text())
    assert info["network"] == "AWS Libfabric"


def test_infolog_reads_choices_without_a_collective_name():
    """nccl-2.20.5/src/enqueue.cc:1498: 'N Bytes -> Algo a proto p time t', no collective."""
    info = infolog.parse_info_log((REAL / "row_split_by_log_lines.txt").read_text())
    assert (info["coll_channels"], info["p2p_channels"]) == (16, 16)
    assert {c["collective"] for c in info["choices"]} == {None}
    summary = {
        (g["collective"], g["algo"], g["proto"], g["min_bytes"], g["max_bytes"], g["calls"])
        for g in infolog.summarize_choices(info["choices"])
    }
    assert summary == {
        ("(unnamed)", "RING", "SIMPLE", 8589934592, 8589934592, 1),
        ("(unnamed)", "TREE", "LL", 4096, 8192, 13),
    }


def test_infolog_command_does_not_ask_for_the_tuning_log_it_has():
    res = CliRunner().invoke(nccl, ["infolog", str(REAL / "row_split_by_log_lines.txt")])
    assert res.exit_code == 0, res.output
    assert "NCCL_DEBUG_SUBSYS" not in res.output
    assert "(unnamed)" in res.output and "TREE/LL  (13 calls)" in res.output
    res = CliRunner().invoke(nccl, ["infolog", str(REAL / "aws_libfabric_info.log")])
    assert res.output.startswith("NCCL ?  network AWS Libfabric  channels ?")
    assert "no algorithm choice lines" in res.output  # here there are none: it says so


def test_oldest_format_error_column_with_real_errors_keeps_the_files_count():
    """nccl-tests of early 2020 (NVIDIA/nccl-tests#37): no '#' before the table lines, no redop/root
    columns, an 'error' column of 1e+00 that is the largest deviation, and the file's own
    'Out of bounds values : 2 FAILED' -- read, not counted as wrong rows, the file's words kept."""
    run = _run("old_format_error_failed.txt")
    assert (run.op, len(run.rows), run.errors, run.ranks) == ("all_gather", 1, [], None)
    row = run.rows[0]
    assert (row["bytes"], row["dtype"], row["redop"], row["root"]) == (4294967296, "float", "", "")
    assert (row["busbw_gbps"], row["inplace_busbw_gbps"]) == (129.05, 128.84)
    assert (row["wrong"], row["max_error"], row["inplace_max_error"]) == ("", 1.0, 1.0)
    assert (run.printed_oob, run.printed_avg) == ("2 FAILED", 128.942) and not run.footer_differs()
    res = CliRunner().invoke(nccl, ["import", str(REAL / "old_format_error_failed.txt")])
    assert res.exit_code == 0, res.output
    assert "the file says 128.942); its out of bounds values: 2 FAILED" in res.output
    assert "WRONG" not in res.output


# ---- issue 35 item 8: the classes the new real pastes showed (each fixture names its thread) -----


def test_out_of_bounds_counts_in_place_wrong_elements_too():
    """nccl-tests checks out-of-place and in-place results and counts a failed check of either
    (v2.13.3 src/common.cu:260, BenchTime in_place 0 and 1 at :578-579): NVIDIA/nccl#1184's 512 KiB
    row is wrong in both; the verdict was the out-of-place count alone."""
    run = _run("rows_left_out.txt", "all_reduce")
    assert results.out_of_bounds(run.rows) == "475896 WRONG (out-of-place 237858, in-place 238038)"
    assert (
        results.format_table(run.rows)
        .splitlines()[-1]
        .endswith("475896 WRONG (out-of-place 237858, in-place 238038)")
    )
    only_in_place = [dict(r, wrong=0) for r in run.rows]  # the same rows, out-of-place clean
    assert results.out_of_bounds(only_in_place) == "238038 WRONG (out-of-place 0, in-place 238038)"
    # in-place N/A
    assert results.out_of_bounds(_run("sendrecv_sum.txt", "sendrecv").rows) == "0 OK"


def test_version_behind_an_mpi_tag_with_no_space_is_read():
    """aws-samples/aws-efa-eks: '[1,0]<stdout>:NCCL version 2.9.9+cuda11.2' (mpirun
    --tag-output)."""
    assert (
        infolog.parse_info_log((REAL / "mpi_tagged_version.log").read_text())["version"] == "2.9.9"
    )


def test_transport_lines_connection_index_is_not_the_channel_count():
    """NVIDIA/nccl#952: only 'Channel NN/0 : a[x] -> b[y] via ...' lines; '/0' is the connection
    index (nccl-2.21.5/src/transport/p2p.cc:364), channels 00..07 are 8; ring lines 'Channel 00/08 :
    0 7 ...' (nccl-2.21.5/src/graph/rings.cc:35) say the count themselves."""
    assert (
        infolog.parse_info_log((REAL / "transport_channels_only.log").read_text())["channels"] == 8
    )
    res = CliRunner().invoke(nccl, ["infolog", str(REAL / "transport_channels_only.log")])
    assert res.output.startswith("NCCL ?  network ?  channels 8 ")
    ring = "[1,0]<stdout>:w-0:26:67 [0] NCCL INFO Channel 07/08 :    0   5   4   7  14  11  10   9"
    assert infolog.parse_info_log(ring)["channels"] == 8


@pytest.mark.parametrize(
    "name, failed",
    [
        (
            "test_cuda_failure.txt",
            "test: Test CUDA failure common.cu:941 'system not yet initialized'",
        ),
        ("nccl_failure_old_header.txt", "NCCL failure all_reduce.cu:95 'unhandled cuda error'"),
        (
            "failure_after_rows.txt",
            "HCA-128: Test NCCL failure common.cu:1204 'unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details) / '",
        ),
    ],
)
def test_a_failed_run_is_named_not_refused_as_no_table_header(name, failed):
    """nccl-tests prints '<host>: Test CUDA failure FILE:LINE ...' (v2.19.6 src/common.h:34, :47,
    :61); NVIDIA/nccl-tests#264, #5 and #322 were refused as 'no table header'."""
    with pytest.raises(NcclTuningError) as e:
        nccltests.parse_runs_file(str(REAL / name))
    msg = str(e.value)
    assert "\n" not in msg and "no table header" not in msg
    assert (
        f"no nccl-tests table to read: the test failed: {REAL / name} line " in msg
        and failed in msg
    )
    if name == "failure_after_rows.txt":
        assert msg.endswith("(3 more failure line(s))")
    res = CliRunner().invoke(nccl, ["import", str(REAL / name)])
    assert res.exit_code == 2 and failed in res.stderr and res.stderr.count("\n") == 1
    info = CliRunner().invoke(nccl, ["infolog", str(REAL / name)])
    assert info.exit_code == 1 and f"failed: {failed}" in info.output


def test_a_failure_beside_a_table_is_one_error_line_and_the_import_exits_1():
    """NVIDIA/nccl-tests#280: the failure line before the rows that were printed."""
    run = _run("broken_row.txt", "all_reduce")
    assert run.failures == [
        f"{REAL / 'broken_row.txt'} line 2: c2211f46f318: Test NCCL failure "
        f"common.cu:1005 'unhandled CUDA error'"
    ]
    res = CliRunner().invoke(nccl, ["import", str(REAL / "broken_row.txt"), "--op", "all_reduce"])
    assert (
        res.exit_code == 1
        and "Test NCCL failure common.cu:1005 'unhandled CUDA error'" in res.stderr
    )


def test_warn_lines_are_surfaced_once_each():
    """nccl-2.21.5/src/debug.cc:179 'host:pid:tid [dev] FILE:LINE NCCL WARN ...';
    NVIDIA/nccl-tests#131."""
    info = infolog.parse_info_log((REAL / "warn_lines.log").read_text())
    assert [(m, n) for m, n, _ in info["warnings"]] == [
        ("Could not find a path for pattern 4, falling back to simple order", 1)
    ]
    res = CliRunner().invoke(nccl, ["infolog", str(REAL / "warn_lines.log")])
    assert res.exit_code == 0 and res.output.startswith("NCCL 2.16.5  network Socket")
    assert (
        "warning: Meowth:8756:8772 [1] graph/search.cc:890 NCCL WARN Could not find a path for "
        "pattern 4, falling back to simple order"
    ) in res.output
    twice = "\n".join([(REAL / "warn_lines.log").read_text()] * 2)
    assert infolog.parse_info_log(twice)["warnings"][0][1] == 2


def test_the_nccl_tests_banner_gives_the_library_version():
    """nccl-tests 2.18+ prints '# nccl-tests version V nccl-headers=C nccl-library=C' (v2.19.6
    src/util.cu:623) and, without NCCL_DEBUG, no 'NCCL version' line: 23102 is 2.31.2
    (nccl-2.21.5/src/nccl.h.in:22); NVIDIA/dgx-spark-playbooks#103."""
    info = infolog.parse_info_log((REAL / "banner_nccl_library.txt").read_text())
    assert (info["version"], info["nccl_tests"]) == ("2.31.2", "2.20.0")
    assert (infolog.nccl_version(22809), infolog.nccl_version(2804)) == ("2.28.9", "2.8.4")
    run = _run("banner_nccl_library.txt")
    assert (run.op, len(run.rows), run.nccl_version) == ("all_reduce", 4, "2.31.2")
    res = CliRunner().invoke(nccl, ["import", str(REAL / "banner_nccl_library.txt")])
    assert (
        res.exit_code == 0
        and "# run 1: NCCL 2.31.2 (the nccl-tests banner's nccl-library)" in res.output
    )


def test_net_ib_using_lines_are_read():
    """nccl-2.21.5/src/transport/net_ib.cc:538 'NET/IB : Using [0]dev:port/link ... ; OOB if:addr';
    NVIDIA/nccl-tests#185."""
    info = infolog.parse_info_log((REAL / "net_ib_using.log").read_text())
    assert info["ib"] == {
        "devices": ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"],
        "oob": "enp220s0np0:11.1.128.136<0>",
    }
    res = CliRunner().invoke(nccl, ["infolog", str(REAL / "net_ib_using.log")])
    assert (
        "  NET/IB: mlx5_10:1/RoCE, mlx5_11:1/RoCE (OOB enp220s0np0:11.1.128.136<0>)" in res.output
    )
