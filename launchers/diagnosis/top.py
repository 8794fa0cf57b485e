"""`launch top [RUN...]`: a live view of each run's ranks -- step (of the program's total), steps/s,
ETA, last seen, straggler score and flags (explain.rank_rows, the rows `launch status --ranks`
shows), and this machine's GPUs when `nvidia-smi` is present. Up to MANY ranks a line per rank;
more: a line per node (min/median/max step) and only the flagged ranks. On a terminal the view is
redrawn in place (rich Live) and `q` or Ctrl-C quits; otherwise one block of plain lines per
refresh. Read-only: it reads status.json as recorded (no backend refresh, unlike `launch status`),
run.yaml and the progress records; it writes nothing and signals nothing."""

from __future__ import annotations

import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, TextIO

from .. import show
from ..errors import LaunchError
from ..records import rundir, runindex
from ..records.rundir import RunDir
from . import explain

MANY = 64  # more ranks than this: one line per node
NODE_LINES = 32  # at most this many node lines (flagged nodes first), then "+N nodes"
FLAGGED_SHOWN = 16  # at most this many flagged ranks listed under the node lines
SMI = [
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
]


def world(spec: dict[str, Any]) -> list[tuple[int, int]]:
    """(node, rank) of every rank of the recorded shape (torchrun's ranks are contiguous per
    node)."""
    per = int(spec["gpus_per_node"])
    return [(r // per, r) for r in range(int(spec["nodes"]) * per)]


def look(path: str, now: float | None = None) -> dict[str, Any]:
    """One run's view: its state as recorded and a row per rank of its world (nothing written)."""
    rd = RunDir.open(path, read_only=True)
    spec, st = rd.read_run_yaml()["spec"], rd.read_status()
    attempt = st.get("attempt", 0)
    rows = explain.rank_rows(rd, attempt, now, ranks=world(spec), hang=st.get("hang"))
    return {
        "run": rd.path,
        "state": st["state"],
        "attempt": attempt,
        "shape": f"{spec['nodes']}x{spec['gpus_per_node']}",
        "rows": rows,
    }


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def eta(r: dict[str, Any]) -> float | None:
    """Seconds to the program's total at its step time; None without a total or a step time."""
    if r.get("total") is None or r["step"] is None or not r["step_time_s"]:
        return None
    return max(0, r["total"] - r["step"]) * r["step_time_s"]


def seen(r: dict[str, Any]) -> str:
    return explain.NO_REPORT if not r["reported"] else f"{r['age_s']:.1f}s ago"


def cell(v: Any, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


RANK_HEAD = (
    f"{'RANK':>5} {'NODE':>4} {'STEP':>13} {'STEPS/S':>8} {'ETA':>8} {'STRAG':>5}  "
    f"{'LAST SEEN':<12} FLAGS"
)


def rank_line(r: dict[str, Any]) -> str:
    step = cell(r["step"]) + ("" if r.get("total") is None else f"/{r['total']}")
    rate = 1.0 / r["step_time_s"] if r["step_time_s"] else None
    return (
        f"{r['rank']:>5} {r['node']:>4} {step:>13} {cell(rate, '{:.2f}'):>8} {duration(eta(r)):>8} "
        f"{cell(r['straggler'], '{:.2f}'):>5}  {seen(r):<12} {' '.join(r['flags'])}"
    ).rstrip()


NODE_HEAD = (
    f"{'NODE':>4} {'RANKS':>5} {'STEP MIN/MED/MAX':>22} {'STEPS/S':>8} {'ETA':>8} "
    f"{'OLDEST':>8}  FLAGGED"
)


def node_line(node: int, rows: list[dict[str, Any]]) -> str:
    steps = [r["step"] for r in rows if r["step"] is not None]
    span = f"{min(steps)}/{int(statistics.median(steps))}/{max(steps)}" if steps else "-"
    times = [r["step_time_s"] for r in rows if r["step_time_s"]]
    rate = 1.0 / statistics.median(times) if times else None
    etas = [e for e in map(eta, rows) if e is not None]
    ages = [r["age_s"] for r in rows if r["reported"]]
    oldest = f"{max(ages):.1f}s" if ages else "-"
    flagged = sum(1 for r in rows if r["flags"])
    unreported = sum(1 for r in rows if not r["reported"])
    note = f"{flagged}" + (f"; {unreported} with {explain.NO_REPORT}" if unreported else "")
    return (
        f"{node:>4} {len(rows):>5} {span:>22} {cell(rate, '{:.2f}'):>8} "
        f"{duration(max(etas) if etas else None):>8} {oldest:>8}  {note}"
    )


def by_node(rows: list[dict[str, Any]]) -> list[str]:
    """Many ranks: a line per node (first those with a flagged or silent rank, at most NODE_LINES),
    then the flagged ranks."""
    nodes: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        nodes.setdefault(r["node"], []).append(r)
    order = sorted(
        nodes, key=lambda k: (not any(r["flags"] or not r["reported"] for r in nodes[k]), k)
    )
    lines = [NODE_HEAD] + [node_line(k, nodes[k]) for k in order[:NODE_LINES]]
    if len(order) > NODE_LINES:
        lines.append(
            f"  +{len(order) - NODE_LINES} nodes more, none flagged"
            if not any(r["flags"] for k in order[NODE_LINES:] for r in nodes[k])
            else f"  +{len(order) - NODE_LINES} nodes more"
        )
    flagged = [r for r in rows if r["flags"]]
    if flagged:
        lines += [f"flagged ranks ({len(flagged)}):", RANK_HEAD] + [
            rank_line(r) for r in flagged[:FLAGGED_SHOWN]
        ]
        if len(flagged) > FLAGGED_SHOWN:
            lines.append(f"  +{len(flagged) - FLAGGED_SHOWN} flagged ranks more")
    return lines


def render(view: dict[str, Any]) -> list[str]:
    """One run's lines: a header, then a line per rank (up to MANY) or per node."""
    rows = view["rows"]
    head = (
        f"{view['run']}  {view['state']}  attempt {view['attempt']}  {view['shape']} "
        f"({len(rows)} ranks, {sum(1 for r in rows if r['flags'])} flagged)"
    )
    ages = [r["age_s"] for r in rows if r["reported"]]
    if not ages:
        return [head, f"  {explain.NO_REPORT}"]
    if view["state"] == "RUNNING" and min(ages) > explain.silent_limit(rows):
        head += f"  -- no rank advanced for {min(ages):.1f}s"
    return [head] + (
        ([RANK_HEAD] + [rank_line(r) for r in rows]) if len(rows) <= MANY else by_node(rows)
    )


def gpu_lines(text: str, host: str) -> list[str]:
    """`nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total` (csv, no units) ->
    one line."""
    cells = []
    for line in text.strip().splitlines():
        f = [c.strip() for c in line.split(",")]
        if len(f) == 4 and all(c.replace(".", "", 1).isdigit() for c in f):
            cells.append(f"{f[0]}: {f[1]}% {float(f[2]) / 1024:.1f}/{float(f[3]) / 1024:.1f} GiB")
    return [f"gpus on {host}: " + "  ".join(cells)] if cells else []


def gpus() -> list[str]:
    """This machine's GPUs, when nvidia-smi is present and answers; nothing otherwise (never an
    error)."""
    if shutil.which(SMI[0]) is None:
        return []
    try:
        p = subprocess.run(SMI, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return []
    return gpu_lines(p.stdout, socket.gethostname()) if p.returncode == 0 else []


def frame(paths: list[str], now: float | None = None) -> list[str]:
    lines: list[str] = []
    for p in paths:
        lines += render(look(p, now)) + [""]
    return lines + gpus()


def running_runs() -> list[str]:
    """No RUN given: the runs not ended (status.json as recorded), newest first."""
    out = [
        rd.path for rd in rundir.list_runs() if rd.read_status().get("state") not in rundir.TERMINAL
    ]
    if not out:
        raise LaunchError("no run is running; give RUN (a run dir) to `launch top`")
    return out


def plain(paths: list[str], interval: float, once: bool, out: TextIO) -> None:
    while True:
        out.write(f"--- {time.strftime('%H:%M:%S')}\n" + "\n".join(frame(paths)) + "\n")
        out.flush()
        if once:
            return
        time.sleep(interval)


def live(paths: list[str], interval: float, out: TextIO) -> None:
    """Redrawn in place until `q` (stdin a terminal, read a key at a time) or Ctrl-C."""
    import termios
    import tty

    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    console = Console(file=out, markup=False, highlight=False, emoji=False)
    try:
        if fd is not None:
            tty.setcbreak(fd)
        with Live(console=console, auto_refresh=False, vertical_overflow="crop") as view:
            while True:
                height = max(5, console.size.height - 1)
                view.update(Text("\n".join(frame(paths)[:height])), refresh=True)
                ready = (
                    select.select([fd], [], [], interval)[0]
                    if fd is not None
                    else time.sleep(interval)
                )
                if ready and os.read(fd, 1) in (b"q", b"Q"):
                    return
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def top(paths: list[str], interval: float, once: bool, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    paths = [runindex.resolve(p) for p in paths] or running_runs()  # a name or a Slurm job id too
    for p in paths:
        RunDir.open(p, read_only=True)  # a bad RUN: its one-line error before any view
    try:
        if once or not show.is_terminal(out):
            plain(paths, interval, once, out)
        else:
            live(paths, interval, out)
    except KeyboardInterrupt:
        pass
