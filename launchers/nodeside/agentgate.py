"""A node's torchrun agent, started early (launchers.backends.earlyagent): `python -m
launchers.nodeside.agentgate torch.distributed.run` (the module it will run, on its command line:
the sweeps find an agent there), started by `launch local` as it starts (before it has parsed its
flags) or once it planned, or by a Slurm node's task as it starts, in the environment the node's
agent will have as far as it is known then.

It imports what torchrun imports (torch: about a second) while the launcher parses, plans, checks
the nodes' python, writes the run dir and opens the agent log (the Slurm task: imports, meets its
peers) -- work that kept the agent from starting, where now the agent's import takes the time. It
waits on its stdin (the launcher's or the task's pipe) for the go: one JSON line with the node's
command (argv, environment) and its agent log, which becomes its stdout and stderr (what it printed
meanwhile, normally nothing, goes there first). Then it becomes the node's agent:
  - the same python running `-m torch.distributed.run`, the preload done, and an environment that
    differs from the one it started with only in what is read after the start
    (procenv.same_start): it runs the module here, as `python -m` would, with the node's environment
    -- in libc's and in what /proc shows (procenv.rewrite: the sweeps and `launch cancel` find it by
    its run's tag);
  - anything else: it execs the command itself, a cold start in this process (same pid, session).
EOF without a go (the launch refused, the launcher gone) ends it at once, having started nothing.
A node program (it imports torch), so no launcher module imports it.
"""

import json
import os
import sys
import threading

from launchers.nodeside import procenv

MODULE = "torch.distributed.run"
# what torch.distributed.run imports at its top, and what its agent imports before it starts the
# ranks (not the module itself: runpy runs that as __main__, as `python -m` does)
PRELOAD = (
    "torch",
    "torch.distributed.argparse_util",
    "torch.distributed.launcher.api",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
)


def warm(started: dict, argv: list, env: dict) -> bool:
    """Whether this process can become argv with env: the same python and module, and env differs
    from the environment it started with only in what is read later (procenv.same_start)."""
    return argv[:3] == [sys.executable, "-m", MODULE] and procenv.same_start(started, env)


def fd_inheritable(fd: int) -> bool:
    """Whether fd came from the launcher (this process opens its own close-on-exec); a cold agent
    started by subprocess (close_fds) inherits only 0-2."""
    try:
        return os.get_inheritable(fd)
    except OSError:  # the listing's own, closed already
        return False


def listen(said: list, go: threading.Event) -> None:
    """The launcher's line, or EOF: this process ends, nothing started."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(0, 1 << 16)
        if not chunk:
            os._exit(0)
        data += chunk
    said.append(json.loads(data))
    go.set()


def preload() -> bool:
    import importlib

    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException:  # noqa: BLE001  -- a cold start says it, in the log
        return False
    return True


def redirect(early: int, path: str) -> None:
    """stdin from /dev/null; stdout and stderr appended to path, after what was printed so far."""
    for f in (sys.stdout, sys.stderr):
        f.flush()
    log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.lseek(early, 0, os.SEEK_SET)
    while chunk := os.read(early, 1 << 16):
        os.write(log, chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((0, null), (1, log), (2, log)):
        os.dup2(to, fd)
    for fd in (early, log, null):
        os.close(fd)


def main() -> None:
    if sys.argv[1:] != [MODULE]:
        sys.exit(f"usage: python -m launchers.nodeside.agentgate {MODULE}")
    for fd in map(int, os.listdir("/proc/self/fd")):  # the launcher's caller's, left open to it
        if fd > 2 and fd_inheritable(fd):
            os.close(fd)
    started = {k: v for k, v in os.environ.items() if k != procenv.ROOM}
    early = os.memfd_create("agentgate-early")
    for fd in (1, 2):
        os.dup2(early, fd)
    said: list = []
    go = threading.Event()
    threading.Thread(target=listen, args=(said, go), daemon=True, name="agentgate").start()
    ready = preload()
    go.wait()
    req = said[0]
    argv, env = [str(a) for a in req["argv"]], {str(k): str(v) for k, v in req["env"].items()}
    redirect(early, req["log"])
    if not (ready and warm(started, argv, env) and procenv.fits(env)):
        os.execvpe(argv[0], argv, env)  # (`--python python3`: found on PATH, as a cold start's)
    os.environ.clear()
    os.environ.update(env)
    procenv.rewrite(env, ("LAUNCH_RUN_ID", "NODE_RANK", "LAUNCH_ATTEMPT", "LAUNCH_RUN_DIR"))
    import runpy

    sys.argv = [sys.argv[0], *argv[3:]]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
