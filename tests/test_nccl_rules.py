"""The validator's facts against the NCCL source copies in ../shared/reference/nccl/src.

Every citation in nccl_tuning.ncclsrc.CITES must point at a line that holds its quoted text, and
the tables (algorithm/protocol/collective names, debug levels and subsystems, MAXCHANNELS, thread
limits, per-peer default, path level names) must equal what the copies say, tag by tag. The
copies live next to the repository (../shared); a checkout without them fails here, never skips.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_tuning import ncclsrc as S

SRC = Path(__file__).resolve().parents[2] / "shared" / "reference" / "nccl" / "src"


def read(tag, file) -> str:
    path = SRC / f"nccl-{S.vstr(tag)}" / file
    if not path.is_file():
        pytest.fail(f"NCCL source copy {path} is missing (expected ../shared next to the repo)")
    return path.read_text(errors="replace")


def test_source_copies_are_the_tags():
    have = sorted(p.name for p in SRC.glob("nccl-2.*"))
    assert have == [f"nccl-{S.vstr(t)}" for t in S.TAGS]


@pytest.mark.parametrize("key", sorted(S.CITES))
def test_citation_lines_hold_their_quote(key):
    c = S.CITES[key]
    for tag, line in c.lines.items():
        lines = read(tag, c.file).splitlines()
        assert c.quote in lines[line - 1], f"{key}: nccl-{S.vstr(tag)}/{c.file}:{line}"


def test_rule_count_per_tag(capsys):
    counts = {S.vstr(t): sum(t in c.lines for c in S.CITES.values()) for t in S.TAGS}
    with capsys.disabled():
        print(f"\nsource-checked rule citations per tag: {counts}")
    assert all(n >= 30 for n in counts.values()), counts


def _c_strings(text, decl):
    m = re.search(re.escape(decl) + r"\s*\{([^}]*)\}", text)
    return tuple(re.findall(r'"([^"]*)"', m.group(1)))


@pytest.mark.parametrize("tag", S.TAGS)
def test_name_tables_equal_the_source(tag):
    init = read(tag, "src/init.cc")
    assert _c_strings(init, "const char* ncclAlgoStr[NCCL_NUM_ALGORITHMS] =") == S.algorithms(tag)
    assert _c_strings(init, "const char* ncclFuncStr[NCCL_NUM_FUNCTIONS] =") == S.FUNCS
    assert _c_strings(init, "const char* ncclProtoStr[NCCL_NUM_PROTOCOLS] =") == S.PROTOS
    dbg = read(tag, "src/debug.cc")
    if tag < (2, 30, 7):
        levels = tuple(re.findall(r'strcasecmp\(nccl_debug, "(\w+)"\)', dbg))
        subsys = tuple(re.findall(r'strcasecmp\(subsys, "(\w+)"\)', dbg))
    else:
        block = dbg[dbg.index("ncclParamDebugLevel"):dbg.index("ncclParamDebugSubsys")]
        levels = tuple(re.findall(r'makeOption\("(\w+)", NCCL_LOG_', block))
        block = dbg[dbg.index("ncclParamDebugSubsys"):dbg.index("ncclParamWarnEnableDebugInfo")]
        subsys = tuple(re.findall(r'makeOption\("(\w+)", NCCL_', block))
    assert levels == S.debug_levels(tag)
    assert subsys == S.debug_subsys(tag)


@pytest.mark.parametrize("tag", [t for t in S.TAGS if t >= (2, 21, 5)])
def test_device_limits_equal_the_source(tag):
    dev = read(tag, "src/include/device.h")
    define = dict(re.findall(r"#define (\w+) (\d+)\s*$", dev, re.MULTILINE))
    assert int(define["MAXCHANNELS"]) == S.maxchannels(tag)
    assert int(define["WARP_SIZE"]) == S.WARP_SIZE and int(define["NCCL_STEPS"]) == S.NCCL_STEPS
    assert (2 * S.WARP_SIZE, int(define["NCCL_SIMPLE_MAX_NTHREADS"])) == S.NTHREADS
    ll128 = int(define["NCCL_LL128_MAX_NTHREADS"])
    assert (ll128 // 4, ll128) == S.LL128_NTHREADS


@pytest.mark.parametrize("tag", S.TAGS)
def test_paths_and_params_equal_the_source(tag):
    paths = read(tag, "src/graph/paths.cc")
    used = set(re.findall(r"\bPATH_([A-Z0-9]+)\b", paths)) - {"NET", "DIS", "MAX"}
    assert used == set(S.path_levels(tag))
    legacy = re.search(r"levelsOldToNew\[\] = \{([^}]*)\}", paths).group(1)
    assert tuple(x.strip()[5:] for x in legacy.split(",")) == S.LEGACY_LEVELS
    init = read(tag, "src/init.cc")
    src = paths if tag < (2, 30, 7) else init
    default = re.search(r'NCCL_PARAM\(NChannelsPerNetPeer, "NCHANNELS_PER_NET_PEER", ([^)]+)\)',
                        src).group(1)
    assert {"2": "2", "-1": "auto", "NCCL_CONFIG_UNDEF_INT": "auto"}[default] == \
        S.per_peer_default(tag)
    assert "#define DEFAULT_BUFFSIZE (1 << 22)" in init and S.DEFAULT_BUFFSIZE == 1 << 22
    assert 'NCCL_PARAM(P2pNetChunkSize, "P2P_NET_CHUNKSIZE", (1 << 17))' in init


def test_validator_import_is_light():
    """validate_env is for the launcher: no torch, no click, no launchers.cli/backends."""
    code = ("import sys, time; t = time.perf_counter(); "
            "from nccl_tuning.validate import validate_env; "
            "bad = [m for m in ('torch', 'click', 'launchers.cli', 'launchers.backends') "
            "if m in sys.modules]; assert not bad, bad; "
            "assert validate_env({'NCCL_PROTO': 'shm'}, '2.30.7')[0].severity == 'error'")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
