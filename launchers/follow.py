"""The one log tailer: every line of a rank log becomes "[nK rR] line".

Used by `launch logs [-f]`, by the local and Slurm backends while a job runs, and on every SSH host
by launchers.remote (which streams its node's logs back over the connection). Stdlib +
launchers.layout and .rundircheck only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Iterable, TextIO

from . import layout
from .records import rundircheck

Source = Callable[[], Iterable[tuple[str, str]]]  # -> (prefix, path) of every file to follow, now
# encodings that write ASCII as its own bytes: a stream in one of them takes ASCII lines as bytes
_ASCII_SAFE = ("utf-8", "utf8", "ascii", "us-ascii", "ansi-x3.4-1968", "latin-1", "iso8859-1")
TAIL_BYTES = 1 << 20  # a reader's most per file and poll: the tail of a larger log (issue 35)


class LogTail:
    """Follows a changing set of files (new ones are picked up), printing whole lines with their
    prefix."""

    def __init__(
        self, sources: Source, out: TextIO | None = None, root: str | None = None, raw: bool = True
    ):
        """root: a reader's (`launch logs`): files opened inside it only (rundircheck.open_inside),
        at most TAIL_BYTES of each per poll; raw False: terminal control sequences removed from the
        lines (show.clean)."""
        self.sources, self.out, self.root, self.raw = sources, out or sys.stdout, root, raw
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}

    def skip_existing(self) -> None:
        """Start following at the current end of every file (new output only)."""
        for _, path in self.sources():
            try:
                self._offsets[path] = os.path.getsize(path)
            except OSError:
                continue

    def poll(self, final: bool = False) -> int:
        """Print what was appended since the last poll; returns the number of lines printed. `final`
        prints an unterminated last line too. Each file's whole lines are decoded and prefixed
        together (no Python per line); ASCII ones stay bytes up to the output's byte stream."""
        out: list = []  # str or (ASCII) bytes-like, in order
        n = 0
        for prefix, path in self.sources():
            try:
                data, skipped = self._read(path)
            except OSError:
                continue
            if skipped:
                out.append(
                    f"{prefix}... {skipped} earlier bytes not shown (the last {TAIL_BYTES >> 20} "
                    f"MiB of {path})\n"
                )
                n += 1
                self._partial.pop(path, None)  # its first line may be the end of a longer one
            buf = self._partial.pop(path, b"") + data
            cut = len(buf) if final else buf.rfind(b"\n") + 1
            if cut < len(buf):
                self._partial[path] = buf[cut:]
            if not cut:
                continue
            nl = buf.count(b"\n", 0, cut)
            ended = buf[cut - 1] == 10  # (else the final poll's unterminated last line)
            n += nl + (not ended)
            if self.raw and buf.isascii() and prefix.isascii():
                # every newline but the last followed by the prefix, without copying the lines
                pb = prefix.encode()
                end = cut + nl * len(pb) - (len(pb) if ended else 0)
                out += [pb, memoryview(buf.replace(b"\n", b"\n" + pb))[:end]]
                out += [] if ended else [b"\n"]
                continue
            body = buf[: cut - 1 if ended else cut]
            # '\n' is never part of a multi-byte sequence: decoding the lines together is decoding
            # each alone
            text = body.decode("utf-8", "replace")
            if not self.raw:
                from .show import clean

                text = "\n".join(clean(ln) for ln in text.split("\n"))
            out.append(prefix + text.replace("\n", "\n" + prefix) + "\n")
        if out:
            self._write(out)
        return n

    def _write(self, out: list) -> None:
        stream = getattr(self.out, "buffer", None)
        ascii_ok = str(getattr(self.out, "encoding", "")).lower().replace("_", "-") in _ASCII_SAFE
        if stream is not None and ascii_ok and not any(isinstance(x, str) for x in out):
            self.out.flush()  # what went through the text layer before comes first
            for x in out:
                stream.write(x)
            stream.flush()
            return
        self.out.write("".join(x if isinstance(x, str) else str(x, "ascii") for x in out))
        self.out.flush()

    def _read(self, path: str) -> tuple[bytes, int]:
        """What was appended to path since the last poll, and how many bytes of it were skipped (a
        reader reads at most TAIL_BYTES: the end)."""
        fd = rundircheck.open_inside(self.root, path) if self.root else os.open(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            start = self._offsets.get(path, 0)
            end = os.fstat(fd).st_size if self.root else None
            skipped = max(0, end - start - TAIL_BYTES) if end is not None else 0
            f.seek(start + skipped)
            data = f.read(TAIL_BYTES) if self.root else f.read()
            self._offsets[path] = f.tell()
        return data, skipped

    def follow(
        self, done: Callable[[], bool], interval: float = 0.2, stop: threading.Event | None = None
    ) -> None:
        """Poll until done() is true (then print the rest) or `stop` is set."""
        while not (stop and stop.is_set()):
            finished = done()
            self.poll(final=finished)
            if finished:
                return
            time.sleep(interval)
        self.poll(final=True)


def run_logs(run_dir: str, rank: int | None = None, prefix: bool = True) -> Source:
    """Every rank log of a run ("[nK rR] "), or one rank's (unprefixed when prefix is False)."""

    def sources():
        for node, r, path in layout.rank_logs(run_dir):
            if rank is None or r == rank:
                yield (f"[n{node} r{r}] " if prefix else ""), path

    return sources


def node_logs(run_dir: str, node: int) -> Source:
    """One node's rank logs ("[nK rR] "): what an SSH host streams back. The agent's own noise (c10d
    warnings, its traceback on a stop) stays in agent.log, as on the other backends."""

    def sources():
        d = layout.path(run_dir, "node_logs", node=node)
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
            if name.startswith("rank") and name.endswith(".log"):
                yield f"[n{node} r{name[4:-4]}] ", os.path.join(d, name)

    return sources


def follower(
    run_dir: str,
    rank: int | None = None,
    out: TextIO | None = None,
    prefix: bool = True,
    reader: bool = False,
    raw: bool = True,
) -> LogTail:
    """reader: `launch logs` (files inside the run dir only, tails, control sequences removed unless
    raw)."""
    return LogTail(run_logs(run_dir, rank, prefix), out, root=run_dir if reader else None, raw=raw)


def follow_in_thread(
    run_dir: str, out: TextIO | None = None
) -> tuple[threading.Thread, threading.Event]:
    """Stream a running job's rank logs from a daemon thread; set the event to stop (prints the
    rest)."""
    stop = threading.Event()
    tail = follower(run_dir, out=out)
    tail.skip_existing()
    t = threading.Thread(
        target=tail.follow, args=(lambda: False,), kwargs={"stop": stop}, daemon=True
    )
    t.start()
    return t, stop
