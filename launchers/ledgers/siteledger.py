"""The site's node ledger (issue 37): a node's reputation that outlives its run. Opt-in:
`--node-ledger PATH` (a profile's `node_ledger`, $LAUNCH_NODE_LEDGER, the API's
JobSpec.node_ledger), one JSON file on shared storage.

Every new run reads it at its start (spec.build_spec: its quarantined hosts are the spec's
`avoid_hosts`; SSH does not use them, Slurm excludes them) and merges its own strikes in at its end
(record_run: the run's nodes.json, each slot's strikes on the host it ran on, with their evidence).
Per host a list of strikes: {time, run, user, attempt, kind, reason, quarantined}.

The rule (state()): a strike weighs 1 (2 for a kind that points at the hardware: recovery.AT_ONCE)
for a week, then halves every week (HALF_LIFE_DAYS); a host's score is the sum. Score >= 2:
quarantined (two strikes within a week, from any runs and users, or one failed GPU check); >= 0.5:
suspect; else ok. A strike under 1/64 of its weight is dropped at the next write. A run's strikes
are keyed by (run, attempt, host): writing again (a resume) adds nothing twice.

Written by many users at once, and data others write (issue 35): the file is read strictly and
written under a lock by launchers.ledgers.ledgerfile (load, update); a bad ledger is one warning
line and is ignored (nothing avoided, nothing written over it). Stdlib only.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

from ..credentials.secretenv import redact_text
from ..errors import LaunchError, brief
from ..resilience.recovery import AT_ONCE, KINDS
from . import nodeledger
from .ledgerfile import DAY, HOST, LIMITS, MAX_STRIKES, MAX_TOTAL, VERSION, load, update

FULL_DAYS, HALF_LIFE_DAYS = 7.0, 7.0  # full weight for a week, then halves every week
QUARANTINE, SUSPECT, FORGET = 2.0, 0.5, 1 / 64


def option(value: Any, what: str = "--node-ledger") -> str:
    """--node-ledger PATH -> its absolute path ("" = none); its directory must exist (the file is
    made on the first write)."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or "\0" in value or "\n" in value:
        raise LaunchError(
            f"{what} {brief(value)} is not accepted; give a file path on shared storage"
        )
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.isdir(os.path.dirname(path)) or os.path.isdir(path):
        raise LaunchError(
            f"{what} {brief(value)} is not accepted: its directory {os.path.dirname(path)!r} "
            "does not exist or it is a directory; give a file path in an existing directory"
        )
    return path


def fields(backend: str, value: Any, what: str, out=None) -> dict[str, Any]:
    """spec.build_spec's node_ledger and avoid_hosts: the ledger read once, at the run's start (a
    resume keeps its run's list: its slots keep their hosts). A bad ledger: one warning, nothing
    avoided. Local nodes have no hosts."""
    path = option(value, what)
    if not path or backend == "local":
        return {"node_ledger": path, "avoid_hosts": ()}
    led, why = load(path)
    if why:
        print(f"launch: warning: {why}", file=out or sys.stderr, flush=True)
    hosts = quarantined(led) if led else []
    if hosts:
        more = f" and {len(hosts) - 8} more" if len(hosts) > 8 else ""
        print(
            f"launch: node ledger {path}: quarantined there, not used: "
            f"{', '.join(hosts[:8])}{more}",
            file=out or sys.stderr,
            flush=True,
        )
    return {"node_ledger": path, "avoid_hosts": tuple(hosts)}


# ----------------------------------------------------------------------------------------- the rule


def weight(strike: dict[str, Any], now: float) -> float:
    """A strike's weight now: 1 (2: a hardware kind) for FULL_DAYS, then halving every
    HALF_LIFE_DAYS."""
    base = 2.0 if strike["kind"] in AT_ONCE else 1.0
    age = max(0.0, (now - strike["time"]) / DAY)
    return base if age <= FULL_DAYS else base * 0.5 ** ((age - FULL_DAYS) / HALF_LIFE_DAYS)


def score(entry: dict[str, Any], now: float) -> float:
    return sum(weight(s, now) for s in entry.get("strikes") or [])


def state(points: float) -> str:
    return "quarantined" if points >= QUARANTINE else "suspect" if points >= SUSPECT else "ok"


def quarantined(led: dict[str, Any], now: float | None = None) -> list[str]:
    """The hosts a new run does not use, sorted."""
    now = time.time() if now is None else now
    return sorted(h for h, e in led["hosts"].items() if state(score(e, now)) == "quarantined")


def rows(led: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    """`launch nodes`: per host (worst first) its strikes, score, state and newest evidence."""
    now = time.time() if now is None else now
    out = []
    for host, e in led["hosts"].items():
        last = max(e["strikes"], key=lambda s: s["time"], default=None)
        points = score(e, now)
        out.append(
            {
                "host": host,
                "strikes": len(e["strikes"]),
                "score": round(points, 2),
                "state": state(points),
                "last": last and evidence(last),
                "when": last and last["time"],
                "last_strike": last,
            }
        )
    return sorted(out, key=lambda r: (-r["score"], r["host"]))


def evidence(s: dict[str, Any]) -> str:
    """A strike in one line: `run R (user U), attempt A: kind: reason`."""
    return f"run {s['run']} ({s['user']}), attempt {s['attempt']}: {s['kind']}: {s['reason']}"


# ------------------------------------------------------------------------------------------ merging


def host_name(word: Any) -> str | None:
    """A run.yaml host (`user@name:port`, a Slurm node) -> the ledger's name for it; None if not a
    HOST."""
    if not isinstance(word, str):
        return None
    name = word.rsplit("@", 1)[-1]
    name = name.split(":", 1)[0] if name.count(":") == 1 else name
    return name if HOST.match(name) else None


def clean(text: Any, limit: int) -> str:
    """Any text -> one line of printable ASCII of at most `limit` characters, secrets redacted."""
    text = redact_text(str(text or ""))
    return re.sub(r"[^ -~]", "?", " ".join(text.split()))[:limit]


def run_strikes(
    led: dict[str, Any] | None, attempts: list[dict[str, Any]], run_id: str, user: str, now: float
) -> dict[str, list[dict[str, Any]]]:
    """A run's nodes.json -> its strikes per host (each slot's failed attempts on the host that
    attempt ran it on; a Slurm requeue's earlier allocations too). A slot never run (a preflight's)
    names no host: left out."""
    times = {
        d.get("attempt"): d.get("decided") or d.get("fault")
        for d in (led or {}).get("decisions") or []
    }
    out: dict[str, list[dict[str, Any]]] = {}
    blocks = [
        (led or {}).get("slots") or {},
        *((e or {}).get("slots") or {} for e in (led or {}).get("earlier") or []),
    ]
    for slots in blocks:
        for entry in slots.values():
            struck = [
                a
                for a in entry.get("attempts") or []
                if a.get("strike")
                and isinstance(a.get("node"), int)
                # the program's failure (recovery.program): no host's fault
                and not a.get("program")
            ]
            for i, a in enumerate(struck):
                n, k = a.get("attempt"), a["node"]
                hosts = (
                    attempts[n].get("hosts") or []
                    if isinstance(n, int) and 0 <= n < len(attempts)
                    else []
                )
                host = host_name(hosts[k]) if 0 <= k < len(hosts) else None
                if host is None:
                    continue
                t = times.get(n)
                out.setdefault(host, []).append(
                    {
                        "time": float(t) if isinstance(t, (int, float)) and 0 < t <= now else now,
                        "run": clean(run_id, LIMITS["run"]),
                        "user": clean(user, LIMITS["user"]),
                        "attempt": n,
                        "kind": a.get("kind") if a.get("kind") in KINDS else "rank",
                        "reason": clean(a.get("failure"), LIMITS["reason"]),
                        "quarantined": bool(entry.get("quarantined")) and i == len(struck) - 1,
                    }
                )
    return out


def merge(led: dict[str, Any], new: dict[str, list[dict[str, Any]]], now: float) -> dict[str, Any]:
    """The ledger with `new` strikes added (none twice: run, attempt, host), faded ones dropped, the
    newest kept within MAX_STRIKES per host and MAX_TOTAL in all."""
    hosts: dict[str, list[dict[str, Any]]] = {
        h: list(e["strikes"]) for h, e in led["hosts"].items()
    }
    for host, strikes in new.items():
        have = {(s["run"], s["attempt"]) for s in hosts.setdefault(host, [])}
        for s in strikes:
            if (s["run"], s["attempt"]) not in have:
                hosts[host].append(s)
                have.add((s["run"], s["attempt"]))
    for host, strikes in hosts.items():
        kept = sorted(
            (s for s in strikes if weight(s, now) >= FORGET * (2 if s["kind"] in AT_ONCE else 1)),
            key=lambda s: s["time"],
        )
        hosts[host] = kept[-MAX_STRIKES:]
    every = sorted(
        ((s["time"], h, i) for h, ss in hosts.items() for i, s in enumerate(ss)), reverse=True
    )
    drop = {(h, i) for _, h, i in every[MAX_TOTAL:]}
    hosts = {
        h: [s for i, s in enumerate(ss) if (h, i) not in drop] for h, ss in sorted(hosts.items())
    }
    return {"version": VERSION, "hosts": {h: {"strikes": ss} for h, ss in hosts.items() if ss}}


def user_name() -> str:
    import getpass

    try:
        return clean(getpass.getuser(), LIMITS["user"]) or str(os.getuid())
    except (KeyError, OSError):
        return str(os.getuid())


def record_run(
    path: str, run_dir: str, run_id: str, attempts: list[dict[str, Any]], out=None
) -> str | None:
    """At a run's end: its strikes (its nodes.json, mapped to hosts) merged into the site ledger at
    `path` (record). Never raises; nothing without a strike."""
    now = time.time()
    try:
        new = run_strikes(nodeledger.read(run_dir), attempts, run_id, user_name(), now)
    except (OSError, ValueError, TypeError, AttributeError, LaunchError) as e:
        return said(
            f"launch: warning: node ledger {path!r} not written: {type(e).__name__}: {e}", out
        )
    return record(path, new, now, out)


def record(path: str, new: dict[str, list[dict[str, Any]]], now: float, out=None) -> str | None:
    """Strikes per host (run_strikes' shape; --preflight gpu's: doctor.preflight) merged into the
    site ledger at `path`; the line said on `out` (stderr): what was recorded, or why not. Never
    raises; nothing when no strike."""
    if not new:
        return None
    why = update(path, lambda led: merge(led, new, now))
    return said(
        f"launch: warning: {why}"
        if why
        else f"launch: node ledger {path}: {sum(map(len, new.values()))} "
        "strike(s) recorded on " + ", ".join(sorted(new)),
        out,
    )


def said(line: str, out=None) -> str:
    print(line, file=out or sys.stderr, flush=True)
    return line


def drain_argv(host: str, led: dict[str, Any]) -> list[str]:
    """`scontrol update` that drains a host with its newest evidence as the reason (argv: no
    shell)."""
    if not HOST.match(host or "") or host not in led["hosts"] or not led["hosts"][host]["strikes"]:
        known = ", ".join(sorted(h for h, e in led["hosts"].items() if e["strikes"])) or "none"
        raise LaunchError(
            f"--drain {brief(host)}: no strike of that host in the node ledger; accepted: {known}"
        )
    last = max(led["hosts"][host]["strikes"], key=lambda s: s["time"])
    reason = f"launch node ledger: {evidence(last)}"[:250]
    return ["scontrol", "update", f"nodename={host}", "state=drain", f"reason={reason}"]
