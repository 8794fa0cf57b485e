"""A hang verdict (status.json `hang`) as the end of an attempt names it: the first failure and the reason."""
from __future__ import annotations

from typing import Any


def hang_failure(hang: dict[str, Any], hosts: list[str] | None = None) -> dict[str, Any]:
    rank = hang["stalled_ranks"][0]
    info = (hang.get("ranks") or {}).get(str(rank), {})
    ff = {"node": info.get("node"), "rank": rank, "exit_code": None, "signal": None, "time": hang.get("since"),
          "reason": f"hang: {info.get('why', 'stalled')}"}
    if hosts and isinstance(ff["node"], int) and ff["node"] < len(hosts):     # named with its host, like the rest
        ff["host"] = hosts[ff["node"]]
    return ff


def hang_reason(hang: dict[str, Any]) -> str:
    return (f"hang: no rank advanced for {hang.get('timeout', 0):g} s; stalled rank(s) "
            f"{', '.join(map(str, hang['stalled_ranks']))}, waiting {len(hang.get('waiting_ranks', []))}; "
            f"stacks in {hang.get('dir')}")
