"""Reads NCCL_DEBUG=INFO logs (`launch nccl infolog`): version, network, channel counts, per-call
algorithm/protocol choices, and the lines that show NCCL refused a setting. Torch-free.

Forms read, as NCCL prints them (cited from the code read at each tag):
- the version: `NCCL version 2.21.5+cuda12.4`, printed bare to stdout at every debug level from
  VERSION up (nccl-2.21.5/src/init.cc:476; VERSION/WARN levels print it bare, INFO as an INFO line,
  nccl-2.22.3/src/init.cc:495-497); only a line that ends with the version counts (WARNs that name
  a compiled-with version do not);
- the network: `Using network <name>`, the whole name (`AWS Libfabric` has a space;
  nccl-2.21.5/src/init.cc:322 prints the plugin's name as is);
- choices: `AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..15}`
  (nccl-2.27.7/src/enqueue.cc:745), `AllReduce: 4096 Bytes -> Algo 0 proto 0 time 12.5`
  (nccl-2.23.4/src/enqueue.cc:1855), and without the collective's name, `8 Bytes -> Algo 0 proto 0
  time 25.2` (nccl-2.20.5/src/enqueue.cc:1498 to nccl-2.22.3/src/enqueue.cc:1613): these keep
  collective None, never a guessed name. Numbered algorithms/protocols are named by ALGOS/PROTOS.
"""
from __future__ import annotations

import re

ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOS = ("LL", "LL128", "SIMPLE")
_VERSION_RE = re.compile(r"(?:^|\s)NCCL version (\d+\.\d+\.\d+)\S*\s*$")
_NET_RE = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_CHAN_RE = re.compile(r"NCCL INFO Channel (\d+)/(\d+) :")
_COUNTS_RE = re.compile(r"NCCL INFO (\d+) coll channels, .*?(\d+) p2p channels")
_CHOICE_RE = re.compile(r"NCCL INFO (?:(\w+): )?(\d+) Bytes -> Algo (\w+) proto (\w+)"
                        r"(?: time ([\d.]+))?(?:.*?channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?")
_REFUSED_RE = re.compile(r"Unrecognized (?:element|prefix) token|No algorithm/protocol available",
                         re.IGNORECASE)
UNNAMED = "(unnamed)"


def _name(tok: str, names) -> str:
    return names[int(tok)] if tok.isdigit() and int(tok) < len(names) else tok.upper()


def parse_info_log(text: str) -> dict:
    """-> {version, network, channels, coll_channels, p2p_channels, choices: [{collective (None
    when the line names none), bytes, algo, proto, channels}], refusals: [line]}; missing facts
    are None / empty."""
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
    """Collapse per-call choices into {collective, algo, proto, min_bytes, max_bytes, calls};
    choices whose line names no collective are grouped as UNNAMED."""
    groups = {}
    for c in choices:
        key = (c["collective"] or UNNAMED, c["algo"], c["proto"])
        g = groups.setdefault(key, {"collective": key[0], "algo": key[1], "proto": key[2],
                                    "min_bytes": c["bytes"], "max_bytes": c["bytes"], "calls": 0})
        g["min_bytes"], g["max_bytes"] = min(g["min_bytes"], c["bytes"]), max(g["max_bytes"], c["bytes"])
        g["calls"] += 1
    return sorted(groups.values(), key=lambda g: (g["collective"], g["min_bytes"]))
