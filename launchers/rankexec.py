"""Per-rank wrapper that torchrun starts: `python -m launchers.rankexec -- <program> <args...>`.

It appends the rank's stdout/stderr to <run dir>/logs/node<K>/rank<R>.log after a header line naming
the attempt, runs the program as a child in its own process group (it dies with the wrapper:
PR_SET_PDEATHSIG), passes stop signals on and records how the rank ended in status/rank<R>.json,
with why when it can tell (launchers.node.rankcause: the exception line of its traceback, an OOM
kill). A secret the job names (--secret, or an env secret still ***: secretenv.NAMES_ENV) that is
not set or is *** refuses the start: one line, exit 2. Stdlib only: it costs a few milliseconds per
rank.

Stop signals (issue: a program must get each stop exactly once): the agent's stop reaches only this
wrapper (the program is in another process group), which passes each kind of signal on once. A
signal that a Slurm step daemon sent to every process of the step (it reached the program directly)
is not passed on again. After SIGINT/SIGTERM/SIGHUP/SIGQUIT the program has LAUNCH_STOP_GRACE
seconds (default 30) to end; then it is killed and the record says so (`killed_after_grace`). The
record of a program that ended after such a stop names it (`stopped_by`, also when a Slurm step
daemon sent it): that end is the stop's, never the rank's own failure
(launchers.diagnosis.firstfail: whatever made the stop goes first, however the program ended on it).
A program stopped by SIGSTOP is continued with its stop, as scancel does. A program that a hang's
stop SIGKILLed first (it is named hung in hang/attempt<A>/stop.json) is recorded `ended_as: hung`.
USR1/USR2 (checkpoint requests) start no grace. A SIGTERM is passed on as LAUNCH_STOP_SIGNAL when
the job set one (--stop-signal SIGINT: Python programs get KeyboardInterrupt).
"""

from __future__ import annotations

import _signal
import os
import sys
import time

from . import layout
from .errors import LaunchError
from .node import rankcause
from .node.rankchild import FORWARDED, spawn

# rank 0's wrapper writes the node's part of manifest.json this long into its program's run (or as
# it ends): reading every package's metadata (~70 ms of CPU) would slow the ranks' start
MANIFEST_AFTER_S = 10.0
GRACE_STARTERS = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT)
DEFAULT_GRACE_S = 30.0


def broadcast(sender: int) -> bool:
    """Whether a signal came from a Slurm step daemon, which signals every process of the step: the
    program got it directly then."""
    try:
        with open(f"/proc/{sender}/comm", "rb") as f:
            return f.read().strip() == b"slurmstepd"
    except OSError:
        return False


def signame(sig: int) -> str:
    """SIGTERM for 15: signal's enums only once they are needed (importing them costs ~5 ms, on
    every rank's start when done first)."""
    import signal

    return signal.Signals(sig).name


def stopped(pid: int) -> bool:
    """Whether the program is stopped by a signal (state T; not t, a debugger's)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] == b"T"  # the state letter follows "(comm) "


class Later:
    """Work the wrapper does once, `after` seconds into its program's run (signals stay blocked
    meanwhile: sigtimedwait takes them after), or as it ends (run() again: nothing)."""

    def __init__(self, after: float, work) -> None:
        self.due, self.work = time.monotonic() + after, work

    def run(self) -> None:
        work, self.work = self.work, None
        if work:
            work()

    def wait_s(self, left: float) -> float:
        return left if self.work is None else max(0.0, min(left, self.due - time.monotonic()))


def supervise(
    child, grace: float, term_as: int = _signal.SIGTERM, later: Later | None = None
) -> tuple[int, float | None, int | None]:
    """Wait for the program, passing each kind of stop signal on once (a SIGTERM as `term_as`);
    (exit code, grace if it was killed, the stop signal it was given before it ended:
    GRACE_STARTERS' first, passed on or broadcast to it -- an end that followed a stop is the
    stop's, not a failure of the rank's own). later: run when it is due, while the program runs."""
    waited = {*FORWARDED, _signal.SIGCHLD}
    delivered: set[int] = set()
    deadline = stop = None
    pid = child.pid
    while True:
        if (code := child.poll()) is not None:
            return code, None, stop
        left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        info = _signal.sigtimedwait(waited, later.wait_s(left) if later else left)
        if later and deadline is None and time.monotonic() >= later.due:  # (in a stop: at the end)
            later.run()
        if info is None:
            if deadline is not None and time.monotonic() >= deadline:
                return child.kill_wait(), grace, stop
            continue
        sig = info.si_signo
        if sig == _signal.SIGCHLD or sig in delivered:
            continue
        if sig in GRACE_STARTERS and stop is None:
            # it ended before the stop reached it: its own end
            if (code := child.poll()) is not None:
                return code, None, None
            stop = sig
        # one stop, whatever its kind
        delivered.update(GRACE_STARTERS if sig in GRACE_STARTERS else (sig,))
        try:
            if not broadcast(info.si_pid):
                os.kill(pid, term_as if sig == _signal.SIGTERM else sig)
            # a stopped program (SIGSTOP: a hang) cannot act on
            if sig in GRACE_STARTERS and stopped(pid):
                os.kill(pid, _signal.SIGCONT)  # its stop: continued, as scancel does
        except ProcessLookupError:
            pass
        if sig in GRACE_STARTERS and deadline is None:
            deadline = time.monotonic() + grace


def bind(env) -> dict:
    """--cpu-bind (LAUNCH_CPU_BIND): this rank's CPU set from its node's plan (launchers.cpubind),
    applied to the wrapper before the program is forked (it inherits it); the record's fields.
    LaunchError: refused."""
    from . import cpubind  # stdlib only, a millisecond

    mode = env.get("LAUNCH_CPU_BIND") or "none"
    first, _, every = (
        env.get("LAUNCH_CPU_BIND_SLOT") or f"0/{env.get('LOCAL_WORLD_SIZE', '1')}"
    ).partition("/")
    # SLOT: nodes sharing a machine
    sets = cpubind.node_plan(mode, int(every), env) if mode != "none" else []
    rec = {"cpu_bind": mode}
    if sets:
        mine = sets[int(first) + int(env.get("LOCAL_RANK", "0"))]
        cpubind.check_allowed(mine, os.sched_getaffinity(0))
        os.sched_setaffinity(0, mine)
        rec.update(mempolicy=cpubind.MEMPOLICY, cpus_note=cpubind.sharing(sets))
    rec["cpus"] = cpubind.format_cpulist(os.sched_getaffinity(0))  # the CPUs the program may run on
    return rec


def snapshot_dir(env) -> str | None:
    """--snapshot (LAUNCH_SNAPSHOT_DIR): where the program runs; LaunchError when this node cannot
    see it."""
    d = env.get("LAUNCH_SNAPSHOT_DIR")
    if d and not os.path.isdir(d):
        raise LaunchError(
            f"its snapshot {d} is not on this node; accepted: a runs root on storage every node "
            "shares, or --no-snapshot"
        )
    return d or None


def work_dir(run_dir: str, snap: str) -> str:
    """--snapshot: the program's cwd, <run dir>/work: the snapshot's directories made there and its
    files (and links) linked to, so relative reads see the frozen tree and relative writes land in
    the run, never in the store (issue 35). Every rank of every node does it (the same result,
    whoever comes first); a link of an earlier snapshot (a resume --snapshot) is pointed at this
    one, the program's own files are kept."""
    work = layout.own_path(run_dir, "work")
    for d, dirs, files in os.walk(snap):
        here = os.path.normpath(os.path.join(work, os.path.relpath(d, snap)))
        if os.path.islink(here) or os.path.isfile(here):
            continue  # the program made something else of it: its own
        os.makedirs(here, exist_ok=True)
        for n in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            target, at = os.path.join(d, n), os.path.join(here, n)
            try:
                os.symlink(target, at)
            except FileExistsError:
                old = os.readlink(at) if os.path.islink(at) else target
                if old != target and old.startswith(os.path.dirname(snap) + os.sep):
                    os.symlink(target, f"{at}.new{os.getpid()}")
                    os.replace(f"{at}.new{os.getpid()}", at)
    return work


def auto_backend(env, run_dir: str, node: int, attempt: int, fd: int) -> tuple[str | None, dict]:
    """--dist-backend auto, settled on this node before the program starts (launchers.nodebackend):
    the job's verdict in the rank log; (None, {}) when the program may start (its
    LAUNCH_DIST_BACKEND set), else (why not, the exit record's fields). A node that has its GPUs in
    a job that stops starts nothing and waits for the stop."""
    from . import nodebackend

    _signal.pthread_sigmask(_signal.SIG_BLOCK, set(GRACE_STARTERS))
    stop: list[int] = []

    def wait(seconds: float) -> bool:
        info = _signal.sigtimedwait(GRACE_STARTERS, seconds)
        if info is not None:
            stop.append(info.si_signo)
        return info is not None

    try:
        v = nodebackend.settle(
            run_dir,
            env,
            node,
            attempt,
            int(env.get("NNODES") or 1),
            int(env.get("LOCAL_RANK") or 0),
            wait,
        )
    except (OSError, LaunchError, ValueError) as e:
        why = f"--dist-backend auto: node {node} cannot decide: {e}"
        v = nodebackend.Verdict(None, why, {node: why})
    if v.backend:  # said by the launcher (nodebackend.Teller) and `launch status`
        env.update(nodebackend.program_env(v.backend, run_dir))
        return None, {}
    if node in v.failed:  # this node's own failure (kind gpus: the node's fault)
        return v.failed[node], {"reason": v.failed[node], **({"kind": v.kind} if v.kind else {})}
    if not stop:
        os.write(
            fd, f"launch: --dist-backend auto: {v.line}; this node waits for the stop\n".encode()
        )
        wait(nodebackend.WAIT_S)
    if stop:
        return "not started: " + v.line, {"stopped_by": signame(stop[0])}
    return v.line, {"reason": v.line}


def node_manifest(run_dir: str, attempt: int) -> None:
    """Global rank 0, MANIFEST_AFTER_S into its program's run (or as it ends): the node's part of
    manifest.json (launchers.records.manifest); a failure is one line on stderr (the agent's log),
    never the rank's end."""
    try:
        from .records import manifest

        manifest.add_node_part(run_dir, attempt)
    except Exception as e:  # noqa: BLE001
        os.write(2, f"launch rankexec: rank 0: manifest.json not completed: {e}\n".encode())


def record(run_dir: str, rec: dict) -> None:
    # only now: nothing but os/_signal/sys/time before the program
    from .records.rundir import RunDir

    try:
        RunDir(run_dir).write_rank_record(rec)
    except OSError as e:  # a full disk: say so, keep the program's exit status
        os.write(
            2,
            f"launch rankexec: cannot write the exit record of rank {rec['rank']}: {e}\n".encode(),
        )


def ended_as(run_dir: str, attempt: int, rank: int, code: int) -> dict:
    """{"ended_as": "hung"} for a program that a hang's stop SIGKILLed first
    (launchers.hang.watch.end_hung: its rank is named in hang/attempt<A>/stop.json), else {}."""
    if code != -_signal.SIGKILL:
        return {}
    stop = layout.read_json(layout.path(run_dir, "hang_stop", attempt=attempt)) or {}
    hung = stop.get("hung_ranks")
    return {"ended_as": "hung"} if isinstance(hung, list) and rank in hung else {}


def refuse(fd: int, run_dir: str, base: dict, why) -> int:
    """The program is not started: one line in the rank log and on stderr, the exit record; the rank
    exits 2."""
    line = f"launch rankexec: rank {base['rank']}: {why}\n".encode()
    os.write(fd, line)
    os.write(2, line)
    record(
        run_dir, dict(base, time=time.time(), pid=None, error=str(why), exit_code=2, signal=None)
    )
    return 2


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -m launchers.rankexec -- <program> [args...]", file=sys.stderr)
        return 2
    env = os.environ
    rank, node = int(env.get("RANK", "0")), int(env.get("NODE_RANK", "0"))
    attempt = int(env.get("LAUNCH_ATTEMPT", "0"))
    run_dir = env.get("LAUNCH_RUN_DIR") or os.getcwd()
    log, fd = open_log(run_dir, node, rank)
    if fd < 0:
        return 2
    base = dict(rank=rank, node=node, attempt=attempt)
    bound, refused, workdir = prepare(env, run_dir)
    cpus = f"cpu-bind {bound['cpu_bind']}: CPUs {bound['cpus']} | " if "mempolicy" in bound else ""
    header = (
        f"===== launch attempt {attempt} | rank {rank} of {env.get('WORLD_SIZE', '?')} | node "
        f"{node} | {cpus}{layout.stamp()} =====\n"
    )
    os.write(fd, header.encode())
    # this attempt's part of the log begins here (O_APPEND: the end)
    start = os.lseek(fd, 0, os.SEEK_CUR)
    extra = {"reason": refused} if isinstance(refused, str) else {}
    if refused is None and env.get("LAUNCH_DIST_BACKEND") == "auto":  # decided here, on the node
        refused, extra = auto_backend(env, run_dir, node, attempt, fd)
    if refused is not None:
        return refuse(
            fd, run_dir, dict(base, cpu_bind=env.get("LAUNCH_CPU_BIND"), **extra), refused
        )
    # taken with sigtimedwait below
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {*FORWARDED, _signal.SIGCHLD})
    oom = rankcause.OomWatch()  # the cgroup's oom_kill counter before the program runs
    child = spawn(argv, fd, workdir)
    os.close(fd)
    # rank 0: the node's part of manifest.json, once the start-up's CPU is the program's
    later = Later(MANIFEST_AFTER_S, lambda: node_manifest(run_dir, attempt)) if rank == 0 else None
    code, killed, stop = supervise(
        child,
        float(env.get("LAUNCH_STOP_GRACE") or DEFAULT_GRACE_S),
        getattr(_signal, env.get("LAUNCH_STOP_SIGNAL") or "SIGTERM", _signal.SIGTERM),
        later,
    )
    if later:  # a program that ended sooner: now
        later.run()
    ended = time.time()  # before any import: the records' order is the failures' order
    from .records.rundir import exit_fields

    rec = dict(base, time=ended, pid=child.pid, **exit_fields(code), **bound)
    if child.warm:  # forked from the node's zygote (--warm-spares)
        rec["warm"] = True
    if stop is not None:  # ended on a stop (launchers.diagnosis.firstfail: never a first failure)
        rec["stopped_by"] = signame(stop)
    # why
    rec.update({"killed_after_grace": killed} if killed else rankcause.cause(code, log, start, oom))
    rec.update(ended_as(run_dir, attempt, rank, code))
    record(run_dir, rec)
    return die_as(code)


def prepare(env, run_dir: str) -> tuple[dict, object, tuple[str, str] | None]:
    """Before the program starts -> (its CPU binding, what refuses the start -- the line why a
    secret does (a str: the record's reason too), a refused CPU set or snapshot (an exception) -- or
    None, (the run's snapshot, its work dir) with --snapshot)."""
    # a secret not given (or ***) is never handed to the program
    from .credentials import NAMES_ENV

    if env.get(NAMES_ENV):  # (secretenv and its patterns imported only for a job with secrets)
        from .credentials.secretenv import unusable

        if (why := unusable(env)) is not None:
            return {}, why, None
    try:
        bound, workdir = bind(env), snapshot_dir(env)
        return bound, None, workdir and (workdir, work_dir(run_dir, workdir))
    except Exception as e:  # noqa: BLE001  -- LaunchError (a refused set, no snapshot) or sched_setaffinity's
        return {}, e, None


def open_log(run_dir: str, node: int, rank: int) -> tuple[str, int]:
    """The rank's log, opened to append -> (its path, the fd); fd -1 when it cannot be (said in one
    line), never through a symlink out of the run dir, never recreating a removed run dir."""
    try:
        log = layout.own_path(run_dir, "rank_log", node=node, rank=rank)
        layout.present(run_dir)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        return log, os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    except (LaunchError, OSError) as e:
        os.write(2, f"launch rankexec: rank {rank}: cannot open its log: {e}\n".encode())
        return "", -1


def die_as(code: int) -> int:
    """The program's exit code back; a signal's death (code < 0) died again the same way, so that
    torchrun reports the signal."""
    if code < 0:
        if -code not in (_signal.SIGKILL, _signal.SIGSTOP):
            _signal.signal(-code, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
