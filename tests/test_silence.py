"""Who is lost (issue 23 item 8: detection that does not cry wolf): launchers.ssh.sshwatch.Silence's
verdicts over the hosts' last-heard times. Pure: stand-in streams with the three times a Prefixed
stream keeps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from launchers.ssh.sshwatch import ALL_QUIET_S, FIRST_WORD_S, LOST_S, Silence

T0 = 1000.0


def silence(*hosts: tuple[float | None, float | None]) -> Silence:
    """hosts: (first word, last word) seconds after T0, None for a host not heard yet."""
    streams = [
        SimpleNamespace(
            heard=first is not None,
            first=T0 + (first or 0),
            last=T0 + (last if first is not None else 0),
        )
        for first, last in hosts
    ]
    s = Silence(streams, [None] * len(streams))
    s.start = T0
    return s


@pytest.mark.parametrize(
    "hosts, at, lost",
    [
        # a running host quiet past LOST_S while another talks: lost
        ([(1, 30), (1, 30 - LOST_S - 1)], 30, [1]),
        ([(1, 30), (1, 30 - LOST_S + 1)], 30, []),
        # everyone quiet alike (a stalled launcher, a machine slowed alike): nobody, until
        # ALL_QUIET_S
        ([(1, 10), (1, 10), (1, 10)], 10 + LOST_S + 5, []),
        ([(1, 10), (1, 10), (1, 10)], 10 + ALL_QUIET_S + 1, [0, 1, 2]),
        # one host alone that stops: the whole-machine rule (nobody else to compare with)
        ([(1, 10)], 10 + LOST_S + 1, []),
        ([(1, 10)], 10 + ALL_QUIET_S + 1, [0]),
        # a host not heard yet while others still arrive: waited for ...
        ([(1, 40), (35, 40), (None, None)], 40, []),
        # ... and lost once FIRST_WORD_S passed since the last one came up, the others talking
        ([(1, 80), (35, 80), (None, None)], 35 + FIRST_WORD_S + 1, [2]),
        # nobody heard yet at all: the start-up of a slow machine, not a lost host, up to
        # ALL_QUIET_S
        ([(None, None), (None, None)], FIRST_WORD_S + 5, []),
        ([(None, None), (None, None)], ALL_QUIET_S + 1, [0, 1]),
    ],
)
def test_verdicts(hosts, at, lost):
    assert sorted(silence(*hosts).verdicts({}, T0 + at)) == lost


def test_an_ended_host_is_not_judged_and_the_reason_says_how_long():
    s = silence((1, 30), (1, 5), (1, 30))
    assert list(s.verdicts({0: "done"}, T0 + 30)) == [1]
    s.conns = [SimpleNamespace(close=lambda: None)] * 3
    ended: dict = {}
    s.check(ended)  # now is real time: every host looks silent alike since T0, far past ALL_QUIET_S
    assert set(ended) == {0, 1, 2} and all(
        v[2].startswith("lost: silent for ") for v in ended.values()
    )


def test_a_proxyjump_hop_is_opened_by_us_with_host_keys_checked(tmp_path):
    """`launch ssh` to a host behind ProxyJump: the jump host's Connection is ours (RejectPolicy,
    our known_hosts), never Fabric's own (AutoAddPolicy); a first hop with its own ProxyJump is
    refused in one line. No network."""
    import paramiko

    from launchers.errors import LaunchError
    from launchers.ssh.hostfile import HostEntry, resolve
    from launchers.ssh.sshconn import SSHSettings, make_connection

    cfg = tmp_path / "cfg"
    cfg.write_text(
        "Host inner\n  HostName 10.9.9.2\n  ProxyJump bob@bastion:2222,mid\nHost bastion\n  "
        "HostName 10.9.9.1\nHost mid\n  HostName 10.9.9.3\nHost loop\n  ProxyJump bad\nHost "
        "bad\n  ProxyJump bastion\n"
    )
    s = SSHSettings(ssh_config=str(cfg), known_hosts=None, identity=None)
    inner = resolve([HostEntry(word="inner", name="inner")], str(cfg))[0]
    c = make_connection(inner, s)
    mid = c.gateway
    assert (
        (mid.host, mid.port) == ("10.9.9.3", 22)
        and (mid.gateway.host, mid.gateway.port, mid.gateway.user) == ("10.9.9.1", 2222, "bob")
        and mid.gateway.gateway is None
    )
    for conn in (c, mid, mid.gateway):
        assert isinstance(conn.client._policy, paramiko.RejectPolicy)
    loop = resolve([HostEntry(word="loop", name="loop")], str(cfg))[0]
    with pytest.raises(LaunchError) as e:
        make_connection(loop, s)
    assert "jump host bad has a ProxyJump of its own" in str(e.value) and "\n" not in str(e.value)
