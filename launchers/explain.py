"""What `launch status` says beyond the state: per-rank progress and stragglers, the hang verdict, the NCCL
refusals found in the rank logs, whether the latest checkpoint is complete (launchers.ckptptr's manifest).
Reads the run dir only (launchers.heartbeat records, the hang monitors' progress/node<K>.json, the logs,
the checkpoints); never changes it."""
from __future__ import annotations

import os
import statistics
import time
from typing import Any

from . import ckptptr, heartbeat, layout
from .rundir import RunDir

LOG_TAIL_BYTES = 1 << 20        # NCCL refusals are searched in the last MiB of each rank log


def rank_rows(rd: RunDir, attempt: int, now: float | None = None) -> list[dict[str, Any]]:
    """One row per rank with a log: last step, age of its last progress (s), step time (s), straggler score
    (its step time over the median). Progress: its heartbeat, else the hang monitor's view, else its log."""
    now = time.time() if now is None else now
    seen = {}
    for k in {n for n, _, _ in rd.rank_logs()}:
        view = layout.read_json(layout.path(rd.path, "node_progress", node=k)) or {}
        if view.get("attempt") == attempt:
            seen.update({int(r): v for r, v in view.get("ranks", {}).items()})
    rows = []
    for node, rank, log in rd.rank_logs():
        hb = heartbeat.read(rd.path, rank)
        hb = hb if hb and hb.get("attempt") == attempt else None
        last = hb["time"] if hb else seen.get(rank, {}).get("last_advance") or os.path.getmtime(log)
        rows.append({"rank": rank, "node": node, "step": hb["step"] if hb else seen.get(rank, {}).get("step"),
                     "age_s": round(max(0.0, now - last), 1), "step_time_s": hb.get("step_time") if hb else None,
                     "straggler": None})
    times = [r["step_time_s"] for r in rows if r["step_time_s"]]
    if times:
        median = statistics.median(times)
        for r in rows:
            if r["step_time_s"] and median > 0:
                r["straggler"] = round(r["step_time_s"] / median, 2)
    return rows


def nccl_refusals(rd: RunDir) -> list[str]:
    """Lines where NCCL refused a setting (the `launch nccl infolog` parser), one per distinct message."""
    from nccl_tuning.nccltests import parse_info_log    # torch-free
    out, seen = [], set()
    for _, rank, log in rd.rank_logs():
        try:
            with open(log, "rb") as f:
                f.seek(max(0, os.path.getsize(log) - LOG_TAIL_BYTES))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        for line in parse_info_log(text)["refusals"]:
            key = line.split("NCCL", 1)[-1]
            if key not in seen:
                seen.add(key)
                out.append(f"rank {rank}: {line}")
    return out


def format_ranks(rows: list[dict[str, Any]]) -> list[str]:
    def cell(v, fmt="{}"):
        return "-" if v is None else fmt.format(v)
    lines = [f"{'RANK':>5} {'NODE':>5} {'STEP':>8} {'AGE(s)':>8} {'STEP(s)':>9} {'STRAGGLER':>9}"]
    for r in rows:
        lines.append(f"{r['rank']:>5} {r['node']:>5} {cell(r['step']):>8} {cell(r['age_s']):>8} "
                     f"{cell(r['step_time_s'], '{:.3f}'):>9} {cell(r['straggler'], '{:.2f}'):>9}")
    return lines


def format_hang(hang: dict[str, Any]) -> str:
    stalled = ", ".join(f"{r} ({hang.get('ranks', {}).get(str(r), {}).get('why', '?')})"
                        for r in hang.get("stalled_ranks", []))
    waiting = ", ".join(map(str, hang.get("waiting_ranks", []))) or "none"
    return f"hang:       stalled {stalled}; waiting {waiting}; stacks in {hang.get('dir')}"


def checkpoint(rd: RunDir, hashes: bool = False) -> dict[str, Any] | None:
    """`latest` checked against its manifest (sizes; with hashes, sha256 too): name, state (complete,
    unverified, damaged), why, and for a damaged one what a resume would load instead (None: nothing)."""
    name = rd.latest_checkpoint()
    if name is None:
        return None
    v = ckptptr.check(rd.checkpoint_dir, name, hashes=hashes)
    out: dict[str, Any] = {"name": name, "state": v.state, "why": v.why, "checked": "sha256" if hashes else "sizes"}
    if v.state == "damaged":
        out["resume_from"] = ckptptr.resolve(rd.checkpoint_dir, hashes=hashes).name
    return out


def format_checkpoint(ck: dict[str, Any] | None) -> str:
    if not ck:
        return "checkpoint: -"
    if ck["state"] == "complete":
        return f"checkpoint: {ck['name']} (complete: {'sha256' if ck['checked'] == 'sha256' else 'sizes'} as written)"
    if ck["state"] == "unverified":
        return f"checkpoint: {ck['name']} (unverified: {ck['why']})"
    then = f"a resume uses {ck['resume_from']}" if ck.get("resume_from") else "no complete checkpoint to resume from"
    return f"checkpoint: {ck['name']} DAMAGED ({ck['why']}); {then}"
