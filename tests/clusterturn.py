"""Turns on a shared dev cluster (make test runs the tests of one cluster on several pytest-xdist workers at once).

Most cluster tests only start their own runs, so several may use the dev Slurm cluster or the SSH test hosts at
once: Slurm queues what does not fit, and each run is found by its own run id, job id or run dir. A test marked
`exclusive` disrupts its cluster or reads its cluster-wide state (kills or pauses slurmd, slurmctld or a host, cuts
a link, takes every node, compares the whole queue before and after): it runs while no other test of that cluster
does. A readers-writer lock per cluster (flock, shared by every worker of the run): the shared tests hold it
shared, an exclusive test holds it alone; a gate in front of it keeps new shared tests out once an exclusive one
waits, so the exclusive one gets its turn when the running ones end (flock alone promises no order)."""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator


@contextlib.contextmanager
def turn(lock_dir: str, cluster: str, exclusive: bool) -> Iterator[None]:
    """Hold `cluster`'s lock (under lock_dir: one per make test run) shared, or alone when exclusive."""
    base = os.path.join(lock_dir, f"{cluster}-cluster")
    with open(base + ".gate", "a+b") as gate, open(base + ".lock", "a+b") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)            # in line: behind an exclusive test that waits, never past it
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield                                       # both fds close (and unlock) on leaving the with
