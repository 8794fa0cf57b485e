"""--warm-spares (issue 37 item 2): a node's torchrun agent and its ranks' programs forked from a
python that has torch imported already, instead of started cold. This is the client side; stdlib
only.

Each node slot of the run's pool (the active nodes and the spares) has a zygote
(launchers.nodeside.zygote): a python of the job's that imported torch once and listens on a Unix
socket in a private directory of the user's (SOCKET_ENV; /tmp/launch-warm-<uid>/<run>-s<slot>.sock).
Two clients use it:
- the node's command, `python -m launchers.warmfork -- python -m torch.distributed.run ...`: the
  agent is forked from the zygote; this process stands in for it (stop signals passed on; it ends as
  the agent ended, with its exit status or its signal);
- the rank wrapper (launchers.rankexec): each program is forked from the zygote (`Warm.spawn`).
A client that finds no zygote (not started yet, still importing torch, gone, refusing) starts its
command cold: warm is never a reason to fail. A forked process's environment, as /proc shows it, is
its own (the zygote keeps room for it), with FORKED_ENV=agent|program: the sweeps, the hang sampler
and `launch cancel` find it as they find a cold one. The zygote's fork that waits for it (the
session) kills its process group when the client goes away, as PR_SET_PDEATHSIG would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import struct
import sys

# the request's writer (receive() reads it) and the two checks, shared with the warm launcher
from .warmclient import peer_uid, private_dir, send  # noqa: F401

SOCKET_ENV = "LAUNCH_WARM_SOCKET"
FORKED_ENV = "LAUNCH_WARM_FORKED"  # agent | program: in the environment of a process forked warm
STOPS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
MAX_REQUEST = 1 << 22


def socket_dir() -> str:
    return f"/tmp/launch-warm-{os.getuid()}"


def socket_path(run_id: str, slot: int) -> str:
    """A node slot's zygote socket (short: a run id of any length fits sun_path)."""
    # here: the warm launcher's client imports this module, and never needs OpenSSL (~3 ms)
    import hashlib

    key = hashlib.sha256(run_id.encode()).hexdigest()[:16]
    return os.path.join(socket_dir(), f"{key}-s{slot}.sock")


def receive(conn: socket.socket, nfds: int) -> tuple[dict, list[int]]:
    """The request and its nfds fds, only from this user (ValueError, OSError: refused; no fd left
    open)."""
    fds: list[int] = []
    try:
        data, fds, _flags, _addr = socket.recv_fds(conn, 65536, nfds)
        if peer_uid(conn) != os.getuid() or len(fds) != nfds or len(data) < 4:
            raise ValueError("refused")
        size = struct.unpack("!I", data[:4])[0]
        if size > MAX_REQUEST:
            raise ValueError("too large")
        body = data[4:]
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("short")
            body += chunk
        return json.loads(body), fds
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise


def accept(conn: socket.socket, nfds: int, check=lambda req: None) -> tuple[dict, list[int]] | None:
    """A server's side of one request: (it, its fds), or None once answered `no` (not this user's,
    malformed, or check(req) raised ValueError/KeyError/TypeError)."""
    conn.settimeout(10)
    try:
        req, fds = receive(conn, nfds)
    except (OSError, ValueError):
        fds = None
    try:
        if fds is not None:
            check(req)
            conn.settimeout(None)
            return req, fds
    except (ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
    with contextlib.suppress(OSError):
        conn.sendall(b"no\n")
    return None


def fork_session(sock: socket.socket, fds: list[int], session) -> None:
    """A server's fork for one accepted request: it runs session() and exits (1 if that raised; it
    never returns into the server's loop); the server closes its copies of the request's fds."""
    if os.fork() == 0:
        code = 0
        try:
            sock.close()
            session()
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)


def request(
    path: str | None, kind: str, argv: list[str], fds: list[int], env: dict[str, str], cwd: str
) -> tuple[socket.socket, int] | None:
    """Ask the zygote at path to fork argv (`python [-u] -m MOD ...` or `python [-u] FILE ...`) with
    fds as its 0, 1, 2, env, cwd and this umask: (the connection, its pid), or None (nothing was
    started: start it cold)."""
    if not path or not private_dir(os.path.dirname(path)):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            raise OSError("not ours")
        s.settimeout(10)
        s.connect(path)
        if peer_uid(s) != os.getuid():  # a listener swapped in: it is sent nothing (env: secrets)
            raise OSError("not ours")
        send(s, {"kind": kind, "argv": argv, "cwd": cwd, "env": env}, fds)
        first = _line(s).split()
        if first[:1] != [b"pid"]:
            raise OSError("refused")
        s.sendall(b"g")  # the go: the zygote's worker runs only once we hold its pid
        s.settimeout(None)
    except OSError:
        s.close()
        return None
    return s, int(first[1])


def _line(s: socket.socket) -> bytes:
    """One line, byte by byte: a buffered read could take the `exit` line after it too (a program
    that ends at once), which read_exit() must find on the socket."""
    line = b""
    while not line.endswith(b"\n") and len(line) < 64:
        chunk = s.recv(1)
        if not chunk:
            break
        line += chunk
    return line


def read_exit(s: socket.socket, block: bool) -> int | None:
    """The forked process's end from its session: its exit code (-N: signal N), None while it runs;
    a session gone without a word reads as SIGKILL."""
    s.setblocking(block)
    try:
        line = b""
        while not line.endswith(b"\n"):
            chunk = s.recv(64)
            if not chunk:
                break
            line += chunk
    except BlockingIOError:
        if not line:
            return None
        s.setblocking(True)
        line += s.recv(64)
    except OSError:
        line = b""
    words = line.split()
    return int(words[1]) if words[:1] == [b"exit"] else -signal.SIGKILL


class Warm:
    """A program forked warm for the rank wrapper: pid, poll() (its exit code or None),
    kill_wait()."""

    warm = True

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid, self.code = conn, pid, None

    @classmethod
    def spawn(cls, argv: list[str], fd: int, env: dict[str, str], cwd: str) -> "Warm | None":
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            got = request(
                env.get(SOCKET_ENV),
                "program",
                [sys.executable, "-u", *argv],
                [null, fd, fd],
                env,
                cwd,
            )
        finally:
            os.close(null)
        return cls(*got) if got else None

    def poll(self) -> int | None:
        if self.code is None:
            self.code = read_exit(self.conn, block=False)
        return self.code

    def kill_wait(self) -> int:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        if self.code is None:
            self.code = read_exit(self.conn, block=True)
        return self.code


def stand_in(argv: list[str]) -> int:
    """The node's command: the agent forked warm, this process ending as it ends; cold (exec)
    without a zygote."""
    got = request(
        os.environ.get(SOCKET_ENV), "agent", argv, [0, 1, 2], dict(os.environ), os.getcwd()
    )
    if got is None:
        os.execv(argv[0], argv)
    conn, pid = got

    def forward(sig, _frame):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)

    for sig in STOPS:
        signal.signal(sig, forward)
    code = read_exit(conn, block=True)
    if code < 0:  # die as the agent died: the backend reads its signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(stand_in(args[1:] if args[:1] == ["--"] else args))
