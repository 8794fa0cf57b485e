"""SSH connections (paramiko) with verified host keys, opened in parallel, and one-line errors
naming the host.

A Connection is the paramiko rendering of a launchers.ssh.sshmodel Route (the one SSH connection
model: hops, keys, known_hosts, RejectPolicy; the files loaded read-only, never written back). Not
Fabric: its Connection set paramiko's AutoAddPolicy, and importing it (invoke: unittest.mock, yaml,
asyncio) cost ~90 ms of a 4-host fan-out's ~480 ms process (bench/ssh_fanout.py); Connection below
is the part launch used.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import LaunchError, need_extra
from .hostfile import ResolvedHost
from .sshimport import paramiko_module
from .sshmodel import Hop, HostKeys, Route, SSHSettings, route, routes


def make_connection(h: ResolvedHost, s: SSHSettings) -> "Connection":
    """A Connection to h, not opened yet: its Route (launchers.ssh.sshmodel: the ssh config's
    ProxyJump hops, each verified as h is) rendered for paramiko."""
    need_extra("paramiko", "ssh", "SSH to the hosts")
    return connection(route(h, s))


def connection(r: Route) -> "Connection":
    """The paramiko rendering of a Route: a Connection per hop, first hop first, each the gateway of
    the next."""
    conn = None
    for hop in r.hops:
        conn = Connection(hop, r, conn)
    return conn


def key_policy(paramiko, keys: HostKeys):
    """The route's host-key rule in paramiko's words: verified and never asked is RejectPolicy
    (paramiko asks no one; it writes a known_hosts file only when told to save, which launch never
    does)."""
    return paramiko.RejectPolicy() if keys.verify else paramiko.AutoAddPolicy()


class PromptSocket(socket.socket):
    """A TCP socket that sends each write at once (TCP_NODELAY) and acknowledges each read at
    once (TCP_QUICKACK, re-armed before every read: Linux drops it on its own). sshd sets
    TCP_NODELAY only for a session with a pty, so its small packets in a row (a reply, then the exit
    status, EOF and close) wait for our ACK of the first; a delayed ACK made that ~40 ms a round
    trip: a 4-host fan-out of `true` took ~140 ms, ~60 ms with this (bench/ssh_fanout.py).
    OpenSSH's client sets TCP_NODELAY too."""

    def recv(self, n: int, flags: int = 0) -> bytes:
        if QUICKACK is not None:
            self.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        return super().recv(n, flags)


QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only; elsewhere plain delayed ACKs


def tcp(host: str, port: int, timeout: float) -> PromptSocket:
    """A prompt TCP connection to host:port (each of its addresses tried in turn); socket.timeout
    past timeout s, else the last address's OSError (describe() names either)."""
    raw = socket.create_connection((host, port), timeout)
    s = PromptSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class CommandTimedOut(Exception):
    pass


@dataclass
class Result:
    exited: int
    stdout: str
    stderr: str


class Connection:
    """What launch uses of a Fabric Connection (open, run, sftp, close), on paramiko alone:
    importing Fabric (and invoke, which imports unittest.mock, yaml, asyncio) was a third of a
    4-host fan-out's whole process. One hop of a Route (launchers.ssh.sshmodel): its address, port,
    user, keys, timeout and known_hosts files (read-only, RejectPolicy: an unknown or changed key is
    refused, never added); the first hop's ProxyCommand is honoured (as Fabric did), a later hop is
    reached through its gateway, the Connection of the hop before it."""

    def __init__(self, hop: Hop, r: Route, gateway: "Connection | None" = None) -> None:
        paramiko = paramiko_module()

        self.hop, self.route, self.gateway = hop, r, gateway
        self.host, self.port, self.user = hop.hostname, hop.port, hop.user
        self.client, self._sftp = paramiko.SSHClient(), None
        self.client.set_missing_host_key_policy(key_policy(paramiko, r.keys))
        for f in hop.known_hosts:
            if os.path.isfile(f):
                self.client.load_system_host_keys(f)  # read-only

    @property
    def transport(self):
        return self.client.get_transport()

    @property
    def is_connected(self) -> bool:
        t = self.transport
        return t is not None and t.is_active()

    def open(self) -> None:
        if self.is_connected:
            return
        paramiko = paramiko_module()

        sock = None
        if self.gateway is not None:
            self.gateway.open()
            sock = self.gateway.transport.open_channel(
                "direct-tcpip", (self.host, self.port), ("", 0), timeout=self.hop.timeout
            )
        elif self.hop.proxy_command:
            sock = paramiko.ProxyCommand(self.hop.proxy_command)
        else:
            sock = tcp(self.host, self.port, self.hop.timeout)
        self.client.connect(self.host, **self.connect_args(), sock=sock)

    def connect_args(self) -> dict[str, Any]:
        """SSHClient.connect's arguments for this hop (but the socket): its port, user, keys and
        timeouts."""
        h, t = self.hop, self.hop.timeout
        return dict(
            port=self.port,
            username=self.user,
            key_filename=list(h.identities) or None,
            look_for_keys=not h.identities_only,
            allow_agent=not h.identities_only,
            timeout=t,
            banner_timeout=t,
            auth_timeout=t,
        )

    def run(
        self,
        command: str,
        hide: bool = False,
        warn: bool = True,
        in_stream: Any = False,
        out_stream=None,
        err_stream=None,
        pty: bool = False,
        timeout: float | None = None,
    ) -> Result:
        """command on the host (pty: stderr comes on stdout, as on a terminal); its output decoded
        as UTF-8 and kept, also written to out_stream/err_stream when given (else to ours, unless
        hide). The exit status (-1: the connection ended without one); CommandTimedOut (the channel
        closed) past timeout s."""
        import shutil
        import sys

        self.open()
        ch = self.transport.open_session(timeout=self.hop.timeout)
        try:
            if pty:
                cols, rows = shutil.get_terminal_size((80, 24))
                ch.get_pty(width=cols, height=rows)
            ch.exec_command(command)
            out = out_stream if out_stream is not None else (None if hide else sys.stdout)
            err = err_stream if err_stream is not None else (None if hide else sys.stderr)
            errs: list[str] = []
            reader = (
                None
                if pty
                else threading.Thread(target=_drain, args=(ch.recv_stderr, err, errs), daemon=True)
            )
            if reader:
                reader.start()
            outs = _drain(
                ch.recv, out, [], ch, None if timeout is None else time.monotonic() + timeout
            )
            if outs is None:
                raise CommandTimedOut(f"command did not end within {timeout:g} s")
            if reader:
                reader.join()
            return Result(ch.recv_exit_status(), "".join(outs), "".join(errs))
        finally:
            ch.close()

    def sftp(self):
        if self._sftp is None:
            self.open()
            self._sftp = self.client.open_sftp()
        return self._sftp

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
        self.client.close()
        if self.gateway is not None:
            self.gateway.close()


def _drain(recv, sink, kept: list, ch=None, deadline: float | None = None) -> list | None:
    """Read a channel's stream to its end (whole characters: an incremental decoder), each piece
    kept and written to sink; with ch and a deadline, None once the deadline passed."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        if ch is not None:
            if deadline is not None and time.monotonic() > deadline:
                return None
            ch.settimeout(
                None if deadline is None else max(0.01, min(1.0, deadline - time.monotonic()))
            )
        try:
            data = recv(32768)
        except socket.timeout:
            continue
        text = dec.decode(data, final=not data)
        if text:
            kept.append(text)
            if sink is not None:
                sink.write(text)
        if not data:
            return kept


def describe(e: BaseException, h: ResolvedHost, s: SSHSettings) -> str:
    """One line naming the host and what went wrong."""
    paramiko = paramiko_module()

    hop = s.hop(h)
    kh = hop.known_hosts_text
    if isinstance(e, paramiko.BadHostKeyException):
        return (
            f"host {h.label}: host key CHANGED ({e.key.get_name()} {e.key.fingerprint}, expected "
            f"{e.expected_key.fingerprint} from {kh}); refusing to connect"
        )
    if isinstance(e, paramiko.AuthenticationException):
        return (
            f"host {h.label}: authentication failed for user {h.user!r} "
            f"({str(e).strip() or type(e).__name__})"
        )
    if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
        return (
            f"host {h.label}: host key unknown (not in {kh}); refusing to connect - verify it "
            "and add it to known_hosts (e.g. ssh-keyscan), or give --known-hosts"
        )
    if isinstance(e, socket.gaierror):
        return f"host {h.label}: name does not resolve ({e.strerror})"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return (
            f"host {h.label}: unreachable, no answer within the {hop.timeout:g} s connect timeout"
        )
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        return (
            f"host {h.label}: unreachable "
            f"({'; '.join(sorted({x.strerror or str(x) for x in e.errors.values()}))})"
        )
    if isinstance(e, OSError):
        return f"host {h.label}: unreachable ({e.strerror or e})"
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"host {h.label}: {msg}"


def connect_all(hosts: Sequence[ResolvedHost], s: SSHSettings) -> list:
    """Open one Connection per host in parallel; any failure closes them all and raises one
    LaunchError."""
    need_extra("paramiko", "ssh", "SSH to the hosts")
    conns = [connection(r) for r in routes(hosts, s)]

    def one(i: int) -> str | None:
        try:
            conns[i].open()
            conns[i].transport.set_keepalive(conns[i].route.keepalive)
            return None
        except Exception as e:  # noqa: BLE001 - every failure becomes a one-line message naming the host
            return describe(e, hosts[i], s)

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as ex:
        errors = [m for m in ex.map(one, range(len(hosts))) if m]
    if errors:
        close_all(conns)
        raise LaunchError("; ".join(errors))
    return conns


def close_all(conns) -> None:
    for c in conns:
        try:
            c.close()
        except Exception:  # noqa: BLE001
            pass


def run_all(
    conns,
    commands: Sequence[str],
    timeout: float | None = None,
    done: Callable[[int, Any], None] | None = None,
) -> list:
    """Run commands[i] on conns[i] in parallel (no pty, output captured); returns Results or
    exceptions. done(i, result) is called as each host's result comes (per-host progress)."""

    def one(i: int):
        try:
            r = conns[i].run(commands[i], hide=True, warn=True, in_stream=False, timeout=timeout)
        except Exception as e:  # noqa: BLE001
            r = e
        if done is not None:
            done(i, r)
        return r

    with ThreadPoolExecutor(max_workers=max(1, len(conns))) as ex:
        return list(ex.map(one, range(len(conns))))


def put_private(conn, path: str, text: str) -> None:
    """text in a new file on conn's host, made private (0600) before anything is written; over SFTP,
    created exclusively (a file or symlink left there is removed first, never followed)."""
    sftp = conn.sftp()
    try:
        sftp.remove(path)
    except OSError:
        pass
    with sftp.open(path, "wx") as f:
        f.chmod(0o600)
        f.write(text.encode("utf-8"))


def fanout(hosts: Sequence[ResolvedHost], s: SSHSettings, command: str) -> list[int]:
    """Connect to every host in parallel and run `command` on each (the bench's unit of work)."""
    conns = connect_all(hosts, s)
    try:
        return [
            r.exited if not isinstance(r, BaseException) else -1
            for r in run_all(conns, [command] * len(conns))
        ]
    finally:
        close_all(conns)


def get_tree(sftp, remote: str, local: str) -> None:
    """remote's tree copied into local over SFTP (each file whole, through a .part; .tmp files
    left)."""
    try:
        entries = sftp.listdir_attr(remote)
    except OSError:
        return
    os.makedirs(local, exist_ok=True)
    for a in entries:
        r, loc = f"{remote}/{a.filename}", os.path.join(local, a.filename)
        if stat.S_ISDIR(a.st_mode or 0):
            get_tree(sftp, r, loc)
        elif stat.S_ISREG(a.st_mode or 0) and ".tmp" not in a.filename:
            sftp.get(r, loc + ".part")
            os.replace(loc + ".part", loc)
