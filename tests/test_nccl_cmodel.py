"""nccl_tuning.cmodel against recorded NCCL verdicts (tests/data/nccl_verdicts.json; see
tests/nccl_verdicts.py).

The verdicts were established by compiling NCCL's own C parsers and comparing them with cmodel on
1,200 seeded values per parser and tag (all 40,744 agreed). NCCL's code is no longer copied or built
here: the agreement is kept as tables of inputs and verdicts, and these tests check that cmodel
still gives every recorded verdict and that the tables still reach every branch of cmodel that the
whole generated set reaches.
"""

import pytest

import nccl_verdicts as V
from nccl_tuning import cmodel
from nccl_tuning import ncclsrc as S

TABLES = V.load()
KEYS = [V.key(k, t) for t in S.TAGS for k in V.kinds(t)]


def split(key):
    kind, ver = key.split("/")
    return kind, tuple(int(x) for x in ver.split("."))


def test_every_parser_and_tag_has_a_table():
    assert sorted(TABLES) == sorted(KEYS)
    assert all(len(TABLES[k]) >= V.FIRST for k in KEYS), {k: len(TABLES[k]) for k in KEYS}


@pytest.mark.parametrize("key", KEYS)
def test_cmodel_gives_the_recorded_verdicts(key):
    kind, tag = split(key)
    bad = [
        (v, want, V.verdict(kind, tag, v))
        for v, want in TABLES[key]
        if V.verdict(kind, tag, v) != want
    ]
    assert not bad, bad[:5]


@pytest.mark.parametrize("key", KEYS)
def test_tables_reach_every_branch_the_generated_values_reach(key):
    """A table that lost a branch-reaching value (or a cmodel change that opened a branch no
    recorded value reaches) fails here: re-read NCCL's code for that branch before recording new
    verdicts."""
    kind, tag = split(key)
    have = set().union(*(V.arcs(kind, tag, v) for v, _ in TABLES[key]))
    gen = set().union(*(V.arcs(kind, tag, v) for v in V.generated(kind, tag)))
    assert gen <= have, sorted(gen - have, key=str)[:5]


@pytest.mark.parametrize(
    "kind,tag,value,want",
    [
        # NCCL's own words for the cases people type (each verdict one recorded from NCCL's code)
        ("proto", (2, 30, 7), "simple", "0 " + " ".join(["0 0 1"] * 5)),
        ("proto", (2, 30, 7), "^LL128", "0 " + " ".join(["1 0 1"] * 5)),
        ("proto", (2, 24, 3), "shm", "5"),  # unknown element: init fails
        ("algo", (2, 24, 3), ":", "SIG11"),  # first entry only ':' -> NULL dereference
        ("algo", (2, 23, 4), "ring,foo", "0 0 1 0 0 0 0 0"),  # <= 2.23: unknown tokens skipped
        ("int", (2, 30, 7), "010", "8"),  # strtoll base 0: octal
        ("int", (2, 30, 7), "0x10", "16"),
        ("int", (2, 30, 7), "9223372036854775808", "-2"),  # ERANGE -> default
        ("int", (2, 30, 7), "", "-2"),
        ("int", (2, 30, 7), "12abc", "12"),  # trailing characters ignored
        ("nthreads", (2, 30, 7), "100", "512 640"),  # not a multiple of 32 -> max
        ("nthreads", (2, 30, 7), "32", "64 160"),  # below min -> min
        ("nthreads", (2, 30, 7), "0", "256 640"),  # <= 0 -> default
        ("subsys", (2, 30, 7), "INIT,foo", "X"),  # 2.30: one unknown name rejects the value
        ("subsys", (2, 27, 7), "^ALL", "0"),
        ("level", (2, 30, 7), " info ", "3"),  # 2.30: trimmed, case-insensitive
        ("level", (2, 30, 7), "INF", "-1"),
    ],
)
def test_named_cases(kind, tag, value, want):
    assert V.verdict(kind, tag, value) == want


@pytest.mark.parametrize("tag", [t for t in S.TAGS if t < (2, 30, 7)], ids=S.vstr)
@pytest.mark.parametrize(
    "value,level",
    [
        # src/debug.cc (e.g. 2.27.7:49-61): strcasecmp on the whole value; no trimming
        ("INFO", 3),
        ("info", 3),
        ("Warn", 2),
        ("VERSION", 1),
        ("ABORT", 4),
        ("TRACE", 5),
        (" INFO", None),
        ("INFO ", None),
        ("", None),
        ("VERBOSE", None),
        ("INF", None),
    ],
)
def test_debug_level_old_table(tag, value, level):
    """ncclDebugInit's level chain up to 2.27 (not a separable function): a table with its source
    lines."""
    assert S.debug_levels(tag) == ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
    i = cmodel.debug_level_old(value, S.debug_levels(tag))
    assert (None if i is None else i + 1) == level


@pytest.mark.parametrize("tag", S.TAGS, ids=S.vstr)
@pytest.mark.parametrize(
    "value,want",
    [
        # src/graph/paths.cc ncclGetLevel: strcmp against the names; first char a digit -> strtol,
        # clamped, levelsOldToNew
        ("SYS", "SYS"),
        ("PHB", "PHB"),
        ("nvl", None),
        ("NVL ", None),
        ("", None),
        ("FAST", None),
        ("0", "LOC"),
        ("1", "PIX"),
        ("2", "PXB"),
        ("3", "PHB"),
        ("4", "SYS"),
        ("5", "SYS"),
        ("9", "SYS"),
        ("2x", "PXB"),
        ("08", "LOC"),
        (" 2", None),
        ("-1", None),
    ],
)
def test_path_level_table(tag, value, want):
    names = S.path_levels(tag)
    got = cmodel.get_level(value, names, S.LEGACY_LEVELS)
    assert (names[got] if isinstance(got, int) else got) == want
