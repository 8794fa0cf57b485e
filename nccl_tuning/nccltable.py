"""One nccl-tests table (Run: its rows, row errors, footer and notes) and how one data row's cells
become a row of results (CSV_COLUMNS): the columns as the file prints them, out-of-place then
in-place (inplace_*), `cputime` for `time` (`-C 1`), the old `error` column kept as max_error, `N/A`
cells as None, an empty redop re-inserted. nccltests reads the text and finds the tables; the format
is described there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from . import results as R

CSV_COLUMNS = (
    "run",
    *R.COLUMNS,
    "redop",
    "root",
    "inplace_time_us",
    "inplace_algbw_gbps",
    "inplace_busbw_gbps",
    "inplace_wrong",
    "max_error",
    "inplace_max_error",
    "time_kind",
)
NUM_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_TIMED = (("time", "time_us"), ("algbw", "algbw_gbps"), ("busbw", "busbw_gbps"))


@dataclass
class Run:
    """One table of an nccl-tests output."""

    index: int
    cols: list
    line: int  # line number of the header (1-based)
    op: str = ""
    rows: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # one line each: 'FILE line N: ...'
    printed_avg: float | None = None  # the file's '# Avg bus bandwidth' value
    printed_oob: str | None = None  # the file's '# Out of bounds values' text
    ranks: int | None = None  # None: no '#  Rank N' lines
    sizes: int | None = None  # sizes in the banner's range (None: no banner)
    elided: list = field(default_factory=list)  # lines where the paste says '...' (rows left out)
    failures: list = field(default_factory=list)  # 'FILE line N: <the failure nccl-tests printed>'
    # 'FILE line N: <an NCCL WARN line>', each message once
    warnings: list = field(default_factory=list)
    nccl_version: str | None = None  # from the banner's nccl-library=CODE

    @property
    def checked(self) -> bool:
        """False when no row's out-of-place #wrong was checked (nccl-tests -c 0 prints N/A)."""
        return any(r["wrong"] != "" for r in self.rows)

    @property
    def avg_busbw(self) -> float | None:
        """nccl-tests' footer: the mean busbw over out-of-place and in-place results."""
        return R.avg_busbw(self.rows) if self.rows else None

    def notes(self) -> list[str]:
        """One line each: what the paste does not say, or where the file's footer differs."""
        out = []
        if self.ranks is None:
            out.append(
                f"run {self.index}: ranks unknown (no '#  Rank N' lines before the table "
                f"at line {self.line}); the ranks column is left empty"
            )
        if self.elided:
            out.append(
                f"run {self.index}: rows were left out of the paste at line(s) "
                f"{', '.join(map(str, self.elided))} ('...'); the table is not whole"
            )
        if self.footer_differs():
            out.append(
                f"run {self.index}: the file's average bus bandwidth {self.printed_avg:g} "
                f"is over rows not all here: {self._missing()}"
            )
        return out

    def footer_differs(self) -> bool:
        """Beyond the rows' 2-decimal rounding and the footer's 6 digits (%g)."""
        if self.printed_avg is None or self.avg_busbw is None:
            return False
        return not math.isclose(
            self.avg_busbw, self.printed_avg, abs_tol=0.005 + 1e-5 * abs(self.printed_avg)
        )

    def _missing(self) -> str:
        sizes = f"the banner's size range holds {self.sizes} size(s), " if self.sizes else ""
        lost = f", {len(self.errors)} could not be read" if self.errors else ""
        cut = (
            f", rows left out at line(s) {', '.join(map(str, self.elided))}" if self.elided else ""
        )
        return (
            f"{sizes}{len(self.rows)} row(s) were read{lost}{cut} (sizes cut from the paste "
            f"or unreadable)"
        )


def _num(tok):
    return None if tok in ("N/A", "n/a", "-", "") else tok


def _positions(cols) -> dict:
    pos = {}
    for i, c in enumerate(cols):
        c = {"cputime": "time", "error": "#wrong"}.get(c, c)
        key = c if c not in pos else "inplace_" + c
        pos.setdefault(key, i)
    return pos


def read_row(run: Run, tok: list, name: str, n: int, text: str) -> None:
    """One data row's words (tok, line n of file name) -> a row of run.rows, or one line in
    run.errors."""
    cols = run.cols
    if "redop" in cols and len(tok) == len(cols) - 1:
        ri = cols.index("redop")
        if ri < len(tok) and NUM_RE.match(tok[ri]):
            tok = tok[:ri] + [""] + tok[ri:]  # empty redop (old alltoall & co)
    where = f"{name} line {n}: the {tok[0]}-byte row"
    if len(tok) != len(cols):
        more = "less" if len(tok) < len(cols) else "more"
        run.errors.append(
            f"{where} has {len(tok)} fields, {more} than the header's {len(cols)} "
            f"(the test stopped, or other output was printed into the row): "
            f"{text[:80]!r}"
        )
        return
    pos = _positions(cols)
    get = lambda k: _num(tok[pos[k]]) if k in pos else None
    for k in (
        "count",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        *(f"inplace_{t}" for t in ("time", "algbw", "busbw", "#wrong")),
    ):
        if (v := get(k)) is not None and not NUM_RE.match(v):
            run.errors.append(f"{where}: {k} is {v!r}, not a number: {text[:80]!r}")
            return
    if get("time") is None or get("busbw") is None:
        run.errors.append(f"{where} has no time or busbw value: {text[:80]!r}")
        return
    run.rows.append(_typed_row(run, get, "error" in cols, int(tok[0])))


def _typed_row(run: Run, get, old_error: bool, nbytes: int) -> dict:
    f = lambda v: None if v is None else float(v)
    w, iw = get("#wrong"), get("inplace_#wrong")
    row = R.typed(
        {
            "op": run.op,
            "bytes": nbytes,
            "ranks": "" if run.ranks is None else run.ranks,
            "time_us": get("time"),
            "algbw_gbps": get("algbw"),
            "busbw_gbps": get("busbw"),
            "backend": "nccl-tests",
            "wrong": "" if w is None or old_error else int(float(w)),
            "count": int(float(get("count") or 0)),
            "dtype": get("type") or "",
            "spread_pct": 0.0,
        }
    )
    row.update(
        run=run.index,
        redop=get("redop") or "",
        root=get("root") or "",
        time_kind="cputime" if "cputime" in run.cols else "time",
        inplace_wrong=None if iw is None or old_error else int(float(iw)),
        max_error=f(w) if old_error else None,
        inplace_max_error=f(iw) if old_error else None,
    )
    for k, key in _TIMED:
        row[f"inplace_{key}"] = f(get("inplace_" + k))
    return row
