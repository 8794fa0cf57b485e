"""The recovery timeline of a run (issue 23 item 6): per restart, when each phase happened and
whether a person was involved. Pure over a run dir's files (run.yaml, nodes.json, the rank logs, the
heartbeats); nothing is measured here that was not recorded by the part that saw it:

  fault              the failed attempt's first failure (its time: the ledger's decision keeps it)
  detected           the launcher saw the attempt end (the ledger's decision)
  decided            the policy decided what follows (the ledger's decision:
                     launchers.resilience.recovery)
  new world formed   every rank of the new attempt started (the rank wrappers' log headers:
                     launchers.rankexec)
  checkpoint loaded  the program said it resumed (`resumed from NAME (..., at TIME)` in rank 0's
                     log, the workloads' line), else unknown
  first step         the new attempt's first heartbeat (progress/rank<R>.json `first`:
                     launchers.heartbeat)

A restart is an attempt that follows a failed one the ledger decided on; `person: no` when the
launcher's loop started it (run.yaml's attempt `by: policy`), yes when it came from `launch resume`.
The heartbeats hold only the current attempt: the launcher records the timeline in status.json
(`recovery`) as each attempt ends, and restarts() merges what it finds now into what was recorded.
"""

from __future__ import annotations

import mmap
import time
from typing import Any

from .. import layout
from ..ledgers import nodeledger

PHASES = (
    ("fault", "fault"),
    ("detected", "detected"),
    ("decided", "decided"),
    ("world_formed", "new world formed"),
    ("checkpoint_loaded", "checkpoint loaded"),
    ("first_step", "first step"),
)
BY_POLICY = "policy"  # run.yaml's attempt `by`: started by the launcher's restart loop
RESUMED = "resumed from "  # the workloads' line on rank 0 (workloads/common/loop.py)
BODY_MAX = 1 << 20  # how much of an attempt's rank 0 log is searched for that line


def parse_stamp(text: str) -> float | None:
    """layout.stamp()'s local time (milliseconds optional) -> epoch seconds; None when it is not
    one."""
    text = text.strip()
    try:
        whole = time.mktime(time.strptime(text[:19], "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    frac = text[19:]
    return whole + (int(frac[1:4]) / 1000 if frac[:1] == "." and frac[1:4].isdigit() else 0.0)


def _attempt_part(path: str, attempt: int) -> tuple[str | None, str]:
    """A rank log's header line for `attempt` and (up to BODY_MAX bytes of) what follows it up to
    the next header; found with mmap's search, never a pass over the lines of a long log."""
    tag = f"===== launch attempt {attempt} |".encode()
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            i = m.rfind(tag)
            while i > 0 and m[i - 1 : i] != b"\n":  # a header starts a line
                i = m.rfind(tag, 0, i)
            if i < 0:
                return None, ""
            eol = m.find(b"\n", i)
            eol = len(m) if eol < 0 else eol
            end = m.find(b"\n===== launch attempt ", eol)
            end = min(len(m) if end < 0 else end, eol + 1 + BODY_MAX)
            return m[i:eol].decode(errors="replace"), m[eol + 1 : end].decode(errors="replace")
    except (OSError, ValueError):  # missing, or empty (mmap of 0 bytes)
        return None, ""


def _rank_logs(run_dir: str, attempt: int, world: int) -> tuple[float | None, float | None]:
    """(new world formed: the latest of the ranks' header times, None until all `world` ranks have
    one; checkpoint loaded: the time on rank 0's `resumed from` line of the attempt)."""
    starts, loaded = [], None
    for _node, rank, path in layout.rank_logs(run_dir):
        head, body = _attempt_part(path, attempt)
        if head is None:
            continue
        starts.append(parse_stamp(head.rstrip().removesuffix("=====").rsplit(" | ", 1)[-1]))
        if rank == 0:
            said = next(
                (ln for ln in body.splitlines() if ln.startswith(RESUMED) and ", at " in ln), None
            )
            loaded = parse_stamp(said.rsplit(", at ", 1)[1].rstrip().rstrip(")")) if said else None
    whole = len(starts) >= world and None not in starts
    return (max(starts) if whole and starts else None), loaded


def _first_step(run_dir: str, attempt: int, world: int) -> float | None:
    firsts = [
        rec.get("first")
        for r in range(world)
        if (rec := layout.read_json(layout.path(run_dir, "progress", rank=r)))
        and rec.get("attempt") == attempt
    ]
    firsts = [t for t in firsts if isinstance(t, (int, float))]
    return min(firsts) if firsts else None


def restarts(
    run_dir: str,
    recorded: list[dict[str, Any]] | None = None,
    data: dict[str, Any] | None = None,
    led: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Each restart's timeline: {attempt, decision, person, phases: [{phase, name, time, at,
    since_fault_s}], detection_to_first_step_s}; a phase not known (yet) has time None. What the
    files no longer tell (an earlier attempt's heartbeat) is taken from `recorded` (status.json's
    `recovery`). data, led: run.yaml's record and the ledger when the caller has read them."""
    data = data if data is not None else layout.load_run_yaml(run_dir)[0]
    led = led if led is not None else nodeledger.read(run_dir)
    decisions = {
        d.get("attempt"): d for d in (led or {}).get("decisions") or [] if not d.get("preflight")
    }
    before = {e.get("attempt"): e for e in recorded or []}
    out = []
    for a in ((data or {}).get("attempts") or [])[1:]:
        k, d = a.get("attempt"), decisions.get(a.get("attempt", 0) - 1)
        if d is None:
            continue
        world = int(a.get("nodes") or 1) * int(a.get("gpus_per_node") or 1)
        formed, loaded = _rank_logs(run_dir, k, world)
        now = dict(
            fault=d.get("fault"),
            detected=d.get("detected"),
            decided=d.get("decided"),
            world_formed=formed,
            checkpoint_loaded=loaded,
            first_step=_first_step(run_dir, k, world),
        )
        old = {p.get("phase"): p.get("time") for p in (before.get(k) or {}).get("phases") or []}
        out.append(
            entry(
                k,
                d.get("action"),
                a.get("by") != BY_POLICY,
                {key: now[key] if now[key] is not None else old.get(key) for key, _ in PHASES},
            )
        )
    return out


def entry(
    attempt: int, decision: str | None, person: bool, times: dict[str, float | None]
) -> dict[str, Any]:
    """One restart's record from its phases' times (epoch seconds or None)."""
    fault = times.get("fault")

    def since(t: float | None) -> float | None:
        return round(t - fault, 3) if t is not None and fault is not None else None

    phases = [
        {
            "phase": key,
            "name": name,
            "time": times.get(key),
            "since_fault_s": since(times.get(key)),
            "at": layout.stamp(times[key]) if times.get(key) is not None else None,
        }
        for key, name in PHASES
    ]
    det, first = times.get("detected"), times.get("first_step")
    return {
        "attempt": attempt,
        "decision": decision,
        "person": "yes" if person else "no",
        "phases": phases,
        "detection_to_first_step_s": round(first - det, 3)
        if det is not None and first is not None
        else None,
    }


def lines(timeline: list[dict[str, Any]] | None) -> list[str]:
    """`launch status`'s block: per restart a line naming it, then one line per phase (its time and
    the seconds since the fault; `-` when not known)."""
    out = []
    for e in timeline or []:
        det = e.get("detection_to_first_step_s")
        out.append(
            f"attempt {e['attempt']} ({e.get('decision')} after attempt {e['attempt'] - 1}'s "
            f"failure; person: {e.get('person')}; detection to first step: "
            f"{'-' if det is None else f'{det:.2f} s'})"
        )
        for p in e.get("phases") or []:
            t = "-" if p.get("at") is None else p["at"]
            s = "" if p.get("since_fault_s") is None else f"  {p['since_fault_s']:+.2f} s"
            out.append(f"  {p['name']:<18} {t}{s}")
    return out
