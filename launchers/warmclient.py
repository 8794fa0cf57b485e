"""The warm launcher's client (launchers.warmstart is its server): what `launch slurm` runs first,
before anything else is imported, to hand the command to the user's warm server.

Only modules the interpreter has already or that are small C modules are imported here: no re,
json, socket, signal, enum or contextlib (the Python wrappers of _socket, _signal and _json, which
cost a served submit ~15 ms of its ~80, against ~6 ms for sbatch itself). The request is the JSON
document warmfork.send writes (written with _json's string encoder, read with json.loads), its
stdin/stdout/stderr passed as file descriptors (SCM_RIGHTS). The rules that keep it honest are
warmstart's (its module doc): the socket lies in the user's private state dir, named by a
fingerprint of the code and the interpreter's state; a server of another user gets nothing; a
client that is refused or not answered runs the command in-process.
"""

from __future__ import annotations

import _json
import _signal
import _socket
import os
import resource
import stat
import sys

from .frozen.statcache import state_dir

MAX_PATH = 104  # sun_path is 108 bytes with its NUL; a longer path goes through /proc/self/fd
# a client in a container is not served outside it
NAMESPACES = ("mnt", "pid", "net", "uts", "user", "ipc")
LIMITS = (
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_NPROC,
    resource.RLIMIT_AS,
    resource.RLIMIT_CORE,
    resource.RLIMIT_STACK,
)
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)


def enabled() -> bool:
    return os.environ.get("LAUNCH_WARM", "1") != "0"


def fingerprint() -> str:
    """What a server's imported code and interpreter state depend on (warmstart's module doc)."""
    try:
        # not hashlib: its OpenSSL would cost every client ~3 ms
        from _blake2 import blake2b as digest
    except ImportError:
        from hashlib import blake2b as digest
    h = digest(digest_size=20)
    env = sorted(
        (k, v) for k, v in os.environ.items() if k.startswith(("PYTHON", "LC_")) or k == "LANG"
    )
    h.update(
        repr(
            (
                sys.executable,
                sys.path,
                tuple(sys.flags),
                os.getuid(),
                os.getgid(),
                sorted(os.getgroups()),
                env,
                [_readlink(f"/proc/self/ns/{n}") for n in NAMESPACES],
                [resource.getrlimit(r) for r in LIMITS],
            )
        ).encode()
    )
    for p in sys.path:  # a package installed, upgraded or removed changes its site dir
        if os.path.basename(p) in ("site-packages", "dist-packages"):
            try:
                h.update(f"{p}:{os.stat(p).st_mtime_ns}".encode())
            except OSError:
                pass
    stack = [os.path.dirname(os.path.abspath(__file__))]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in sorted(it, key=lambda e: e.name):
                if e.name.endswith(".py") and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    h.update(f"{e.path}:{st.st_size}:{st.st_mtime_ns}".encode())
                elif e.is_dir(follow_symlinks=False) and e.name != "__pycache__":
                    stack.append(e.path)
    return h.hexdigest()[:20]


def _readlink(p: str) -> str:
    try:
        return os.readlink(p)
    except OSError:
        return ""


_mine: list[str | None] = []  # this client's socket path: run() and spawn() walk the package once


def socket_path(fp: str | None = None) -> str | None:
    if fp is None and _mine:
        return _mine[0]
    p = os.path.join(state_dir(), "warm", f"{os.uname().nodename}-{fp or fingerprint()}.sock")
    p = p if len(os.fsencode(os.path.basename(p))) <= MAX_PATH - 24 else None
    if fp is None:
        _mine.append(p)
    return p


class address:
    """`with address(path) as addr`: path as a socket address that fits sun_path -- itself, or, in a
    deep state dir, the same file reached through /proc/self/fd/N of its directory (open while the
    caller binds or connects)."""

    def __init__(self, path: str) -> None:
        self.path, self.fd = path, None

    def __enter__(self) -> str:
        if len(os.fsencode(self.path)) <= MAX_PATH:
            return self.path
        self.fd = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{self.fd}/{os.path.basename(self.path)}"

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)


def private_dir(d: str, make: bool = False) -> bool:
    """d is a real directory of this user's that no one else may enter (made so when make and
    missing)."""
    if make:
        try:
            os.mkdir(d, 0o700)
        except OSError:
            pass
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def peer_uid(s) -> int:
    """The uid of the process at the other end of a connected Unix socket (SO_PEERCRED: pid, uid,
    gid as three ints)."""
    cred = s.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[4:8], sys.byteorder, signed=True)


def to_json(v) -> str:
    """The JSON text json.dumps writes for a request's values (str, int, lists and str-keyed dicts
    of them), ASCII with every other character escaped as json.dumps does."""
    if isinstance(v, str):
        return _json.encode_basestring_ascii(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(to_json(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{to_json(str(k))}: {to_json(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"not a request value: {type(v).__name__}")


def send(s, req: dict, fds: list[int]) -> None:
    """warmfork.send's message (a 4-byte length, then the JSON request with this process's umask)
    with fds attached (warmfork.receive reads it)."""
    mask = os.umask(0)
    os.umask(mask)
    body = to_json(dict(req, umask=mask)).encode()
    data = len(body).to_bytes(4, "big") + body
    rights = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
    sent = s.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
    s.sendall(data[sent:])


class Lines:
    """Lines read from a socket as they come."""

    def __init__(self, s) -> None:
        self.s, self.buf = s, b""

    def next(self) -> list[bytes]:
        """The next line's words ([] at the end or on an error)."""
        while b"\n" not in self.buf:
            try:
                chunk = self.s.recv(256)
            except OSError:
                return []
            if not chunk:
                return []
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.split()


def run(argv: list[str]) -> int | None:
    """Run `argv` in the warm server: its exit status; None when there is none to use or it refused
    the command (nothing ran: run it in-process)."""
    path = socket_path()
    if path is None or not private_dir(os.path.dirname(path)):
        return None
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            s.close()
            return None
        with address(path) as addr:
            s.connect(addr)
        # whoever swapped a directory in between gets nothing (env: secrets)
        if peer_uid(s) != os.getuid():
            s.close()
            return None
        send(s, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
    except OSError:
        s.close()
        return None
    lines = Lines(s)
    first = lines.next()
    if first[:1] != [b"pid"]:
        s.close()
        return None
    return _wait(s, lines, int(first[1]))


def _wait(s, lines: Lines, pid: int) -> int:
    """Forward signals to the worker until it ends; its exit status."""

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except OSError:
            pass

    for sig in FORWARDED:
        _signal.signal(sig, forward)
    last = lines.next()
    s.close()
    if last[:1] == [b"exit"]:
        return int(last[1])
    print(
        f"launch: error: the warm launcher's worker (pid {pid}) ended without an exit status; "
        "see `launch list` for what it submitted",
        file=sys.stderr,
    )
    return 1
