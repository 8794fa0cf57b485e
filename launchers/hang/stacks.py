"""Every rank's Python stack (py-spy, a tool made for this), and whether the rank is stalled or
waiting.

A rank blocked inside torch.distributed (a collective, a barrier, a wait) is *waiting*; a stopped
process, or one whose stack is elsewhere, is *stalled*. Stdlib only (py-spy is a separate binary,
installed by make).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

from .. import layout
from .sample import STOPPED

DUMP_TIMEOUT_S = 10.0
WAIT_MARKERS = ("torch/distributed/", "torch\\distributed\\")


def py_spy() -> str | None:
    """py-spy next to this interpreter (a venv's bin) or on PATH."""
    near = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return near if os.access(near, os.X_OK) else shutil.which("py-spy")


def dump(pid: int) -> tuple[str, bool]:
    """(text, ok): the process's Python stacks, or why there are none. --nonblocking: a stopped
    process cannot be suspended again, and a waiting one is not disturbed."""
    tool = py_spy()
    if tool is None:
        return (
            f"py-spy is not installed on {socket.gethostname()} (pip install py-spy==0.4.3, or "
            "`make venv`); no stack captured",
            False,
        )
    try:
        p = subprocess.run(
            [tool, "dump", "--pid", str(pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=DUMP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"py-spy dump --pid {pid} did not answer within {DUMP_TIMEOUT_S:.0f} s", False
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[0]
        hint = (
            " (ptrace not permitted: run as the job's user, or allow it: kernel.yama.ptrace_scope)"
            if "ermission" in p.stderr or "ptrace" in p.stderr.lower()
            else ""
        )
        return f"py-spy dump --pid {pid} failed on {socket.gethostname()}: {why}{hint}", False
    return p.stdout, True


def main_thread(text: str) -> list[str]:
    """The frames of the main thread (innermost first) of a py-spy dump."""
    frames, inside = [], False
    for line in text.splitlines():
        if line.startswith("Thread "):
            if inside:
                break
            inside = '"MainThread"' in line
        elif inside and line.startswith("    "):
            frames.append(line.strip())
    return frames


def classify(state: str, text: str, ok: bool) -> tuple[str, str]:
    """('stalled' | 'waiting', why) for one rank."""
    if state in STOPPED:
        return "stalled", "process stopped (state T: SIGSTOP or a debugger)"
    if state == "gone":
        return "stalled", "process gone"
    if not ok:
        return "stalled", "no stack (see its file)"
    frames = main_thread(text)
    for f in frames:
        if any(m in f for m in WAIT_MARKERS):
            return "waiting", f"in {f}"
    return "stalled", f"stack elsewhere: {frames[0] if frames else 'no Python frame'}"


def capture(run_dir: str, attempt: int, ranks: dict[int, dict]) -> dict[int, dict]:
    """Dump every given rank's stack into hang/attempt<A>/rank<R>.txt; rank -> {class, why, step,
    node}."""
    out = {}
    for rank, t in sorted(ranks.items()):
        text, ok = dump(t["pid"])
        path = layout.path(run_dir, "hang_stack", attempt=attempt, rank=rank)
        header = f"# rank {rank} pid {t['pid']} on {socket.gethostname()} state {t.get('state')}\n"
        layout.atomic_write(
            path, header + text + ("" if text.endswith("\n") else "\n"), durable=False
        )
        cls, why = classify(t.get("state", "?"), text, ok)
        out[rank] = {"class": cls, "why": why, "step": t.get("step"), "node": t.get("node")}
    return out
