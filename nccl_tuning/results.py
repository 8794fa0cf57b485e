"""Result rows (one per op and size) shared by bench, sweep and the nccl-tests importer: read/write
CSV and print them as an nccl-tests style table. Torch-free.

A row is a dict with the bench.CSV_COLUMNS keys (numbers typed), plus `preset` in a sweep's CSV.
"""

from __future__ import annotations

import csv
import os

from .errors import NcclTuningError

COLUMNS = (
    "op",
    "bytes",
    "ranks",
    "time_us",
    "algbw_gbps",
    "busbw_gbps",
    "wrong",
    "backend",
    "count",
    "dtype",
    "spread_pct",
)
_INT = ("bytes", "ranks", "wrong", "count", "run", "inplace_wrong")
_FLOAT = (
    "time_us",
    "algbw_gbps",
    "busbw_gbps",
    "spread_pct",
    "inplace_time_us",
    "inplace_algbw_gbps",
    "inplace_busbw_gbps",
    "max_error",
    "inplace_max_error",
)
# nccl-tests' redop/root columns per op (what all_reduce_perf & co print for a float sum run)
_REDOP = {"all_reduce": "sum", "reduce_scatter": "sum", "reduce": "sum"}
_ROOT = {"broadcast": "0", "reduce": "0"}


def typed(row: dict) -> dict:
    out = dict(row)
    for k in _INT:
        if out.get(k) not in (None, ""):
            out[k] = int(float(out[k]))
    for k in _FLOAT:
        if out.get(k) not in (None, ""):
            out[k] = float(out[k])
        elif k == "spread_pct":
            out[k] = 0.0
    return out


def read_csv(path: str) -> list[dict]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise NcclTuningError(f"results file {path}: cannot read it ({e.strerror})") from None
    missing = [
        c for c in ("op", "bytes", "ranks", "time_us", "busbw_gbps") if rows and c not in rows[0]
    ]
    if missing:
        raise NcclTuningError(f"results file {path}: missing column(s) {', '.join(missing)}")
    return [typed(r) for r in rows]


def write_csv(path: str, rows: list[dict], columns=COLUMNS) -> None:
    """Write rows; refuses to overwrite an existing file (results are never replaced)."""
    if os.path.exists(path):
        raise NcclTuningError(f"{path} exists; results are never overwritten (choose another path)")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "x", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})


def format_table(rows: list[dict], title: str = "") -> str:
    """nccl-tests' column layout (out-of-place only), one block per op, with its Avg bus
    bandwidth."""
    lines = [f"# {title}"] if title else []
    ops = list(dict.fromkeys(r["op"] for r in rows))
    for op in ops:
        block = [r for r in rows if r["op"] == op]
        first = block[0]
        ranks = "ranks unknown" if first["ranks"] in (None, "") else f"{first['ranks']} ranks"
        lines += [
            "#",
            f"# {op}  ({first.get('backend') or '?'}, {ranks})",
            f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>7} "
            f"{_time_label(block):>8} {'algbw':>7} {'busbw':>7} {_wrong_label(block):>6}",
            f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>7} "
            f"{'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}",
        ]
        for r in block:
            count = r.get("count") if r.get("count") not in (None, "") else r["bytes"] // 4
            lines.append(
                f"{r['bytes']:>12} {count:>13} {_dtype(r):>9} {_cell(r, 'redop', _REDOP):>7} "
                f"{_cell(r, 'root', _ROOT):>7} {r['time_us']:>8.2f} {r['algbw_gbps']:>7.2f} "
                f"{r['busbw_gbps']:>7.2f} {_wrong(r):>6}"
            )
        lines.append(f"# Avg bus bandwidth    : {avg_busbw(block):.6g}")
    lines.append(f"# Out of bounds values : {out_of_bounds(rows)}")
    return "\n".join(lines) + "\n"


def avg_busbw(rows) -> float:
    """As nccl-tests' footer (src/common.cu v2.13.3:538-539, 995): the mean busbw over every
    timed result, out-of-place and in-place (rows from an import carry inplace_busbw_gbps)."""
    vals = [
        v
        for r in rows
        for v in (r["busbw_gbps"], r.get("inplace_busbw_gbps"))
        if v not in (None, "")
    ]
    return sum(vals) / len(vals) if vals else 0.0


def out_of_bounds(rows) -> str:
    """'0 OK', 'N WRONG (out-of-place A, in-place B)' -- nccl-tests checks both placements and
    counts a failed check of either (v2.13.3 src/common.cu:260, called for in_place 0 and 1 at
    :578-579) --, 'N/A (not checked)' when no row was checked (nccl-tests -c 0), or, for old
    nccl-tests whose `error` column is the largest deviation and not a count, that maximum."""
    counts = [
        [int(r[k]) for r in rows if r.get(k) not in (None, "")] for k in ("wrong", "inplace_wrong")
    ]
    errs = [
        e
        for r in rows
        for e in (r.get("max_error"), r.get("inplace_max_error"))
        if e not in (None, "")
    ]
    if not any(counts) and errs:
        return f"N/A (an 'error' column: the largest deviation, max {max(errs):g}, not a count)"
    if not any(counts):
        return "N/A (not checked)"
    oop, inplace = sum(counts[0]), sum(counts[1])
    if oop + inplace == 0:
        return "0 OK"
    return f"{oop + inplace} WRONG (out-of-place {oop}, in-place {inplace})"


def _wrong(r: dict) -> str:
    if r.get("wrong") in (None, "") and r.get("max_error") not in (None, ""):
        return f"{r['max_error']:.0e}"
    return "N/A" if r.get("wrong") in (None, "") else str(r["wrong"])


def _wrong_label(rows) -> str:
    return "error" if any(r.get("max_error") not in (None, "") for r in rows) else "#wrong"


def _cell(r: dict, key: str, default: dict) -> str:
    """The file's redop/root where the row has them ('-' where its layout had none), else the
    bench's values for a float sum run."""
    if key in r:
        return str(r[key]) or "-"
    return default.get(r["op"], "none" if key == "redop" else "-1")


def _time_label(rows) -> str:
    return "cputime" if rows and all(r.get("time_kind") == "cputime" for r in rows) else "time"


def _dtype(r: dict) -> str:
    d = r.get("dtype") or "float32"
    return "float" if d == "float32" else d
