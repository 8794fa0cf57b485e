"""Prefixed log reading and following: every line of logs/node<K>/rank<R>.log becomes "[nK rR] line"."""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, TextIO

from .rundir import RunDir


class Follower:
    """Tails every rank log of a run (picking up logs that appear later), one prefixed line at a time."""

    def __init__(self, rd: RunDir, rank: int | None = None, out: TextIO | None = None, prefix: bool = True):
        self.rd, self.rank, self.out, self.prefix = rd, rank, out or sys.stdout, prefix
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}

    def _logs(self):
        for node, rank, path in self.rd.rank_logs():
            if self.rank is None or rank == self.rank:
                yield node, rank, path

    def skip_existing(self) -> None:
        """Start following at the current end of every log (new output only)."""
        for _, _, path in self._logs():
            self._offsets[path] = os.path.getsize(path)

    def poll(self, final: bool = False) -> int:
        """Print what was appended since the last poll; returns the number of lines printed."""
        n = 0
        for node, rank, path in self._logs():
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
                    self._offsets[path] = f.tell()
            except OSError:
                continue
            data = self._partial.pop(path, b"") + data
            lines = data.split(b"\n")
            if lines[-1] and not final:
                self._partial[path] = lines[-1]
            tail = lines[:-1] if not final or not lines[-1] else lines
            prefix = f"[n{node} r{rank}] " if self.prefix else ""
            for line in tail:
                self.out.write(prefix + line.decode("utf-8", "replace") + "\n")
                n += 1
        if n:
            self.out.flush()
        return n

    def follow(self, done: Callable[[], bool], interval: float = 0.2, stop: threading.Event | None = None) -> None:
        """Poll until done() is true (then print the rest) or `stop` is set."""
        while not (stop and stop.is_set()):
            finished = done()
            self.poll(final=finished)
            if finished:
                return
            time.sleep(interval)
        self.poll(final=True)


def follow_in_thread(rd: RunDir, out: TextIO | None = None) -> tuple[threading.Thread, threading.Event]:
    """Stream a running job's rank logs from a daemon thread; set the event to stop (prints the rest)."""
    stop = threading.Event()
    f = Follower(rd, out=out)
    f.skip_existing()
    t = threading.Thread(target=f.follow, args=(lambda: False,), kwargs={"stop": stop}, daemon=True)
    t.start()
    return t, stop
