"""What `launch status` says beyond the state: per-rank progress and stragglers, the hang verdict,
the NCCL refusals found in the rank logs, whether the latest checkpoint is complete
(launchers.ckptptr's manifest). Reads the run dir only (launchers.heartbeat records, the hang
monitors' progress/node<K>.json, the logs, the checkpoints); never changes it."""

from __future__ import annotations

import os
import shlex
import statistics
import time
from typing import Any

from .. import ckptptr, heartbeat, layout, procs
from ..errors import LaunchError
from ..frozen import extcache
from ..hang import sample
from ..records import rundircheck
from ..records.rundir import RunDir
from ..resilience import timeline

LOG_TAIL_BYTES = 1 << 20  # NCCL refusals are searched in the last MiB of each rank log


# `silent`: this many median step times (at least SILENT_MIN_S) behind
SILENT_STEPS, SILENT_MIN_S = 5, 0.5
SLOW = 1.5  # `slow`: a straggler score from here up
NO_REPORT = "no progress reported"


def monitor_views(rd: RunDir, nodes: set[int], attempt: int) -> dict[int, dict[str, Any]]:
    """rank -> the hang monitors' view of it this attempt (progress/node<K>.json: step,
    last_advance)."""
    seen: dict[int, dict[str, Any]] = {}
    for k in nodes:
        view = layout.read_json(layout.path(rd.path, "node_progress", node=k)) or {}
        if view.get("attempt") == attempt:
            seen.update({int(r): v for r, v in view.get("ranks", {}).items()})
    return seen


def stopped_here(run_id: str) -> set[int]:
    """Ranks of this run whose program is stopped (SIGSTOP, state T in /proc) on this machine (the
    hang monitor's own reading: launchers.hang.sample); read-only, and nothing for ranks on other
    machines."""
    found = set()
    for rank, (pid, _) in sample.rank_programs(run_id).items():
        st = sample.proc_stat(pid)
        if st is not None and st[0] in sample.STOPPED:
            found.add(rank)
    return found


def rank_rows(
    rd: RunDir,
    attempt: int,
    now: float | None = None,
    ranks: list[tuple[int, int]] | None = None,
    hang: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per rank (ranks: (node, rank) pairs; default every rank with a log): last step, the
    program's total, age of its last progress (s), step time (s), straggler score (its step time
    over the median), flags (flag()). Progress: its heartbeat, else the hang monitor's view;
    neither: age None (`reported` False) -- a quiet rank's log is no measure of its progress."""
    now = time.time() if now is None else now
    pairs = ranks if ranks is not None else [(n, r) for n, r, _ in rd.rank_logs()]
    seen = monitor_views(rd, {n for n, _ in pairs}, attempt)
    rows = []
    for node, rank in pairs:
        hb = heartbeat.read(rd.path, rank)
        hb = hb if hb and hb.get("attempt") == attempt else None
        mon = seen.get(rank, {})
        last = hb["time"] if hb else mon.get("last_advance")
        rows.append(
            {
                "rank": rank,
                "node": node,
                "step": hb["step"] if hb else mon.get("step"),
                "total": hb.get("total") if hb else None,
                "reported": last is not None,
                "age_s": None if last is None else round(max(0.0, now - last), 1),
                "step_time_s": hb.get("step_time") if hb else None,
                "straggler": None,
            }
        )
    times = [r["step_time_s"] for r in rows if r["step_time_s"]]
    if times:
        median = statistics.median(times)
        for r in rows:
            if r["step_time_s"] and median > 0:
                r["straggler"] = round(r["step_time_s"] / median, 2)
    return flag(rows, hang, stopped_here(rd.run_id))


def flag(
    rows: list[dict[str, Any]], hang: dict[str, Any] | None = None, stopped: set[int] = frozenset()
) -> list[dict[str, Any]]:
    """Each row's flags: STOPPED (its program SIGSTOPped on this machine); STALLED / waiting as the
    hang verdict (status.json's `hang`) says; `silent`: its last progress silent_limit() older than
    the freshest rank's (so a pause every rank takes, a checkpoint or the end, flags nobody);
    `slow`: a straggler score of SLOW or more."""
    hang = hang or {}
    stalled, waiting = set(hang.get("stalled_ranks", [])), set(hang.get("waiting_ranks", []))
    ages = [r["age_s"] for r in rows if r["age_s"] is not None]
    limit = silent_limit(rows)
    for r in rows:
        r["flags"] = [
            f
            for f, on in (
                ("STOPPED", r["rank"] in stopped),
                ("STALLED", r["rank"] in stalled),
                ("waiting", r["rank"] in waiting),
                ("silent", r["age_s"] is not None and r["age_s"] - min(ages) > limit),
                ("slow", (r["straggler"] or 0) >= SLOW),
            )
            if on
        ]
    return rows


def silent_limit(rows: list[dict[str, Any]]) -> float:
    """SILENT_STEPS median step times, at least SILENT_MIN_S: how far behind the freshest rank is
    `silent`."""
    times = [r["step_time_s"] for r in rows if r["step_time_s"]]
    return max(SILENT_STEPS * (statistics.median(times) if times else 0.0), SILENT_MIN_S)


def last_step(rd: RunDir, attempt: int) -> int | None:
    """`last step:` -- metrics.jsonl's last line, else rank 0's last reported step this attempt
    (launchers.heartbeat: a program without the workloads' metrics), None without either."""
    step = rd.last_step()
    if step is not None:
        return step
    hb = heartbeat.read(rd.path, 0)
    return hb.get("step") if hb and hb.get("attempt") == attempt else None


def nccl_refusals(rd: RunDir) -> list[str]:
    """Lines where NCCL refused a setting (the `launch nccl infolog` parser), one per distinct
    message."""
    from nccl_tuning.nccltests import parse_info_log  # torch-free

    out, seen = [], set()
    for _, rank, log in rd.rank_logs():
        try:  # inside the run dir, a regular file, its tail (rundircheck.open_inside: issue 35)
            with os.fdopen(rundircheck.open_inside(rd.path, log), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES))
                text = f.read(LOG_TAIL_BYTES).decode("utf-8", "replace")
        except (OSError, LaunchError):
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

    lines = [
        f"{'RANK':>5} {'NODE':>5} {'STEP':>8} {'AGE(s)':>8} {'STEP(s)':>9} {'STRAGGLER':>9}  FLAGS"
    ]
    for r in rows:
        # never an age made up from its log: said in the FLAGS column
        if not r.get("reported", True):
            lines.append(
                f"{r['rank']:>5} {r['node']:>5} {'-':>8} {'-':>8} {'-':>9} {'-':>9}  {NO_REPORT}"
            )
            continue
        lines.append(
            f"{r['rank']:>5} {r['node']:>5} {cell(r['step']):>8} {cell(r['age_s']):>8} "
            f"{cell(r['step_time_s'], '{:.3f}'):>9} {cell(r['straggler'], '{:.2f}'):>9}  "
            f"{' '.join(r.get('flags', []))}".rstrip()
        )
    return lines


def format_hang(hang: dict[str, Any]) -> str:
    stalled = ", ".join(
        f"{r} ({hang.get('ranks', {}).get(str(r), {}).get('why', '?')})"
        for r in hang.get("stalled_ranks", [])
    )
    waiting = ", ".join(map(str, hang.get("waiting_ranks", []))) or "none"
    return f"hang:       stalled {stalled}; waiting {waiting}; stacks in {hang.get('dir')}"


def checkpoint(rd: RunDir, hashes: bool = False) -> dict[str, Any] | None:
    """`latest` checked against its manifest (sizes; with hashes, its digests too): name, state
    (complete, unverified, damaged), why, and for a damaged one what a resume would load instead
    (None: nothing)."""
    name = rd.latest_checkpoint()
    if name is None:
        return None
    v = ckptptr.check(rd.checkpoint_dir, name, hashes=hashes)
    # xxh3_128, sha256
    checked = (ckptptr.digest_of(rd.checkpoint_dir, name) or "sizes") if hashes else "sizes"
    out: dict[str, Any] = {"name": name, "state": v.state, "why": v.why, "checked": checked}
    if v.state == "damaged":
        out["resume_from"] = ckptptr.resolve(rd.checkpoint_dir, hashes=hashes).name
    return out


def format_checkpoint(ck: dict[str, Any] | None) -> str:
    if not ck:
        return "checkpoint: -"
    if ck["state"] == "complete":
        return f"checkpoint: {ck['name']} (complete: {ck['checked'] or 'sizes'} as written)"
    if ck["state"] == "unverified":
        return f"checkpoint: {ck['name']} (unverified: {ck['why']})"
    then = (
        f"a resume uses {ck['resume_from']}"
        if ck.get("resume_from")
        else "no complete checkpoint to resume from"
    )
    return f"checkpoint: {ck['name']} DAMAGED ({ck['why']}); {then}"


def building(
    rd: RunDir, spec: dict[str, Any], attempt: int, now: float | None = None
) -> list[dict[str, Any]]:
    """The torch extension builds under way (launchers.frozen.extcache: its FileBaton `lock`
    present), each with the nodes none of whose ranks has reported a step yet this attempt (they
    wait on it); node None: every node already reported (the build is named without a node)."""
    builds = extcache.building(extcache.ext_dir(spec), now)
    if not builds:
        return []
    g = int(spec.get("gpus_per_node") or 1)
    pairs = [(k, k * g + i) for k in range(int(spec.get("nodes") or 1)) for i in range(g)]
    rows = rank_rows(rd, attempt, now, ranks=pairs)
    quiet = sorted(
        {r["node"] for r in rows} - {r["node"] for r in rows if r["step"] is not None}
    ) or [None]
    return [
        {"node": k, "name": name, "secs": round(secs, 1)} for name, secs in builds for k in quiet
    ]


def warm_slots(rd: RunDir, spec: dict[str, Any]) -> dict[str, list[int]]:
    """--warm-spares, a running run: the pool's slots whose zygote is up (status/warm-slot<S>.json;
    one on this host whose pid is gone is not) and those that would start cold."""
    import glob
    import socket

    up = set()
    for f in glob.glob(layout.path(rd.path, "warm_slot", slot="*")):
        rec = layout.read_json(f) or {}
        pid, here = rec.get("pid"), rec.get("host") == socket.gethostname()
        if isinstance(rec.get("slot"), int) and (
            not here or isinstance(pid, int) and pid > 0 and procs.alive(pid)
        ):
            up.add(rec["slot"])
    pool = set(
        range(
            max(int(spec.get("max_nodes") or 0), int(spec.get("nodes") or 1))
            + int(spec.get("spares") or 0)
        )
    )
    return {"warm": sorted(up & pool), "cold": sorted(pool - up)}


def attempt_rows(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """run.yaml's attempts as `launch status` lists them: number, start, and what started it."""
    return [
        {"attempt": a.get("attempt", k), "started": a.get("started"), "why": started_by(a, k)}
        for k, a in enumerate(attempts or [])
    ]


def started_by(a: dict[str, Any], k: int) -> str:
    """An attempt's reason: `launch resume`, the recovery policy's restart, Slurm's requeue (restart
    N), the launch."""
    by = a.get("by")
    if by == timeline.BY_POLICY:
        return "restarted by the recovery policy"
    if by:
        return str(by)
    if a.get("reason"):
        return str(a["reason"]) + (
            f" (restart {a['slurm_restart']})" if a.get("slurm_restart") else ""
        )
    return "the launch" if k == 0 else "-"


def format_attempts(rows: list[dict[str, Any]]) -> list[str]:
    """`launch status`'s lines under `attempt:` when the run has more than one: each attempt and its
    reason."""
    if len(rows or []) < 2:
        return []
    return [
        f"            {r['attempt']}: {r['why']}"
        + (f"  (started {r['started']})" if r.get("started") else "")
        for r in rows
    ]


def next_steps(st: dict[str, Any]) -> list[str]:
    """`launch status`'s last lines for a run with a first failure: the log to read first (the
    failing rank's, else its node's agent log; on Slurm also the node's own Slurm output file) and
    the command to try next (docs/TROUBLESHOOTING.md)."""
    ff = st.get("first_failure")
    if not ff or st.get("state") == "COMPLETED" or ff.get("node") is None:
        return []
    rd, node, rank, job = st["run_dir"], ff["node"], ff.get("rank"), st.get("slurm_job_id")
    log = f"rank{rank}.log" if rank is not None else "agent.log"
    lines = [f"see:        {os.path.join(rd, 'logs', f'node{node}', log)}"]
    out = os.path.join(rd, "slurm", f"{job}_{node}_log.out")
    if job and os.path.isfile(out):
        lines.append(f"slurm out:  {out}")
    rank_opt = f" --rank {rank}" if rank is not None else ""
    return lines + [f"next:       launch logs {shlex.quote(rd)}{rank_opt}"]
