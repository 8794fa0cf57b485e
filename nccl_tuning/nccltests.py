"""Parsers for what admins already have: nccl-tests text output (all_reduce_perf & co) and
NCCL_DEBUG=INFO logs. Torch-free.

nccl-tests (format: nccl-tests src/common.cu, v2.13.3 and v2.19.6 in ../shared/reference): a table
is found by its header line (`size  count  type  redop  root  time  algbw  busbw  #wrong  time ...`,
with or without the leading '#', old layouts with `error` and no `root` too); lines may carry an
mpirun --tag-output prefix (`[1,0]<stdout>:`), an mpiexec -prepend-rank prefix (`[0] `) or
an srun --label prefix (`0: `). Every table in a
file is one run (rows get `run` = 1, 2, ...); several `# nThread` banners before one table mean
processes printing at the same time (nccl-tests started once per process without MPI): refused.
The first time/algbw/busbw group is out-of-place (the row's values); the second, in-place, is kept
as inplace_* keys. `-C 1` prints `cputime` for `time` (kept in time_us, time_kind 'cputime').
`N/A` cells become None (`#wrong` N/A: nothing was checked, `-c 0`). Old alltoall/all_gather/
broadcast tables print an empty redop (nccl-tests v2.13.3 src/alltoall.cu), so their rows have one
field less than the header: the redop cell is re-inserted. A row that is cut or mixed with other
output is a per-row error naming the line, never a traceback. The average bus bandwidth is computed
as nccl-tests does (v2.13.3 src/common.cu:538-539, 995: the mean over out-of-place AND in-place).
The collective comes from the binary name in the text (`all_reduce_perf`) or the file name, else
must be given.

NCCL INFO: version, network, channel counts, per-call algorithm/protocol choices (the TUNING lines
`AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE ...`, old form `Algo 1 proto 2 time 12.3`),
and the lines that show NCCL refused a setting (`Unrecognized element token`, `No algorithm/protocol
available`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from . import results as R
from .errors import NcclTuningError

BINARIES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
            "alltoall": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
            "sendrecv": "sendrecv", "gather": "gather", "scatter": "scatter",
            "hypercube": "hypercube"}
DTYPES = {"float": "float32", "half": "float16", "double": "float64", "bfloat16": "bfloat16",
          "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
          "int64": "int64", "uint64": "uint64", "int": "int32"}
_BIN_RE = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(sorted(BINARIES, key=len, reverse=True))
                     + r")_perf(?![A-Za-z0-9])")
_TAG_RE = re.compile(r"^(?:\[\d+,\d+\]<(?:stdout|stderr)>:|\[\d+\] |\d+: )")
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group|Pid|on)\b")
_THREADS_RE = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_NUM_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_TIMED = ("time", "algbw", "busbw")


@dataclass
class Run:
    """One table of an nccl-tests output."""
    index: int
    cols: list
    line: int                                       # line number of the header (1-based)
    rows: list = field(default_factory=list)
    errors: list = field(default_factory=list)      # one line each: 'FILE line N: ...'
    printed_avg: float | None = None                # the file's '# Avg bus bandwidth' value
    ranks: int = 0

    @property
    def checked(self) -> bool:
        """False when no row's out-of-place #wrong was checked (nccl-tests -c 0 prints N/A)."""
        return any(r["wrong"] != "" for r in self.rows)

    @property
    def avg_busbw(self) -> float | None:
        """nccl-tests' footer: the mean busbw over out-of-place and in-place results."""
        vals = [v for r in self.rows for v in (r["busbw_gbps"], r.get("inplace_busbw"))
                if v is not None]
        return sum(vals) / len(vals) if vals else None


def detect_op(text: str, filename: str = "") -> str | None:
    m = _BIN_RE.search(text) or _BIN_RE.search(os.path.basename(filename))
    return BINARIES[m.group(1)] if m else None


def _is_header(words) -> bool:
    return words[:2] == ["size", "count"] and "busbw" in words


def _num(tok):
    return None if tok in ("N/A", "n/a", "-", "") else tok


def _positions(cols) -> dict:
    pos = {}
    for i, c in enumerate(cols):
        c = "time" if c == "cputime" else c
        key = c if c not in pos else "inplace_" + c
        pos.setdefault(key, i)
    return pos


def parse_runs(text: str, op: str | None = None, filename: str = "") -> list[Run]:
    """Every table of an nccl-tests output, with per-row errors; NcclTuningError (one line) when
    the file holds no table, no collective name, or runs printed on top of each other."""
    name = filename or "input"
    op = op or detect_op(text, filename)
    if not op:
        raise NcclTuningError(f"{name}: cannot tell which collective this is (no <name>_perf in "
                              f"the text or file name); accepted binaries: "
                              f"{', '.join(b + '_perf' for b in BINARIES)}")
    runs: list[Run] = []
    banners, ranks, dup_ranks, threads = 0, set(), False, 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = _TAG_RE.sub("", raw, count=1)
        s = line.strip()
        words = s.lstrip("#").split()
        if _is_header(words):
            if banners > 1 or dup_ranks:
                raise NcclTuningError(
                    f"{name} line {n}: {max(banners, 2)} runs printed into one file at the same "
                    f"time ({banners} '# nThread' banners, rank numbers repeated before one "
                    f"table): nccl-tests was started once per process without MPI; refused, "
                    f"their rows cannot be told apart (import one log per process, or build "
                    f"nccl-tests with MPI=1)")
            total = (max(ranks) + 1) if ranks else threads
            runs.append(Run(len(runs) + 1, words, n, ranks=total))
            banners, ranks, dup_ranks = 0, set(), False
            continue
        if words[:1] == ["nThread"]:
            banners += 1
            t = _THREADS_RE.search(s)
            threads = int(t.group(1)) * int(t.group(2)) if t else 0
            continue
        m = _RANK_RE.match(s.lstrip("#").strip()) if "Rank" in s else None
        if m:
            dup_ranks |= int(m.group(1)) in ranks
            ranks.add(int(m.group(1)))
            continue
        if not runs or not words:
            continue
        run = runs[-1]
        if s.lstrip("#").strip().startswith("Avg bus bandwidth"):
            val = s.split(":", 1)[1].split()
            run.printed_avg = float(val[0]) if val and _NUM_RE.match(val[0]) else None
        elif words[0].isdigit() and not s.startswith("#"):
            _row(run, words, op, name, n, s)
    if not runs:
        raise NcclTuningError(f"{name}: no nccl-tests table header ('size  count  type ... "
                              f"busbw', with or without '#') found")
    return runs


def _row(run: Run, tok: list, op: str, name: str, n: int, text: str) -> None:
    cols = run.cols
    if "redop" in cols and len(tok) == len(cols) - 1:
        ri = cols.index("redop")
        if ri < len(tok) and _NUM_RE.match(tok[ri]):
            tok = tok[:ri] + [""] + tok[ri:]          # empty redop (old alltoall & co)
    where = f"{name} line {n}: the {tok[0]}-byte row"
    if len(tok) != len(cols):
        more = "less" if len(tok) < len(cols) else "more"
        run.errors.append(f"{where} has {len(tok)} fields, {more} than the header's {len(cols)} "
                          f"(the test stopped, or other output was printed into the row): "
                          f"{text[:80]!r}")
        return
    pos = _positions(cols)
    get = lambda k: _num(tok[pos[k]]) if k in pos else None
    for k in ("count", *_TIMED, *("inplace_" + t for t in _TIMED)):
        v = get(k)
        if v is not None and not _NUM_RE.match(v):
            run.errors.append(f"{where}: {k} is {v!r}, not a number: {text[:80]!r}")
            return
    wrong_col = "#wrong" if "#wrong" in pos else "error"
    w = get(wrong_col)
    if w is not None and not _NUM_RE.match(w):
        run.errors.append(f"{where}: {wrong_col} is {w!r}, not a number: {text[:80]!r}")
        return
    if w is not None:
        w = 0 if float(w) == 0 else (1 if wrong_col == "error" else int(float(w)))
    if get("time") is None or get("busbw") is None:
        run.errors.append(f"{where} has no time or busbw value: {text[:80]!r}")
        return
    row = R.typed({"op": op, "bytes": int(tok[0]), "ranks": run.ranks, "time_us": get("time"),
                   "algbw_gbps": get("algbw"), "busbw_gbps": get("busbw"),
                   "wrong": "" if w is None else w, "backend": "nccl-tests",
                   "count": int(float(get("count") or 0)),
                   "dtype": DTYPES.get(get("type") or "", get("type")), "spread_pct": 0.0})
    row["run"] = run.index
    row["time_kind"] = "cputime" if "cputime" in cols else "time"
    for k in _TIMED:
        v = get("inplace_" + k)
        row["inplace_" + k] = float(v) if v is not None else None
    run.rows.append(row)


def parse(text: str, op: str | None = None, filename: str = "") -> list[dict]:
    """nccl-tests output text -> rows of every run (results.COLUMNS keys + run, backend
    'nccl-tests'). A file with row errors and no good row is refused with the first error."""
    runs = parse_runs(text, op, filename)
    rows = [r for run in runs for r in run.rows]
    if not rows:
        errors = [e for run in runs for e in run.errors]
        why = f": {errors[0]}" if errors else ""
        raise NcclTuningError(f"{filename or 'input'}: the nccl-tests table has no complete data "
                              f"row{why}")
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


# ---- NCCL_DEBUG=INFO logs ------------------------------------------------------------------

ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOS = ("LL", "LL128", "SIMPLE")
_VERSION_RE = re.compile(r"NCCL INFO NCCL version (\d+\.\d+\.\d+)")
_NET_RE = re.compile(r"NCCL INFO Using network (\S+)")
_CHAN_RE = re.compile(r"NCCL INFO Channel (\d+)/(\d+) :")
_COUNTS_RE = re.compile(r"NCCL INFO (\d+) coll channels, .*?(\d+) p2p channels")
_CHOICE_RE = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)"
                        r"(?: time ([\d.]+))?(?:.*?channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?")
_REFUSED_RE = re.compile(r"Unrecognized (?:element|prefix) token|No algorithm/protocol available",
                         re.IGNORECASE)


def _name(tok: str, names) -> str:
    return names[int(tok)] if tok.isdigit() and int(tok) < len(names) else tok.upper()


def parse_info_log(text: str) -> dict:
    """-> {version, network, channels, coll_channels, p2p_channels, choices: [{collective, bytes,
    algo, proto, channels}], refusals: [line]}; missing facts are None / empty."""
    out = {"version": None, "network": None, "channels": None, "coll_channels": None,
           "p2p_channels": None, "choices": [], "refusals": []}
    for line in text.splitlines():
        if out["version"] is None and (m := _VERSION_RE.search(line)):
            out["version"] = m.group(1)
        elif out["network"] is None and (m := _NET_RE.search(line)):
            out["network"] = m.group(1)
        elif m := _CHAN_RE.search(line):
            out["channels"] = max(out["channels"] or 0, int(m.group(2)))
        elif m := _COUNTS_RE.search(line):
            out["coll_channels"], out["p2p_channels"] = int(m.group(1)), int(m.group(2))
        elif m := _CHOICE_RE.search(line):
            coll, nbytes, algo, proto, _, lo, hi = m.groups()
            out["choices"].append({"collective": coll, "bytes": int(nbytes),
                                   "algo": _name(algo, ALGOS), "proto": _name(proto, PROTOS),
                                   "channels": int(hi) - int(lo) + 1 if lo is not None else None})
        if _REFUSED_RE.search(line):
            out["refusals"].append(line.strip())
    return out


def summarize_choices(choices) -> list[dict]:
    """Collapse per-call choices into {collective, algo, proto, min_bytes, max_bytes, calls}."""
    groups = {}
    for c in choices:
        key = (c["collective"], c["algo"], c["proto"])
        g = groups.setdefault(key, {"collective": key[0], "algo": key[1], "proto": key[2],
                                    "min_bytes": c["bytes"], "max_bytes": c["bytes"], "calls": 0})
        g["min_bytes"], g["max_bytes"] = min(g["min_bytes"], c["bytes"]), max(g["max_bytes"], c["bytes"])
        g["calls"] += 1
    return sorted(groups.values(), key=lambda g: (g["collective"], g["min_bytes"]))
