"""How the rank wrapper (launchers.rankexec) starts its program: forked from the node's zygote when
the job keeps one there (--warm-spares: launchers.warmfork's Warm; torch already imported), else a
cold fork + exec of `python -u` (Cold) -- in its own process group, stdout/stderr on the rank's log,
stdin from /dev/null, dying with the wrapper (PR_SET_PDEATHSIG). Stdlib only, and only what Python
itself loads at start-up (os, sys, _signal: signal's enums cost ~5 ms): it sits on every rank's
start-up path."""

from __future__ import annotations

import _signal
import os
import sys

FORWARDED = (
    _signal.SIGTERM,
    _signal.SIGINT,
    _signal.SIGUSR1,
    _signal.SIGUSR2,
    _signal.SIGHUP,
    _signal.SIGQUIT,
)
# util-linux's setpriv sets PR_SET_PDEATHSIG and execs the program (kept across exec): ~1 ms, where
# importing ctypes in the child costs ~10 ms of every rank's start; ctypes where it is missing or
# too old for --pdeathsig (util-linux < 2.33: RHEL 8's setpriv would refuse it, and fail the rank)
SETPRIV = ("/usr/bin/setpriv", "/bin/setpriv")


def setpriv() -> str | None:
    """A setpriv that takes --pdeathsig: its binary names the option (~0.1 ms to read)."""
    for path in SETPRIV:
        try:
            with open(path, "rb") as f:
                if b"pdeathsig" in f.read():
                    return path
        except OSError:
            continue
    return None


def _die_with_parent() -> None:
    import ctypes  # in the forked child only, when no setpriv is there

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _exec(argv: list[str], through: str | None) -> None:
    """exec `python -u <argv>`, set to die with this process's parent (the wrapper): through
    setpriv, when there is one that can."""
    program = [sys.executable, "-u", *argv]
    if through:
        try:
            os.execv(through, [through, "--pdeathsig", "KILL", "--", *program])
        except OSError:
            pass
    _die_with_parent()
    os.execv(sys.executable, program)


class Cold:
    """The program as this wrapper's own child: pid, poll() (its exit code or None), kill_wait()."""

    warm = False

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        done, status = os.waitpid(self.pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if done else None

    def kill_wait(self) -> int:
        os.kill(self.pid, _signal.SIGKILL)
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def spawn(argv: list[str], fd: int, workdir: tuple[str, str] | None = None):
    """The program: forked from the node's zygote when the job has one there (--warm-spares:
    launchers.warmfork; torch already imported), else started cold (cold)."""
    if os.environ.get("LAUNCH_WARM_SOCKET"):
        from ..warmfork import Warm

        env = dict(os.environ)
        if workdir:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (workdir[0], env.get("PYTHONPATH"))))
            env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        child = Warm.spawn(argv, fd, env, workdir[1] if workdir else os.getcwd())
        if child is not None:
            return child
    return Cold(cold(argv, fd, workdir))


def cold(argv: list[str], fd: int, workdir: tuple[str, str] | None = None) -> int:
    """fork + exec of `python -u <argv>` with stdout/stderr on fd, stdin from /dev/null, dying with
    this wrapper; workdir: (the run's snapshot, first on its PYTHONPATH; its cwd, the run's work/).
    Plain fork/exec rather than subprocess: the wrapper sits on every rank's start-up path, and this
    keeps its imports to os/_signal/sys/time (json only once the program has ended)."""
    through = setpriv()
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing here may return into the wrapper's code
        os.setpgid(0, 0)  # its own group: the agent's killpg of the wrapper's group skips it
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        for s in FORWARDED:  # exec resets caught signals to their defaults; be explicit anyway
            _signal.signal(s, _signal.SIG_DFL)
        if workdir:  # --snapshot: the program's tree as frozen at submit, seen from work/
            os.chdir(workdir[1])
            os.environ["PYTHONPATH"] = os.pathsep.join(
                filter(None, (workdir[0], os.environ.get("PYTHONPATH")))
            )
            os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # no __pycache__ into the store
        _exec(argv, through)
    except BaseException as e:  # noqa: BLE001
        os.write(2, f"launch rankexec: cannot start {sys.executable}: {e}\n".encode())
    os._exit(127)
