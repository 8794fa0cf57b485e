"""Hosts for `launch ssh`: a hostfile (`host [slots=N]`, `#` comments; DeepSpeed's format) or
`--hosts a,b`.

A host word is `[user@]name[:port]` (`[v6addr]:port` too). Names are resolved through the ssh config
the way Fabric does it (paramiko's SSHConfig: HostName, User, Port, IdentityFile, ConnectTimeout,
UserKnownHostsFile): `--ssh-config FILE` alone if given, else ~/.ssh/config then
/etc/ssh/ssh_config. The first host is node 0 and the master. Pure apart from reading files; no
network.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import LaunchError, brief, need_extra
from ..options.values import INT_TEXT
from .sshimport import paramiko_module

_NAME = re.compile(r"^[A-Za-z0-9_.%+-]+$")
SYSTEM_SSH_CONFIG = "/etc/ssh/ssh_config"


@dataclass(frozen=True)
class HostEntry:
    word: str  # as written (user@name:port), shown in messages and recorded in run.yaml
    name: str  # the name to look up in ssh config (alias)
    user: str | None = None  # from the word; None = ssh config / current user
    port: int | None = None  # from the word; None = ssh config / 22
    slots: int | None = None
    line: int = 0  # hostfile line (0 = from --hosts)


@dataclass(frozen=True)
class ResolvedHost:
    entry: HostEntry
    hostname: str  # address to connect to (ssh config HostName or the name itself)
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    connect_timeout: float | None = None
    known_hosts_files: tuple[str, ...] = ()
    ssh_options: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        """`sshhost2 (10.216.0.12:22)`: the name a user wrote and where it leads."""
        if self.hostname == self.entry.name:
            return self.hostname if self.port == 22 else f"{self.hostname}:{self.port}"
        return f"{self.entry.name} ({self.hostname}:{self.port})"


def parse_host_word(word: str, where: str) -> tuple[str, str | None, int | None]:
    """`[user@]name[:port]` -> (name, user, port); raises LaunchError naming `where`."""
    w = word.strip()
    user = None
    if "@" in w:
        user, w = w.rsplit("@", 1)
        if not user or not re.match(r"^[A-Za-z0-9_.-]+$", user):
            raise LaunchError(
                f"{where}: bad user in host {brief(word)}; expected [user@]host[:port]"
            )
    port: int | None = None
    if w.startswith("["):
        m = re.match(r"^\[([0-9A-Fa-f:.]+)\](?::(.*))?$", w)
        if not m:
            raise LaunchError(
                f"{where}: malformed host {brief(word)}; expected [user@]host[:port] or "
                "[v6addr]:port"
            )
        w, p = m.group(1), m.group(2)
    elif w.count(":") == 1:
        w, p = w.split(":")
    else:
        p = None  # a name, or a bare IPv6 address (no port)
    if p is not None:
        if not (INT_TEXT.fullmatch(p) and len(p) < 10) or not 1 <= int(p) <= 65535:
            raise LaunchError(
                f"{where}: bad port {brief(p)} in host {brief(word)}; accepted: 1-65535"
            )
        port = int(p)
    if not w or (":" not in w and not _NAME.match(w)):
        raise LaunchError(f"{where}: malformed host {brief(word)}; expected [user@]host[:port]")
    return w, user, port


def parse_hostfile_text(text: str, source: str) -> list[HostEntry]:
    """Parse hostfile text; raises LaunchError for malformed slots, unknown fields, duplicates,
    emptiness."""
    # here: launchers.spec is ~40 ms of an SSH fan-out's imports
    from ..spec import MAX_NODES, MAX_PER_NODE

    entries: list[HostEntry] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        where = f"{source} line {n}"
        name, user, port = parse_host_word(words[0], where)
        slots = None
        for extra in words[1:]:
            key, eq, val = extra.partition("=")
            if key != "slots" or not eq:
                raise LaunchError(f"{where}: unknown field {brief(extra)}; accepted: slots=N")
            if slots is not None:
                raise LaunchError(f"{where}: slots given twice")
            if not (INT_TEXT.fullmatch(val) and len(val) < 10) or not 1 <= int(val) <= MAX_PER_NODE:
                raise LaunchError(
                    f"{where}: malformed {brief(extra)}; expected slots=N with an integer N "
                    f"1-{MAX_PER_NODE}"
                )
            slots = int(val)
        entries.append(
            HostEntry(word=words[0], name=name, user=user, port=port, slots=slots, line=n)
        )
        if len(entries) > MAX_NODES:
            raise LaunchError(
                f"{where}: more than {MAX_NODES} hosts; accepted: at most {MAX_NODES}"
            )
    if not entries:
        raise LaunchError(f"{source} lists no hosts; expected one `host [slots=N]` per line")
    _no_duplicates(entries, source)
    return entries


def read_hostfile(path: str) -> list[HostEntry]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise LaunchError(f"hostfile {path!r} does not exist") from None
    except UnicodeDecodeError as e:
        raise LaunchError(
            f"hostfile {path!r} is not UTF-8 (byte {e.start}); expected lines `host [slots=N]`"
        ) from None
    except OSError as e:
        raise LaunchError(
            f"hostfile {path!r} cannot be read ({e.strerror}); expected a file of lines "
            "`host [slots=N]`"
        ) from None
    return parse_hostfile_text(text, f"hostfile {path!r}")


def parse_hosts_option(hosts: Iterable[str] | str) -> list[HostEntry]:
    """`--hosts a,b,user@c:2222` (or a profile list) -> entries."""
    words = (
        hosts.split(",")
        if isinstance(hosts, str)
        else [w for h in hosts for w in str(h).split(",")]
    )
    entries = []
    for w in words:
        if not w.strip():
            raise LaunchError(
                f"--hosts {','.join(words)!r} has an empty host name; expected host1,host2,..."
            )
        name, user, port = parse_host_word(w, "--hosts")
        entries.append(HostEntry(word=w.strip(), name=name, user=user, port=port))
    if not entries:
        raise LaunchError("--hosts is empty; expected host1,host2,...")
    _no_duplicates(entries, "--hosts")
    return entries


def _no_duplicates(entries: list[HostEntry], source: str) -> None:
    seen: dict[tuple, HostEntry] = {}
    for e in entries:
        key = (e.name.lower(), e.port)
        if key in seen:
            first = seen[key]
            at = f" (lines {first.line} and {e.line})" if e.line else ""
            raise LaunchError(
                f"{source}: host {e.word!r} is listed twice{at}; each host is one node"
            )
        seen[key] = e


def load_ssh_config(path: str | None):
    """A fresh paramiko SSHConfig: `path` only if given (must exist), else ~/.ssh/config +
    /etc/ssh/ssh_config."""
    need_extra("paramiko", "ssh", "SSH to the hosts")
    paramiko = paramiko_module()

    cfg = paramiko.SSHConfig()
    if path:
        if not os.path.isfile(path):
            raise LaunchError(f"--ssh-config {path!r} does not exist")
        paths = [path]
    else:
        paths = [
            p for p in (os.path.expanduser("~/.ssh/config"), SYSTEM_SSH_CONFIG) if os.path.isfile(p)
        ]
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                cfg.parse(f)
        except Exception as e:  # paramiko raises ConfigParseError and friends
            raise LaunchError(
                f"ssh config {p!r} cannot be parsed: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from None
    return cfg


def lookup(cfg, e: HostEntry) -> ResolvedHost:
    """What the parsed ssh config (load_ssh_config) says of one entry; the word's own user and port
    come first."""
    import getpass

    o = cfg.lookup(e.name)
    timeout = o.get("connecttimeout")
    return ResolvedHost(
        entry=e,
        hostname=o.get("hostname", e.name),
        port=e.port or int(o.get("port", 22)),
        user=e.user or o.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in o.get("identityfile", [])),
        connect_timeout=float(timeout) if timeout else None,
        known_hosts_files=tuple(
            os.path.expanduser(p) for p in o.get("userknownhostsfile", "").split() if p
        ),
        ssh_options=dict(o),
    )


def resolve(entries: list[HostEntry], ssh_config_path: str | None) -> list[ResolvedHost]:
    """Resolve names through the ssh config; refuse two entries that lead to the same address and
    port."""
    cfg = load_ssh_config(ssh_config_path)
    out: list[ResolvedHost] = []
    seen: dict[tuple[str, int], ResolvedHost] = {}
    for e in entries:
        r = lookup(cfg, e)
        key = (r.hostname.lower(), r.port)
        if key in seen:
            raise LaunchError(
                f"hosts {seen[key].entry.word!r} and {e.word!r} are the same host "
                f"({r.hostname}:{r.port}); each host is one node"
            )
        seen[key] = r
        out.append(r)
    return out


def hosts_from_options(opts: dict[str, Any]) -> list[HostEntry]:
    """The entries named by --hosts or --hostfile (exactly one of them)."""
    hosts, hostfile = opts.get("hosts"), opts.get("hostfile")
    if hosts and hostfile:
        raise LaunchError("give either --hosts or --hostfile, not both")
    if hostfile:
        return read_hostfile(hostfile)
    if hosts:
        return parse_hosts_option(hosts)
    raise LaunchError(
        "launch ssh needs hosts: --hostfile FILE (lines `host [slots=N]`) or --hosts h1,h2,..."
    )


def avoiding(
    entries: list[HostEntry], avoid: tuple[str, ...], need: int, ledger: str
) -> list[HostEntry]:
    """The hosts less those the site's node ledger quarantined when the run started (`avoid`:
    launchers.ledgers.siteledger); fewer than `need` left (--nodes + --spares): one line naming them
    and the ledger."""
    bad = {h.lower() for h in avoid}
    left = [e for e in entries if e.name.lower() not in bad]
    if len(left) < len(entries) and len(left) < need:
        out = ", ".join(e.word for e in entries if e.name.lower() in bad)
        raise LaunchError(
            f"host(s) {out} quarantined in the node ledger {ledger}: {len(left)} of {len(entries)} "
            f"hosts left, {need} needed (--nodes + --spares); accepted: more hosts (`launch nodes "
            f"--node-ledger {ledger}` says why)"
        )
    return left


def pool_hosts(
    entries: list[HostEntry], nodes: int | None, spares: int
) -> tuple[int, list[HostEntry]]:
    """The hosts of an SSH run's pool (issue 23: launchers.resilience.recovery): slot k is the k-th
    host; the first `nodes` are the nodes, the next `spares` the spares, any further host is not
    used. nodes None (--nodes not given): every host that is not a spare is a node. Returns (nodes,
    the pool's hosts)."""
    if nodes is None:
        nodes = len(entries) - spares
        if nodes < 1:
            raise LaunchError(
                f"--spares {spares} leaves no host for a node ({len(entries)} hosts given); "
                f"accepted: --spares 0-{len(entries) - 1}, or more hosts"
            )
    if nodes + spares > len(entries):
        raise LaunchError(
            f"--nodes {nodes} is more than the {len(entries)} hosts given"
            if not spares
            else f"--nodes {nodes} with --spares {spares} needs {nodes + spares} hosts; "
            f"{len(entries)} given"
        )
    return nodes, entries[: nodes + spares]
