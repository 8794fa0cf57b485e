"""A hang verdict (status.json `hang`) as the end of an attempt names it: the first failure and the
reason."""

from __future__ import annotations

from typing import Any

# stalled for certain, not only a stack outside torch
SURE = ("process stopped", "process gone", "behind")


def hung_ranks(hang: dict[str, Any]) -> list[int]:
    """The ranks a hang's stop ends first (SIGKILL, before the others' stop): the stalled ones that
    are stopped, gone or behind when there are such, else every stalled one (a rank waiting in DDP's
    gradient all-reduce shows only autograd's backward in Python: merely 'elsewhere', it is spared
    when a sure one is there)."""
    ranks, info = list(hang["stalled_ranks"]), hang.get("ranks") or {}
    sure = [r for r in ranks if str(info.get(str(r), {}).get("why", "")).startswith(SURE)]
    return sure or ranks


def first_stalled(hang: dict[str, Any]) -> int:
    """The stalled rank to name first: one stopped, gone or behind before one whose stack is merely
    elsewhere."""
    return hung_ranks(hang)[0]


def hang_failure(hang: dict[str, Any], hosts: list[str] | None = None) -> dict[str, Any]:
    rank = first_stalled(hang)
    info = (hang.get("ranks") or {}).get(str(rank), {})
    ff = {
        "node": info.get("node"),
        "rank": rank,
        "exit_code": None,
        "signal": None,
        "time": hang.get("since"),
        "reason": f"hang: {info.get('why', 'stalled')}",
        "kind": "hang",
    }
    # named with its host, like the rest
    if hosts and isinstance(ff["node"], int) and ff["node"] < len(hosts):
        ff["host"] = hosts[ff["node"]]
    return ff


SHOWN = 4  # stalled ranks named with their why; more are counted


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary(hang: dict[str, Any]) -> str:
    """`no rank advanced for 10 s; stalled: rank 1 (process stopped); 3 ranks waiting on it`: the
    stalled ranks by name with their why, the waiting ones counted (`launch status` lists them)."""
    info, stalled = hang.get("ranks") or {}, list(hang["stalled_ranks"])
    named = ", ".join(
        f"rank {r} ({info.get(str(r), {}).get('why', 'stalled')})" for r in stalled[:SHOWN]
    )
    more = f" and {plural(len(stalled) - SHOWN, 'more rank')}" if len(stalled) > SHOWN else ""
    waiting = len(hang.get("waiting_ranks") or [])
    on = "it" if len(stalled) == 1 else "them"
    return f"no rank advanced for {hang.get('timeout', 0):g} s; stalled: {named}{more}; " + (
        f"{plural(waiting, 'rank')} waiting on {on}" if waiting else "no rank waiting on " + on
    )


def hang_reason(hang: dict[str, Any]) -> str:
    """The run's reason for a hang: summary() and where the stacks are."""
    return f"hang: {summary(hang)}; stacks in {hang.get('dir')}"
