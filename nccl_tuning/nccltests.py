"""Reads nccl-tests text output (all_reduce_perf & co) as people paste it. Torch-free.

Format: nccl-tests src/common.cu (v2.13.3, v2.19.6 src/util.cu) and the per-test headers of old
versions (v2.11.0 src/*.cu). A table is found by its header line (`size  count  type  redop  root
time  algbw  busbw  #wrong ...`, with or without the leading '#'; old layouts with `error` and no
`root`, no `redop` in all_gather/sendrecv, `root` without `redop` in broadcast). Launcher and log
collector prefixes (PREFIXES) are stripped, stacked ones too, and rows pasted as a markdown table
are read cell by cell; a header behind any other prefix is refused with one line naming it. Every
table is one run (`run` = 1, 2, ...), labelled with the
collective the text names last before it (`# Collective test starting: X_perf`, a command line),
else --op, else the file name; `Collective test concluded` names the table above it. Several
`# nThread` banners before one table (one nccl-tests per process, no MPI) are refused.

Columns, kept as the file prints them: the first time/algbw/busbw/#wrong group is out-of-place,
the second in-place (inplace_* keys, in the CSV too); `-C 1` prints `cputime` for `time`; `type`,
`redop` and `root` are the file's words (a column the layout lacks stays empty). `#wrong` is a count
of wrong elements (v2.13.3 src/common.cu:533); the old `error` column is the largest deviation
found (v2.11.0 src/common.cu:737, `%5.0le` of maxDelta), not a count: it is kept as max_error and
the row's `wrong` stays empty. `N/A` cells are None. Old alltoall & co print an empty redop: the
cell is re-inserted. A row that is cut, mixed with other output, or a piece of a row between log
lines is one error line naming the file and line, never a traceback and never dropped silently.

A failure nccl-tests prints (`Test NCCL failure`, `Test CUDA failure`, `Test timeout`, the old `NCCL
failure FILE:LINE`: infolog.failure) is named in one line: a file whose test failed before any table
is refused with that failure, never 'no table header'; after a table it is kept with the run
(Run.failures). NCCL WARN lines are kept too (Run.warnings), and the banner's `nccl-library=CODE`
(nccl-tests 2.18+, src/util.cu:623) gives Run.nccl_version.

Ranks come from the `#  Rank N` lines (highest + 1); without them they are unknown (empty), said
in a note. The average bus bandwidth is nccl-tests' (v2.13.3 src/common.cu:538-539, 995: mean
over out-of-place and in-place); where the file's own footer differs beyond the 2-decimal rounding
of the rows, a note says which rows are missing (the banner's size range, src/common.cu:573).
"""

from __future__ import annotations

import os
import re

from .errors import NcclTuningError
from .infolog import ALGOS, PROTOS, failure, nccl_version, parse_info_log, summarize_choices  # noqa: F401 (public API)
from .nccltable import NUM_RE, Run, read_row

BINARIES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "sendrecv",
    "gather": "gather",
    "scatter": "scatter",
    "hypercube": "hypercube",
}
_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)"  # RFC 3339
# what launchers and log collectors put before each line (stripped, stacked ones too)
PREFIXES = (
    ("mpirun --tag-output", r"\[\d+,\d+\]<(?:stdout|stderr)>:"),
    ("mpiexec -prepend-rank", r"\[\d+\] "),
    ("srun --label", r" *\d+: "),
    ("kubectl logs --timestamps", _TS + " "),
    ("AWS console log table", r"\| " + _TS + r" \| "),
    ("[date time] stamp", r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\] "),
    ("markdown-escaped '#'", r"\\(?=#)"),
)
_BIN_RE = re.compile(
    r"(?<![A-Za-z0-9])("
    + "|".join(sorted(BINARIES, key=len, reverse=True))
    + r")_perf(?![A-Za-z0-9])"
)
_PREFIX_RE = re.compile("|".join(p for _, p in PREFIXES))
_HEADER_RE = re.compile(r"#?\s*size\s+count\s+type\s")
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group|Pid|on)\b")
_BANNER_RE = re.compile(
    r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)"
    r"\s+step:\s+(\d+)\((factor|bytes)\)"
)
_REDUCED_RE = re.compile(r"Reducing maxBytes to (\d+)")
_LIBRARY_RE = re.compile(r"nccl-library=(\d+)")
_WARN_RE = re.compile(r"\bNCCL WARN (.+?)\s*$")
_ELLIPSIS_RE = re.compile(r"^(?:\.{3,}|\u2026)$")


def detect_op(text: str, filename: str = "") -> str | None:
    m = _BIN_RE.search(text) or _BIN_RE.search(os.path.basename(filename))
    return BINARIES[m.group(1)] if m else None


def strip_prefix(raw: str) -> str:
    """The line without the PREFIXES before it (and the indentation a paste adds before them)."""
    s = raw.lstrip()
    for _ in range(len(PREFIXES)):
        m = _PREFIX_RE.match(s)
        if not m or not m.end():
            break
        s = s[m.end() :]
    return s


def _cells(s: str) -> str:
    """A row pasted as a markdown table ('1024 | 512 | half | sum | ...') -> its cells, spaced."""
    return " ".join(c.strip() for c in s.strip("|").split("|")) if s.count("|") >= 4 else s


def _is_header(words) -> bool:
    return words[:2] == ["size", "count"] and "busbw" in words


def _sizes(m) -> int:
    """How many sizes nccl-tests times from minBytes to maxBytes (v2.13.3 src/common.cu:573)."""
    lo, hi, step, kind = int(m[0]), int(m[1]), int(m[2]), m[3]
    if kind == "bytes":
        return (hi - lo) // step + 1 if step > 0 and hi >= lo else 0
    n, size = 0, max(lo, 1)
    while size <= hi and step > 1:
        n, size = n + 1, size * step
    return n


class _Reader:
    """Line by line: banners, Rank lines, headers, rows, footers; state of the open table."""

    def __init__(self, name: str, op: str | None, filename: str):
        self.name, self.op = name, op
        self.file_op = detect_op("", filename)
        self.runs: list[Run] = []
        self.banners, self.ranks, self.dup, self.range = 0, set(), False, None
        self.named, self.open = None, False
        self.failures, self.warnings, self.library, self.warned = [], [], None, set()

    def line(self, n: int, raw: str) -> None:
        s = _cells(strip_prefix(raw).strip())
        words = s.lstrip("#").split()
        if _is_header(words):
            return self.header(n, words)
        if self.said(n, s):
            return
        if (m := _HEADER_RE.search(raw)) and not _HEADER_RE.match(s):
            known = ", ".join(k for k, _ in PREFIXES)
            raise NcclTuningError(
                f"{self.name} line {n}: the table header comes after "
                f"{raw[: m.start()]!r}, a line prefix not known here (known: "
                f"{known}); refused: strip it, then import"
            )
        self.names(s)
        if words[:1] == ["nThread"]:
            self.banners += 1
            b = _BANNER_RE.search(s)
            self.range = [*b.groups()[2:]] if b else None
        elif (r := _REDUCED_RE.search(s)) and self.range:
            self.range[1] = r.group(1)
        elif m := (_RANK_RE.match(s.lstrip("#").strip()) if "Rank" in s else None):
            self.dup |= int(m.group(1)) in self.ranks
            self.ranks.add(int(m.group(1)))
        elif self.runs and words:
            self.table_line(n, s, words)

    def said(self, n: int, s: str) -> bool:
        """A failure, an NCCL WARN line (each message once) or the banner's library code: kept with
        the open run (before any table: with the first)."""
        where = self.runs[-1] if self.runs else self
        if f := failure(s):
            where.failures.append(f"{self.name} line {n}: {f}")
        elif (m := _WARN_RE.search(s)) and m.group(1) not in self.warned:
            self.warned.add(m.group(1))
            where.warnings.append(f"{self.name} line {n}: {s.strip()}")
        elif m := _LIBRARY_RE.search(s):
            self.library = nccl_version(int(m.group(1)))
        else:
            return False
        return not NUM_RE.match(words[0]) if (words := s.split()) else True

    def names(self, s: str) -> None:
        m = _BIN_RE.search(s)
        if m and "test concluded" not in s:
            self.named = BINARIES[m.group(1)]

    def header(self, n: int, words: list) -> None:
        if self.banners > 1 or self.dup:
            raise NcclTuningError(
                f"{self.name} line {n}: {max(self.banners, 2)} runs printed into one file at the "
                f"same time ({self.banners} '# nThread' banners, rank numbers repeated before one "
                f"table): nccl-tests was started once per process without MPI; refused, their rows "
                f"cannot be told apart (import one log per process, or build nccl-tests with MPI=1)"
            )
        op = self.named or self.op or self.file_op
        if not op:
            raise NcclTuningError(
                f"{self.name}: cannot tell which collective the table at line "
                f"{n} is (no <name>_perf in the text before it or in the file "
                f"name); give --op; accepted binaries: "
                f"{', '.join(b + '_perf' for b in BINARIES)}"
            )
        first = not self.runs
        self.runs.append(
            Run(
                len(self.runs) + 1,
                words,
                n,
                op,
                ranks=max(self.ranks) + 1 if self.ranks else None,
                sizes=_sizes(self.range) if self.range else None,
                nccl_version=self.library,
            )
        )
        if first:  # what the file said before its first table
            self.runs[0].failures, self.runs[0].warnings = self.failures, self.warnings
        self.banners, self.ranks, self.dup, self.range = 0, set(), False, None
        self.named, self.open = None, True

    def table_line(self, n: int, s: str, words: list) -> None:
        run, text = self.runs[-1], s.lstrip("#").strip()
        if text.startswith(("Out of bounds values", "Avg bus bandwidth")):
            val = text.split(":", 1)[1].split() if ":" in text else []
            if text.startswith("Out"):
                run.printed_oob = " ".join(val) or None
            else:
                run.printed_avg = float(val[0]) if val and NUM_RE.match(val[0]) else None
                self.open = False
        elif self.open and _ELLIPSIS_RE.match(text):
            run.elided.append(n)
        elif s.startswith("#") or not self.open or not NUM_RE.match(words[0]):
            return
        elif words[0].isdigit():
            read_row(run, words, self.name, n, s)
        else:
            run.errors.append(
                f"{self.name} line {n}: a piece of a row between other output (the "
                f"row was split by log lines; its values are not read): {s[:80]!r}"
            )


def parse_runs(text: str, op: str | None = None, filename: str = "") -> list[Run]:
    """Every table of an nccl-tests output, with per-row errors; NcclTuningError (one line) when
    the file holds no table, a table no collective name, an unknown line prefix, or runs printed
    on top of each other."""
    reader = _Reader(filename or "input", op, filename)
    for n, raw in enumerate(text.splitlines(), 1):
        reader.line(n, raw)
    if not reader.runs and reader.failures:
        more = (
            f" ({len(reader.failures) - 1} more failure line(s))"
            if len(reader.failures) > 1
            else ""
        )
        raise NcclTuningError(
            f"no nccl-tests table to read: the test failed: {reader.failures[0]}{more}"
        )
    if not reader.runs:
        raise NcclTuningError(
            f"{filename or 'input'}: no nccl-tests table header ('size  count  "
            f"type ... busbw', with or without '#') found"
        )
    return reader.runs


def parse(text: str, op: str | None = None, filename: str = "") -> list[dict]:
    """nccl-tests output text -> rows of every run (CSV_COLUMNS keys, backend 'nccl-tests'). A
    file with row errors and no good row is refused with the first error."""
    runs = parse_runs(text, op, filename)
    rows = [r for run in runs for r in run.rows]
    if not rows:
        errors = [e for run in runs for e in run.errors]
        why = f": {errors[0]}" if errors else ""
        raise NcclTuningError(
            f"{filename or 'input'}: the nccl-tests table has no complete data row{why}"
        )
    return rows


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError as e:
        raise NcclTuningError(f"{path}: cannot read it ({e.strerror})") from None


def parse_file(path: str, op: str | None = None) -> list[dict]:
    return parse(_read(path), op, path)


def parse_runs_file(path: str, op: str | None = None) -> list[Run]:
    return parse_runs(_read(path), op, path)
