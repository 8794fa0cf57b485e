"""/proc/<pid>/environ of a process that takes another environment after it started (a zygote's
fork, an early agent at its go): the sweeps, `launch cancel` and the hang sampler find a run's
processes by what /proc shows, so it must show the process's own environment. The process starts
with ROOM in its environment (padding: room in the block the kernel shows), sets os.environ (libc's
environment: setenv copies, so nothing points into the block any more) and then rewrite() writes
the new environment over the block, in place."""

import ctypes

ROOM = "LAUNCH_WARM_ROOM"


def padding(env) -> str:
    """ROOM's value for a process started with env: room for env and 32 KiB more."""
    return "x" * (32768 + sum(len(k) + len(v) + 2 for k, v in env.items()))


def fits(env) -> bool:
    """Whether env fits in this process's block."""
    start, end = _block()
    return sum(len(f"{k}={v}".encode()) + 1 for k, v in env.items()) <= end - start


def rewrite(env, first=()) -> None:
    """/proc/self/environ shows env (its `first` names first: a block too small keeps those)."""
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
