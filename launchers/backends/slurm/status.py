"""What Slurm says about a job, without slurmdbd: squeue (live), scontrol (live and recently
finished), `sacct -c` (the jobcomp log: finished jobs only). Calls are rate-limited per run through
a small cache file in <run dir>/slurm/. A job that none of them knows is GONE; when the controller
does not answer at all (down, paused, timing out) the job is UNKNOWN -- never a verdict.

Parsing is pure (tested with recorded output). This is the one place `scontrol show job` runs
(show_job) and the one reader of its KEY=VALUE words (job_fields): the job's state here, its
preemption times for the batch script (inalloc.hold_for_requeue), the files it names for `launch
cancel`'s check (trust.slurm_refusal).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from . import cmd, pending

FACTS = ("Partition", "Priority", "Dependency", "StartTime", "NumNodes")
MIN_INTERVAL_S = 2.0  # at most one round of Slurm calls per run per this many seconds
CMD_TIMEOUT_S = 15.0

LIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "STOPPED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "PREEMPTED",
    "RESV_DEL_HOLD",
    "SPECIAL_EXIT",
}
ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
}


@dataclass
class SlurmJob:
    job_id: str
    state: str  # Slurm's state name, or GONE
    source: str  # squeue | scontrol | sacct | none
    reason: str = ""
    restarts: int = 0
    exit_code: str = ""
    nodelist: str = ""
    checked: float = 0.0
    # scontrol's words a pending job is explained by (FACTS)
    facts: dict = field(default_factory=dict)
    waiting: str = ""  # why it is pending, in words (launchers.backends.slurm.pending)

    @property
    def live(self) -> bool:
        return self.state in LIVE


# ------------------------------------------------------------------------------------------ parsing


def _base_state(s: str) -> str:
    # "CANCELLED by 0" -> CANCELLED; "RUNNING+" or flags are dropped
    return s.strip().split()[0].rstrip("+").upper() if s.strip() else ""


def parse_squeue(out: str, job_id: str) -> SlurmJob | None:
    """`squeue -h -j ID -o %i|%T|%r|%N` output."""
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0] == job_id:
            return SlurmJob(
                job_id,
                _base_state(parts[1]),
                "squeue",
                reason=parts[2] if len(parts) > 2 else "",
                nodelist=parts[3] if len(parts) > 3 else "",
            )
    return None


_FIELD = re.compile(r"(?:^|(?<=\s))([A-Za-z][^=\s]*)=(.*?)(?=\s+[A-Za-z][^=\s]*=|\s*$)")
FILES = ("StdOut", "StdErr", "Command")  # the files Slurm names for a job (values may hold blanks)


def job_fields(out: str) -> dict[str, str]:
    """`scontrol show job -o` output -> {KEY: VALUE}: the one reader of its KEY=VALUE words. A value
    runs to the next word that is a KEY= (a path or a job name may hold blanks); the first of a key
    wins, over the lines too (-o: one line per job, so give it one line to read one job)."""
    fields: dict[str, str] = {}
    for line in out.splitlines():
        for m in _FIELD.finditer(line):
            fields.setdefault(m.group(1), m.group(2))
    return fields


def parse_scontrol(out: str, job_id: str) -> SlurmJob | None:
    """`scontrol show job -o ID` output (one line of KEY=VALUE words)."""
    for line in out.splitlines():
        fields = job_fields(line)
        element = f"{fields.get('ArrayJobId')}_{fields.get('ArrayTaskId')}"  # an array task: 123_4
        if job_id in (fields.get("JobId"), element) and "JobState" in fields:
            try:
                restarts = int(fields.get("Restarts", "0"))
            except ValueError:
                restarts = 0
            return SlurmJob(
                job_id,
                _base_state(fields["JobState"]),
                "scontrol",
                reason=fields.get("Reason", ""),
                restarts=restarts,
                exit_code=fields.get("ExitCode", ""),
                nodelist=fields.get("NodeList", ""),
                facts={k: fields[k] for k in FACTS if k in fields},
            )
    return None


def parse_preempt_time(out: str) -> str | None:
    """PreemptTime=... from `scontrol show job -o J` (None when unset: 'None', 'Unknown',
    absent)."""
    value = job_fields(out).get("PreemptTime", "")
    return None if value in ("", "None", "Unknown", "N/A") else value


def parse_end_time(out: str) -> float | None:
    """EndTime=YYYY-MM-DDTHH:MM:SS (local time) as epoch seconds; None when unset or not
    parseable."""
    try:
        return time.mktime(time.strptime(job_fields(out)["EndTime"], "%Y-%m-%dT%H:%M:%S"))
    except (KeyError, ValueError):
        return None


def parse_files(out: str) -> list[str]:
    """The files (FILES) each line of `scontrol show job -o` names, as written (blanks kept)."""
    return [v for line in out.splitlines() for k, v in job_fields(line).items() if k in FILES]


def parse_sacct(out: str, job_id: str) -> SlurmJob | None:
    """`sacct -c -X -n -P -j ID -o JobID,State,ExitCode,NodeList`: the last row for the id wins (a
    requeued job has one jobcomp row per ended run)."""
    found = None
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0] == job_id:
            found = SlurmJob(
                job_id,
                _base_state(parts[1]),
                "sacct",
                exit_code=parts[2] if len(parts) > 2 else "",
                nodelist=parts[3] if len(parts) > 3 else "",
            )
    return found


# ----------------------------------------------------------------------------------------- querying

Runner = Callable[[list[str]], "tuple[int, str]"]


def _run(argv: list[str], timeout: float = CMD_TIMEOUT_S) -> tuple[int, str]:
    """(exit status, stdout) -- stderr instead of stdout when the command failed; 124 when it timed
    out."""
    try:
        p = cmd.run(argv, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not answer within {timeout:.0f} s"
    except OSError as e:
        return 127, str(e)
    return p.returncode, p.stdout if p.returncode == 0 else (p.stderr or p.stdout)


def show_job(
    job_id: str, run: Runner | None = None, timeout: float = CMD_TIMEOUT_S
) -> tuple[int, str]:
    """`scontrol show job -o ID`, the one place it runs: (exit status, its lines, one per job; or
    why it failed: 124 when it did not answer within timeout, 127 when scontrol cannot run)."""
    argv = ["scontrol", "show", "job", "-o", job_id]
    return run(argv) if run is not None else _run(argv, timeout)


def job_files(job_id: str, timeout: float = 30.0) -> list[str] | None:
    """The files Slurm names for the job (parse_files); None when scontrol does not answer or know
    the job."""
    rc, out = show_job(job_id, timeout=timeout)
    return parse_files(out) if rc == 0 else None


def known_of(hosts: tuple[str, ...], run: Runner = _run) -> tuple[str, ...]:
    """The hosts Slurm has as nodes (`sinfo -N`): an --exclude of a name it lacks would refuse the
    job; all of them when sinfo does not answer (a dry-run away from Slurm shows them all)."""
    if not hosts:
        return hosts
    rc, out = run(["sinfo", "-h", "-N", "-o", "%N"])
    known = set(out.split()) if rc == 0 else None
    return hosts if known is None else tuple(h for h in hosts if h in known)


NO_CONTROLLER = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Zero Bytes were transmitted",
    "Connection refused",
    "Communication connection failure",
    "did not answer",
)


def unanswered(rc: int, out: str) -> bool:
    """A failed Slurm command that says nothing about the job (controller down, paused, timed
    out)."""
    return rc in (124, 127) or (rc != 0 and any(m in out for m in NO_CONTROLLER))


def ask_slurm(job_id: str, run: Runner = _run, explain: bool = False) -> SlurmJob:
    """scontrol (live and recently ended, with the restart count), then squeue, then sacct -c; GONE
    if none of them knows the job. explain: a pending job's `waiting` too (explain_wait: one or two
    more calls)."""
    rc, out = show_job(job_id, run)
    job = parse_scontrol(out, job_id) if rc == 0 else None
    silent = unanswered(rc, out)
    if job is None:
        rc, out = run(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r|%N"])
        job = parse_squeue(out, job_id) if rc == 0 else None
        silent = silent and unanswered(rc, out)
    if job is not None:
        if explain and job.state == "PENDING":
            job.waiting = explain_wait(job, run)
        return job
    why = " ".join(out.split())[:200]
    rc, out = run(
        ["sacct", "-c", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList"]
    )
    acct = parse_sacct(out, job_id) if rc == 0 else None
    if acct is not None and acct.state in ENDED:
        return acct
    if silent:  # the controller did not answer: no verdict from silence
        return SlurmJob(job_id, "UNKNOWN", "none", reason=why or "no reply")
    return SlurmJob(job_id, "GONE", "none")


def explain_wait(job: SlurmJob, run: Runner = _run) -> str:
    """Why a pending job waits, in words (pending.explain): its reason and scontrol's facts, with
    its partition's queue (`squeue --start`: the jobs ahead, the start estimate) and, for a
    partition limit, the partition's."""
    part = job.facts.get("Partition", "")
    queue = limits = None
    if part:
        rc, out = run(
            [
                "squeue",
                "-h",
                "--start",
                "-p",
                part,
                "-t",
                "PENDING,RUNNING",
                "-o",
                pending.SQUEUE_FORMAT,
            ]
        )
        queue = pending.parse_queue(out) if rc == 0 else None
        if pending.needs_partition(job.reason):
            rc, out = run(["scontrol", "show", "partition", "-o", part])
            limits = pending.parse_partition(out) if rc == 0 else None
    return pending.explain(job.job_id, job.reason, job.facts, queue, limits)


def query(
    job_id: str,
    cache_dir: str,
    run: Runner = _run,
    min_interval: float = MIN_INTERVAL_S,
    now: Callable[[], float] = time.time,
) -> SlurmJob:
    """ask_slurm() at most once per min_interval per run; an ended job is never asked about
    again."""
    path = os.path.join(cache_dir, ".slurm-query.json")
    try:
        with open(path, encoding="utf-8") as f:
            cached = SlurmJob(**json.load(f))
        if cached.job_id == job_id and (
            cached.state in ENDED or now() - cached.checked < min_interval
        ):
            return cached
    except (OSError, ValueError, TypeError):
        pass
    job = ask_slurm(job_id, run, explain=True)
    job.checked = now()
    try:
        # the run dir was removed: never recreated
        if not os.path.isdir(os.path.dirname(cache_dir)):
            return job
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(asdict(job), f)
        os.replace(tmp, path)
    except OSError:
        pass
    return job


# ----------------------------------------------------------------------------------------- our view


def to_run_state(job: SlurmJob) -> tuple[str, str | None]:
    """Slurm state -> (run state, reason). Live states are never terminal; PREEMPTED/REQUEUED
    neither."""
    s = job.state
    if s == "PENDING":  # why it waits, in words, when scontrol told (else squeue's bare reason)
        why = job.waiting or job.reason
        if job.restarts:
            return "REQUEUED", f"requeued {job.restarts}x, pending ({why})"
        return "PENDING", job.waiting or None
    if s in ("REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"):
        return "REQUEUED", f"Slurm {s}"
    if s == "PREEMPTED":
        return "PREEMPTED", "preempted by Slurm"
    if s in LIVE:
        return "RUNNING", (f"Slurm {s}" if s != "RUNNING" else None)
    if s == "COMPLETED":
        return "COMPLETED", None
    if s == "CANCELLED":
        return "CANCELLED", f"Slurm job {job.job_id} was cancelled"
    if s == "GONE":
        return (
            "FAILED",
            f"Slurm job {job.job_id} is gone: not in squeue, scontrol or the jobcomp log (sacct "
            "-c)",
        )
    what = {
        "TIMEOUT": "reached its time limit",
        "NODE_FAIL": "lost a node (NODE_FAIL)",
        "OUT_OF_MEMORY": "ran out of memory",
    }.get(s, f"ended {s}")
    return "FAILED", f"Slurm job {job.job_id} {what}" + (
        f" (exit {job.exit_code})" if job.exit_code else ""
    )
