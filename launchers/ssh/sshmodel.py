"""The one SSH connection model (issue 34 item 4): what a destination resolves to, read from the ssh
config once. Both transports render it: launchers.ssh.sshconn (paramiko: `launch ssh`, its node
checks, `launch cancel`, doctor) and launchers.ssh.clusterssh (OpenSSH subprocesses: `--cluster`'s
login node, which needs OpenSSH's ControlMaster). The same host gets the same hops, address, port,
user, keys, known_hosts and host-key rule from both.

    settings(opts)              --known-hosts/--identity/--connect-timeout checked -> SSHSettings
    route(dest, s, jumps)       the Route to dest (an entry, or a host hostfile.resolve read already): its jump
                                hosts, first hop first, then dest, each a Hop; the ssh config parsed
                                at most once
    routes(hosts, s)            a Route per host, one parse of the ssh config for them all

The rules, each in this one place:
- host keys (HOST_KEYS): verified against the hop's known_hosts files only -- --known-hosts (a
  cluster's known_hosts) alone, else the ssh config's UserKnownHostsFile less /dev/null, else
  ~/.ssh/known_hosts, and with either the site's /etc/ssh/ssh_known_hosts (root's: where sites hand
  out login nodes' keys; OpenSSH reads it too) -- an unknown or changed key refused, never asked,
  never written. paramiko: RejectPolicy, the files loaded read-only; OpenSSH: BatchMode=yes,
  StrictHostKeyChecking=yes, UpdateHostKeys=no, UserKnownHostsFile=those files,
  GlobalKnownHostsFile=/dev/null.
- jump hosts: the ones given (a cluster's `jump:`), else the destination's ProxyJump in the ssh
  config, first hop first, each resolved through the same ssh config and verified as any host; a
  first hop with a ProxyJump of its own is refused (one ProxyJump line lists every hop). Only the
  first hop's ProxyCommand is honoured; each later hop is reached through the one before (paramiko:
  a direct-tcpip channel; OpenSSH: a nested ProxyCommand `ssh -W`, never ProxyJump, which would give
  a hop none of these options).
- keys: --identity (a cluster's identity) alone, else the ssh config's IdentityFile, with the agent
  and the default keys unless the ssh config says IdentitiesOnly.
- timeouts: --connect-timeout (a cluster: 10 s), else the ssh config's ConnectTimeout, else 10 s;
  keepalive 5 s.
Pure apart from reading the ssh config (paramiko's SSHConfig, as hostfile reads it); no network.
"""  # noqa: E501

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import LaunchError
from .hostfile import HostEntry, ResolvedHost, load_ssh_config, lookup, parse_host_word

DEFAULT_TIMEOUT = 10.0
KEEPALIVE_S = 5
# read with the user's own files unless --known-hosts is given
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts",)
NESTED = (
    "host {dest}: jump host {hop} has a ProxyJump of its own in the ssh config; accepted: one "
    "ProxyJump line listing every hop, first hop first"
)


@dataclass(frozen=True)
class HostKeys:
    """How a host's key is taken: checked against the hop's known_hosts files (verify; unknown or
    changed: refused), never asked about (ask), never written to a file (write)."""

    verify: bool = True
    ask: bool = False
    write: bool = False


HOST_KEYS = HostKeys()


@dataclass(frozen=True)
class Hop:
    """One host of a route, as the transports connect to it."""

    host: ResolvedHost  # what the ssh config says of it; host.entry: the word as written
    known_hosts: tuple[str, ...]  # the only files its key is checked against (read-only)
    identities: tuple[str, ...]  # the private keys offered
    identities_only: bool  # those alone: no agent, no default keys
    timeout: float  # connect (and banner, auth) timeout, seconds
    proxy_command: str | None = None  # the ssh config's ProxyCommand (the route's first hop only)

    @property
    def entry(self) -> HostEntry:
        return self.host.entry

    @property
    def hostname(self) -> str:
        return self.host.hostname

    @property
    def port(self) -> int:
        return self.host.port

    @property
    def user(self) -> str:
        return self.host.user

    @property
    def known_hosts_text(self) -> str:
        """The files, as the messages name them: `a or b`."""
        return " or ".join(self.known_hosts)


@dataclass(frozen=True)
class Route:
    """The jump hosts, first hop first, then the destination; the ssh config they were read from
    (None: ~/.ssh/config and /etc/ssh/ssh_config); the host-key rule and keepalive every hop
    gets."""

    hops: tuple[Hop, ...]
    ssh_config: str | None = None
    keys: HostKeys = HOST_KEYS
    keepalive: int = KEEPALIVE_S

    @property
    def jumps(self) -> tuple[Hop, ...]:
        return self.hops[:-1]

    @property
    def dest(self) -> Hop:
        return self.hops[-1]


@dataclass(frozen=True)
class SSHSettings:
    ssh_config: str | None = None
    # None: the host's UserKnownHostsFile, else ~/.ssh/known_hosts; + the global
    known_hosts: str | None = None
    identity: str | None = None  # None: the host's IdentityFile
    timeout: float | None = None  # None: ssh config ConnectTimeout, else DEFAULT_TIMEOUT

    def known_hosts_for(self, h: ResolvedHost) -> list[str]:
        if self.known_hosts:
            return [self.known_hosts]
        files = [f for f in h.known_hosts_files if f != "/dev/null"] or [
            os.path.expanduser("~/.ssh/known_hosts")
        ]
        return files + [g for g in GLOBAL_KNOWN_HOSTS if os.path.isfile(g) and g not in files]

    def timeout_for(self, h: ResolvedHost) -> float:
        return float(self.timeout or h.connect_timeout or DEFAULT_TIMEOUT)

    def hop(self, h: ResolvedHost, first: bool = True) -> Hop:
        """h as a hop of a route (first: the route's first hop, the one its ProxyCommand may
        reach)."""
        only = bool(self.identity) or str(option(h, "identitiesonly") or "no").lower() == "yes"
        return Hop(
            host=h,
            known_hosts=tuple(self.known_hosts_for(h)),
            identities=(self.identity,) if self.identity else h.identity_files,
            identities_only=only,
            timeout=self.timeout_for(h),
            proxy_command=option(h, "proxycommand") if first else None,
        )


def settings(opts: dict[str, Any]) -> SSHSettings:
    """The SSH options of `launch ssh` and `launch doctor --hosts/--hostfile`, checked (files
    present, timeout)."""
    for key, flag in (("known_hosts", "--known-hosts"), ("identity", "--identity")):
        if opts.get(key) and not os.path.isfile(opts[key]):
            raise LaunchError(f"{flag} {opts[key]!r} does not exist")
    t = opts.get("connect_timeout")
    if t is not None and (
        isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 600
    ):
        raise LaunchError(f"--connect-timeout {t!r} is not accepted; expected seconds in (0, 600]")
    return SSHSettings(
        ssh_config=opts.get("ssh_config"),
        known_hosts=opts.get("known_hosts"),
        identity=opts.get("identity"),
        timeout=float(t) if t else None,
    )


def option(h: ResolvedHost, key: str) -> str | None:
    """The ssh config's value of key for h; None when unset or `none`."""
    v = str(h.ssh_options.get(key, "")).strip()
    return None if not v or v.lower() == "none" else v


def proxy_jump(h: ResolvedHost) -> list[HostEntry]:
    """h's ProxyJump hops from the ssh config, first hop first, as entries (`[user@]host[:port]`
    each)."""
    out, jump = [], option(h, "proxyjump")
    for word in [w.strip() for w in jump.split(",")] if jump else []:
        name, user, port = parse_host_word(word, f"host {h.label}: the ssh config's ProxyJump")
        out.append(HostEntry(word=word, name=name, user=user, port=port))
    return out


class Config:
    """One ssh config, parsed on first use (a route without jump hosts needs no parse beyond
    hostfile's)."""

    def __init__(self, path: str | None) -> None:
        self.path, self.parsed = path, None

    def lookup(self, e: HostEntry) -> ResolvedHost:
        if self.parsed is None:
            self.parsed = load_ssh_config(self.path)
        return lookup(self.parsed, e)


def route(
    dest: HostEntry | ResolvedHost,
    s: SSHSettings,
    jumps: Sequence[HostEntry] = (),
    nested: str = NESTED,
    config: Config | None = None,
) -> Route:
    """The Route to dest: through `jumps` when given, else dest's ProxyJump hops. A first hop with a
    ProxyJump of its own: LaunchError(nested, formatted with dest's label and the hop's word)."""
    config = config or Config(s.ssh_config)
    if isinstance(dest, HostEntry):
        dest = config.lookup(dest)
    through = list(jumps) or proxy_jump(dest)
    hosts = [*(config.lookup(e) for e in through), dest]
    if through and option(hosts[0], "proxyjump"):
        raise LaunchError(nested.format(dest=dest.label, hop=through[0].word))
    return Route(
        hops=tuple(s.hop(h, first=i == 0) for i, h in enumerate(hosts)), ssh_config=s.ssh_config
    )


def routes(hosts: Sequence[ResolvedHost], s: SSHSettings) -> list[Route]:
    config = Config(s.ssh_config)
    return [route(h, s, config=config) for h in hosts]
