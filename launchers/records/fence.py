"""Fencing (issue 23): every attempt of a run is a generation, and a write from an older one is
refused.

The generation is the attempt number, kept in one small file of the run dir (`status/generation`:
layout's "generation"). Its one writer is RunDir.write_run_yaml: whenever run.yaml gains an attempt
(a submit, a resume, a restart of the launcher's restart loop, a Slurm requeue recorded by node 0)
the file is replaced atomically with that attempt's number, before any node of it starts (on Slurm:
once node 0 recorded the requeued attempt). It only moves forward.

Every writer that can outlive its attempt (a paused or partitioned node that comes back) checks it
right before it commits: a rank wrapper's exit record and a Slurm node's record (RunDir), the
heartbeat (Watch: a stat of the generation on its first beat, after a pause, and at most once a
PERIOD while it beats on -- a beat is one pwrite), rank 0's part of manifest.json, a checkpoint's
save, manifest and `latest` (launchers.ckptptr, workloads.common). A write from attempt M while the
run is at attempt N > M is refused -- nothing written -- and said in one line, `launch: fenced:
<what> from attempt M refused (the run is at attempt N)`, appended to the run's launcher.log and
written on the writer's stderr (its own log: the rank log of a program, the agent's log of a rank
wrapper). The program is not killed by this: it is stopped by the usual means; a checkpoint writer
gets Fenced (an error in the old rank only). A run dir without the file (made before fencing) is at
attempt 0. Stdlib only (every rank imports it).
"""

from __future__ import annotations

import os
import sys
import time

from .. import layout


class Fenced(RuntimeError):
    """A write from an older attempt was refused (the message is the fenced line)."""


def current(run_dir: str) -> int:
    """The run's generation: the attempt it is at (0 without the file, or when it cannot be
    read)."""
    try:
        with open(layout.path(run_dir, "generation"), encoding="ascii") as f:
            text = f.read().strip()
    except (OSError, ValueError):
        return 0
    return int(text) if text.isdigit() else 0


def newest(attempts: object) -> int | None:
    """The newest attempt of run.yaml's `attempts` (each one's `attempt`, else its place); None
    without one."""
    if not isinstance(attempts, list):
        return None
    found = [a.get("attempt", i) if isinstance(a, dict) else i for i, a in enumerate(attempts)]
    return max((n for n in found if type(n) is int), default=None)


def advance(run_dir: str, attempt: int | None) -> None:
    """The launcher's side: the run is at `attempt` from now on (atomic, durable; never moves
    backwards)."""
    where = layout.own_path(run_dir, "generation")
    if attempt is not None and (attempt > current(run_dir) or not os.path.exists(where)):
        layout.atomic_write(where, f"{attempt}\n")


def line(what: str, mine: int, now: int) -> str:
    return f"launch: fenced: {what} from attempt {mine} refused (the run is at attempt {now})"


def check(run_dir: str, mine: int | None, what: str) -> str | None:
    """The refusal (its line, logged) when attempt `mine` is older than the run's generation; None:
    write. `mine` None (a record without an attempt) is never refused."""
    now = current(run_dir)
    if mine is None or mine >= now:
        return None
    said = line(what, mine, now)
    log(run_dir, said)
    return said


def require(run_dir: str, mine: int | None, what: str) -> None:
    """check(), raising Fenced when refused (a checkpoint writer: the old rank stops with the
    line)."""
    said = check(run_dir, mine, what)
    if said:
        raise Fenced(said)


def from_env(env=None) -> tuple[str, int] | None:
    """(run dir, attempt) of a process that `launch` started (LAUNCH_RUN_DIR, LAUNCH_ATTEMPT); None
    outside."""
    env = os.environ if env is None else env
    run_dir, attempt = env.get("LAUNCH_RUN_DIR"), env.get("LAUNCH_ATTEMPT", "")
    return (run_dir, int(attempt)) if run_dir and attempt.isdigit() else None


def require_env(what: str) -> int | None:
    """require() for this process's run and attempt (from its environment); its attempt, None
    outside a run."""
    mine = from_env()
    if mine is not None:
        require(mine[0], mine[1], what)
    return None if mine is None else mine[1]


def log(run_dir: str, said: str) -> None:
    """The line on stderr and appended to launcher.log (never through a symlink); a failure to log
    is not raised."""
    try:
        sys.stderr.write(said + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        fd = os.open(
            layout.own_path(run_dir, "launcher_log"),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
            0o644,
        )
    except Exception:  # noqa: BLE001 -- a removed run dir, a symlink (LaunchError): nothing to log into
        return
    try:
        os.write(fd, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {said}\n".encode())
    finally:
        os.close(fd)


# seconds: how long a writer that writes on and on goes without looking at the generation
PERIOD = 1.0


class Watch:
    """check() for a writer that writes often (the heartbeat). refused(now) stats the generation
    file on the first write, then only when `now` is PERIOD past the last look (or went backwards),
    and reads it again only when it changed: a write in between costs no system call. A zombie that
    wakes (a paused or partitioned rank: its clock moved on while it slept) looks before its first
    write; one that never stopped writing is refused at most a PERIOD after the generation moved
    (what it wrote meanwhile carries its own, older attempt: the readers of the records -- hang
    detection, the timeline -- keep to the run's attempt). Once refused, every later write is
    refused (said once). refused() without `now` looks every time."""

    def __init__(self, run_dir: str, mine: int, what: str) -> None:
        self.run_dir, self.mine, self.what = run_dir, mine, what
        self.path = layout.path(run_dir, "generation")
        self.seen: tuple[int, int, int] | None = None
        self.refusal: str | None = None
        self.looked: float | None = None  # the `now` of the last look

    def refused(self, now: float | None = None) -> bool:
        if self.refusal is not None:
            return True
        if (
            now is not None
            and self.looked is not None
            and self.looked <= now < self.looked + PERIOD
        ):
            return False
        self.looked = now
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            key = (0, 0, 0)
        if key != self.seen:
            self.seen = key
            self.refusal = check(self.run_dir, self.mine, self.what)
        return self.refusal is not None
