"""Hostfile / --hosts parsing and ssh-config resolution (pure logic, no network)."""

import pytest

from launchers.errors import LaunchError
from launchers.ssh.hostfile import (
    hosts_from_options,
    parse_host_word,
    parse_hostfile_text,
    parse_hosts_option,
    resolve,
)


def test_hostfile_format():
    text = """# cluster
worker-1 slots=8
  alice@worker-2:2222 slots=8   # trailing comment

10.0.0.3
[fe80::1]:22
"""
    es = parse_hostfile_text(text, "hf")
    assert [(e.name, e.user, e.port, e.slots, e.line) for e in es] == [
        ("worker-1", None, None, 8, 2),
        ("worker-2", "alice", 2222, 8, 3),
        ("10.0.0.3", None, None, None, 5),
        ("fe80::1", None, 22, None, 6),
    ]
    assert es[1].word == "alice@worker-2:2222"


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "lists no hosts"),
        ("# only a comment\n\n", "lists no hosts"),
        ("a\nb\na slots=2\n", "host 'a' is listed twice (lines 1 and 3)"),
        ("a slots=x\n", "malformed 'slots=x'"),
        ("a slots=0\n", "malformed 'slots=0'"),
        ("a slots=\n", "malformed 'slots='"),
        ("a gpus=2\n", "unknown field 'gpus=2'"),
        ("a slots=1 slots=2\n", "slots given twice"),
        ("a:99999\n", "bad port '99999'"),
        ("a:\n", "bad port ''"),
        ("@a\n", "bad user"),
        ("a/b\n", "malformed host 'a/b'"),
    ],
)
def test_hostfile_errors(text, words):
    with pytest.raises(LaunchError) as ei:
        parse_hostfile_text(text, "hostfile 'hf'")
    msg = str(ei.value)
    assert words in msg and "\n" not in msg and msg.startswith("hostfile 'hf'")


def test_hosts_option():
    es = parse_hosts_option("gpu1,root@gpu2:2200")
    assert [(e.name, e.user, e.port) for e in es] == [("gpu1", None, None), ("gpu2", "root", 2200)]
    assert [e.name for e in parse_hosts_option(["a", "b,c"])] == ["a", "b", "c"]
    for bad, words in (("a,,b", "empty host name"), ("a,a", "listed twice"), ("a,b:x", "bad port")):
        with pytest.raises(LaunchError, match=words):
            parse_hosts_option(bad)
    assert parse_host_word("u@h:22", "x") == ("h", "u", 22)


def test_hosts_from_options(tmp_path):
    with pytest.raises(LaunchError, match="needs hosts"):
        hosts_from_options({})
    with pytest.raises(LaunchError, match="not both"):
        hosts_from_options({"hosts": ["a"], "hostfile": "x"})
    with pytest.raises(LaunchError, match="does not exist"):
        hosts_from_options({"hostfile": str(tmp_path / "nope")})


def test_resolve_through_ssh_config(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        "Host gpu*\n  User bob\n  Port 2022\n  IdentityFile ~/k\n  ConnectTimeout 3\n  "
        "UserKnownHostsFile /x/known\nHost gpu1\n  HostName 10.1.1.1\nHost gpu2\n  HostName "
        "10.1.1.1\n"
    )
    a, b = resolve(parse_hosts_option("gpu1,carol@gpu3:23"), str(cfg))
    assert (a.hostname, a.port, a.user, a.connect_timeout, a.known_hosts_files) == (
        "10.1.1.1",
        2022,
        "bob",
        3.0,
        ("/x/known",),
    )
    assert a.identity_files[0].endswith("/k") and not a.identity_files[0].startswith("~")
    assert (b.hostname, b.port, b.user) == ("gpu3", 23, "carol")
    assert a.label == "gpu1 (10.1.1.1:2022)"
    with pytest.raises(LaunchError, match="are the same host"):
        resolve(parse_hosts_option("gpu1,gpu2"), str(cfg))
    with pytest.raises(LaunchError, match="--ssh-config .* does not exist"):
        resolve(parse_hosts_option("gpu1"), str(tmp_path / "missing"))
