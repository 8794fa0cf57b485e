"""Progress a training program reports to `launch` (hang detection, `launch status --ranks`).

    from launchers import heartbeat
    for step, batch in enumerate(loader):
        ...
        heartbeat.step(step, total=len(loader))     # total: optional, gives `launch top` its ETA

    heartbeat.checkpoint(path)      # rank 0, once a checkpoint under $LAUNCH_CHECKPOINT_DIR is complete
    heartbeat.hang_stop()           # in a stop handler: a hang's stop (skip a save agreed over all ranks)?

Stdlib only and cheap: the record (<run dir>/progress/rank<R>.json: step, time, step time, `first`:
the time of this attempt's first beat) is rewritten in place, one pwrite per call and no other
system call (bench/hang_detection.py measures it next to a training step): the run's generation is
looked at on the first beat, after a pause and at most once a second (launchers.records.fence.Watch:
a beat of an older attempt is refused, said once). The record's `total` and `first` (null when never
given) were added later: readers use .get(). Outside a `launch` run (no LAUNCH_RUN_DIR) every call
is a no-op, so a program may call it unconditionally.
"""  # noqa: E501

from __future__ import annotations

import os
import time

from . import ckptptr, layout
from .records import fence

RECORD_BYTES = 192  # the record is padded to this size and rewritten in place (one pwrite)
PAD = " " * (RECORD_BYTES - 1) + "\n"
# getpid is a system call (glibc caches it no more): once, and again in a forked child
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class Reporter:
    """One rank's progress record writer (step() uses one made from the rank's environment)."""

    def __init__(self, run_dir: str | None, rank: int, attempt: int) -> None:
        self.run_dir, self.rank, self.attempt = run_dir, rank, attempt
        self.total: int | None = None
        self.fd: int | None = None
        self.step: int | None = None
        self.last_step_at: float | None = None
        self.step_time: float | None = None
        # this process's first beat (launchers.resilience.timeline: first step)
        self.first: float | None = None
        # the record's unchanging start, and its end as of the last change (total, first, pid)
        self.head = f'{{"rank": {rank}, "attempt": {attempt}, "step": '
        self.tail: str | None = None
        self.tail_pid = _pid
        self.fence = (
            fence.Watch(run_dir, attempt, f"the heartbeat of rank {rank}") if run_dir else None
        )

    def beat(self, step: int | None, now: float, total: int | None = None) -> None:
        if total is not None and total != self.total:
            self.total, self.tail = int(total), None
        if step is None:
            step = 0 if self.step is None else self.step + 1
        if step != self.step:
            if self.step is not None and self.last_step_at is not None:
                dt = (now - self.last_step_at) / max(1, step - self.step)
                self.step_time = dt if self.step_time is None else 0.8 * self.step_time + 0.2 * dt
            self.step, self.last_step_at = step, now
        if self.first is None:
            self.first, self.tail = now, None
        self.write(now)  # every step: the last one before a hang must be on record

    def write(self, now: float) -> None:
        # an older attempt's beat: nothing written
        if self.fence is not None and self.fence.refused(now):
            return
        if self.fd is None:
            path = layout.path(self.run_dir, "progress", rank=self.rank)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        # what changes at most once in a while, formatted then (a beat in a training loop is ~10 us
        # of Python besides its pwrite: each f-string field counts)
        if self.tail is None or self.tail_pid != _pid:
            total = "null" if self.total is None else self.total
            first = "null" if self.first is None else f"{self.first:.3f}"
            self.tail = f', "total": {total}, "pid": {_pid}, "first": {first}}}'
            self.tail_pid = _pid
        st = "null" if self.step_time is None else f"{self.step_time:.6f}"
        rec = f'{self.head}{self.step}, "time": {now:.3f}, "step_time": {st}{self.tail}'
        os.pwrite(self.fd, (rec + PAD[min(len(rec), RECORD_BYTES - 1) :]).encode(), 0)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_beat: Reporter | None = None


def _reporter() -> Reporter:
    global _beat
    if _beat is None:
        env = os.environ
        _beat = Reporter(
            env.get("LAUNCH_RUN_DIR"),
            int(env.get("RANK", "0")),
            int(env.get("LAUNCH_ATTEMPT", "0")),
        )
    return _beat


def step(n: int | None = None, total: int | None = None) -> None:
    """Report that training reached step n (default: the previous step + 1); total: the steps the
    run will take, when known (given once is enough; `launch top` shows an ETA from it)."""
    beat = _reporter()
    if beat.run_dir:
        beat.beat(n, time.time(), total)


def checkpoint(path: str) -> bool:
    """Report a complete checkpoint (a directory or file) on global rank 0: when it lies directly in
    this run's checkpoints dir ($LAUNCH_CHECKPOINT_DIR), `checkpoints/latest` names it (what `launch
    status` shows as `checkpoint:`). False (nothing written) elsewhere, on other ranks, or outside a
    `launch` run."""
    beat, ckpt_dir = _reporter(), os.environ.get("LAUNCH_CHECKPOINT_DIR")
    if not (beat.run_dir and ckpt_dir) or beat.rank != 0:
        return False
    path = os.path.realpath(path)
    if os.path.dirname(path) != os.path.realpath(ckpt_dir) or not os.path.exists(path):
        return False
    ckptptr.write_latest(ckpt_dir, os.path.basename(path))
    return True


def hang_stop() -> dict | None:
    """This attempt's stop is a hang's (--hang-timeout): the record ({"reason": "hang",
    "hung_ranks": [...], "time"}) that the launcher writes (hang/attempt<A>/stop.json) before it
    ends the hung ranks (SIGKILL) and stops the others (their stop signal); None otherwise (a
    preemption, a cancel, no stop, outside a `launch` run). A program that saves collectively on a
    stop skips that save then -- a collective with the hung ranks fails -- and keeps its last good
    checkpoint."""
    env = os.environ
    run_dir = env.get("LAUNCH_RUN_DIR")
    if not run_dir:
        return None
    try:
        attempt = int(env.get("LAUNCH_ATTEMPT", "0"))
    except ValueError:
        return None
    return layout.read_json(layout.path(run_dir, "hang_stop", attempt=attempt))


NUMBERS = ("rank", "attempt", "step", "time", "step_time", "total", "pid", "first")


def read(run_dir: str, rank: int) -> dict | None:
    """A rank's last progress record, or None (not reported yet, caught mid-write, or not what a
    rank writes: a field of another type is a planted record, issue 35)."""
    rec = layout.read_json(layout.path(run_dir, "progress", rank=rank))
    ok = rec is not None and all(
        rec.get(k) is None or type(rec[k]) in (int, float) for k in NUMBERS
    )
    return rec if ok else None
