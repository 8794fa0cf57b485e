"""A pending Slurm job explained (issue 25 item 2): why it waits and what would change it, from
scontrol's Reason and facts, `squeue --start` of its partition and `scontrol show partition`. The
parsers and words are pure (fixtures in the format Slurm 22.05 prints for our commands); two
slurm-marked tests check it on the dev cluster: a blocker job filling the partition, then `scontrol
hold`."""

from __future__ import annotations

import io
import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, require_cluster, run_launch
from launchers.backends.slurm import pending
from launchers.backends.slurm import status as ss
from launchers.show import Progress

# scontrol show job -o 12 (src/api/job_info.c: Reason, Dependency, StartTime, Partition, NumNodes)
SCONTROL = (
    "JobId=12 JobName=train UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901748 "
    "Nice=0 Account=(null) QOS=normal JobState=PENDING Reason={reason} Dependency={dep} "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=00:10:00 "
    "TimeMin=N/A SubmitTime=2026-12-05T01:20:00 EligibleTime=2026-12-05T01:20:00 "
    "AccrueTime=2026-12-05T01:20:00 StartTime={start} EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-05T01:20:05 Scheduler=Backfill:* "
    "Partition=gpu AllocNode:Sid=lnode1:412 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=(null) NumNodes={nodes} NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* MinCPUsNode=1 "
    "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
    "Contiguous=0 Licenses=(null) Network=(null) Command=/runs/w/slurm/submission.sh"
)
# squeue -h --start -p gpu -t PENDING,RUNNING -o '%i|%T|%Q|%S' (sorted by start time; N/A: no
# estimate)
SQUEUE = (
    "11|RUNNING|4294901749|2026-12-05T01:19:58\n10|PENDING|4294901750|2026-12-05T01:29:58\n"
    "12|PENDING|4294901748|2026-12-05T01:30:00\n13|PENDING|4294901748|N/A\n"
)
# scontrol show partition -o gpu (src/api/partition_info.c)
PARTITION = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES "
    "QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO "
    "MaxNodes={max} MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED "
    "Nodes=lnode[1-4] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO "
    "OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=16 TotalNodes=4 "
    "SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED"
)


def job_line(reason="Resources", dep="(null)", start="2026-12-05T01:30:00", nodes="1-1"):
    return SCONTROL.format(reason=reason, dep=dep, start=start, nodes=nodes)


def ask(scontrol, squeue=SQUEUE, partition=PARTITION.format(max="UNLIMITED")):
    calls = []

    def run(argv):
        calls.append(argv)
        if argv[0] == "squeue":
            return 0, squeue
        return 0, partition if argv[1:3] == ["show", "partition"] else scontrol

    return ss.ask_slurm("12", run, explain=True), calls


@pytest.mark.parametrize(
    "reason, extra, words",
    [
        (
            "Resources",
            {},
            [
                "Resources: waiting for resources: the nodes it needs are busy",
                "1 job ahead of it in partition gpu, 1 running there",
                "Slurm's start estimate 2026-12-05T01:30:00 (squeue --start)",
            ],
        ),
        ("Priority", {}, ["Priority: jobs of higher priority come first", "1 job ahead"]),
        (
            "JobHeldUser",
            {},
            ["JobHeldUser: held (scontrol hold): `scontrol release 12` lets it start"],
        ),
        ("JobHeldAdmin", {}, ["held by an administrator", "`scontrol release 12`"]),
        (
            "DependencyNeverSatisfied",
            {"dep": "afterok:11(failed)"},
            [
                "DependencyNeverSatisfied: can never start: the job it depends on "
                "(afterok:11(failed)) did not end"
            ],
        ),
        (
            "Dependency",
            {"dep": "afterok:11(unfulfilled)"},
            ["waits for the job it depends on (afterok:11(unfulfilled))"],
        ),
        (
            "PartitionNodeLimit",
            {"nodes": "5-5"},
            [
                "PartitionNodeLimit: can never run as is: it asks for 5 nodes, partition gpu "
                "allows 4 (all it has)",
                "fewer --nodes",
            ],
        ),
        ("Reservation", {}, ["Reservation: waits for its reservation"]),
        ("QOSMaxJobsPerUserLimit", {}, ["held back by a QOS limit (QOSMaxJobsPerUserLimit)"]),
        ("AssocGrpCpuLimit", {}, ["held back by a account (association) limit (AssocGrpCpuLimit)"]),
        (
            "QOSMaxNodePerJobLimit",
            {},
            ["can never run as is: it asks for more than its QOS allows one job"],
        ),
        (
            "ReqNodeNotAvail,_UnavailableNodes:lnode3",
            {},
            ["ReqNodeNotAvail: nodes it needs are not available"],
        ),
        ("SomethingNew", {}, ["SomethingNew: Slurm's reason: SomethingNew"]),
    ],
)
def test_reason_in_words(reason, extra, words):
    job, calls = ask(job_line(reason, **extra))
    state, why = ss.to_run_state(job)
    assert state == "PENDING" and job.waiting == why
    for w in words:
        assert w in why, why
    squeue = [c for c in calls if c[0] == "squeue"]
    assert squeue == [
        ["squeue", "-h", "--start", "-p", "gpu", "-t", "PENDING,RUNNING", "-o", "%i|%T|%Q|%S"]
    ]
    assert any(c[1:3] == ["show", "partition"] for c in calls) == (reason == "PartitionNodeLimit")


def test_queue_estimate_and_partition_limits():
    q = pending.parse_queue(SQUEUE)
    assert [(r["id"], r["state"], r["priority"]) for r in q][:2] == [
        ("11", "RUNNING", 4294901749),
        ("10", "PENDING", 4294901750),
    ]
    assert (
        pending.queue_words("13", None, q, "gpu")
        == "2 jobs ahead of it in partition gpu, 1 running there"
    )
    assert (
        pending.estimate("13", q, {"StartTime": "Unknown"})
        == "no start estimate from Slurm yet (squeue --start: N/A)"
    )
    assert (
        pending.estimate("14", [], {"StartTime": "2026-12-05T03:00:00"})
        == "Slurm's start estimate 2026-12-05T03:00:00 (squeue --start)"
    )
    limits = pending.parse_partition(PARTITION.format(max="2"))
    assert (limits["MaxNodes"], limits["TotalNodes"], limits["State"]) == ("2", "4", "UP")
    why = pending.explain(
        "12", "PartitionNodeLimit", {"Partition": "gpu", "NumNodes": "3-3"}, [], limits
    )
    assert "it asks for 3 nodes, partition gpu allows at most 2 per job" in why
    job, _ = ask(job_line(), squeue="")  # squeue lists nothing: no job ahead, still an estimate
    assert (
        "0 jobs ahead of it in partition gpu, 0 running there; Slurm's start estimate "
        "2026-12-05T01:30:00" in job.waiting
    )


def test_requeued_pending_and_progress_line():
    job, _ = ask(job_line("BeginTime").replace("Restarts=0", "Restarts=2"))
    assert ss.to_run_state(job) == (
        "REQUEUED",
        "requeued 2x, pending (BeginTime: waits for its begin time)",
    )
    out = io.StringIO()
    st = {
        "state": "PENDING",
        "slurm_job_id": "12",
        "slurm_state": "PENDING",
        "slurm_reason": "JobHeldUser",
        "reason": "JobHeldUser: held (scontrol hold): `scontrol release 12` lets it start",
    }
    Progress(out).run(st, {})
    assert out.getvalue() == (
        "launch: slurm job 12 PENDING (reason: JobHeldUser: held (scontrol hold): "
        "`scontrol release 12` lets it start)\n"
    )


# ---------------------------------------------------------------------------------- the dev cluster


@pytest.fixture
def blocker():
    """Every node of the dev cluster's partition taken by someone else's exclusive job (a plain
    `sbatch --wrap`, no torch: only its place in the queue matters), running before the test
    submits; cancelled at its end (one per test, not per module: it must not outlive the test's
    exclusive turn on the cluster)."""
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--exclusive",
            "-N",
            "4",
            "-t",
            "10",
            "-o",
            "/dev/null",
            "-J",
            "blocker",
            "--wrap",
            "sleep 600",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        deadline = time.monotonic() + 120
        while (
            subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
            ).stdout.strip()
            != "RUNNING"
        ):
            assert time.monotonic() < deadline, f"blocker job {job} never ran"
            time.sleep(0.5)
        yield job
    finally:
        subprocess.run(["scancel", job], capture_output=True)


def _status_line(run_dir):
    return next(
        ln
        for ln in run_launch("status", run_dir, check=True).stdout.splitlines()
        if ln.startswith("state:")
    )


def _wait_line(run_dir, needle, timeout=90):
    deadline, line = time.monotonic() + timeout, ""
    while needle not in line and time.monotonic() < deadline:
        line = _status_line(run_dir)
        time.sleep(1)
    assert needle in line, line
    return line


@pytest.mark.exclusive
@pytest.mark.slurm
def test_waiting_job_names_the_blocker(blocker, workdir):
    p = run_launch(
        "slurm", "--nodes", "1", "--time", "10", "--run-dir", "runs/wait", "--", "report.py"
    )
    try:
        assert p.returncode == 0, p.stderr
        line = _wait_line("runs/wait", "Resources: waiting for resources")
        assert (
            "PENDING" in line and "0 jobs ahead of it in partition gpu, 1 running there" in line
        ), line
        assert "start estimate" in line, line
        w = run_launch("wait", "runs/wait", "--timeout", "3")  # wait's progress line says the same
        assert (
            "launch: slurm job" in w.stderr
            and "reason: Resources: waiting for resources" in w.stderr
        ), w.stderr
    finally:
        run_launch("cancel", "runs/wait")


@pytest.mark.exclusive
@pytest.mark.slurm
def test_held_job_says_how_to_release(blocker, workdir):
    p = run_launch(
        "slurm", "--nodes", "1", "--time", "10", "--run-dir", "runs/held", "--", "report.py"
    )
    try:
        assert p.returncode == 0, p.stderr
        job = Path("runs/held/slurm/jobs").read_text().split()[-1]
        subprocess.run(["scontrol", "hold", job], check=True, capture_output=True)
        line = _wait_line("runs/held", f"`scontrol release {job}`")
        assert "PENDING" in line and (
            "JobHeldUser: held" in line or "JobHeldAdmin: held" in line
        ), line
        # a job that never ran: scancel at once, no graceful stop
        c = run_launch("cancel", "runs/held")
        assert c.returncode == 0, c.stderr
        st = json.loads(Path("runs/held/status.json").read_text())
        assert st["state"] == "CANCELLED" and "launch cancel" in st["reason"], st
        assert subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip() in ("", "CANCELLED"), "the held job is still queued"
    finally:
        run_launch("cancel", "runs/held")
