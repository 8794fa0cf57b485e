"""The master port: one chooser for every backend (local, SSH, a Slurm node).

The default port is derived from a key (the run id, or the Slurm job id), so it is stable across the
attempts of a run; when it is taken the next candidates are derived from "<key>:<i>". --master-port
is taken as given. Stdlib only (a Slurm node imports this on its way to torchrun).
"""

from __future__ import annotations

import functools
import socket

from .errors import LaunchError

PORT_LOW, PORT_HIGH = 20000, 60000
TRIES = 32


EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"
MIN_WINDOW = 4096  # ports left outside the ephemeral range that are enough to derive from


@functools.lru_cache(maxsize=1)
def _ephemeral() -> tuple[int, int] | None:
    """The kernel's ephemeral port range, read once per process (candidates() derives 32 ports)."""
    try:
        with open(EPHEMERAL, encoding="ascii") as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    return lo, hi


def window(ephemeral: tuple[int, int] | None = None) -> tuple[int, int]:
    """[low, high): [20000, 60000) less the kernel's ephemeral range (ip_local_port_range) when what
    is left below or above it is at least MIN_WINDOW wide. A port in that range may be given to any
    outgoing connection between our probe and the agent's bind (seen under the test suite's load:
    EADDRINUSE on a free-probed derived port)."""
    ephemeral = ephemeral or _ephemeral()
    if ephemeral is None:
        return PORT_LOW, PORT_HIGH
    lo, hi = ephemeral
    if lo - PORT_LOW >= MIN_WINDOW:
        return PORT_LOW, lo
    if PORT_HIGH - (hi + 1) >= MIN_WINDOW:
        return hi + 1, PORT_HIGH
    return PORT_LOW, PORT_HIGH


def derive_port(key: str) -> int:
    """A port in window() (within [20000, 60000)) that is stable for a given run id (or Slurm job
    id) on a machine."""
    import hashlib  # here: the Slurm nodes import this module on their way to torchrun

    low, high = window()
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return low + h % (high - low)


def candidates(key: str, tries: int = TRIES) -> list[int]:
    """The derived ports, in the order they are tried."""
    return [derive_port(key if i == 0 else f"{key}:{i}") for i in range(tries)]


def port_free(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


def choose_port(key: str, fixed: int | None, probe_addr: str | None) -> int:
    """`fixed` (--master-port) if given -- it must be free where probed --, else the first free
    candidate. Without a probe address (nothing to probe from here) the first candidate."""
    if fixed is not None:
        if probe_addr and not port_free(probe_addr, fixed):
            raise LaunchError(
                f"--master-port {fixed} is in use on {probe_addr}; pick another or omit it"
            )
        return fixed
    for port in candidates(key):
        if probe_addr is None or port_free(probe_addr, port):
            return port
    low, high = window()
    raise LaunchError(
        f"no free master port on {probe_addr} among {TRIES} derived from {key!r} "
        f"({low}-{high - 1}); give --master-port"
    )
