"""One verified OpenSSH connection to a cluster's login node for one `launch` command (issue 25 item
1).

    ssh_argv(c, line, control)   the `ssh` argv that runs `line` on the login node (pure: golden-tested)
    remote_line(c, words, cwd)   the login node's command line: `words` (its `launch ...`) run by sh in cwd
                                 with LAUNCH_RUNS_ROOT = the cluster's runs root, ended when the connection drops
    explain(c, stderr)           ssh's failure as one line naming the cluster, the hop and the cause
    Session(c)                   a ControlMaster for the command's life (private temp dir, closed at the end):
                                 every remote call of the command goes over this one connection

The route is launchers.ssh.sshmodel's, the one `launch ssh` takes to a host (model(c)): the
cluster's `jump:` hosts (else the login node's ProxyJump in the ssh config), first hop first, then
the login node, each resolved through the same ssh config. Each hop is an `ssh` of its own rendering
its Hop (hop_options): BatchMode=yes, StrictHostKeyChecking=yes, UpdateHostKeys=no (verified, never
asked, never written), UserKnownHostsFile = the hop's known_hosts files (the cluster's known_hosts,
else the ssh config's, else ~/.ssh/known_hosts) with GlobalKnownHostsFile=/dev/null, -i IDENTITY
with IdentitiesOnly, -F SSH_CONFIG, ConnectTimeout and keepalives. The hops are nested ProxyCommands
(`ssh OPTS -W [%h]:%p HOP`), not ProxyJump: OpenSSH passes none of the -o options to a ProxyJump
hop, whose key would then be checked against ~/.ssh/known_hosts under the user's defaults.
"""  # noqa: E501

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time

from ..errors import LaunchError
from .clusters import Cluster
from .hostfile import HostEntry
from .sshmodel import Hop, Route, SSHSettings, route

CONNECT_S = 10  # each hop's ConnectTimeout
ALIVE_COUNT = 2  # keepalives unanswered before ssh gives up: a dead link ends the command in ~10 s
NESTED = (
    "cluster {name}: jump host {{hop}} has its own ProxyJump in the ssh config; accepted: every "
    "hop listed in the cluster's jump: (first hop first)"
)


def model(c: Cluster) -> Route:
    """The cluster's route (launchers.ssh.sshmodel, as `launch ssh` reads a host): its `jump:` hosts
    (else the login node's ProxyJump in the ssh config), then the login node, with the cluster's
    known_hosts, identity, ssh config."""
    s = SSHSettings(
        ssh_config=c.ssh_config, known_hosts=c.known_hosts, identity=c.identity, timeout=CONNECT_S
    )
    return route(c.login_entry, s, jumps=c.jump, nested=NESTED.format(name=c.name))


def files(paths: tuple[str, ...]) -> str:
    """Paths as one ssh option value: ssh splits it at spaces (a path with one is double-quoted) and
    expands %-tokens in it (a literal % doubled)."""
    return " ".join(f'"{p}"' if " " in p else p for p in (p.replace("%", "%%") for p in paths))


def hop_options(hop: Hop, r: Route) -> list[str]:
    """The OpenSSH rendering of one hop of the route (its host key verified, never asked, never
    written)."""
    k = r.keys
    out = [
        "-o",
        "BatchMode=" + ("no" if k.ask else "yes"),
        "-o",
        "StrictHostKeyChecking=" + ("ask" if k.ask else "yes" if k.verify else "no"),
        "-o",
        "UpdateHostKeys=" + ("yes" if k.write else "no"),
        "-o",
        f"ConnectTimeout={math.ceil(hop.timeout)}",
        "-o",
        f"ServerAliveInterval={r.keepalive}",
        "-o",
        f"ServerAliveCountMax={ALIVE_COUNT}",
        "-o",
        f"UserKnownHostsFile={files(hop.known_hosts)}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
    ]
    for key in hop.identities:
        out += ["-i", key.replace("%", "%%")]
    if hop.identities_only:
        out += ["-o", "IdentitiesOnly=yes"]
    if r.ssh_config:
        out += ["-F", r.ssh_config]
    return out


def target(e: HostEntry) -> list[str]:
    return [*(["-p", str(e.port)] if e.port else []), *(["-l", e.user] if e.user else []), e.name]


def hops(c: Cluster) -> list[HostEntry]:
    """The jump hosts, first hop first: the cluster's `jump:`, else the ssh config's ProxyJump of
    the login."""
    return [h.entry for h in model(c).jumps]


def proxy_command(r: Route, through: tuple[Hop, ...]) -> str | None:
    """The ProxyCommand that reaches the next host through `through` (nested: each level's % escaped
    once more, as each ssh expands the tokens of its own ProxyCommand)."""
    if not through:
        return None
    inner = proxy_command(r, through[:-1])
    pc = ["-o", "ProxyCommand=" + inner.replace("%", "%%")] if inner else []
    return shlex.join(
        [
            "ssh",
            *hop_options(through[-1], r),
            *pc,
            "-T",
            "-W",
            "[%h]:%p",
            *target(through[-1].entry),
        ]
    )


def ssh_argv(
    c: Cluster, line: str | None = None, control: str | None = None, master: bool = False
) -> list[str]:
    """ssh to the login node: run `line`, or (master) hold the connection as the ControlMaster at
    `control`."""
    r = model(c)
    pc = proxy_command(r, r.jumps)
    argv = ["ssh", *hop_options(r.dest, r), *(["-o", "ProxyCommand=" + pc] if pc else [])]
    if control:
        argv += [
            "-o",
            f"ControlPath={control}",
            "-o",
            "ControlMaster=" + ("yes" if master else "no"),
        ]
    argv += ["-T", *(["-N"] if master else []), *target(c.login_entry)]
    return argv + ([line] if line is not None else [])


# The login node's side of a call: its `launch` in the background, stdin (the connection) watched:
# when it ends (Ctrl-C here, a dropped link), the login node's launch gets SIGTERM; its own exit
# code is the call's.
WATCH = (
    "exec 3<&0; {cmd} 3<&- & p=$!; {{ while read -r _; do :; done; kill -TERM $p; }} <&3 "
    ">/dev/null 2>&1 & w=$!; exec 3<&-; wait $p; r=$?; kill $w 2>/dev/null; exit $r"
)


def remote_line(
    c: Cluster,
    words: list[str],
    cwd: str | None = None,
    watch: bool = True,
    receive: tuple[str, ...] = (),
) -> str:
    """`launch WORDS` on the login node, in cwd (default: the runs root, so that run names resolve
    there, or / while it does not exist), LAUNCH_RUNS_ROOT set; one `sh -c` word (the login shell
    may be csh). watch: ended when the connection's stdin ends (WATCH; the caller keeps it open),
    else run to its end (a short call whose output is read). receive: variables whose values come
    first on stdin, one base64 line each (secrets: never on a command line nor in a file there),
    exported for launch."""
    root = shlex.quote(c.runs_root)
    go = f"cd {shlex.quote(cwd)} || exit 2" if cwd else f"cd {root} 2>/dev/null || cd /"
    go += "".join(
        f'; IFS= read -r v && {n}=$(printf %s "$v" | base64 -d) && export {n} || exit 2'
        for n in receive
    )
    cmd = " ".join([c.launch, *(shlex.quote(w) for w in words)])
    return "sh -c " + shlex.quote(
        f"{go}; LAUNCH_RUNS_ROOT={root}; export LAUNCH_RUNS_ROOT; "
        + (WATCH.format(cmd=cmd) if watch else f"exec {cmd}")
    )


def shell_line(script: str) -> str:
    return "sh -c " + shlex.quote(script)


# ----------------------------------------------------------------------------------- ssh's failures

CAUSES = (  # ssh's line -> (the host it names, what to say)
    (
        r"No \S+ host key is known for (\S+)",
        "host key unknown (not in {kh}); refusing to connect - verify it and "
        "add it to that file (e.g. ssh-keyscan)",
    ),
    (
        r"Host key for (\S+) has changed",
        "host key CHANGED (not the one in {kh}); refusing to connect",
    ),
    (r"connect to host (\S+ port \d+): (.+)", "unreachable ({1})"),
    (r"Could not resolve hostname (\S+): (.+)", "name does not resolve ({1})"),
    (r"(\S+): Permission denied \((.+)\)", "authentication failed ({1})"),
    (r"Connection to (\S+ port \d+) timed out", "no answer (timed out)"),
    (r"Connection (?:closed|reset) by (\S+ port \d+)", "the connection was closed by the host"),
)


def which_hop(c: Cluster, said: str) -> tuple[str, Hop | None]:
    """(`jump host bastion:2222 (hop 1)` or `login node login1`, its hop) for ssh's
    `[127.0.0.1]:2222`, `h port 22`, `h`; (`host h`, None) for a host not on the route."""
    m = re.fullmatch(r"\[?([^\]\s]+?)\]?(?::(\d+)| port (\d+))?", said)
    host, port = (m.group(1), m.group(2) or m.group(3)) if m else (said, None)
    try:
        r = model(c)
    except LaunchError:
        return f"host {said}", None
    names = [
        *(f"jump host {j.entry.word} (hop {i + 1})" for i, j in enumerate(r.jumps)),
        f"login node {c.login}",
    ]
    for name, h in zip(names, r.hops):
        if host in (h.hostname, h.entry.name) and (port is None or int(port) == h.port):
            return name, h
    return f"host {said}", None


class Unreachable(LaunchError):
    """The login node could not be reached (one line, exit 2, nothing run there); `cause`: the part
    after the cluster's name (`launch list --cluster all` shows it in the cluster's row)."""

    def __init__(self, c: Cluster, cause: str) -> None:
        super().__init__(f"cluster {c.name} (login {c.route}): {cause}; nothing was run")
        self.cause = cause


def explain(c: Cluster, stderr: str) -> Unreachable:
    """ssh's stderr -> the error: the first line of a known kind (CAUSES), naming its hop; else
    ssh's last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for pattern, what in CAUSES:
        for ln in lines:
            m = re.search(pattern, ln)
            if m:
                name, hop = which_hop(c, m.group(1))
                kh = (
                    hop.known_hosts_text if hop else c.known_hosts or "the ssh config's known_hosts"
                )
                return Unreachable(c, f"{name}: {what.format(*m.groups(), kh=kh)}")
    return Unreachable(c, lines[-1] if lines else "ssh failed without a message")


class Session:
    """The command's one connection: a ControlMaster (its socket in a private temp dir) opened by
    open(), reused by every call (argv()), closed by close() -- also when a call failed or Ctrl-C
    came."""

    def __init__(self, c: Cluster) -> None:
        self.c, self.master = c, None
        short = len(tempfile.gettempdir()) < 64  # a unix socket's path: at most 107 bytes
        self.dir = tempfile.mkdtemp(prefix="launch-ssh-", dir=None if short else "/tmp")
        self.sock, self.err = os.path.join(self.dir, "s"), os.path.join(self.dir, "err")

    def open(self, timeout: float) -> "Session":
        """Connect (every hop verified); a failure or no connection within timeout: LaunchError, one
        line."""
        if not shutil.which("ssh"):
            raise LaunchError(
                f"cluster {self.c.name}: no `ssh` client on this machine's PATH; accepted: "
                "OpenSSH's ssh (Debian: apt-get install openssh-client)"
            )
        with open(self.err, "wb") as err:
            self.master = subprocess.Popen(
                ssh_argv(self.c, control=self.sock, master=True),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        end = time.monotonic() + timeout
        while not os.path.exists(self.sock):
            if self.master.poll() is not None or time.monotonic() > end:
                said = open(self.err, encoding="utf-8", errors="replace").read()
                if self.master.poll() is None:
                    said = f"no answer within {timeout:g} s"
                raise explain(self.c, said)
            time.sleep(0.02)
        return self

    def argv(self, line: str) -> list[str]:
        return ssh_argv(self.c, line, control=self.sock)

    def close(self) -> None:
        if self.master is not None and self.master.poll() is None:
            end_ssh(self.master)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def end_ssh(p: subprocess.Popen, grace: float = 5.0) -> None:
    """An ssh of ours ended: SIGTERM, then SIGKILL after `grace` seconds (one that does not end on
    SIGTERM never holds the launch), reaped."""
    p.terminate()
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
