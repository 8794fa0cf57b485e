"""Parsers for what admins already have: nccl-tests text output (all_reduce_perf & co) and
NCCL_DEBUG=INFO logs. Torch-free.

nccl-tests: the table is read by its header line (`#  size  count  type  redop  root  time  algbw
busbw  #wrong  time ...`), so old layouts (`error` instead of `#wrong`, no `root`) parse too. The
first time/algbw/busbw group is out-of-place (the row's values); the second, in-place, is kept as
inplace_* keys. `N/A` cells become None. The collective comes from the binary name in the text
(`all_reduce_perf`) or the file name, else must be given.

NCCL INFO: version, network, channel counts, per-call algorithm/protocol choices (the TUNING lines
`AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE ...`, old form `Algo 1 proto 2 time 12.3`),
and the lines that show NCCL refused a setting (`Unrecognized element token`, `No algorithm/protocol
available`).
"""
from __future__ import annotations

import os
import re

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
_RANK_RE = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group|Pid)\b", re.MULTILINE)
_THREADS_RE = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")


def detect_op(text: str, filename: str = "") -> str | None:
    m = _BIN_RE.search(text) or _BIN_RE.search(os.path.basename(filename))
    return BINARIES[m.group(1)] if m else None


def _header(lines):
    for i, line in enumerate(lines):
        words = line.lstrip("#").split()
        if line.startswith("#") and words[:2] == ["size", "count"] and "busbw" in words:
            return i, words
    return None, None


def _num(tok):
    return None if tok in ("N/A", "n/a", "-") else tok


def parse(text: str, op: str | None = None, filename: str = "") -> list[dict]:
    """nccl-tests output text -> rows (results.COLUMNS keys, backend 'nccl-tests')."""
    op = op or detect_op(text, filename)
    if not op:
        raise NcclTuningError(f"{filename or 'input'}: cannot tell which collective this is (no "
                              f"<name>_perf in the text or file name); accepted binaries: "
                              f"{', '.join(b + '_perf' for b in BINARIES)}")
    lines = text.splitlines()
    start, cols = _header(lines)
    if start is None:
        raise NcclTuningError(f"{filename or 'input'}: no nccl-tests table header "
                              f"('#  size  count  type ... busbw') found")
    ranks = len(set(_RANK_RE.findall(text)))
    if not ranks:
        t = _THREADS_RE.search(text)
        ranks = int(t.group(1)) * int(t.group(2)) if t else 0
    # column positions: first and second occurrence of the timed group
    pos = {}
    for i, c in enumerate(cols):
        key = c if c not in pos else "inplace_" + c
        pos.setdefault(key, i)
    wrong_col = "#wrong" if "#wrong" in pos else "error"
    rows = []
    for line in lines[start + 1:]:
        s = line.strip()
        if not s or s.startswith("#"):
            if rows and s.startswith("# Avg bus bandwidth"):
                break
            continue
        tok = s.split()
        if not tok[0].isdigit() or len(tok) < pos["busbw"] + 1:
            continue
        get = lambda k: _num(tok[pos[k]]) if k in pos and pos[k] < len(tok) else None
        w = get(wrong_col)
        if w is not None and wrong_col == "error":
            w = 0 if float(w) == 0 else 1
        row = {"op": op, "bytes": int(tok[0]), "ranks": ranks, "time_us": get("time"),
               "algbw_gbps": get("algbw"), "busbw_gbps": get("busbw"),
               "wrong": "" if w is None else int(w), "backend": "nccl-tests",
               "count": int(tok[1]), "dtype": DTYPES.get(get("type") or "", get("type")),
               "spread_pct": 0.0}
        row = R.typed(row)
        for k in ("time", "algbw", "busbw"):
            v = get("inplace_" + k)
            row["inplace_" + k] = float(v) if v is not None else None
        rows.append(row)
    if not rows:
        raise NcclTuningError(f"{filename or 'input'}: the nccl-tests table has no data rows")
    return rows


def parse_file(path: str, op: str | None = None) -> list[dict]:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise NcclTuningError(f"{path}: cannot read it ({e.strerror})") from None
    return parse(text, op, path)


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
