"""Why a pending Slurm job waits, in words, and what would change it (issue 25 item 2). Pure: the
caller (status.ask_slurm, the one owner of Slurm queries) runs the commands and hands their output
here.

Sources, Slurm 22.05 (tag slurm-22-05-11-1):
- the Reason codes: job_reason_string(), src/common/slurm_protocol_defs.c:1739 (Priority :1749,
  Dependency :1751, Resources :1753, PartitionNodeLimit :1755, PartitionTimeLimit :1757,
  PartitionDown :1759, JobHeldAdmin :1763, JobHeldUser :1765, BeginTime :1767, Reservation :1777,
  ReqNodeNotAvail :1779, BadConstraints :1789, InvalidAccount :1801, InvalidQOS :1803, QOSNotAllowed
  :1819, AccountNotAllowed :1821, DependencyNeverSatisfied :1823, QOSMaxNodePerJobLimit :1845,
  JobHoldMaxRequeue :1887, JobArrayTaskLimit :1889; QOS*/Assoc* limits); `scontrol show job` prints
  them as `Reason=` (src/api/job_info.c:450, a state_desc with its blanks as `_`), next to
  `Dependency=` (:453: `afterok:123(failed)`, the state from _depend_state2str,
  src/slurmctld/job_scheduler.c:2800/2860), `StartTime=` (:540), `Partition=` (:606), `NumNodes=`
  (:658);
- `squeue --start` (doc/man/man1/squeue.1:1448): pending jobs in order of expected start, any format
  may be given with it; fields %i (id), %T (state), %Q (priority), %S (actual or expected start
  time; N/A without one: src/squeue/print.c:391);
- `scontrol show partition -o` (src/api/partition_info.c): MaxNodes= (:232, UNLIMITED or a number),
  MaxTime= (:237), State= (:316), TotalNodes= (:328).
"""

from __future__ import annotations

from typing import Any

SQUEUE_FORMAT = "%i|%T|%Q|%S"  # squeue -h --start -p PART -t PENDING,RUNNING -o SQUEUE_FORMAT
NO_TIME = ("", "N/A", "Unknown", "None", "(null)")

# Reason code -> (kind, words); {job} {part} {nodes} {max} {dep} {maxtime} are filled in by
# explain()
REASONS: dict[str, tuple[str, str]] = {
    "Priority": ("queue", "jobs of higher priority come first; it starts after them"),
    "Resources": (
        "queue",
        "waiting for resources: the nodes it needs are busy; it starts as they free up (a "
        "shorter --time lets the backfill scheduler fit it in sooner)",
    ),
    "None": ("queue", "not scheduled yet"),
    "Prolog": ("queue", "its prolog is running"),
    "JobHeldUser": ("held", "held (scontrol hold): `scontrol release {job}` lets it start"),
    "JobHeldAdmin": (
        "held",
        "held by an administrator: it starts once an operator runs `scontrol release {job}`",
    ),
    "JobHoldMaxRequeue": (
        "held",
        "held after too many requeues: `scontrol release {job}` lets it start again",
    ),
    "DependencyNeverSatisfied": (
        "never",
        "can never start: the job it depends on ({dep}) did not end as required; "
        "`launch cancel` it and submit again",
    ),
    "Dependency": ("wait", "waits for the job it depends on ({dep}) to end"),
    "PartitionNodeLimit": (
        "never",
        "can never run as is: it asks for {nodes} nodes, partition {part} allows "
        "{max}; `launch cancel` it and submit again with fewer --nodes",
    ),
    "PartitionTimeLimit": (
        "never",
        "can never run as is: its time limit is above partition {part}'s MaxTime "
        "{maxtime}; `launch cancel` it and submit again with a shorter --time",
    ),
    "PartitionDown": (
        "wait",
        "partition {part} is down: it starts when an administrator brings it up",
    ),
    "PartitionInactive": (
        "wait",
        "partition {part} is inactive: it starts when an administrator activates it",
    ),
    "BeginTime": ("wait", "waits for its begin time"),
    "Reservation": (
        "wait",
        "waits for its reservation (the reservation has not started, or its nodes are busy)",
    ),
    "ReqNodeNotAvail": (
        "wait",
        "nodes it needs are not available (down, drained or reserved; `sinfo -R` says why)",
    ),
    "BadConstraints": (
        "never",
        "can never run as is: no node of partition {part} meets its constraints; "
        "`launch cancel` it and submit again with other --constraint",
    ),
    "InvalidAccount": (
        "never",
        "can never run: its account is not valid; submit again with another --account",
    ),
    "InvalidQOS": ("never", "can never run: its QOS is not valid; submit again with another --qos"),
    "AccountNotAllowed": (
        "never",
        "can never run in partition {part}: its account is not allowed there",
    ),
    "QOSNotAllowed": ("never", "can never run in partition {part}: its QOS is not allowed there"),
    "JobArrayTaskLimit": (
        "limit",
        "the array's limit of tasks running at once (--max-parallel) is reached",
    ),
    "Licenses": ("wait", "waits for licenses"),
    "Cleaning": ("wait", "its nodes are still being cleaned up after a previous job"),
}
NEVER_LIMITS = (
    "MaxNodePerJob",
    "MaxCpuPerJob",
    "MaxWallDurationPerJob",
    "MaxMemPerJob",
    "MaxMemoryPerJob",
    # a limit per job: more than it may ever ask
    "MaxGRESPerJob",
    "MinCpu",
    "MinNode",
    "MinMemory",
)


def code_of(reason: str) -> str:
    """`ReqNodeNotAvail,_UnavailableNodes:n1` -> ReqNodeNotAvail (a state_desc has its blanks as
    `_`)."""
    return reason.split(",")[0].split("_")[0].strip() if reason else ""


def parse_queue(out: str) -> list[dict[str, Any]]:
    """`squeue -h --start ... -o SQUEUE_FORMAT` -> [{id, state, priority, start}] in Slurm's
    order."""
    rows = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            prio = int(parts[2]) if parts[2].isdigit() else 0
            rows.append(
                {
                    "id": parts[0],
                    "state": parts[1].strip().upper(),
                    "priority": prio,
                    "start": parts[3],
                }
            )
    return rows


def parse_partition(out: str) -> dict[str, str]:
    """`scontrol show partition -o NAME` -> its KEY=VALUE words (the first line)."""
    line = (out.strip().splitlines() or [""])[0]
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def needs_partition(reason: str) -> bool:
    """Whether the words need the partition's limits (scontrol show partition)."""
    return code_of(reason) in ("PartitionNodeLimit", "PartitionTimeLimit")


def _id_key(job_id: str) -> tuple[int, str]:
    head = job_id.split("_")[0]
    return (int(head) if head.isdigit() else 0, job_id)


def queue_words(job_id: str, priority: int | None, queue: list[dict[str, Any]], part: str) -> str:
    """`2 jobs ahead of it in partition debug, 1 running there`: the pending jobs Slurm will look at
    first (higher priority; the same and submitted earlier), and the running ones."""
    me = next((r for r in queue if r["id"] == job_id), None)
    prio = me["priority"] if me else (priority or 0)
    pending = [r for r in queue if r["state"] == "PENDING" and r["id"] != job_id]
    ahead = [
        r
        for r in pending
        if r["priority"] > prio or (r["priority"] == prio and _id_key(r["id"]) < _id_key(job_id))
    ]
    running = sum(r["state"] in ("RUNNING", "COMPLETING", "CONFIGURING") for r in queue)
    n = len(ahead)
    return (
        f"{n} job{'' if n == 1 else 's'} ahead of it in partition {part or '?'}, "
        f"{running} running there"
    )


def estimate(job_id: str, queue: list[dict[str, Any]] | None, facts: dict[str, str]) -> str:
    """Slurm's start estimate (squeue --start's %S, else scontrol's StartTime), in words."""
    me = next((r for r in queue or () if r["id"] == job_id), None)
    when = me["start"] if me and me["start"] not in NO_TIME else facts.get("StartTime", "")
    if when in NO_TIME:
        return "no start estimate from Slurm yet (squeue --start: N/A)"
    return f"Slurm's start estimate {when} (squeue --start)"


def limit_words(code: str) -> tuple[str, str] | None:
    """A QOS or association limit (QOSMaxJobsPerUserLimit, AssocGrpCpuLimit, ...) -> (kind,
    words)."""
    owner = (
        "QOS"
        if code.startswith("QOS")
        else "account (association)"
        if code.startswith("Assoc")
        else None
    )
    if owner is None:
        return None
    if any(k in code for k in NEVER_LIMITS):
        return "never", (
            f"can never run as is: it asks for more than its {owner} allows one job ({code}); "
            "`launch cancel` it and submit again smaller, or with another --qos/--account"
        )
    return "limit", (
        f"held back by a {owner} limit ({code}): it starts when your other jobs (or your group's) "
        "end, or with a --qos/--account whose limit is higher"
    )


def explain(
    job_id: str,
    reason: str,
    facts: dict[str, str],
    queue: list[dict[str, Any]] | None = None,
    partition: dict[str, str] | None = None,
) -> str:
    """One line: `Resources: waiting for resources: the nodes it needs are busy; 0 jobs ahead of it
    in partition debug, 1 running there; Slurm's start estimate 2026-12-05T02:00:00 (squeue
    --start)`."""
    code = code_of(reason) or "None"
    kind, words = REASONS.get(code) or limit_words(code) or ("wait", f"Slurm's reason: {reason}")
    part = facts.get("Partition", "")
    prt = partition or {}
    fill = {
        "job": job_id,
        "part": part or "?",
        "nodes": facts.get("NumNodes", "?").split("-")[0],
        "max": f"at most {prt['MaxNodes']} per job"
        if prt.get("MaxNodes", "UNLIMITED") != "UNLIMITED"
        else f"{prt.get('TotalNodes', '?')} (all it has)",
        "dep": facts.get("Dependency") or "?",
        "maxtime": prt.get("MaxTime", "?"),
    }
    line = f"{code}: {words.format(**fill)}"
    if kind == "queue":
        line += (
            f"; {queue_words(job_id, _int(facts.get('Priority')), queue, part)}"
            if queue is not None
            else ""
        )
        line += f"; {estimate(job_id, queue, facts)}"
    return line


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None
