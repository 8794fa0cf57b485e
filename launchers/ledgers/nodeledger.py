"""The node ledger of a run (issue 23): nodes.json in the run dir, written only by the launcher
process that runs the attempts (launchers.resilience.restarts), atomically (launchers.layout). Per
node slot and attempt what happened to it (the first failure on it: exit code or signal, lost, hung;
or stopped with the run), its strikes, quarantined or not; the pool (active slots in node-rank
order, idle spares, quarantined) and each decision of launchers.resilience.recovery.

No ledger file when no attempt of the run ever failed and no `--preflight gpu --spares` quarantined
a slot before it started (preflight()); `launch status` shows it as a short block.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .. import layout
from ..resilience.recovery import Decision, Failure, Past, Pool

NAME = "node_ledger"  # its key in layout.FILES


_told: set[str] = set()  # the damaged ledgers this process has warned of (once each)


def read(run_dir: str, attempts: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """nodes.json; with run.yaml's attempts, each slot also names its `host` (the SSH host, the
    Slurm node it last ran on: with_hosts)."""
    path = layout.path(run_dir, NAME)
    led = layout.read_json(path)
    # the run dir is data: a damaged file is no traceback
    if led is not None and (why := problem(led)):
        if path not in _told:
            _told.add(path)
            print(
                f"launch: warning: {path} is ignored: {why} (not as launch writes it)",
                file=sys.stderr,
                flush=True,
            )
        return None
    return with_hosts(led, attempts) if led and attempts else led


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def problem(led: Any) -> str | None:
    """Why nodes.json is not a ledger as launch writes it (None: it is one), checked before anything
    reads it."""
    if not isinstance(led, dict):
        return "not a JSON object"
    pool, slots, decisions = (
        led.get("pool") or {},
        led.get("slots") or {},
        led.get("decisions") or [],
    )
    if not isinstance(pool, dict) or not all(
        isinstance(pool.get(k) or [], list) and all(map(_count, pool.get(k) or []))
        for k in ("active", "spares", "quarantined")
    ):
        return "its pool is not lists of slot numbers"
    if not isinstance(slots, dict) or not all(
        str(k).isdigit() and isinstance(v, dict) for k, v in slots.items()
    ):
        return "its slots are not slot numbers with their records"
    for v in slots.values():
        tried = v.get("attempts") or []
        if not isinstance(tried, list) or not all(
            isinstance(a, dict)
            and _count(a.get("attempt", 0))
            and _count(a.get("node", 0))
            and isinstance(a.get("sign", ""), str)
            for a in tried
        ):
            return "a slot's attempts are not records with attempt and node numbers"
        if not _count(v.get("strikes", 0)) or not isinstance(v.get("quarantined", False), bool):
            return "a slot's strikes are not a count or its quarantine not true/false"
    if not isinstance(decisions, list) or not all(isinstance(d, dict) for d in decisions):
        return "its decisions are not a list of records"
    return None


def with_hosts(led: dict[str, Any], attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ledger with `host` in each slot that ran on a known host (an attempt's `hosts`, node
    order; the latest); a local run's slots have none."""
    slots = {}
    for k, entry in (led.get("slots") or {}).items():
        entry = dict(entry)
        for a in entry.get("attempts") or []:
            hosts = (
                attempts[a["attempt"]].get("hosts") or []
                if 0 <= a.get("attempt", -1) < len(attempts)
                else []
            )
            if 0 <= a.get("node", -1) < len(hosts):
                entry["host"] = hosts[a["node"]]
        slots[k] = entry
    return dict(led, slots=slots)


def strikes(led: dict[str, Any] | None) -> dict[int, int]:
    return {int(s): int(v.get("strikes", 0)) for s, v in ((led or {}).get("slots") or {}).items()}


def past(led: dict[str, Any] | None) -> tuple[Past, ...]:
    """The failed attempts on the ledger's slots (the preflight's left out), in attempt order, each
    with its sign (launchers.resilience.recovery.sign_of) and whether it struck: the policy tells
    the program's failure from a node's (recovery.repeats)."""
    out = [
        Past(a["attempt"], int(k), a.get("sign") or "", bool(a.get("strike")))
        for k, v in ((led or {}).get("slots") or {}).items()
        for a in v.get("attempts") or []
        if a.get("kind") and not a.get("preflight")
    ]
    return tuple(sorted(out, key=lambda p: p.attempt))


HOUR_S = 3600.0


def restarts_within(led: dict[str, Any] | None, now: float, span: float = HOUR_S) -> int:
    """The restarts the ledger decided (every decision but a stop; a preflight's is none) in the
    `span` seconds before `now`, by their `decided` times: what --max-restarts-per-hour counts (a
    Slurm requeue's ledger too)."""
    return sum(
        1
        for d in (led or {}).get("decisions") or []
        if not d.get("preflight")
        and d.get("action") != "stop"
        and isinstance(d.get("decided"), (int, float))
        and d["decided"] > now - span
    )


def pool_for(led: dict[str, Any] | None, nodes: int, spares: int, least: int = 0) -> Pool:
    """The pool an attempt of the run starts from: the ledger's when it has `nodes` active slots (a
    run of --nodes MIN:MAX: `least` = MIN to `nodes` = MAX), else a fresh one less the quarantined
    slots (a run resumed with another number of nodes)."""
    if led and led.get("pool"):
        pool = Pool.from_dict(led["pool"])
        if (least or nodes) <= len(pool.active) <= nodes:
            return pool
        return Pool.fresh(nodes, spares, pool.quarantined, pool.active + pool.spares, least)
    return Pool.fresh(nodes, spares)


def record(
    run_dir: str,
    led: dict[str, Any] | None,
    attempt: int,
    pool: Pool,
    failure: Failure | None,
    node_codes: dict[str, Any],
    decision: Decision,
    quarantine_after: int,
    times: dict[str, float | None] | None = None,
) -> dict[str, Any]:
    """The ledger with a failed attempt added (pool: its slots; node_codes: status.json `nodes`,
    node rank -> its agent's exit; times: the decision's fault, detected and decided, epoch seconds:
    launchers.resilience.timeline), written atomically; returned."""
    led = dict(led or {}, quarantine_after=quarantine_after)
    slots = {str(k): dict(v) for k, v in (led.get("slots") or {}).items()}
    for node, slot in enumerate(pool.active):
        entry = slots.setdefault(str(slot), {"strikes": 0, "quarantined": False, "attempts": []})
        code = node_codes.get(str(node))
        # a strike unless the program's (recovery.program)
        if failure is not None and failure.slot == slot:
            what = {
                "failure": failure.what or failure.kind,
                "kind": failure.kind,
                "strike": decision.strikes.get(slot, 0) > entry.get("strikes", 0),
                **sign(failure),
            }
        else:
            what = {
                "failure": "ended with the run" if code in (0, None) else "stopped with the run"
            }
        entry["attempts"] = [
            *entry.get("attempts", []),
            {"attempt": attempt, "node": node, "exit": code, **what},
        ]
    chain = {*decision.program, attempt} if decision.program else set()
    # every slot: the program's failure lifts a quarantine (recovery.program)
    for k, entry in slots.items():
        entry["attempts"] = [
            dict(a, strike=False, program=True)
            if a.get("attempt") in chain and a.get("sign")
            else a
            # the program's: no node's strike
            for a in entry.get("attempts") or []
        ]
        lifted = entry.get("quarantined") and int(k) not in decision.pool.quarantined
        entry["strikes"] = decision.strikes.get(int(k), 0 if lifted else entry.get("strikes", 0))
        entry["quarantined"] = int(k) in decision.pool.quarantined
    led.update(
        slots=slots,
        pool=decision.pool.to_dict(),
        decisions=[
            *(led.get("decisions") or []),
            {"attempt": attempt, "action": decision.action, "why": decision.why, **(times or {})},
        ],
    )
    _write(run_dir, led)
    return led


def program_signs(led: dict[str, Any] | None) -> set[str]:
    """The signs of the failures the policy found the program's, no node's
    (launchers.resilience.recovery.program)."""
    return {
        a["sign"]
        for v in ((led or {}).get("slots") or {}).values()
        for a in v.get("attempts") or []
        if a.get("program") and a.get("sign")
    }


def sign(failure: Failure) -> dict[str, str]:
    return {"sign": failure.sign} if failure.sign else {}


def preflight(
    run_dir: str,
    led: dict[str, Any] | None,
    attempt: int,
    decision: Decision,
    bad: dict[int, str],
    quarantine_after: int,
    decided: float,
) -> dict[str, Any]:
    """The ledger with `--preflight gpu`'s decision before `attempt` started
    (launchers.resilience.recovery.preflight_start): each bad slot quarantined with its one line
    (kind gpu, never run: no node); the pool the run starts on; the decision (no person: the policy
    took it), written atomically; returned."""
    led = dict(led or {}, quarantine_after=quarantine_after)
    slots = {str(k): dict(v) for k, v in (led.get("slots") or {}).items()}
    for slot, line in sorted(bad.items()):
        entry = slots.setdefault(str(slot), {"strikes": 0, "quarantined": False, "attempts": []})
        entry["attempts"] = [
            *entry.get("attempts", []),
            {
                "attempt": attempt,
                "preflight": True,
                "exit": None,
                "failure": f"--preflight gpu: {line}",
                "kind": "gpu",
                "strike": True,
            },
        ]
        entry.update(
            strikes=entry.get("strikes", 0) + decision.strikes.get(slot, 1), quarantined=True
        )
    led.update(
        slots=slots,
        pool=decision.pool.to_dict(),
        decisions=[
            *(led.get("decisions") or []),
            {
                "attempt": attempt,
                "preflight": True,
                "person": "no",
                "action": decision.action,
                "why": decision.why,
                "decided": decided,
            },
        ],
    )
    _write(run_dir, led)
    return led


def quarantined_hosts(led: dict[str, Any] | None, attempts: list[dict[str, Any]]) -> list[str]:
    """The hosts the run's quarantined slots ran on (a slot's attempts -> run.yaml's attempts'
    `hosts`, node order): what a Slurm requeue of a --spares run excludes from its next
    allocation."""
    out = set()
    for entry in ((led or {}).get("slots") or {}).values():
        for a in entry.get("attempts") or [] if entry.get("quarantined") else []:
            hosts = (
                attempts[a["attempt"]].get("hosts") or []
                if a.get("attempt", -1) < len(attempts)
                else []
            )
            if 0 <= a.get("node", -1) < len(hosts):
                out.add(hosts[a["node"]])
    return sorted(out)


def new_allocation(run_dir: str, led: dict[str, Any] | None, pool: Pool) -> None:
    """A Slurm requeue of a --spares run runs in another allocation: its slots numbered anew (slot
    k: its k-th host), the slots and pool of the allocation before kept under `earlier` (its
    quarantined hosts are excluded from this one by the requeue: quarantined_hosts); the decisions
    (the restart budget) go on. Nothing without a ledger."""
    if not led:
        return
    led = dict(
        led,
        slots={},
        pool=pool.to_dict(),
        earlier=[
            *(led.get("earlier") or []),
            {"slots": led.get("slots") or {}, "pool": led.get("pool")},
        ],
    )
    _write(run_dir, led)


def _write(run_dir: str, led: dict[str, Any]) -> None:
    layout.present(run_dir)  # never recreates a removed run dir
    layout.atomic_write(
        layout.own_path(run_dir, NAME), json.dumps(led, indent=1, sort_keys=True) + "\n"
    )


def _slots(items: Any) -> str:
    return ", ".join(map(str, items)) or "none"


def lines(led: dict[str, Any] | None) -> list[str]:
    """`launch status`'s block: the pool, each slot with a strike (its failures), each decision; []
    without a ledger or when no slot ever had a strike."""
    slots = {int(k): v for k, v in ((led or {}).get("slots") or {}).items()}
    struck = {k: v for k, v in sorted(slots.items()) if v.get("strikes")}
    if not struck:
        return []
    pool = (led or {}).get("pool") or {}
    out = [
        f"slots active {_slots(pool.get('active', []))}; spares {_slots(pool.get('spares', []))}; "
        f"quarantined {_slots([f'{q}{_host(slots, q)}' for q in pool.get('quarantined', [])])} "
        f"(at {led.get('quarantine_after')} strikes)"
    ]
    for k, v in struck.items():
        fails = "; ".join(
            f"attempt {a['attempt']}: {a['failure']}"
            for a in v.get("attempts", [])
            if a.get("strike")
        )
        out.append(
            f"slot {k}{_host(slots, k)}: {v['strikes']} strike{'s' if v['strikes'] != 1 else ''}"
            f"{', quarantined' if v.get('quarantined') else ''} ({fails})"
        )
    out += [
        (
            f"before attempt {d['attempt']} (--preflight gpu; person: no)"
            if d.get("preflight")
            else f"attempt {d['attempt']}"
        )
        + f": {d['action']} -- {_named(d['why'], slots)}"
        for d in (led or {}).get("decisions") or []
    ]
    return out


def on_host(text: str, hosts: list[str] | None) -> str:
    """`rank 3 on node 1, ...` -> `rank 3 on node 1 (lnode2), ...`: the first `node K` named with
    its host."""
    import re

    return re.sub(
        r"\bnode (\d+)\b(?! \()",
        lambda m: (
            m.group(0)
            + (f" ({hosts[int(m.group(1))]})" if int(m.group(1)) < len(hosts or []) else "")
        ),
        text,
        count=1,
    )


def _host(slots: dict[int, Any], k: int) -> str:
    return f" ({slots[k]['host']})" if k in slots and slots[k].get("host") else ""


def _named(text: str, slots: dict[int, Any]) -> str:
    """A decision's words with each `slot K` followed by its host where known: `slot 1
    (sshhost2)`."""
    import re

    return re.sub(
        r"\bslot (\d+)\b(?! \()", lambda m: m.group(0) + _host(slots, int(m.group(1))), text
    )
