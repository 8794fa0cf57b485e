"""NCCL facts per source tag, each with the file:line it was read from.

The tags are the NCCL releases whose code was read (NVIDIA/nccl at each tag; the commits are in
../shared/reference/nccl/README.md): read, never copied. A version between two tags is checked with
the nearest tag at or below its major.minor (said in the output); below the oldest, with the oldest.
Every fact below names its source line; CITES maps a rule key to {tag: line} in one file and the
text that line holds (a reference for a reader checking it with `git show TAG:PATH`; the tables are
cites_tuning, cites_params and cites_iflist); tests/test_nccl_rules.py pins the facts.
"""

from __future__ import annotations

from .cites_iflist import IF_CITES
from .cites_params import PARAM_CITES
from .cites_tuning import TUNING_CITES

TAGS = ((2, 18, 6), (2, 21, 5), (2, 23, 4), (2, 24, 3), (2, 27, 7), (2, 30, 7))
OLDEST, NEWEST = TAGS[0], TAGS[-1]


def vstr(v) -> str:
    return ".".join(str(x) for x in v)


def rules_tag(version: tuple, tags: tuple = TAGS) -> tuple[tuple, str | None]:
    """-> (tag whose rules apply, a note saying so when the tag is not the version itself)."""
    below = [t for t in tags if t[:2] <= tuple(version[:2])]
    if not below:
        return tags[0], (
            f"older than the oldest NCCL release read ({vstr(tags[0])}); checked with "
            f"{vstr(tags[0])}'s rules"
        )
    tag = below[-1]
    if tuple(version) == tag:
        return tag, None
    if tuple(version) > tags[-1]:
        return tag, f"newer than the newest NCCL release read; checked with {vstr(tag)}'s rules"
    return tag, (
        f"no rules read from this exact version; checked with {vstr(tag)}, the nearest "
        f"NCCL release read at or below {version[0]}.{version[1]}"
    )


CITES = {**TUNING_CITES, **PARAM_CITES}  # rule key -> citation.Cite (tuning model, then parameters)


# NCCL_SOCKET_IFNAME / NCCL_IB_HCA (parseStringList, matchIfList and their readers) were also read
# at 2.16.5 and 2.17.1, so they have their own tag list; a version is checked with the nearest of
# IF_TAGS at or below it (if_rules_tag). Their citations are IF_CITES (cites_iflist).
IF_TAGS = ((2, 16, 5), (2, 17, 1)) + TAGS


def cite(key: str, tag: tuple) -> str:
    """'nccl-2.24.3/src/graph/tuning.cc:99' for the tag, or the nearest older tag that has it."""
    c = CITES[key] if key in CITES else IF_CITES[key]
    have = [t for t in sorted(c.lines) if t <= tag] or sorted(c.lines)
    t = have[-1]
    return f"nccl-{vstr(t)}/{c.file}:{c.lines[t]}"


def has(key: str, tag: tuple) -> bool:
    return tag in CITES[key].lines


# ---- facts per tag (each line names its citation key) -------------------------------------

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # func_names
PROTOS = ("LL", "LL128", "Simple")  # proto_names


def algorithms(tag) -> tuple:  # algo_names
    base = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree")
    return base + (("PAT",) if tag >= (2, 23, 4) else ())


def coll_algorithms(coll: str, tag) -> set:
    """Algorithms the tuning model gives a bandwidth for this collective (bcast_ring_only,
    ag_algos, ar_no_pat)."""
    if coll in ("Broadcast", "Reduce"):
        return {"Ring"}
    if coll in ("AllGather", "ReduceScatter"):
        if tag < (2, 21, 5):
            return {"Ring"}
        return {"Ring", "NVLS", "CollNetDirect"} | ({"PAT"} if tag >= (2, 23, 4) else set())
    return {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree"}


# algorithms that run only with Simple (nvls_simple, collnet_simple, pat_simple)
SIMPLE_ONLY = {"CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"}
# algorithms available only on some hardware / setups (NVLink SHARP, CollNet plugin, PAT's
# one-GPU-per-node case): a collective left with only these fails elsewhere
CONDITIONAL = {"CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"}

WARP_SIZE = 32
NTHREADS = (64, 512)  # nthreads_call: min 2*WARP_SIZE, max NCCL_SIMPLE_MAX_NTHREADS
LL128_NTHREADS = (160, 640)  # ll128_nthreads_call: NCCL_LL128_MAX_NTHREADS/4 .. 640
NCCL_STEPS = 8  # nccl_steps
DEFAULT_BUFFSIZE = 1 << 22  # buffsize_default
DEFAULT_NET_CHUNK = 1 << 17  # net_chunk_param


def maxchannels(tag) -> int:
    """maxchannels (2.18.6's devcomm.h was not read: 32 as in 2.21.5)."""
    return 64 if tag >= (2, 27, 7) else 32


def per_peer_default(tag) -> str:
    """per_peer_param: 2 in 2.18.6; -1 = automatic (per_peer_auto) from 2.21.5."""
    return "2" if tag < (2, 21, 5) else "auto"


def debug_levels(tag) -> tuple:
    """debug_levels / debug_level_param: the names NCCL_DEBUG accepts (same five in every tag)."""
    return ("VERSION", "WARN", "INFO", "ABORT", "TRACE")


def debug_subsys(tag) -> tuple:
    """debug_subsys_strtok / debug_subsys_param: NCCL_DEBUG_SUBSYS names per tag."""
    names = [
        "INIT",
        "COLL",
        "P2P",
        "SHM",
        "NET",
        "GRAPH",
        "TUNING",
        "ENV",
        "ALLOC",
        "CALL",
        "PROXY",
        "NVLS",
    ]
    if tag >= (2, 21, 5):
        names += ["BOOTSTRAP", "REG"]
    if tag >= (2, 23, 4):
        names += ["PROFILE"]
    if tag >= (2, 24, 3):
        names += ["RAS"]
    if tag >= (2, 30, 7):
        names.insert(names.index("CALL"), "ALLOC_HOST")
        names += ["DESTROY"]
    return tuple(names + ["ALL"])


def path_levels(tag) -> tuple:
    """level_strcmp: the names ncclGetLevel compares against (topoPathTypeStr up to PATH_SYS).
    topo.h/topo.cc were not read: the set is the PATH_* levels paths.cc of that tag
    uses below NET, in NCCL's order; C2C and P2C appear from 2.27.7."""
    if tag >= (2, 27, 7):
        return ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS")
    return ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS")


LEGACY_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")  # level_table


# ---- NCCL_SOCKET_IFNAME / NCCL_IB_HCA facts per tag (IF_TAGS; each names its IF_CITES key) -------


def if_rules_tag(version: tuple) -> tuple[tuple, str | None]:
    return rules_tag(version, IF_TAGS)


def if_key(base: str, tag) -> str:
    """The citation key for the tag: the _30 key where 2.30.7 moved the code to another file."""
    return base + "_30" if tag >= (2, 30, 7) and base + "_30" in IF_CITES else base


def if_parser(tag) -> str:
    """if_port_scan: a character scanner up to 2.27.7 ('name:' -> port atoi('') = 0);
    if_port_tok: strtok(',') + strsep(':') in 2.30.7 ('name:' -> port -1 = any)."""
    return "tok" if tag >= (2, 30, 7) else "scan"


MAX_IFS = 16  # max_ifs: NCCL_SOCKET_IFNAME entries read (if_max_scan/if_max_tok)
IF_PREFIX_MAX = 63  # struct netIf prefix[64] (utils.h), with its terminating NUL


def max_ib_devs(tag) -> int:
    """ib_max / ib_max_30: NCCL_IB_HCA entries read; 16 in 2.16.5 and 2.17.1, 32 from 2.18.6."""
    return 16 if tag < (2, 18, 6) else 32


def if_auto(tag) -> tuple:
    """sock_auto: the order NCCL tries when NCCL_SOCKET_IFNAME is unset or one character long
    (sock_len); 2.30.7 also avoids virbr* until last."""
    if tag >= (2, 30, 7):
        return ("ib", "NCCL_COMM_ID's subnet", "^docker,lo,virbr", "docker", "lo", "virbr")
    return ("ib", "NCCL_COMM_ID's subnet", "^docker,lo", "docker", "lo")


def skips_not_running(tag) -> bool:
    """sock_running_30: from 2.30.7 interfaces that are not RUNNING are never selected."""
    return tag >= (2, 30, 7)
