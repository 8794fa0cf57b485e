"""What `launch` shows people: tables and progress lines.

Tables (`launch list`, `launch status`): on a terminal, rich tables; otherwise (a pipe, a file)
plain text with aligned columns; `--json` is the CLI's and never comes here. rich is imported only
when the stream is a terminal, so scripts and pipes never pay for it (and a missing rich falls back
to the plain text). Progress (waiting in the Slurm queue, SSH preflight, file collection): one line
on stderr per change, the same on a terminal and in a log -- never a spinner. Stdlib only otherwise;
reads nothing but what it is given.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Sequence, TextIO

from .frozen.extcache import line

KV = re.compile(r"^([a-z][a-z ]{0,20}):\s+(.*)$")
# terminal control: CSI (ESC [ or C1 0x9b ... final), OSC/DCS/APC/PM/SOS strings (to BEL or ST),
# other ESC sequences, and every C0/C1 control but tab and newline (issue 35: names, reasons and log
# lines are data)
CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?|(?:\x1b[\]PX^_]|[\x90\x98\x9d-\x9f])[^\x07\x1b\x9c]*"
    r"(?:\x07|\x1b\\|\x9c)?|\x1b[ -/]*[0-~]?|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def clean(text: Any) -> str:
    """text as people may see it on a terminal: its control sequences removed (tab and newline
    kept)."""
    return CONTROL.sub("", str(text))


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def _rich(out: TextIO):
    """A rich Console on `out` when it is a terminal and rich is installed, else None."""
    if not is_terminal(out):
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=out, markup=False, highlight=False, emoji=False)


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, two spaces apart; no trailing blanks."""
    cells = [[clean(c) for c in headers]] + [[clean(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in cells)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    console = _rich(out)
    if console is None:
        out.write(plain_table(headers, rows))
        return
    from rich.table import Table

    t = Table(*headers, header_style="bold", pad_edge=False)
    for r in rows:
        t.add_row(*(clean(c) for c in r))
    console.print(t)


def status(text: str, out: TextIO | None = None) -> None:
    """`launch status`'s text (api.format_status): as is when not a terminal; on one, its `key:
    value` lines as a two-column grid and its per-rank block (a header line of upper-case words) as
    a table."""
    out, text = out or sys.stdout, clean(text)
    console = _rich(out)
    if console is None:
        out.write(text + "\n")
        return
    from rich.table import Table

    lines = text.splitlines()
    head = next(
        (
            i
            for i, ln in enumerate(lines)
            if len(ln.split()) > 2 and ln.split()[0].isupper() and ":" not in ln
        ),
        len(lines),
    )
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for ln in lines[:head]:
        m = KV.match(ln)
        grid.add_row(*(m.groups() if m else ("", ln)))
    console.print(grid)
    if head < len(lines):
        names = lines[head].split()
        t = Table(*names, header_style="bold", pad_edge=False)
        for ln in lines[head + 1 :]:
            t.add_row(*ln.split(None, len(names) - 1))  # the last column may hold words (FLAGS)
        console.print(t)


class Progress:
    """Progress lines on stderr ("launch: ..."), each printed once: a key's line again only when it
    changed."""

    def __init__(self, out: TextIO | None = None):
        self.out = out
        self.shown: dict[str, str] = {}

    def say(self, key: str, text: str) -> None:
        if self.shown.get(key) == text:
            return
        self.shown[key] = text
        out = self.out or sys.stderr
        out.write(f"launch: {clean(text)}\n")
        out.flush()

    def run(self, st: dict[str, Any], node_records: dict[int, dict[str, Any]]) -> None:
        """A run being waited for: its state (with Slurm's state and pending reason), then each node
        as its record says it started (Slurm nodes write one when their agent starts)."""
        job = st.get("slurm_job_id")
        what = f"slurm job {job}" if job else "run"
        state = st.get("state", "?")
        if state in ("COMPLETED", "FAILED", "CANCELLED"):
            return  # the end line says it
        slurm = st.get("slurm_state")
        # in words
        why = (
            (st.get("reason") or st.get("slurm_reason")) if slurm == "PENDING" else st.get("reason")
        )
        detail = "; ".join(
            x
            for x in (
                (f"Slurm {slurm}" if slurm and slurm != state else ""),
                (f"reason: {why}" if why and why != "None" else ""),
            )
            if x
        )
        self.say("state", f"{what} {state}" + (f" ({detail})" if detail else ""))
        for k, rec in sorted(node_records.items()):
            if rec.get("state") == "RUNNING":
                self.say(f"node{k}", f"node {k} started on {rec.get('host', '?')}")
        # decided on the nodes (nodebackend)
        if (dist := st.get("dist_backend") or {}).get("complete"):
            self.say("dist", f"--dist-backend auto -> {dist['verdict']}")
        # a torch extension build (launchers.frozen.extcache): every 15 s at most
        for b in st.get("building") or []:
            self.say(
                f"build{b['node']}{b['name']}", line(b["node"], b["name"], b["secs"] // 15 * 15)
            )


def counted(what: str, total: int, out: TextIO | None = None, terminal_only: bool = False):
    """A thread-safe callback(name, word) printing "launch: <what> k/N: <name> <word>" as each of N
    parts ends (SSH hosts answering the preflight, hosts' files collected). terminal_only: silent
    unless the stream is a terminal (a preflight that fails must leave its one-line error alone in a
    log)."""
    import threading

    lock, seen = threading.Lock(), [0]
    stream = out or sys.stderr
    live = not terminal_only or is_terminal(stream)

    def say(name: str, word: str) -> None:
        with lock:
            seen[0] += 1
            if live:
                stream.write(f"launch: {what} {seen[0]}/{total}: {name} {word}\n")
                stream.flush()

    return say
