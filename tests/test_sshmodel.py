"""The one SSH connection model (launchers.ssh.sshmodel, issue 34 item 4): the same ssh config and
destination give one Route whether `launch ssh` (a hostfile's host) or `--cluster` (its login node,
by ProxyJump or `jump:`) asks, and its two renderings agree hop by hop on a 2-hop jump chain --
paramiko's Connections (sshconn) and the OpenSSH argv (clusterssh), read back by `ssh -G` (OpenSSH's
own evaluation of the options and the config; it connects nowhere): address, port, user, keys,
known_hosts, the host-key rule (rejected, never asked, never written). No network."""

from __future__ import annotations

import getpass
import shlex
import subprocess

import paramiko

from launchers.ssh import clusterssh, sshmodel
from launchers.ssh.clusters import Cluster, jump_entry
from launchers.ssh.hostfile import HostEntry, parse_hosts_option, resolve
from launchers.ssh.sshconn import make_connection

CFG = """Host inner
  HostName 10.9.9.2
  ProxyJump bob@bastion:2222,mid
Host bastion
  HostName 10.9.9.1
  UserKnownHostsFile {d}/kh_bastion /dev/null
  ProxyCommand nc %h 2222
Host mid
  HostName 10.9.9.3
  Port 2200
  User carol
  IdentityFile {d}/key_mid
  IdentitiesOnly yes
Host *
  ConnectTimeout 7
"""


def setup(tmp_path, monkeypatch):
    """The ssh config, each hop's host key in the known_hosts file it names (bastion's own file; the
    others ~/.ssh/known_hosts, here under a scratch HOME); the route as `launch ssh` resolves it,
    the cluster of it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / "key_mid").touch()
    key = paramiko.ECDSAKey.generate()
    line = f"{{}} {key.get_name()} {key.get_base64()}\n"
    (tmp_path / "kh_bastion").write_text(line.format("[10.9.9.1]:2222"))
    (tmp_path / ".ssh" / "known_hosts").write_text(
        line.format("[10.9.9.3]:2200") + line.format("10.9.9.2")
    )
    cfg = tmp_path / "cfg"
    cfg.write_text(CFG.format(d=tmp_path))
    s = sshmodel.SSHSettings(ssh_config=str(cfg), timeout=clusterssh.CONNECT_S)
    host = resolve(parse_hosts_option("inner"), str(cfg))[0]
    return s, host, Cluster(name="c", login="inner", runs_root="/r", ssh_config=str(cfg))


def test_one_route_whoever_asks(tmp_path, monkeypatch):
    s, host, c = setup(tmp_path, monkeypatch)
    r = sshmodel.route(host, s)
    explicit = Cluster(
        name="c",
        login="inner",
        runs_root="/r",
        ssh_config=s.ssh_config,
        jump=tuple(jump_entry(w, "test") for w in ("bob@bastion:2222", "mid")),
    )
    assert r == sshmodel.route(HostEntry(word="inner", name="inner"), s) == clusterssh.model(c)
    assert clusterssh.model(explicit) == r == sshmodel.routes([host], s)[0]
    assert [(h.entry.word, h.hostname, h.port, h.user) for h in r.hops] == [
        ("bob@bastion:2222", "10.9.9.1", 2222, "bob"),
        ("mid", "10.9.9.3", 2200, "carol"),
        ("inner", "10.9.9.2", 22, getpass.getuser()),
    ]
    home_kh = (str(tmp_path / ".ssh" / "known_hosts"),)
    assert [h.known_hosts for h in r.hops] == [(str(tmp_path / "kh_bastion"),), home_kh, home_kh]
    assert [(h.identities, h.identities_only) for h in r.hops] == [
        ((), False),
        ((str(tmp_path / "key_mid"),), True),
        ((), False),
    ]
    # the first hop's only
    assert [h.proxy_command for h in r.hops] == ["nc 10.9.9.1 2222", None, None]
    assert {h.timeout for h in r.hops} == {
        10.0
    } and r.keys == sshmodel.HOST_KEYS == sshmodel.HostKeys(verify=True, ask=False, write=False)


def openssh_hops(argv: list[str]) -> list[tuple[list[str], bool]]:
    """Each hop's own ssh words (its options and target; not its ProxyCommand, -T, -W or the
    command) and whether it had a ProxyCommand, first hop first, unnested from the argv's
    ProxyCommands (%% is ssh's own escape)."""
    out, words = [], argv[1:-1]
    while True:
        pc = next((w for w in words if w.startswith("ProxyCommand=")), None)
        drop = {
            i for i, w in enumerate(words) if w in ("-T", "-W", pc) or (i and words[i - 1] == "-W")
        }
        drop |= {i - 1 for i in drop if words[i] == pc}
        out.insert(0, ([w for i, w in enumerate(words) if i not in drop], pc is not None))
        if pc is None:
            return out
        words = shlex.split(pc.removeprefix("ProxyCommand=").replace("%%", "%"))[1:]


def ssh_g(words: list[str]) -> dict[str, list[str]]:
    p = subprocess.run(["ssh", "-G", *words], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    got: dict[str, list[str]] = {}
    for ln in p.stdout.splitlines():
        k, _, v = ln.partition(" ")
        got.setdefault(k, []).append(v)
    return got


def test_paramiko_and_openssh_renderings_agree_hop_by_hop(tmp_path, monkeypatch):
    s, host, c = setup(tmp_path, monkeypatch)
    r, conn, chain = sshmodel.route(host, s), make_connection(host, s), []
    while conn is not None:
        chain.insert(0, conn)
        conn = conn.gateway
    argv = clusterssh.ssh_argv(c, "true")
    hops = openssh_hops(argv)
    assert len(chain) == len(hops) == len(r.hops) == 3
    for k, (conn, (words, through), hop) in enumerate(zip(chain, hops, r.hops)):
        g, args = ssh_g(words), conn.connect_args()
        assert (g["hostname"], g["port"], g["user"]) == (
            [hop.hostname],
            [str(hop.port)],
            [hop.user],
        )
        assert (conn.host, args["port"], args["username"]) == (hop.hostname, hop.port, hop.user)
        # host keys: the same files, checked and refused when unknown, never asked, never written
        assert g["userknownhostsfile"] == [" ".join(hop.known_hosts)] and g[
            "globalknownhostsfile"
        ] == ["/dev/null"]
        said = f"[{hop.hostname}]:{hop.port}" if hop.port != 22 else hop.hostname
        assert conn.client._system_host_keys.lookup(said) is not None  # loaded from those files
        assert isinstance(conn.client._policy, paramiko.RejectPolicy)
        assert (g["stricthostkeychecking"], g["batchmode"], g["updatehostkeys"]) == (
            ["true"],
            ["yes"],
            ["false"],
        )
        # keys and timeouts
        assert (
            (g["identitiesonly"] == ["yes"]) == hop.identities_only == (not args["look_for_keys"])
        )
        assert set(hop.identities) <= set(g["identityfile"]) and (
            args["key_filename"] or []
        ) == list(hop.identities)
        assert g["connecttimeout"] == ["10"] and args["timeout"] == hop.timeout == 10.0
        # the first hop's ProxyCommand is the config's (ssh reads it itself), each later hop goes
        # through the one before
        assert through == (k > 0) == (conn.gateway is not None) == (conn.hop.proxy_command is None)
        assert (k == 0) == ("nc %h 2222" in g.get("proxycommand", []))
    assert (
        [words[-1] for words, _ in hops] == ["bastion", "mid", "inner"]
        and hops[0][0][-5:-1] == ["-p", "2222", "-l", "bob"]
        and argv[-2:] == ["inner", "true"]
    )  # each target as written


def test_the_sites_global_known_hosts_is_read_with_the_users_own_unless_one_file_is_given(
    tmp_path, monkeypatch
):
    """Sites hand out login nodes' keys in /etc/ssh/ssh_known_hosts (OpenSSH reads it): both
    transports read it after the hop's own files; a --known-hosts (a cluster's known_hosts) is the
    only file."""
    s, host, c = setup(tmp_path, monkeypatch)
    site = tmp_path / "ssh_known_hosts"
    site.write_text("")
    monkeypatch.setattr(sshmodel, "GLOBAL_KNOWN_HOSTS", (str(site), str(tmp_path / "absent")))
    hops = sshmodel.route(host, s).hops
    assert [h.known_hosts for h in hops] == [
        (f"{tmp_path}/kh_bastion", str(site)),
        (f"{tmp_path}/.ssh/known_hosts", str(site)),
        (f"{tmp_path}/.ssh/known_hosts", str(site)),
    ]
    assert clusterssh.model(c).hops == hops
    one = sshmodel.SSHSettings(
        ssh_config=s.ssh_config, known_hosts=str(tmp_path / "kh"), timeout=s.timeout
    )
    assert {h.known_hosts for h in sshmodel.route(host, one).hops} == {(str(tmp_path / "kh"),)}
