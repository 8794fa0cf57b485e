"""The validator's NCCL facts, as read from NCCL's code per tag (nccl_tuning.ncclsrc), pinned as
tables.

NCCL's code is read in NVIDIA/nccl at each tag (../shared/reference/nccl/README.md lists the
commits), never copied into the repository: each fact below names its `nccl-<tag>/<path>:<line>`
citation (ncclsrc.CITES). The tables were checked against those lines when they were read; here they
are pinned, so that a change to a fact is a deliberate edit of both the module and this table, made
after reading the code again.
"""

import re
import subprocess
import sys

import pytest

from nccl_tuning import ncclsrc as S

V = {S.vstr(t): t for t in S.TAGS}
PAT = ("PAT",)
BASE_ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree")
SUBSYS_218 = (
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
)

# tag: (ncclAlgoStr, MAXCHANNELS, NCHANNELS_PER_NET_PEER default, NCCL_DEBUG_SUBSYS names, path
# levels)
FACTS = {
    "2.18.6": (
        BASE_ALGOS,
        32,
        "2",
        SUBSYS_218 + ("ALL",),
        ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS"),
    ),
    "2.21.5": (
        BASE_ALGOS,
        32,
        "auto",
        SUBSYS_218 + ("BOOTSTRAP", "REG", "ALL"),
        ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS"),
    ),
    "2.23.4": (
        BASE_ALGOS + PAT,
        32,
        "auto",
        SUBSYS_218 + ("BOOTSTRAP", "REG", "PROFILE", "ALL"),
        ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS"),
    ),
    "2.24.3": (
        BASE_ALGOS + PAT,
        32,
        "auto",
        SUBSYS_218 + ("BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL"),
        ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS"),
    ),
    "2.27.7": (
        BASE_ALGOS + PAT,
        64,
        "auto",
        SUBSYS_218 + ("BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL"),
        ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS"),
    ),
    "2.30.7": (
        BASE_ALGOS + PAT,
        64,
        "auto",
        SUBSYS_218[:9]
        + ("ALLOC_HOST",)
        + SUBSYS_218[9:]
        + ("BOOTSTRAP", "REG", "PROFILE", "RAS", "DESTROY", "ALL"),
        ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS"),
    ),
}


def test_the_tags_read():
    assert sorted(FACTS) == sorted(V)
    assert [S.vstr(t) for t in S.TAGS] == sorted(V, key=lambda v: tuple(map(int, v.split("."))))


@pytest.mark.parametrize("key", sorted(S.CITES))
def test_citations_are_well_formed(key):
    """Every citation names a file of NCCL's tree, a line per tag read, and the text that line
    holds."""
    c = S.CITES[key]
    assert re.fullmatch(r"src/[a-z_/]+\.(cc|h)", c.file), c.file
    assert c.quote.strip() and "\n" not in c.quote and len(c.quote) <= 120, c.quote
    assert c.lines and set(c.lines) <= set(S.TAGS), c.lines
    assert all(isinstance(n, int) and n > 0 for n in c.lines.values()), c.lines
    for tag in S.TAGS:
        got = S.cite(key, tag)
        m = re.fullmatch(r"nccl-(\d+\.\d+\.\d+)/(src/[\w/.]+):(\d+)", got)
        assert m and m.group(2) == c.file, got
        cited = V[m.group(1)]
        assert int(m.group(3)) == c.lines[cited]
        older = [t for t in c.lines if t <= tag]
        # the tag, else the nearest older one
        assert cited == (max(older) if older else max(c.lines)), (got, tag)


def test_rule_count_per_tag(capsys):
    counts = {S.vstr(t): sum(t in c.lines for c in S.CITES.values()) for t in S.TAGS}
    with capsys.disabled():
        print(f"\nrule citations per tag: {counts}")
    assert all(n >= 30 for n in counts.values()), counts


@pytest.mark.parametrize("ver", sorted(FACTS))
def test_facts_per_tag(ver):
    tag = V[ver]
    algos, maxch, per_peer, subsys, levels = FACTS[ver]
    assert S.algorithms(tag) == algos  # algo_names
    # func_names
    assert S.FUNCS == ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
    assert S.PROTOS == ("LL", "LL128", "Simple")  # proto_names
    assert S.maxchannels(tag) == maxch  # maxchannels
    assert S.per_peer_default(tag) == per_peer  # per_peer_param
    assert S.debug_subsys(tag) == subsys  # debug_subsys_*
    assert S.debug_levels(tag) == ("VERSION", "WARN", "INFO", "ABORT", "TRACE")  # debug_levels
    assert S.path_levels(tag) == levels  # level_strcmp
    assert S.LEGACY_LEVELS == ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")  # level_table


def test_device_limits():
    """device.h (devcomm.h before 2.18): WARP_SIZE, NCCL_STEPS, NCCL_SIMPLE/LL128_MAX_NTHREADS;
    init.cc buffers."""
    assert (S.WARP_SIZE, S.NCCL_STEPS) == (32, 8)
    assert S.NTHREADS == (2 * 32, 512) and S.LL128_NTHREADS == (640 // 4, 640)
    assert S.DEFAULT_BUFFSIZE == 1 << 22 and S.DEFAULT_NET_CHUNK == 1 << 17


@pytest.mark.parametrize(
    "version,tag,noted",
    [
        ((2, 30, 7), (2, 30, 7), False),
        ((2, 28, 3), (2, 27, 7), True),
        ((2, 31, 0), (2, 30, 7), True),
        ((2, 17, 1), (2, 18, 6), True),
        ((2, 24, 0), (2, 24, 3), True),
        ((2, 22, 3), (2, 21, 5), True),
    ],
)
def test_rules_tag(version, tag, noted):
    got, note = S.rules_tag(version)
    assert got == tag and bool(note) == noted


def test_validator_import_is_light():
    """validate_env is for the launcher: no torch, no click, no launchers.cli/backends."""
    code = (
        "import sys, time; t = time.perf_counter(); "
        "from nccl_tuning.validate import validate_env; "
        "bad = [m for m in ('torch', 'click', 'launchers.cli', 'launchers.backends') "
        "if m in sys.modules]; assert not bad, bad; "
        "assert validate_env({'NCCL_PROTO': 'shm'}, '2.30.7')[0].severity == 'error'"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
