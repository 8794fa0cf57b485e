"""NCCL_SOCKET_IFNAME / NCCL_IB_HCA: values and the devices they select, per NCCL tag, each with its
citation.

The rules were read in NVIDIA/nccl at each tag of ncclsrc.IF_TAGS (2.16.5 and 2.17.1 included;
commits in ../shared/reference/nccl/README.md), never copied: parseStringList / matchIf / matchPort
/ matchIfList in src/misc/utils.cc, the '^' and '=' prefixes of their readers (findInterfaces in
src/misc/socket.cc, 2.30.7 src/os/linux.cc; ncclIbInit in src/transport/net_ib.cc, 2.30.7
src/transport/net_ib/init.cc). Every table row names the line it follows; the validator's messages
must name it too.
"""

import re

import pytest

from nccl_tuning import cmodel as C
from nccl_tuning import ncclsrc as S
from nccl_tuning.validate import validate

V = {S.vstr(t): t for t in S.IF_TAGS}
OLD = ("2.16.5", "2.17.1", "2.18.6", "2.21.5", "2.23.4", "2.24.3", "2.27.7")
ALL = OLD + ("2.30.7",)
UT = "src/misc/utils.cc"


def test_the_if_tags_read():
    assert tuple(V) == ALL
    assert S.IF_TAGS[2:] == S.TAGS  # the other rules keep their tags


@pytest.mark.parametrize("key", sorted(S.IF_CITES))
def test_if_citations_are_well_formed(key):
    c = S.IF_CITES[key]
    assert re.fullmatch(r"src/[a-z_/]+\.(cc|h)", c.file), c.file
    assert c.quote.strip() and "\n" not in c.quote and len(c.quote) <= 120
    assert c.lines and set(c.lines) <= set(S.IF_TAGS)
    for tag in c.lines:
        assert S.cite(key, tag) == f"nccl-{S.vstr(tag)}/{c.file}:{c.lines[tag]}"


# which tags each rule was read at: the readers moved in 2.30.7 (their _30 twins), the parser was
# rewritten in 2.30.7 (if_*_scan -> if_*_tok), the network selection moved in 2.27 (net_disabled_27)
COVER = {
    ALL: (
        "if_parse",
        "if_match",
        "if_port_match",
        "if_empty_all",
        "sock_len",
        "sock_auto",
        "max_ifs",
        "bootstrap_none",
    ),
    OLD: (
        "if_port_scan",
        "if_max_scan",
        "sock_not",
        "sock_exact",
        "sock_match",
        "ib_not",
        "ib_exact",
        "ib_match",
        "ib_ports",
        "ib_none",
        "ib_max",
    ),
    ("2.30.7",): (
        "if_port_tok",
        "if_name_tok",
        "if_max_tok",
        "sock_not_30",
        "sock_exact_30",
        "sock_match_30",
        "sock_running_30",
        "ib_not_30",
        "ib_exact_30",
        "ib_match_30",
        "ib_ports_30",
        "ib_none_30",
        "ib_max_30",
    ),
    OLD[:-1]: ("net_disabled",),
    ("2.27.7", "2.30.7"): ("net_disabled_27",),
}


def test_every_if_rule_is_cited_at_the_tags_it_holds():
    assert sorted(k for keys in COVER.values() for k in keys) == sorted(S.IF_CITES)
    for tags, keys in COVER.items():
        for key in keys:
            assert sorted(S.IF_CITES[key].lines) == sorted(V[t] for t in tags), key
    for key in COVER[OLD]:  # every reader rule exists at 2.30.7 under its twin
        twin = S.if_key(key, V["2.30.7"])
        assert (2, 30, 7) in S.IF_CITES[twin].lines or key.endswith("_scan"), key


# tag: (parser, NCCL_IB_HCA entries read, automatic NCCL_SOCKET_IFNAME order, non-RUNNING skipped)
AUTO = ("ib", "NCCL_COMM_ID's subnet", "^docker,lo", "docker", "lo")
FACTS = {
    "2.16.5": ("scan", 16, AUTO, False),
    "2.17.1": ("scan", 16, AUTO, False),
    "2.18.6": ("scan", 32, AUTO, False),
    "2.21.5": ("scan", 32, AUTO, False),
    "2.23.4": ("scan", 32, AUTO, False),
    "2.24.3": ("scan", 32, AUTO, False),
    "2.27.7": ("scan", 32, AUTO, False),
    "2.30.7": (
        "tok",
        32,
        ("ib", "NCCL_COMM_ID's subnet", "^docker,lo,virbr", "docker", "lo", "virbr"),
        True,
    ),
}


@pytest.mark.parametrize("ver", ALL)
def test_if_facts_per_tag(ver):
    tag = V[ver]
    parser, ib_max, auto, running = FACTS[ver]
    assert S.if_parser(tag) == parser  # if_port_scan / if_port_tok
    assert S.max_ib_devs(tag) == ib_max  # ib_max / ib_max_30
    assert S.MAX_IFS == 16  # max_ifs
    assert S.if_auto(tag) == auto  # sock_auto
    assert S.skips_not_running(tag) == running  # sock_running_30


@pytest.mark.parametrize(
    "version,tag,noted",
    [
        ((2, 16, 5), (2, 16, 5), False),
        ((2, 17, 1), (2, 17, 1), False),
        ((2, 16, 2), (2, 16, 5), True),
        ((2, 15, 5), (2, 16, 5), True),
        ((2, 19, 3), (2, 18, 6), True),
        ((2, 30, 7), (2, 30, 7), False),
    ],
)
def test_if_rules_tag(version, tag, noted):
    got, note = S.if_rules_tag(version)
    assert got == tag and bool(note) == noted


# parseStringList: value -> [(name, port)] with the scanner (<= 2.27.7) and the tokenizer (2.30.7)
PARSE = [
    ("eth0", [("eth0", -1)], [("eth0", -1)]),
    ("eth0,eth1", [("eth0", -1), ("eth1", -1)], [("eth0", -1), ("eth1", -1)]),
    ("mlx5_0:1,mlx5_1", [("mlx5_0", 1), ("mlx5_1", -1)], [("mlx5_0", 1), ("mlx5_1", -1)]),
    ("mlx5_0:", [("mlx5_0", 0)], [("mlx5_0", -1)]),  # atoi("") = 0 vs empty -> -1
    ("mlx5_0:1:2", [("mlx5_0", 1)], [("mlx5_0", 1)]),  # rail ignored / read apart
    (":1,eth0", [("eth0", -1)], [("eth0", -1)]),  # no name: entry dropped
    (",,eth0,,", [("eth0", -1)], [("eth0", -1)]),
    ("x:abc,y", [("x", 0), ("y", -1)], [("x", 0), ("y", -1)]),
    ("x:-1", [("x", -1)], [("x", -1)]),
    ("x: 2", [("x", 2)], [("x", 2)]),  # atoi skips white space
    ("eth0, eth1", [("eth0", -1), (" eth1", -1)], [("eth0", -1), (" eth1", -1)]),
    ("a" * 70, [("a" * 70, -1)], [("a" * 63, -1)]),  # overrun vs cut at 63
    ("", [], []),
]


@pytest.mark.parametrize("value,scan,tok", PARSE)
def test_parse_string_list(value, scan, tok):
    """nccl-2.18.6/src/misc/utils.cc:137 (scanner, port at :150) and
    nccl-2.30.7/src/misc/utils.cc:189 (strtok/strsep, port at :205)."""
    assert C.parse_string_list_scan(value, 16) == scan
    assert C.parse_string_list_tok(value, 16) == tok


def test_parse_string_list_stops_at_max():
    value = ",".join(f"e{i}" for i in range(20))
    for parse in (C.parse_string_list_scan, C.parse_string_list_tok):
        assert [n for n, _ in parse(value, 16)] == [f"e{i}" for i in range(16)]


HCAS = ["mlx5_0:1", "mlx5_1:1", "mlx5_1:2", "mlx5_10:1", "mlx5_11:1", "mlx5_2:1"]
IFS = ["lo", "eth0", "eth1", "eth10", "eth1.100", "ib0", "docker0"]
SIXTEEN = ",".join(f"x{i}" for i in range(16))

# (variable, value, tags it holds at, devices selected, the citation the verdict names at its tag)
N18, IB18, SK18 = (
    "nccl-2.18.6/" + UT,
    "nccl-2.18.6/src/transport/net_ib.cc",
    "nccl-2.18.6/src/misc/socket.cc",
)
SELECTS = [
    (
        "NCCL_IB_HCA",
        "mlx5_1",
        ALL,
        ["mlx5_1:1", "mlx5_1:2", "mlx5_10:1", "mlx5_11:1"],
        f"{N18}:171",
    ),
    ("NCCL_IB_HCA", "=mlx5_1", ALL, ["mlx5_1:1", "mlx5_1:2"], f"{IB18}:184"),
    ("NCCL_IB_HCA", "mlx5_1:1", ALL, ["mlx5_1:1", "mlx5_10:1", "mlx5_11:1"], f"{N18}:176"),
    ("NCCL_IB_HCA", "=mlx5_1:2", ALL, ["mlx5_1:2"], f"{N18}:176"),
    ("NCCL_IB_HCA", "^mlx5_1", ALL, ["mlx5_0:1", "mlx5_2:1"], f"{IB18}:182"),
    (
        "NCCL_IB_HCA",
        "^=mlx5_1",
        ALL,
        ["mlx5_0:1", "mlx5_10:1", "mlx5_11:1", "mlx5_2:1"],
        f"{IB18}:184",
    ),
    (
        "NCCL_IB_HCA",
        "^mlx5_1:2",
        ALL,
        ["mlx5_0:1", "mlx5_1:1", "mlx5_10:1", "mlx5_11:1", "mlx5_2:1"],
        f"{N18}:176",
    ),
    ("NCCL_IB_HCA", "=^mlx5_1", ALL, [], f"{IB18}:215"),
    ("NCCL_IB_HCA", "mlx5_1:", OLD, [], f"{N18}:150"),  # atoi("") = 0
    (
        "NCCL_IB_HCA",
        "mlx5_1:",
        ("2.30.7",),
        ["mlx5_1:1", "mlx5_1:2", "mlx5_10:1", "mlx5_11:1"],
        "nccl-2.30.7/src/misc/utils.cc:205",
    ),
    ("NCCL_IB_HCA", "", ALL, HCAS, f"{N18}:185"),
    ("NCCL_IB_HCA", "=", ALL, HCAS, f"{N18}:185"),
    ("NCCL_IB_HCA", "^", ALL, [], f"{IB18}:252"),
    ("NCCL_IB_HCA", "mlx5_0, mlx5_2", ALL, ["mlx5_0:1"], f"{IB18}:215"),
    ("NCCL_IB_HCA", "MLX5_0", ALL, [], f"{IB18}:215"),  # case-sensitive
    ("NCCL_IB_HCA", "mlx5_0:0", ALL, [], f"{IB18}:204"),  # ports from 1
    ("NCCL_IB_HCA", "mlx5_0:-1", ALL, ["mlx5_0:1"], f"{N18}:176"),
    (
        "NCCL_IB_HCA",
        SIXTEEN + ",mlx5_2",
        ("2.16.5", "2.17.1"),
        [],
        "nccl-2.16.5/src/transport/net_ib.cc:69",
    ),
    ("NCCL_IB_HCA", SIXTEEN + ",mlx5_2", ALL[2:], ["mlx5_2:1"], f"{IB18}:215"),
    ("NCCL_SOCKET_IFNAME", "eth1", ALL, ["eth1", "eth10", "eth1.100"], f"{N18}:171"),
    ("NCCL_SOCKET_IFNAME", "=eth1", ALL, ["eth1"], f"{SK18}:107"),
    (
        "NCCL_SOCKET_IFNAME",
        "^lo,docker",
        ALL,
        ["eth0", "eth1", "eth10", "eth1.100", "ib0"],
        f"{SK18}:105",
    ),
    (
        "NCCL_SOCKET_IFNAME",
        "^=eth1",
        ALL,
        ["lo", "eth0", "eth10", "eth1.100", "ib0", "docker0"],
        f"{SK18}:135",
    ),
    ("NCCL_SOCKET_IFNAME", "eth0:5", ALL, ["eth0"], f"{SK18}:135"),  # matched with port -1
    ("NCCL_SOCKET_IFNAME", "^=", ALL, [], "nccl-2.18.6/src/bootstrap.cc:45"),
    ("NCCL_SOCKET_IFNAME", "ib", ("2.30.7",), ["ib0"], "nccl-2.30.7/src/os/linux.cc:417"),
    ("NCCL_SOCKET_IFNAME", SIXTEEN + ",eth0", ALL, [], "nccl-2.18.6/src/include/socket.h:18"),
]


def _selected(var, value, tag, devices):
    ib = var == "NCCL_IB_HCA"
    limit = S.max_ib_devs(tag) if ib else S.MAX_IFS
    sel = C.if_selector(value, limit, S.if_parser(tag))
    out = []
    for dev in devices:
        name, _, port = dev.partition(":")
        if C.if_selects(sel, name, int(port) if ib else -1):
            out.append(dev)
    return out


@pytest.mark.parametrize("var,value,tags,want,src", SELECTS)
def test_what_a_value_selects(var, value, tags, want, src):
    """The model selects `want` from the devices at every tag listed, and the validator says so
    there (an error when nothing is selected), naming the row's citation at the citation's tag."""
    devices = HCAS if var == "NCCL_IB_HCA" else IFS
    for ver in tags:
        assert _selected(var, value, V[ver], devices) == want, (value, ver)
        found = validate({var: value}, V[ver], devices={var: devices})
        if want:
            assert any(
                f.message.startswith(f"on this node it selects {', '.join(want)} (") for f in found
            ), (value, ver, found)
            assert not any(f.severity == "error" for f in found), found
        else:
            assert any(
                f.severity == "error" and "selects none of this node's" in f.message for f in found
            ), (value, ver, found)
    cited = V[src.split("/")[0][len("nccl-") :]]
    assert cited in [V[v] for v in tags] or cited == V["2.18.6"], src
    found = validate({var: value}, cited, devices={var: devices})
    assert any(src in f.message for f in found), (src, found)


W, E, N = "warning", "error", "note"
# (variable, value, tag, severities in order, the citation the messages name) -- no devices known
VERDICTS = [
    ("NCCL_SOCKET_IFNAME", "eth1", "2.18.6", [N, W], f"{N18}:171"),  # the prefix trap
    ("NCCL_SOCKET_IFNAME", "=eth1", "2.18.6", [N, N], f"{SK18}:107"),
    ("NCCL_SOCKET_IFNAME", "eth0", "2.18.6", [N], f"{N18}:171"),  # no eth00..: no trap
    ("NCCL_SOCKET_IFNAME", "^lo,docker", "2.30.7", [N], "nccl-2.30.7/src/os/linux.cc:385"),
    ("NCCL_SOCKET_IFNAME", "e", "2.30.7", [W], "nccl-2.30.7/src/misc/socket.cc:198"),
    ("NCCL_SOCKET_IFNAME", "", "2.16.5", [W], "nccl-2.16.5/src/misc/socket.cc:350"),
    ("NCCL_SOCKET_IFNAME", "^=", "2.24.3", [N, E], "nccl-2.24.3/src/bootstrap.cc:112"),
    ("NCCL_SOCKET_IFNAME", "=^eth0", "2.27.7", [N, W, N, E], "nccl-2.27.7/src/misc/socket.cc:137"),
    ("NCCL_SOCKET_IFNAME", "eth0:1", "2.21.5", [N, N], "nccl-2.21.5/src/misc/socket.cc:136"),
    ("NCCL_IB_HCA", "mlx5_1", "2.17.1", [N, W], "nccl-2.17.1/src/misc/utils.cc:171"),
    ("NCCL_IB_HCA", "=mlx5_1", "2.17.1", [N, N], "nccl-2.17.1/src/transport/net_ib.cc:183"),
    ("NCCL_IB_HCA", "mlx5_1:", "2.27.7", [N, W, E], "nccl-2.27.7/src/misc/utils.cc:148"),
    ("NCCL_IB_HCA", "mlx5_1:", "2.30.7", [N, N, W], "nccl-2.30.7/src/misc/utils.cc:205"),
    ("NCCL_IB_HCA", "^", "2.23.4", [N, E], "nccl-2.23.4/src/net.cc:576"),
    ("NCCL_IB_HCA", "^", "2.30.7", [N, E], "nccl-2.30.7/src/plugin/net.cc:181"),
    ("NCCL_IB_HCA", "", "2.30.7", [N], "nccl-2.30.7/src/misc/utils.cc:234"),
    ("NCCL_IB_HCA", "mlx5_0:0", "2.21.5", [N, W, E], "nccl-2.21.5/src/transport/net_ib.cc:437"),
    ("NCCL_IB_HCA", "^mlx5_0:0", "2.21.5", [N, W], "nccl-2.21.5/src/transport/net_ib.cc:415"),
    ("NCCL_IB_HCA", "mlx5_0, mlx5_2", "2.24.3", [N, W], "nccl-2.24.3/src/transport/net_ib.cc:577"),
    (
        "NCCL_IB_HCA",
        ",".join(f"hca_{c}" for c in "abcdefghijklmnopq"),
        "2.16.5",
        [N, W],
        "nccl-2.16.5/src/transport/net_ib.cc:69",
    ),
]


@pytest.mark.parametrize("var,value,ver,sevs,src", VERDICTS)
def test_verdicts_without_devices(var, value, ver, sevs, src):
    found = [f for f in validate({var: value}, V[ver]) if f.variable == var]
    assert [f.severity for f in found] == sevs, found
    assert any(src in f.message for f in found), (src, found)


def test_older_versions_say_which_rules_the_lists_use():
    note = [
        f for f in validate({"NCCL_IB_HCA": "=mlx5_0"}, (2, 17, 1)) if f.variable == "nccl-version"
    ]
    assert len(note) == 1 and "NCCL_SOCKET_IFNAME and NCCL_IB_HCA with 2.17.1's" in note[0].message
    assert not [
        f for f in validate({"NCCL_ALGO": "ring"}, (2, 17, 1)) if "NCCL_IB_HCA" in f.message
    ]
