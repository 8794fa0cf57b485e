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
  collective None, never a guessed name. Numbered algorithms/protocols are named by ALGOS/PROTOS;
- the version behind a launcher's prefix with no space (`[1,0]<stdout>:NCCL version 2.9.9+cuda11.2`,
  mpirun --tag-output) and, where no version line is there, nccl-tests' own banner `# nccl-tests
  version 2.20.0 nccl-headers=23102 nccl-library=23102` (nccl-tests-2.19.6/src/util.cu:623, the
  library's ncclGetVersion code), decoded as NCCL_VERSION does (nccl-2.21.5/src/nccl.h.in:22:
  X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after);
- channels: a ring line `Channel 00/08 : 0 7 ...` says the count after the '/'
  (nccl-2.21.5/src/graph/rings.cc:35); a transport line `Channel 03/0 : 15[7] -> 6[6] [send] via
  ...` has the connection index there (nccl-2.21.5/src/transport/p2p.cc:364, net.cc:195: `%02d/%d`),
  so without ring lines the count is the highest channel id seen + 1, never the connection index;
- `NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:...` (nccl-2.21.5/src/
  transport/net_ib.cc:538): the HCA ports NCCL's IB transport uses;
- WARN lines (`host:pid:tid [dev] file.cc:line NCCL WARN ...`, nccl-2.21.5/src/debug.cc:179), each
  message once with its count, and the failures nccl-tests prints (`Test NCCL failure`, `Test CUDA
  failure`: nccl-tests-2.19.6/src/common.h:47,61,34; `Test timeout`:
  nccl-tests-2.19.6/src/common.cu:523; `NCCL failure FILE:LINE` of nccl-tests before 2.0): each said
  in one line.
"""

from __future__ import annotations

import re

ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOS = ("LL", "LL128", "SIMPLE")
_VERSION_RE = re.compile(r"(?:^|[\s:>\]])NCCL version (\d+\.\d+\.\d+)\S*\s*$")
_BANNER_RE = re.compile(
    r"nccl-tests version (\S+)(?: \(\w+\))? nccl-headers=(\d+) nccl-library=(\d+)"
)
_RING_RE = re.compile(r"NCCL INFO Channel (\d+)/(\d+) :(?:\s+\d+)+\s*$")
_LINK_RE = re.compile(r"NCCL INFO Channel (\d+)(?:/\d+)? : \d+\[")
_IB_RE = re.compile(r"NET/IB : Using(.*?);\s*OOB (\S+)")
_WARN_RE = re.compile(r"\bNCCL WARN (.+?)\s*$")
_FAIL_RE = re.compile(
    r"(?:Test (?:NCCL|CUDA) failure|(?<!Test )NCCL failure|Test timeout \(\d+s\)) \S+:\d+.*$"
)
_NET_RE = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_COUNTS_RE = re.compile(r"NCCL INFO (\d+) coll channels, .*?(\d+) p2p channels")
_CHOICE_RE = re.compile(
    r"NCCL INFO (?:(\w+): )?(\d+) Bytes -> Algo (\w+) proto (\w+)"
    r"(?: time ([\d.]+))?(?:.*?channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?"
)
_REFUSED_RE = re.compile(
    r"Unrecognized (?:element|prefix) token|No algorithm/protocol available", re.IGNORECASE
)
UNNAMED = "(unnamed)"


def _name(tok: str, names) -> str:
    return names[int(tok)] if tok.isdigit() and int(tok) < len(names) else tok.upper()


def nccl_version(code: int) -> str:
    """NCCL's version code (NCCL_VERSION_CODE, ncclGetVersion) -> 'X.Y.Z'."""
    if code < 20900:  # X*1000 + Y*100 + Z up to 2.8
        return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def failure(line: str) -> str | None:
    """The failure nccl-tests printed on this line (from the host name on), else None."""
    m = _FAIL_RE.search(line)
    return line[: m.end()].strip() if m else None


def parse_info_log(text: str) -> dict:
    """-> {version, nccl_tests, network, channels, coll_channels, p2p_channels, ib: {devices, oob} |
    None, choices: [{collective (None when the line names none), bytes, algo, proto, channels}],
    refusals: [line], warnings: [(message, count, first line)], failures: [line]}; missing facts are
    None / empty."""
    out = {
        "version": None,
        "nccl_tests": None,
        "network": None,
        "channels": None,
        "coll_channels": None,
        "p2p_channels": None,
        "ib": None,
        "choices": [],
        "refusals": [],
        "warnings": [],
        "failures": [],
    }
    rings, links, warns, library = None, set(), {}, None
    for line in text.splitlines():
        if out["version"] is None and (m := _VERSION_RE.search(line)):
            out["version"] = m.group(1)
        elif m := _BANNER_RE.search(line):
            out["nccl_tests"], library = m.group(1), int(m.group(3))
        elif out["network"] is None and (m := _NET_RE.search(line)):
            out["network"] = m.group(1)
        elif m := _RING_RE.search(line):
            rings = max(rings or 0, int(m.group(2)))
        elif m := _LINK_RE.search(line):
            links.add(int(m.group(1)))
        elif m := _COUNTS_RE.search(line):
            out["coll_channels"], out["p2p_channels"] = int(m.group(1)), int(m.group(2))
        elif m := _CHOICE_RE.search(line):
            out["choices"].append(_choice(m))
        elif out["ib"] is None and (m := _IB_RE.search(line)):
            out["ib"] = {
                "devices": re.findall(r"\[\d+\](\S+?:\d+/\w+)", m.group(1)),
                "oob": m.group(2),
            }
        elif m := _WARN_RE.search(line):
            w = warns.setdefault(m.group(1), [0, line.strip()])
            w[0] += 1
        elif f := failure(line):
            out["failures"].append(f)
        if _REFUSED_RE.search(line):
            out["refusals"].append(line.strip())
    out["channels"] = rings or (max(links) + 1 if links else None)
    out["version"] = out["version"] or (nccl_version(library) if library else None)
    out["warnings"] = [(msg, n, first) for msg, (n, first) in warns.items()]
    return out


def _choice(m) -> dict:
    coll, nbytes, algo, proto, _, lo, hi = m.groups()
    return {
        "collective": coll,
        "bytes": int(nbytes),
        "algo": _name(algo, ALGOS),
        "proto": _name(proto, PROTOS),
        "channels": int(hi) - int(lo) + 1 if lo is not None else None,
    }


def summarize_choices(choices) -> list[dict]:
    """Collapse per-call choices into {collective, algo, proto, min_bytes, max_bytes, calls};
    choices whose line names no collective are grouped as UNNAMED."""
    groups = {}
    for c in choices:
        key = (c["collective"] or UNNAMED, c["algo"], c["proto"])
        g = groups.setdefault(
            key,
            {
                "collective": key[0],
                "algo": key[1],
                "proto": key[2],
                "min_bytes": c["bytes"],
                "max_bytes": c["bytes"],
                "calls": 0,
            },
        )
        g["min_bytes"], g["max_bytes"] = (
            min(g["min_bytes"], c["bytes"]),
            max(g["max_bytes"], c["bytes"]),
        )
        g["calls"] += 1
    return sorted(groups.values(), key=lambda g: (g["collective"], g["min_bytes"]))
