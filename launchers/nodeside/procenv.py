"""A process that takes another environment after it started (a zygote's fork, an early agent at
its go: launchers.nodeside.agentgate).

/proc/<pid>/environ: the sweeps, `launch cancel` and the hang sampler find a run's processes by what
/proc shows, so it must show the process's own environment. The process starts with ROOM in its
environment (padding: room in the block the kernel shows), sets os.environ (libc's environment:
setenv copies, so nothing points into the block any more) and then rewrite() writes the new
environment over the block, in place.

same_start(): whether a python (torch imported) that started with one environment may take another:
they differ only in what is read after the start (LATE: the launcher's own variables, torchrun's
rendezvous, NCCL's); anything else (PYTHONPATH, LD_PRELOAD, OMP_NUM_THREADS, a job's own) may have
changed how the interpreter or torch started. Stdlib only, light: the launcher's entry imports it.
"""

ROOM = "LAUNCH_WARM_ROOM"
# read after the interpreter and torch started: by torchrun's arguments, the rank wrapper, NCCL
LATE = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "TORCH_EXTENSIONS_DIR")
LATE_PREFIXES = ("LAUNCH_", "PET_", "NCCL_", "TORCH_NCCL_")


def late(name: str) -> bool:
    return name in LATE or name.startswith(LATE_PREFIXES)


def same_start(started, env) -> bool:
    """Whether a process that started with `started` (ROOM aside) may take env."""
    if ROOM in env:
        return False
    keys = (started.keys() | env.keys()) - {ROOM}
    return all(late(k) for k in keys if started.get(k) != env.get(k))


def padding(env) -> str:
    """ROOM's value for a process started with env: room for env and 32 KiB more."""
    return "x" * (32768 + sum(len(k) + len(v) + 2 for k, v in env.items()))


def fits(env) -> bool:
    """Whether env fits in this process's block."""
    start, end = _block()
    return sum(len(f"{k}={v}".encode()) + 1 for k, v in env.items()) <= end - start


def rewrite(env, first=()) -> None:
    """/proc/self/environ shows env (its `first` names first: a block too small keeps those)."""
    import ctypes

    start, end = _block()
    order = [k for k in first if k in env] + [k for k in env if k not in first]
    data = b"".join(f"{k}={env[k]}".encode() + b"\0" for k in order)
    room = end - start
    if len(data) > room:
        data = data[: data.rfind(b"\0", 0, room) + 1]
    ctypes.memmove(start, data.ljust(room, b"\0"), room)


def _block() -> tuple[int, int]:
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[47]), int(fields[48])  # env_start, env_end (proc(5): fields 50, 51)
