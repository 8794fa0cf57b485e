"""A node slot's zygote for --warm-spares (launchers.warmfork): `python -m launchers.nodeside.zygote
SOCKET SLOT`.

It imports torch (and torchrun) once, then listens on SOCKET; each request (only from its own user)
is forked twice: a session that reports the pid and the end, and the worker, which becomes what a
cold start would have run -- `python [-u] -m MOD args` or `python [-u] FILE args` -- with the
request's fds, environment, cwd and umask. It lives while its stdin is open (the launcher's pipe, or
the SSH session's pty), and ends on SIGTERM/SIGHUP or when its socket file is gone. A node program:
it imports torch, so no module of the launcher imports it (tests/test_layers.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys

from .. import layout
from ..errors import LaunchError
from ..records import fence
from ..warmfork import FORKED_ENV, accept, fork_session, private_dir
from . import procenv

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.run",
    "torch._dynamo",
    "torch.distributed.checkpoint",
    # what a training program imports at its first optimizer step or save anyway
    "numpy.random",
)
FIRST_STEP_WAIT_S = 30.0
FIRST = (
    FORKED_ENV,
    "LAUNCH_RUN_ID",
    "NODE_RANK",
    "LAUNCH_ATTEMPT",
    "RANK",
    "LOCAL_RANK",
    "LAUNCH_RUN_DIR",
)


def main(path: str, slot: str) -> None:
    if (
        procenv.ROOM not in os.environ
    ):  # room in /proc's copy of the environment for a forked process's own
        env = dict(
            os.environ,
            **{procenv.ROOM: procenv.padding(os.environ)},
        )
        os.execve(
            sys.executable, [sys.executable, "-m", "launchers.nodeside.zygote", path, slot], env
        )
    if not private_dir(os.path.dirname(path), make=True) or not _after_first_step(
        os.environ.get("LAUNCH_RUN_DIR")
    ):
        return
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    base = {"path": list(sys.path), "pp": _entries(os.environ.get("PYTHONPATH"))}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    sock.bind(tmp)
    sock.listen(64)
    os.replace(tmp, path)  # ready only once torch is in
    said = _say_ready(slot)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(0))
    ino = os.stat(path).st_ino
    try:
        while True:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            ready, _, _ = select.select([sock, 0], [], [], 1.0)
            # stdin closed: the launcher's gone
            if 0 in ready and not _read(0) or not os.path.exists(path):
                return
            if sock in ready:
                conn, _ = sock.accept()
                with conn:
                    _accept(sock, conn, base)
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == ino:
                os.unlink(path)
        with contextlib.suppress(OSError, TypeError):
            os.unlink(said)


def _say_ready(slot: str) -> str | None:
    """status/warm-slot<S>.json in the run dir (`launch status`: the slot is warm); its path, None
    if not written."""
    try:
        import time

        run_dir = os.environ["LAUNCH_RUN_DIR"]
        target = layout.own_path(run_dir, "warm_slot", slot=int(slot))
        tmp = f"{target}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "slot": int(slot),
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.time(),
                },
                f,
            )
        os.replace(tmp, target)
        return target
    except (KeyError, ValueError, OSError, LaunchError):
        return None


def _after_first_step(run_dir: str | None) -> bool:
    """Wait (at most FIRST_STEP_WAIT_S) until the run's rank 0 reported a step or a restart is under
    way (the run's generation), so that importing torch here does not slow the first attempt's own
    start; False when the launcher went meanwhile (stdin closed)."""
    import time

    deadline = time.monotonic() + FIRST_STEP_WAIT_S
    while (
        run_dir
        and time.monotonic() < deadline
        and not os.path.exists(layout.path(run_dir, "progress", rank=0))
        and not fence.current(run_dir)
    ):
        if select.select([0], [], [], 0.2)[0] and not _read(0):
            return False
    return True


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: the pty's other side closed
        return b""


def _entries(pp: str | None) -> list[str]:
    return [p for p in (pp or "").split(os.pathsep) if p]


def _accept(sock: socket.socket, conn: socket.socket, base: dict) -> None:
    got = accept(conn, 3, lambda req: req.update(run=_program(req["argv"])))
    if got is None:
        return
    req, fds = got
    fork_session(sock, fds, lambda: _session(conn, req, fds, base))


def _program(argv: list) -> tuple[str, str, list[str]]:
    """("module" | "file", its name, its arguments) of `python [-u] -m MOD ...` / `python [-u] FILE
    ...` run by this zygote's own python; ValueError for anything else (the client starts it
    cold)."""
    if not argv or argv[0] != sys.executable:
        raise ValueError("another python")
    rest = [str(a) for a in argv[1:]]
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return "module", rest[1], rest[2:]
    if rest and not rest[0].startswith("-"):
        return "file", rest[0], rest[1:]
    raise ValueError("not a program")


def _session(conn: socket.socket, req: dict, fds: list[int], base: dict) -> None:
    client = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        conn.close()
        _worker(req, fds, r, base)  # never returns
    os.close(r)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"pid {pid}\n".encode())
    conn.settimeout(30)
    try:
        if conn.recv(1) == b"g":  # the client holds the pid: never both this and its cold start
            os.write(w, b"g")
    except OSError:
        pass
    os.close(w)  # without the go the worker exits having run nothing
    conn.settimeout(None)
    code = _wait(conn, pid)
    with contextlib.suppress(OSError):
        conn.sendall(f"exit {code}\n".encode())
        # the rank wrapper waits with sigtimedwait: it wakes at once
        os.kill(client, signal.SIGCHLD)


def _wait(conn: socket.socket, pid: int) -> int:
    """The worker's exit code (-N: signal N); the client gone first (EOF): the worker's group is
    killed."""
    pidfd = os.pidfd_open(pid)
    watch: list = [pidfd, conn]
    try:
        while True:
            ready, _, _ = select.select(watch, [], [])
            if conn in ready and not conn.recv(4096):
                watch = [pidfd]
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(OSError):
                        kill(pid, signal.SIGKILL)
            if pidfd in ready:
                return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    finally:
        os.close(pidfd)


def _stdio() -> None:
    """sys.stdin/stdout/stderr on fds 0, 1, 2; -u: unbuffered, as a cold start's."""
    import io

    for i, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(
            io.FileIO(i, "w", closefd=False),
            write_through=True,
            errors="backslashreplace" if i == 2 else None,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))


def _worker(req: dict, fds: list[int], go: int, base: dict) -> None:
    """What `python -u ...` would do, in this fork: never returns."""
    import runpy

    code: int = 1
    try:
        if os.read(go, 1) != b"g":
            os._exit(1)
        os.close(go)
        how, name = _become(req, fds, base)
        code = 0
        if how == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        code = (
            e.code
            if isinstance(e.code, int)
            else (0 if e.code is None else (print(e.code, file=sys.stderr), 1)[1])
        )
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 (shown as the interpreter shows it)
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        _wind_down(code)


def _become(req: dict, fds: list[int], base: dict) -> tuple[str, str]:
    """This fork made the requested program's process, as a cold `python -u` start would be: its own
    process group, stdio on the given fds, default signals (SIGINT: KeyboardInterrupt), the
    request's environment (in libc and in /proc/<pid>/environ), cwd, umask, sys.path and argv ->
    (how it runs: "module" or "path", the name)."""
    os.setpgid(0, 0)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    for sig in (
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGCHLD,
    ):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    env = dict(req["env"], **{FORKED_ENV: req["kind"]})
    os.environ.clear()
    os.environ.update(env)
    procenv.rewrite(env, FIRST)
    os.chdir(req["cwd"])
    os.umask(int(req["umask"]))
    _stdio()
    how, name, args = req["run"]
    first = os.getcwd() if how == "module" else os.path.dirname(os.path.realpath(name))
    rest = [p for p in base["path"][1:] if p not in base["pp"]]
    sys.path[:] = [first, *_entries(env.get("PYTHONPATH")), *rest]
    sys.argv = [name, *args]
    return how, name


def _wind_down(code: int) -> None:
    """The interpreter's end, as `python` ends: non-daemon threads joined, atexit run, stdio
    flushed, then exit with the code (a KeyboardInterrupt's, code < 0: by SIGINT). Never returns."""
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        threading._shutdown()
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            f.flush()
    if code < 0:  # KeyboardInterrupt: the interpreter ends by SIGINT
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    finally:
        os._exit(0)  # at once: an interpreter holding torch takes ~1 s to wind down
