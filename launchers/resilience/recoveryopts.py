"""The recovery policy's options (issue 23), read and checked for spec.build_spec: --nodes N or
MIN:MAX (a run that may shrink to MIN nodes and grow back to MAX), --spares, --quarantine-after and
the restart budget (--max-restarts, --max-restarts-per-hour), from the flags over the profile; which
backends take spares and a range. launchers.resilience.recovery's policy reads the values they give
the spec.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import LaunchError, brief
from ..options.values import parse_int

MAX_SPARES = MAX_NODES = 65536  # --spares; --nodes, the hosts of a hostfile
QUARANTINE_AFTER = 2  # --quarantine-after's default
SPARES_ON = ("local", "ssh", "slurm")  # the backends that carry out a replacement by a spare
RANGES_ON = ("local", "ssh", "slurm")  # ... and a shrink (--nodes MIN:MAX)


def options(backend: str, pick: Callable[..., Any], said: Callable[[str], str]) -> dict[str, Any]:
    """--nodes, --spares, --quarantine-after and the restart budget (--max-restarts;
    --max-restarts-per-hour, 0: no hourly limit), from the flags over the profile (spec.build_spec's
    pick/said). --spares K or --nodes MIN:MAX without --max-restarts allow K + MAX - MIN + 1
    restarts; a --max-restarts given wins."""
    low, nodes = node_range(said("nodes"), pick("nodes", 1))
    spares = parse_int(said("spares"), pick("spares", 0), 0, MAX_SPARES)
    after = parse_int(
        said("quarantine_after"), pick("quarantine_after", QUARANTINE_AFTER), 1, MAX_SPARES
    )
    on = ", ".join("launch " + b for b in SPARES_ON)
    if spares and backend not in SPARES_ON:
        raise LaunchError(
            f"{said('spares')} {spares} is not yet on this backend ({backend}); accepted: 0 here, "
            f"or spares with {on}"
        )
    if low < nodes and backend not in RANGES_ON:
        raise LaunchError(
            f"{said('nodes')} {low}:{nodes} (a range) is not yet on this backend ({backend}); "
            f"accepted: a number of nodes here, or MIN:MAX with "
            + ", ".join("launch " + b for b in RANGES_ON)
        )
    given, extra = pick("max_restarts"), spares + nodes - low
    restarts = (
        parse_int(said("max_restarts"), given, 0)
        if given is not None
        else (extra + 1 if extra else 0)
    )
    ranged = (low, nodes) if low < nodes else (0, 0)
    per_hour = parse_int(said("max_restarts_per_hour"), pick("max_restarts_per_hour", 0), 0)
    return {
        "nodes": nodes,
        "min_nodes": ranged[0],
        "max_nodes": ranged[1],
        "spares": spares,
        "quarantine_after": after,
        "max_restarts": restarts,
        "max_restarts_per_hour": per_hour,
    }


def node_range(what: str, value: Any) -> tuple[int, int]:
    """--nodes N (an int, its text) or MIN:MAX (a run that may shrink to MIN nodes and grow back to
    MAX) -> (MIN, MAX); N is (N, N)."""
    if not isinstance(value, str) or ":" not in value:
        n = parse_int(what, value, 1, MAX_NODES)
        return n, n
    accepted = (
        f"N or MIN:MAX, integers 1-{MAX_NODES} in plain decimal digits, MIN <= MAX (e.g. 2 or 1:2)"
    )
    try:
        low, high = (parse_int(what, v, 1, MAX_NODES) for v in value.split(":", 1))
    except LaunchError:
        raise LaunchError(f"{what} {brief(value)} is not accepted; give {accepted}") from None
    if low > high:
        raise LaunchError(
            f"{what} {brief(value)} is not accepted: MIN {low} is more than MAX {high}; give "
            f"{accepted}"
        )
    return low, high
