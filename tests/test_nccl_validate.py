"""Validator rules, table-driven, per NCCL source tag (pure logic).

Every row names the line of NCCL's code (nccl-<tag>/..., read in NVIDIA/nccl) the rule comes from;
when the finding carries that citation the test checks the message names it (so the message and the
table cannot drift from the source). tests/test_nccl_rules.py pins the facts.
"""

import pytest

from nccl_tuning.errors import NcclTuningError
from nccl_tuning.knowledge import DEBUGGING_CLASS, NAMES, REMOVED, parse_int, parse_version
from nccl_tuning.validate import Finding, has_errors, validate, validate_env

SEED = {"NCCL_ALGO": "ring", "NCCL_PROTO": "shm", "NCCL_SHM_DISABLE": "0"}
TUNING = "src/graph/tuning.cc"


def one(env, version=None, production=True):
    return [
        (f.severity, f.variable)
        for f in validate(env, version, production)
        if f.variable != "nccl-version"
    ]


W, E, N = "warning", "error", "note"

# (env, tag, expected [(severity, variable)], citation the messages must name or None)
RULES = [
    # parseList >= 2.24: strtok skips empty pieces; an unknown token fails init
    ({"NCCL_PROTO": "shm"}, "2.30.7", [(E, "NCCL_PROTO")], f"nccl-2.30.7/{TUNING}:109"),
    ({"NCCL_PROTO": "shm"}, "2.24.3", [(E, "NCCL_PROTO")], f"nccl-2.24.3/{TUNING}:99"),
    ({"NCCL_ALGO": ";ring"}, "2.30.7", [(E, "NCCL_ALGO")], f"nccl-2.30.7/{TUNING}:69"),
    ({"NCCL_ALGO": ";ring"}, "2.24.3", [(E, "NCCL_ALGO")], f"nccl-2.24.3/{TUNING}:67"),
    ({"NCCL_ALGO": ":"}, "2.30.7", [(E, "NCCL_ALGO")], f"nccl-2.30.7/{TUNING}:82"),  # SIGSEGV
    ({"NCCL_PROTO": "::;simple"}, "2.24.3", [(E, "NCCL_PROTO")], f"nccl-2.24.3/{TUNING}:75"),
    ({"NCCL_PROTO": "simple;:"}, "2.24.3", [(E, "NCCL_PROTO")], f"nccl-2.24.3/{TUNING}:67"),
    ({"NCCL_ALGO": ":"}, "2.23.4", [(W, "NCCL_ALGO"), (W, "NCCL_ALGO"), (W, "NCCL_ALGO")], None),
    ({"NCCL_ALGO": "ring,,tree"}, "2.30.7", [(W, "NCCL_ALGO")], None),
    ({"NCCL_ALGO": ",ring"}, "2.24.3", [(W, "NCCL_ALGO")], None),
    ({"NCCL_ALGO": "ring;"}, "2.27.7", [(W, "NCCL_ALGO")], None),
    ({"NCCL_ALGO": ""}, "2.30.7", [(W, "NCCL_ALGO")], None),  # empty: a no-op
    ({"NCCL_ALGO": "allreduce::tree"}, "2.30.7", [(W, "NCCL_ALGO")], None),
    ({"NCCL_ALGO": "allreduce:"}, "2.30.7", [(E, "NCCL_ALGO")], f"nccl-2.30.7/{TUNING}:109"),
    ({"NCCL_ALGO": "ring, tree"}, "2.30.7", [(E, "NCCL_ALGO")], f"nccl-2.30.7/{TUNING}:109"),
    (
        {"NCCL_ALGO": "allreduce:tree;ring"},
        "2.30.7",
        [(E, "NCCL_ALGO")],
        f"nccl-2.30.7/{TUNING}:73",
    ),
    (
        {"NCCL_ALGO": "allreduce:tree;alltoall:ring"},
        "2.30.7",
        [(E, "NCCL_ALGO")],
        f"nccl-2.30.7/{TUNING}:119",
    ),
    ({"NCCL_ALGO": "allreduce:tree,ring;allgather:ring"}, "2.24.3", [(W, "NCCL_ALGO")], None),
    ({"NCCL_ALGO": "RING,tree"}, "2.30.7", [(W, "NCCL_ALGO")], None),  # strcasecmp
    ({"NCCL_ALGO": "^tree"}, "2.30.7", [(W, "NCCL_ALGO")], None),
    ({"NCCL_ALGO": "ring,pat"}, "2.24.3", [(W, "NCCL_ALGO")], None),
    ({"NCCL_ALGO": "ring,foo"}, "2.24.3", [(E, "NCCL_ALGO")], f"nccl-2.24.3/{TUNING}:99"),
    # a collective left with nothing fails at its first call from 2.24 (no fallback)
    (
        {"NCCL_ALGO": "tree"},
        "2.30.7",
        [(W, "NCCL_ALGO"), (E, "NCCL_ALGO")],
        "nccl-2.30.7/src/enqueue.cc:2063",
    ),
    (
        {"NCCL_ALGO": "^ring"},
        "2.27.7",
        [(W, "NCCL_ALGO"), (E, "NCCL_ALGO"), (W, "NCCL_ALGO")],
        "nccl-2.27.7/src/enqueue.cc:1825",
    ),
    (
        {"NCCL_PROTO": "^LL,LL128,Simple"},
        "2.30.7",
        [(W, "NCCL_PROTO"), (E, "NCCL_PROTO")],
        "nccl-2.30.7/src/enqueue.cc:2063",
    ),
    # parseList <= 2.23: unknown tokens skipped; fallbacks
    (
        {"NCCL_PROTO": "shm"},
        "2.23.4",
        [(W, "NCCL_PROTO"), (E, "NCCL_PROTO")],
        "nccl-2.23.4/src/enqueue.cc:1848",
    ),
    (
        {"NCCL_PROTO": "shm"},
        "2.21.5",
        [(W, "NCCL_PROTO"), (W, "NCCL_PROTO")],
        f"nccl-2.21.5/{TUNING}:332",
    ),
    (
        {"NCCL_PROTO": "shm"},
        "2.18.6",
        [(W, "NCCL_PROTO"), (E, "NCCL_PROTO")],
        "nccl-2.18.6/src/enqueue.cc:1182",
    ),
    (
        {"NCCL_PROTO": ""},
        "2.23.4",
        [(W, "NCCL_PROTO"), (E, "NCCL_PROTO")],
        f"nccl-2.23.4/{TUNING}:34",
    ),
    (
        {"NCCL_ALGO": "ring, tree"},
        "2.23.4",
        [(W, "NCCL_ALGO"), (W, "NCCL_ALGO")],
        f"nccl-2.23.4/{TUNING}:44",
    ),
    (
        {"NCCL_ALGO": "allreduce:tree,ring;allgather:ring"},
        "2.23.4",
        [(W, "NCCL_ALGO"), (W, "NCCL_ALGO"), (W, "NCCL_ALGO")],
        f"nccl-2.23.4/{TUNING}:313",
    ),
    (
        {"NCCL_ALGO": "collnetdirect"},
        "2.23.4",
        [(W, "NCCL_ALGO"), (W, "NCCL_ALGO")],
        f"nccl-2.23.4/{TUNING}:313",
    ),
    (
        {"NCCL_ALGO": "collnetdirect"},
        "2.30.7",
        [(W, "NCCL_ALGO"), (E, "NCCL_ALGO"), (W, "NCCL_ALGO")],
        None,
    ),
    (
        {"NCCL_ALGO": "tree"},
        "2.23.4",
        [(W, "NCCL_ALGO"), (W, "NCCL_ALGO")],
        f"nccl-2.23.4/{TUNING}:352",
    ),
    (
        {"NCCL_ALGO": "tree"},
        "2.21.5",
        [(W, "NCCL_ALGO"), (W, "NCCL_ALGO")],
        f"nccl-2.21.5/{TUNING}:332",
    ),
    (
        {"NCCL_ALGO": "tree"},
        "2.18.6",
        [(W, "NCCL_ALGO"), (N, "NCCL_ALGO")],
        f"nccl-2.18.6/{TUNING}:296",
    ),
    (
        {"NCCL_ALGO": "ring,pat"},
        "2.21.5",
        [(W, "NCCL_ALGO"), (W, "NCCL_ALGO")],
        f"nccl-2.21.5/{TUNING}:44",
    ),
    ({"NCCL_ALGO": "ring,pat"}, "2.23.4", [(W, "NCCL_ALGO")], None),
    # LL128: default 2 = platform check; 1 (listed, or unlisted under '^') forces it
    ({"NCCL_PROTO": "^LL"}, "2.30.7", [(W, "NCCL_PROTO")], f"nccl-2.30.7/{TUNING}:518"),
    ({"NCCL_PROTO": "LL128"}, "2.24.3", [(W, "NCCL_PROTO")], f"nccl-2.24.3/{TUNING}:420"),
    ({"NCCL_PROTO": "^Simple"}, "2.18.6", [(W, "NCCL_PROTO")], f"nccl-2.18.6/{TUNING}:282"),
    ({"NCCL_PROTO": "^LL128"}, "2.30.7", [(W, "NCCL_PROTO")], None),  # debugging class only
    ({"NCCL_PROTO": "ll,simple"}, "2.30.7", [(W, "NCCL_PROTO")], None),
    (
        {"NCCL_ALGO": "allreduce:nvls", "NCCL_PROTO": "allreduce:LL"},
        "2.30.7",
        [(W, "NCCL_ALGO"), (W, "NCCL_PROTO"), (E, "NCCL_PROTO")],
        "nccl-2.30.7/src/enqueue.cc:2063",
    ),
    ({"NCCL_ALGO": "allreduce:nvls"}, "2.30.7", [(W, "NCCL_ALGO"), (W, "NCCL_ALGO")], None),
    # getNthreads: multiples of 32 in [min, max]; <= 0 means default
    ({"NCCL_NTHREADS": "96"}, "2.30.7", [(W, "NCCL_NTHREADS")], None),  # valid: debugging class
    ({"NCCL_NTHREADS": "100"}, "2.30.7", [(W, "NCCL_NTHREADS")], f"nccl-2.30.7/{TUNING}:17"),
    ({"NCCL_NTHREADS": "1024"}, "2.21.5", [(W, "NCCL_NTHREADS")], f"nccl-2.21.5/{TUNING}:123"),
    ({"NCCL_NTHREADS": "32"}, "2.24.3", [(W, "NCCL_NTHREADS")], f"nccl-2.24.3/{TUNING}:194"),
    ({"NCCL_NTHREADS": "-1"}, "2.30.7", [(N, "NCCL_NTHREADS")], f"nccl-2.30.7/{TUNING}:17"),
    (
        {"NCCL_NTHREADS": "0x100"},
        "2.30.7",
        [(N, "NCCL_NTHREADS")],
        "nccl-2.30.7/src/misc/param.cc:95",
    ),
    (
        {"NCCL_LL128_NTHREADS": "128"},
        "2.27.7",
        [(W, "NCCL_LL128_NTHREADS")],
        f"nccl-2.27.7/{TUNING}:226",
    ),
    # channels: clamped to MAXCHANNELS (32 up to 2.24, 64 from 2.27); MIN 0 fine; MAX < 1 -> 1
    (
        {"NCCL_MIN_NCHANNELS": "64"},
        "2.24.3",
        [(W, "NCCL_MIN_NCHANNELS")],
        "nccl-2.24.3/src/graph/connect.cc:335",
    ),
    ({"NCCL_MIN_NCHANNELS": "64"}, "2.27.7", [(W, "NCCL_MIN_NCHANNELS")], None),  # debugging only
    (
        {"NCCL_MAX_NCHANNELS": "48"},
        "2.21.5",
        [(W, "NCCL_MAX_NCHANNELS")],
        "nccl-2.21.5/src/graph/connect.cc:341",
    ),
    (
        {"NCCL_MAX_NCHANNELS": "0"},
        "2.30.7",
        [(W, "NCCL_MAX_NCHANNELS")],
        "nccl-2.30.7/src/graph/connect.cc:354",
    ),
    ({"NCCL_MIN_NCHANNELS": "0"}, "2.30.7", [(W, "NCCL_MIN_NCHANNELS")], None),  # debugging only
    # per-peer channels: default 2 in 2.18, automatic since 2.21
    (
        {"NCCL_NCHANNELS_PER_NET_PEER": "2"},
        "2.18.6",
        [(N, "NCCL_NCHANNELS_PER_NET_PEER")],
        "nccl-2.18.6/src/graph/paths.cc:667",
    ),
    (
        {"NCCL_NCHANNELS_PER_NET_PEER": "4"},
        "2.21.5",
        [(W, "NCCL_NCHANNELS_PER_NET_PEER")],
        "nccl-2.21.5/src/graph/paths.cc:715",
    ),
    (
        {"NCCL_NCHANNELS_PER_NET_PEER": "4"},
        "2.30.7",
        [(W, "NCCL_NCHANNELS_PER_NET_PEER")],
        "nccl-2.30.7/src/graph/paths.cc:993",
    ),
    # buffers: used as given (no units, -2 = default); chunk clamped to BUFFSIZE / NCCL_STEPS
    ({"NCCL_BUFFSIZE": "4M"}, "2.30.7", [(E, "NCCL_BUFFSIZE")], "nccl-2.30.7/src/init.cc:827"),
    ({"NCCL_BUFFSIZE": "4194304"}, "2.24.3", [(N, "NCCL_BUFFSIZE")], "nccl-2.24.3/src/init.cc:598"),
    ({"NCCL_BUFFSIZE": "0"}, "2.21.5", [(E, "NCCL_BUFFSIZE")], "nccl-2.21.5/src/init.cc:561"),
    (
        {"NCCL_BUFFSIZE": "big"},
        "2.30.7",
        [(W, "NCCL_BUFFSIZE"), (E, "NCCL_BUFFSIZE")],
        "nccl-2.30.7/src/misc/param.cc:95",
    ),
    (
        {"NCCL_BUFFSIZE": "99999999999999999999"},
        "2.27.7",
        [(W, "NCCL_BUFFSIZE")],
        "nccl-2.27.7/src/misc/param.cc:82",
    ),
    ({"NCCL_BUFFSIZE": "010"}, "2.30.7", [(N, "NCCL_BUFFSIZE")], None),
    (
        {"NCCL_P2P_NET_CHUNKSIZE": "1048576"},
        "2.30.7",
        [(W, "NCCL_P2P_NET_CHUNKSIZE"), (W, "NCCL_P2P_NET_CHUNKSIZE")],
        "nccl-2.30.7/src/init.cc:842",
    ),
    ({"NCCL_P2P_NET_CHUNKSIZE": "1048576"}, "2.18.6", [(W, "NCCL_P2P_NET_CHUNKSIZE")], None),
    ({"NCCL_P2P_NET_CHUNKSIZE": "524288"}, "2.30.7", [(W, "NCCL_P2P_NET_CHUNKSIZE")], None),
    # NCCL_DEBUG: strcasecmp up to 2.27 (unknown: nothing printed); trimmed enum in 2.30
    ({"NCCL_DEBUG": "INFO"}, "2.30.7", [], None),
    ({"NCCL_DEBUG": "info"}, "2.27.7", [(N, "NCCL_DEBUG")], None),
    ({"NCCL_DEBUG": "VERBOSE"}, "2.27.7", [(W, "NCCL_DEBUG")], "nccl-2.27.7/src/debug.cc:42"),
    (
        {"NCCL_DEBUG": "VERBOSE"},
        "2.30.7",
        [(W, "NCCL_DEBUG")],
        "nccl-2.30.7/src/include/param/parser_enum.h:22",
    ),
    ({"NCCL_DEBUG": " INFO "}, "2.30.7", [], None),
    ({"NCCL_DEBUG": " INFO "}, "2.24.3", [(W, "NCCL_DEBUG")], "nccl-2.24.3/src/debug.cc:38"),
    ({"NCCL_DEBUG": "ABORT"}, "2.18.6", [], None),
    ({"NCCL_DEBUG": "TRACE"}, "2.30.7", [(N, "NCCL_DEBUG")], None),
    # NCCL_DEBUG_SUBSYS: names per tag; unknown skipped up to 2.27, whole value rejected in 2.30
    (
        {"NCCL_DEBUG_SUBSYS": "INIT,^NET"},
        "2.27.7",
        [(W, "NCCL_DEBUG_SUBSYS")],
        "nccl-2.27.7/src/debug.cc:73",
    ),
    ({"NCCL_DEBUG_SUBSYS": "^COLL,P2P"}, "2.30.7", [], None),
    (
        {"NCCL_DEBUG_SUBSYS": "init,ras"},
        "2.21.5",
        [(W, "NCCL_DEBUG_SUBSYS")],
        "nccl-2.21.5/src/debug.cc:55",
    ),
    ({"NCCL_DEBUG_SUBSYS": "init,ras"}, "2.24.3", [], None),
    ({"NCCL_DEBUG_SUBSYS": "INIT, NET"}, "2.30.7", [], None),
    ({"NCCL_DEBUG_SUBSYS": "INIT, NET"}, "2.27.7", [(W, "NCCL_DEBUG_SUBSYS")], None),
    (
        {"NCCL_DEBUG_SUBSYS": "INIT,foo"},
        "2.30.7",
        [(W, "NCCL_DEBUG_SUBSYS")],
        "nccl-2.30.7/src/include/param/parser_bitset.h:51",
    ),
    ({"NCCL_DEBUG_SUBSYS": "ALLOC_HOST"}, "2.27.7", [(W, "NCCL_DEBUG_SUBSYS")], None),
    (
        {"NCCL_DEBUG_SUBSYS": ""},
        "2.27.7",
        [(W, "NCCL_DEBUG_SUBSYS")],
        "nccl-2.27.7/src/debug.cc:73",
    ),
    (
        {"NCCL_DEBUG_SUBSYS": "^ALL"},
        "2.30.7",
        [(W, "NCCL_DEBUG_SUBSYS")],
        "nccl-2.30.7/src/debug.cc:55",
    ),
    ({"NCCL_DEBUG_SUBSYS": ","}, "2.30.7", [(W, "NCCL_DEBUG_SUBSYS")], None),
    # path levels: strcmp (case-sensitive), legacy numbers, names per tag, P2P_DISABLE=1 wins
    (
        {"NCCL_P2P_LEVEL": "nvl"},
        "2.30.7",
        [(W, "NCCL_P2P_LEVEL")],
        "nccl-2.30.7/src/graph/paths.cc:259",
    ),
    ({"NCCL_P2P_LEVEL": "NVL"}, "2.30.7", [(W, "NCCL_P2P_LEVEL")], None),  # debugging class
    (
        {"NCCL_NET_GDR_LEVEL": "2"},
        "2.24.3",
        [(N, "NCCL_NET_GDR_LEVEL")],
        "nccl-2.24.3/src/graph/paths.cc:209",
    ),
    ({"NCCL_NET_GDR_LEVEL": "FAST"}, "2.21.5", [(W, "NCCL_NET_GDR_LEVEL")], None),
    (
        {"NCCL_P2P_LEVEL": "C2C"},
        "2.24.3",
        [(W, "NCCL_P2P_LEVEL")],
        "nccl-2.24.3/src/graph/paths.cc:225",
    ),
    ({"NCCL_P2P_LEVEL": "C2C"}, "2.27.7", [(W, "NCCL_P2P_LEVEL")], None),  # debugging class
    (
        {"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"},
        "2.30.7",
        [(W, "NCCL_P2P_DISABLE"), (W, "NCCL_P2P_LEVEL")],
        "nccl-2.30.7/src/graph/paths.cc:251",
    ),
    # integers read by strtoll base 0 (words read as 0)
    (
        {"NCCL_P2P_DISABLE": "true"},
        "2.30.7",
        [(W, "NCCL_P2P_DISABLE")],
        "nccl-2.30.7/src/misc/param.cc:95",
    ),
    ({"NCCL_IB_DISABLE": "0"}, "2.30.7", [(N, "NCCL_IB_DISABLE")], None),
]


@pytest.mark.parametrize("env,tag,expected,src", RULES)
def test_rules_from_source(env, tag, expected, src):
    fs = [f for f in validate(env, tag) if f.variable != "nccl-version"]
    assert [(f.severity, f.variable) for f in fs] == expected, "\n".join(map(str, fs))
    if src:
        assert any(src in f.message for f in fs), "\n".join(map(str, fs))


@pytest.mark.parametrize(
    "version,expected",
    [
        ("2.30.7", [(W, "NCCL_ALGO"), (E, "NCCL_PROTO"), (N, "NCCL_SHM_DISABLE")]),
        ("2.24.3", [(W, "NCCL_ALGO"), (E, "NCCL_PROTO"), (N, "NCCL_SHM_DISABLE")]),
        (
            "2.23.4",
            [(W, "NCCL_ALGO"), (W, "NCCL_PROTO"), (N, "NCCL_SHM_DISABLE"), (E, "NCCL_PROTO")],
        ),
        (
            "2.21.5",
            [(W, "NCCL_ALGO"), (W, "NCCL_PROTO"), (N, "NCCL_SHM_DISABLE"), (W, "NCCL_PROTO")],
        ),
        (
            "2.18.6",
            [(W, "NCCL_ALGO"), (W, "NCCL_PROTO"), (N, "NCCL_SHM_DISABLE"), (E, "NCCL_PROTO")],
        ),
    ],
)
def test_seed_preset_per_version(version, expected):
    """The seed article's preset: NCCL_PROTO=shm fails init from 2.24 (tuning.cc:99/109), fails
    every dense collective in 2.18/2.23 (enqueue.cc:1182/1848) and only in 2.21.5 survives, by the
    Ring restore that does not clear disabled protocols (2.21.5 tuning.cc:332)."""
    assert one(SEED, version) == expected


@pytest.mark.parametrize(
    "version,tag,noted",
    [
        ("2.30.7", "2.30.7", False),
        ("2.24", "2.24.3", True),
        ("2.22.3", "2.21.5", True),
        ("2.26.2", "2.24.3", True),
        ("2.29.1", "2.27.7", True),
        ("2.31", "2.30.7", True),
        ("2.12", "2.18.6", True),
    ],
)
def test_between_tags_nearest_older_copy_is_named(version, tag, noted):
    notes = [f for f in validate({"NCCL_PROTO": "shm"}, version) if f.variable == "nccl-version"]
    assert bool(notes) == noted
    if noted:
        assert f"checked with {tag}" in notes[0].message
    assert any(f"NCCL {tag}" in f.message for f in validate({"NCCL_PROTO": "shm"}, version))


def test_algo_elements_per_tag():
    new = validate({"NCCL_ALGO": "ring"}, "2.30.7")[0].message
    old = validate({"NCCL_ALGO": "ring"}, "2.21.5")[0].message
    assert "NVLS" in new and "PAT" in new
    assert "PAT" not in old  # ncclAlgoStr has PAT from 2.23 (init.cc:40)
    off = validate({"NCCL_ALGO": "ring"}, "2.18.6")[0].message.split("topology:")[1]
    assert "all_gather" not in off  # Ring only before 2.21 (tuning.cc:169)


def test_validate_env_signature_and_errors():
    fs = validate_env({"NCCL_PROTO": "shm", "PATH": "/bin"}, "2.30.7")
    assert isinstance(fs[0], Finding) and has_errors(fs)
    assert [f.variable for f in fs] == ["NCCL_PROTO"]
    assert not has_errors(validate_env({"NCCL_DEBUG": "WARN"}, None))
    with pytest.raises(NcclTuningError, match="not a version"):
        validate_env({}, "latest")


@pytest.mark.parametrize(
    "env,version,expected",
    [
        ({"NCCL_PROTOCOL": "LL"}, None, [(E, "NCCL_PROTOCOL")]),
        ({"NCCL_TIMEOUT": "1800"}, None, [(E, "NCCL_TIMEOUT")]),
        ({"NCCL_ASYNC_ERROR_HANDLING": "1"}, None, [(W, "NCCL_ASYNC_ERROR_HANDLING")]),
        ({"NCCL_LL_THRESHOLD": "0"}, None, [(W, "NCCL_LL_THRESHOLD")]),
        ({"NCCL_IB_GDR_LEVEL": "PHB"}, None, [(W, "NCCL_IB_GDR_LEVEL")]),
        ({"NCCL_IB_TIMEOUT": "40"}, None, [(E, "NCCL_IB_TIMEOUT")]),
        ({"NCCL_IB_TIMEOUT": "22"}, None, []),
        (
            {"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"},
            None,
            [(E, "NCCL_NSOCKS_PERTHREAD")],
        ),
        ({"NCCL_P2P_DISABLE": "2"}, None, [(E, "NCCL_P2P_DISABLE")]),
        ({"NCCL_LAUNCH_MODE": "group"}, None, [(E, "NCCL_LAUNCH_MODE")]),
        ({"NCCL_SOCKET_FAMILY": "AF_INET6"}, None, []),
        ({"NCCL_NET": "AWS-OFI"}, None, [(N, "NCCL_NET")]),
        ({"NCCL_DEBUG_FILE": "/tmp/nccl.log"}, None, [(W, "NCCL_DEBUG_FILE")]),
        ({"NCCL_TUNER_PLUGIN": "libtuner.so"}, "2.18.6", [(W, "NCCL_TUNER_PLUGIN")]),
        ({"NCCL_TUNER_PLUGIN": "libtuner.so"}, "2.21.5", []),
        ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}, None, []),
        ({"TORCH_NCCL_DUMP_ON_TIMOUT": "1"}, None, [(W, "TORCH_NCCL_DUMP_ON_TIMOUT")]),
        ({"PATH": "/bin", "OMP_NUM_THREADS": "1"}, None, []),
    ],
)
def test_names_and_documented_ranges(env, version, expected):
    """Names come from the 2.30.7 name list (nccl_tuning/data); variables whose reading code is
    not read per tag keep their documented ranges, read with strtoll like every param."""
    assert one(env, version) == expected


def test_did_you_mean():
    (f,) = validate({"NCCL_PROTOCOL": "LL"})
    assert "did you mean NCCL_PROTO?" in f.message
    (f,) = validate({"NCCL_SOCKET_IFACE": "eth0"})
    assert "did you mean NCCL_SOCKET_IFNAME?" in f.message


def test_debugging_class_is_a_note_outside_production():
    assert one({"NCCL_BUFFSIZE": "8388608"}, production=False) == [(N, "NCCL_BUFFSIZE")]
    assert one({"NCCL_BUFFSIZE": "8388608"}, production=True) == [(W, "NCCL_BUFFSIZE")]


def test_messages_name_variable_value_and_accepted():
    (f,) = validate({"NCCL_NTHREADS": "100"}, "2.30.7")
    assert str(f).startswith("warning NCCL_NTHREADS=100: ignored: ")
    assert "NCCL warns and will use 512" in f.message and "multiples of 32 in 64..512" in f.message


def test_data_files_loaded_as_sets():
    assert len(NAMES) == 245 and "NCCL_PROTO" in NAMES
    assert "NCCL_IB_GDR_LEVEL" in REMOVED and "NCCL_ALGO" in DEBUGGING_CLASS


@pytest.mark.parametrize(
    "text,value,rest",
    [
        ("010", 8, ""),
        ("0x10", 16, ""),
        ("4M", 4, "M"),
        ("08", 0, "8"),
        ("-5", -5, ""),
        (" 12", 12, ""),
        ("0x", 0, "x"),
        ("abc", 0, "abc"),
        ("+7k", 7, "k"),
    ],
)
def test_parse_int_like_strtoll(text, value, rest):
    p = parse_int(text)
    assert (p.value, p.rest) == (value, rest)


def test_newer_and_older_versions_noted():
    assert [f.variable for f in validate({}, "2.31")] == ["nccl-version"]
    assert [f.variable for f in validate({}, "2.8")] == ["nccl-version"]
    with pytest.raises(NcclTuningError, match="not a version"):
        parse_version("latest")
