"""Progress a training program reports to `launch` (hang detection, `launch status --ranks`).

    from launchers import heartbeat
    for step, batch in enumerate(loader):
        ...
        heartbeat.step(step)

Stdlib only and cheap: the record (<run dir>/progress/rank<R>.json: step, time, step time) is rewritten in
place, one pwrite per call (bench/heartbeat_overhead.py measures it next to a training step). Outside a
`launch` run (no LAUNCH_RUN_DIR) every call is a no-op, so a program may call it unconditionally.
"""
from __future__ import annotations

import os
import time

from . import layout

RECORD_BYTES = 192        # the record is padded to this size and rewritten in place (one pwrite)


class _Beat:
    def __init__(self) -> None:
        env = os.environ
        self.run_dir = env.get("LAUNCH_RUN_DIR")
        self.rank = int(env.get("RANK", "0"))
        self.attempt = int(env.get("LAUNCH_ATTEMPT", "0"))
        self.fd: int | None = None
        self.step: int | None = None
        self.last_step_at: float | None = None
        self.step_time: float | None = None

    def beat(self, step: int | None, now: float) -> None:
        if step is None:
            step = 0 if self.step is None else self.step + 1
        if self.step is not None and step != self.step and self.last_step_at is not None:
            dt = (now - self.last_step_at) / max(1, step - self.step)
            self.step_time = dt if self.step_time is None else 0.8 * self.step_time + 0.2 * dt
        if step != self.step:
            self.step, self.last_step_at = step, now
        self.write(now)      # every step: the last one before a hang must be on record

    def write(self, now: float) -> None:
        if self.fd is None:
            path = layout.path(self.run_dir, "progress", rank=self.rank)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        st = "null" if self.step_time is None else f"{self.step_time:.6f}"
        rec = (f'{{"rank": {self.rank}, "attempt": {self.attempt}, "step": {self.step}, "time": {now:.3f}, '
               f'"step_time": {st}, "pid": {os.getpid()}}}')
        os.pwrite(self.fd, rec.ljust(RECORD_BYTES - 1).encode() + b"\n", 0)


_beat: _Beat | None = None


def step(n: int | None = None) -> None:
    """Report that training reached step n (default: the previous step + 1)."""
    global _beat
    if _beat is None:
        _beat = _Beat()
    if _beat.run_dir:
        _beat.beat(n, time.time())


def read(run_dir: str, rank: int) -> dict | None:
    """A rank's last progress record, or None (not reported yet, or caught mid-write)."""
    return layout.read_json(layout.path(run_dir, "progress", rank=rank))
