"""A warm `launch slurm`: a resident copy of the launcher, its modules imported, that runs a submit
in a fresh fork.

What a `launch slurm` submit spends before `sbatch` is mostly the interpreter importing the
launcher, click, yaml and submitit (~130 ms, against ~40 ms of work and ~10 ms of sbatch). So after
a submit run in-process, the launcher leaves a *warm server* behind (a detached process, this
module's `serve`): it imports all of that once and waits on a Unix socket; the next `launch slurm`
(entry.main, before it imports anything else) hands it the command (argv, working directory,
environment, umask and its stdin/stdout/stderr, passed as file descriptors), and the server forks a
worker that runs the command exactly as the launcher would in-process. The client forwards Ctrl-C
and other signals to the worker and exits with its exit status.

What keeps it honest:
  * one server per user, host and code: the socket lies in the user's state dir (`warm/`, 0700, the
    user's), named by the host and a fingerprint of the interpreter, sys.path, the launcher's source
    files (sizes, mtimes), the site directories' mtimes (a package installed or upgraded), the
    user's groups, the PYTHON*/locale environment, the process's namespaces (a client in a container
    is never served outside it) and limits. A server whose files changed on disk exits; the client
    of other code finds no socket.
  * each command runs in a fork of a server that never ran one itself: no state of one launch
    reaches another.
  * the client uses only a socket in a directory that is its own and private, served by a process of
    its own user (SO_PEERCRED, checked before anything is sent), and the server serves only its own
    user; a client whose request was refused or never answered runs the command in-process. Nothing
    runs twice: the worker starts only after the client holds its pid.
  * it idles out after IDLE_S seconds; LAUNCH_WARM=0 neither uses nor leaves one (the tests'
    default).
The client's side is launchers.warmclient (what `launch` runs first, light on imports); this
module is the server's. Stdlib only until the server imports the launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys

from .warmclient import address, enabled, fingerprint, private_dir, run, socket_path  # noqa: F401
from .warmfork import accept, fork_session

IDLE_S = 600
CHECK_S = 5.0  # how often an idle server looks whether its code changed
PRELOAD = (
    "launchers.cli",
    "launchers.api",
    "launchers.runjson",
    "launchers.jobenv",
    "launchers.pipeline",
    "yaml",  # run.yaml's writer (with libyaml's part)
    "launchers.backends.slurm.backend",
    "launchers.backends.slurm.submit",
    "launchers.backends.slurm.task",
    "submitit.slurm.slurm",
)


def spawn() -> None:
    """Leave a warm server behind (detached, its own session); silent when it cannot."""
    import subprocess

    path = socket_path()
    if path is None:
        return
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if private_dir(os.path.dirname(path)):
            subprocess.Popen(
                [sys.executable, "-m", "launchers.warmstart", path, json.dumps(sys.path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                cwd="/",
            )


# ---- the server (`python -m launchers.warmstart SOCKET`, started by spawn()) ----


def serve(path: str) -> None:
    import importlib
    import time

    fp = fingerprint()
    if path != socket_path(fp) or not private_dir(os.path.dirname(path)):
        return
    for name in PRELOAD:
        importlib.import_module(name)
    from .frozen import snaptree

    snaptree.prime()
    import gc

    # what is imported now is never collected: no collection in a worker touches (copies) its pages
    gc.freeze()
    sock = _bind(path)
    if sock is None:
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the socket file goes with the server
    ino = os.stat(path).st_ino
    idle_since = time.monotonic()
    try:
        while True:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                if (
                    time.monotonic() - idle_since > IDLE_S
                    or fingerprint() != fp
                    or not os.path.exists(path)
                ):
                    return
                continue
            idle_since = time.monotonic()
            with conn:
                _accept(sock, conn)
    finally:
        with contextlib.suppress(OSError):
            # still this server's socket file (not a newer server's)
            if os.stat(path).st_ino == ino:
                os.unlink(path)
        sock.close()


def _bind(path: str) -> socket.socket | None:
    """Listen on path; None when another live server holds it. A socket file no server answers is
    replaced."""
    try:
        with address(path) as addr:
            return _listen(path, addr)
    except OSError:
        return None


def _listen(path: str, addr: str) -> socket.socket | None:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(addr)
        return None  # a live server: it serves
    except FileNotFoundError:
        pass
    except ConnectionRefusedError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    finally:
        probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(addr)
        sock.listen(16)
    except OSError:
        sock.close()
        return None
    sock.settimeout(CHECK_S)
    return sock


def _accept(sock: socket.socket, conn: socket.socket) -> None:
    """Read one request (only from this user) and fork its session; a bad one is answered `no`."""
    got = accept(conn, 3)
    if got is None:
        return
    req, fds = got
    # it forks the worker, hands over its pid, its end
    fork_session(sock, fds, lambda: _session(conn, req, fds))


def _session(conn: socket.socket, req: dict, fds: list[int]) -> None:
    r, w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.close(done_r)
        conn.close()
        _worker(req, fds, r, done_w)  # never returns
    os.close(r)
    os.close(done_w)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"pid {pid}\n".encode())
        os.write(w, b"g")
    finally:
        os.close(w)  # without the go the worker exits having run nothing
    # the worker's exit status as it is done, before its (large) process is torn down; from
    # waitpid when it died without saying
    said = os.read(done_r, 8)
    os.close(done_r)
    code = int(said) if said else os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    conn.sendall(f"exit {code if code >= 0 else 128 - code}\n".encode())
    if said:
        os.waitpid(pid, 0)  # reaped once the client has its status


def _worker(req: dict, fds: list[int], go: int, done: int) -> None:
    """The command, run as a fresh `launch` would run it in the client's place."""
    import atexit

    code = 1
    try:
        if os.read(go, 1) != b"g":
            os._exit(1)
        os.close(go)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # SIGPIPE stays ignored, as Python sets it
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.umask(int(req["umask"]))
        sys.argv = list(req["argv"])
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
        from .cli import main

        main()
    except SystemExit as e:
        code = (
            e.code
            if isinstance(e.code, int)
            else (0 if e.code is None else (print(e.code, file=sys.stderr), 1)[1])
        )
    except BaseException as e:  # noqa: BLE001 (shown as the interpreter would show it)
        import traceback

        traceback.print_exc()
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                f.flush()
        code = code & 0xFF if isinstance(code, int) else 1
        with contextlib.suppress(OSError):
            os.write(done, str(code).encode())
        os._exit(code)


if __name__ == "__main__":
    # the client's, its script's directory first (part of the fingerprint)
    sys.path[:] = json.loads(sys.argv[2])
    serve(sys.argv[1])
