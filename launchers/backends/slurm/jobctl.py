"""A Slurm job in the queue, from the launcher's side: its states (squeue), scancel, the wait until
it has left the queue, the run's last job id (slurm/jobs), and launch cancel of a run (the stop
signal to its steps and their grace, then scancel; in the user's own allocation its launcher and its
steps by name). one_line: a Slurm command's error output in one line."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ... import layout, procs
from ...errors import LaunchError
from ...records.rundir import TERMINAL, RunDir
from ...stops import wait_s
from . import cmd
from . import status as slurm_status

CANCEL_WAIT_S = 90.0


def one_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    msg = " / ".join(lines[-2:]) if lines else "no output"
    return msg.replace("sbatch: error: ", "")


def cancel_run(rd: RunDir) -> None:
    """launch cancel of a Slurm run (SlurmBackend.cancel): the stop signal to its steps, their
    grace, scancel."""
    st = rd.update_status(cancel_requested=True, cancel_at=time.time())
    job_id = st.get("slurm_job_id") or last_job(rd)
    if st.get("in_allocation"):
        cancel_in_allocation(rd, st, job_id)
    elif job_id and queued_only(job_id):  # nothing runs yet: no program to stop gracefully
        scancel(job_id)
        wait_gone(job_id)
    elif job_id:
        spec = rd.spec()  # run.yaml, read once
        scancel(job_id, "--signal=" + spec.stop_signal[3:])
        try:
            wait_gone(job_id, wait_s(spec.stop_grace))  # the batch side then scancels the job
        except LaunchError:
            scancel(job_id)
            wait_gone(job_id)
    with rd.lock():
        if rd.read_status().get("state") not in TERMINAL:
            rd.update_status(
                state="CANCELLED", reason=f"by launch cancel (scancel {job_id})", first_failure=None
            )


def cancel_in_allocation(rd: RunDir, st: dict[str, Any], job_id: str | None) -> None:
    """In the user's own allocation: its launcher gets SIGTERM, this run's steps (by their name)
    scancel."""
    if rd.launcher_alive(st):
        os.kill(st["launcher"]["pid"], signal.SIGTERM)
    if job_id:  # the step(s) this run started in the allocation, by their name
        p = cmd.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"], timeout=None)
        for line in p.stdout.splitlines():
            step, _, name = line.partition("|")
            if name.strip() == f"launch-{rd.run_id}":
                cmd.run(["scancel", step.strip()], timeout=60)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while procs.tagged_pids(rd.run_id) and time.monotonic() < deadline:
        time.sleep(0.2)


def scancel(job_id: str, *flags: str) -> None:
    p = cmd.run(["scancel", *flags, job_id], timeout=60)
    if (
        p.returncode != 0
        and "already completing or completed" not in p.stderr
        and "Invalid job id" not in p.stderr
    ):
        raise LaunchError(f"scancel {job_id} failed: {one_line(p.stderr)}")


def queue_states(job_id: str) -> list[str] | None:
    """The states squeue lists for the job (one per array task); None when squeue fails."""
    p = cmd.run(["squeue", "-h", "-j", job_id, "-o", "%T"], timeout=30)
    return p.stdout.split() if p.returncode == 0 else None


def queued_only(job_id: str) -> bool:
    """squeue lists the job (every task of an array) as PENDING only: `scancel --signal` would reach
    nothing."""
    return set(queue_states(job_id) or ()) == {"PENDING"}


def wait_gone(job_id: str, wait_s: float = CANCEL_WAIT_S) -> None:
    """Until squeue no longer lists the job as pending, running or completing (all its tasks are
    gone)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        states = queue_states(job_id)
        if not states or all(s not in slurm_status.LIVE for s in states):
            return
        time.sleep(0.2)
    raise LaunchError(f"Slurm job {job_id} is still listed {wait_s:.0f} s after scancel")


def last_job(rd: RunDir) -> str | None:
    try:
        with open(layout.path(rd.path, "slurm_jobs"), encoding="utf-8") as f:
            lines = f.read().split()
        return lines[-1] if lines else None
    except OSError:
        return None
