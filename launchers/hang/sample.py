"""When did each rank of this node last advance? From its heartbeat when the program reports one
(launchers.heartbeat: a new step, or new log output), otherwise from what is visible without help:
the rank's log growing, or its CPU time growing (at least BUSY of the wall time: a rank blocked in a
gloo collective or asleep uses next to none). A stopped process (SIGSTOP) never advances; a
program's exit is its last advance. Stdlib only."""

from __future__ import annotations

import os
from typing import Any

from .. import heartbeat, layout, procs
from ..procs import is_rank_wrapper

BUSY = 0.10
CLK_TCK = os.sysconf("SC_CLK_TCK")
STOPPED = ("T", "t")
# the rank's program has exited (or is a zombie its wrapper is about to reap)
ENDED = ("gone", "Z", "X")


def proc_stat(pid: int) -> tuple[str, int, float] | None:
    """(state letter, parent pid, CPU seconds) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode("utf-8", "replace").partition("=")[::2] for i in items if b"=" in i)


def rank_programs(run_id: str, node: int | None = None) -> dict[int, tuple[int, int]]:
    """rank -> (pid, node) of each rank's program (the rank wrapper's child) on this machine; only
    `node`'s ranks when given."""
    pids = procs.tagged_pids(run_id)
    wrappers = {p for p in pids if is_rank_wrapper(p)}
    out = {}
    for pid in pids:
        st = proc_stat(pid)
        # or forked warm
        if st is None or st[1] not in wrappers and procs.forked_as(pid) != "program":
            continue
        env = environ_of(pid)
        try:
            rank, where = int(env["RANK"]), int(env.get("NODE_RANK", "-1"))
        except (KeyError, ValueError):
            continue
        if node is None or where == node:
            out[rank] = (pid, where)
    return out


class Tracker:
    """The last time each rank of this node (or of every node on this machine: node None)
    advanced."""

    def __init__(self, run_dir: str, run_id: str, attempt: int, node: int | None, now: float):
        self.run_dir, self.run_id, self.attempt, self.node, self.start = (
            run_dir,
            run_id,
            attempt,
            node,
            now,
        )
        self.ranks: dict[int, dict[str, Any]] = {}

    def sample(self, now: float) -> dict[int, dict[str, Any]]:
        found = rank_programs(self.run_id, self.node)
        for rank, (pid, node) in found.items():
            t = self.ranks.get(rank)
            if t is None or t["pid"] != pid:
                t = self.ranks[rank] = {
                    "pid": pid,
                    "node": node,
                    "last_advance": now,
                    "step": None,
                    "step_time": None,
                    "heartbeat": False,
                    "cpu": None,
                    "log": None,
                    "at": now,
                }
            self.update(rank, t, now)
        for rank, t in self.ranks.items():
            # its program exited since: state gone (or Z)
            if rank not in found and t["state"] not in ENDED:
                self.update(rank, t, now)
        return self.ranks

    def update(self, rank: int, t: dict[str, Any], now: float) -> None:
        st = proc_stat(t["pid"])
        state, cpu = (st[0], st[2]) if st else ("gone", t["cpu"])
        hb = heartbeat.read(self.run_dir, rank)
        if hb and hb.get("attempt") == self.attempt and hb.get("time", 0) >= self.start - 1:
            t["heartbeat"], t["step_time"] = True, hb.get("step_time")
            if hb.get("step") != t["step"]:
                t["step"], t["last_advance"] = (
                    hb.get("step"),
                    max(t["last_advance"], min(now, hb["time"])),
                )
        try:
            size = os.path.getsize(layout.path(self.run_dir, "rank_log", node=t["node"], rank=rank))
        except OSError:
            size = t["log"]
        moved = t["log"] is not None and size is not None and size > t["log"]
        if not t["heartbeat"] and t["cpu"] is not None and cpu is not None and state not in STOPPED:
            moved = moved or cpu - t["cpu"] >= BUSY * max(now - t["at"], 1e-3)
        if (moved and state not in STOPPED) or (state in ENDED and t.get("state") not in ENDED):
            # a program's exit is its last act: the others' silence counts from it
            t["last_advance"] = now
        t.update(state=state, cpu=cpu, log=size, at=now)
