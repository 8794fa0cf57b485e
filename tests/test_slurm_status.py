"""Slurm status without slurmdbd: parsing recorded squeue/scontrol/sacct -c output, GONE, the rate
limit."""

import pytest

from launchers.backends.slurm import cmd
from launchers.backends.slurm import status as ss

SCONTROL_RUNNING = (
    "JobId=7 JobName=train UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 ExitCode=0:0 NodeList=lnode[1-2] BatchHost=lnode1"
)
SCONTROL_REQUEUED = (
    "JobId=7 JobName=train JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 "
    "Restarts=1 ExitCode=0:0 NodeList=(null)"
)
SCONTROL_TIMEOUT = (
    "JobId=7 JobName=train JobState=TIMEOUT Reason=TimeLimit Restarts=0 ExitCode=0:15 "
    "NodeList=lnode1"
)
SQUEUE = "7|COMPLETING|None|lnode[1-2]\n"
SACCT = "7|PENDING|0:0|lnode[1-2]\n7|CANCELLED by 0|0:15|lnode[1-2]\n"


def runner(answers):
    calls = []

    def run(argv):
        calls.append(argv[0])
        return answers.get(argv[0], (1, ""))

    return run, calls


def test_parsers():
    j = ss.parse_scontrol(SCONTROL_RUNNING, "7")
    assert (j.state, j.restarts, j.nodelist, j.source) == ("RUNNING", 0, "lnode[1-2]", "scontrol")
    assert ss.parse_scontrol(SCONTROL_RUNNING, "8") is None
    assert ss.parse_squeue(SQUEUE, "7").state == "COMPLETING"
    a = ss.parse_sacct(SACCT, "7")  # the last jobcomp row for a requeued job wins
    assert (a.state, a.exit_code) == ("CANCELLED", "0:15")


def test_preempt_time_and_end_time_from_scontrol():
    """(moved from test_slurm_inalloc: inalloc.hold_for_requeue reads them through this module)"""
    line = (
        "JobId=42 JobName=x JobState=RUNNING PreemptTime=2026-01-02T03:04:05 "
        "EndTime=2026-01-02T03:09:05 X=1"
    )
    assert ss.parse_preempt_time(line) == "2026-01-02T03:04:05"
    assert ss.parse_end_time(line) - ss.parse_end_time(line.replace("T03:09", "T03:08")) == 60
    assert ss.parse_preempt_time("JobId=42 PreemptTime=None EndTime=Unknown") is None
    assert ss.parse_end_time("JobId=42 EndTime=Unknown") is None


def test_one_reader_of_scontrol_words_keeps_blanks_in_paths():
    """job_fields: a value runs to the next KEY= word (paths and job names may hold blanks; TRES
    keeps its own '='s); the first of a key wins. parse_files: each line's StdOut/StdErr/Command, as
    written."""
    line = (
        "JobId=9 JobName=my job JobState=RUNNING TRES=cpu=2,node=1 Socks/Node=* Command=/r/my "
        "run/job.sh StdErr=/r/my run/x.err StdIn=/dev/null StdOut=/r/my run/x.out Power= "
    )
    f = ss.job_fields(line + "\nJobId=10 JobState=PENDING")
    assert (f["JobName"], f["JobState"], f["TRES"], f["Socks/Node"], f["Power"]) == (
        "my job",
        "RUNNING",
        "cpu=2,node=1",
        "*",
        "",
    )
    assert ss.parse_files(line + "\nJobId=10 StdOut=/s/y.out") == [
        "/r/my run/job.sh",
        "/r/my run/x.err",
        "/r/my run/x.out",
        "/s/y.out",
    ]
    assert ss.parse_scontrol(line, "9").state == "RUNNING"
    calls = []
    assert ss.show_job("9", run=lambda argv: calls.append(argv) or (0, line)) == (0, line)
    assert calls == [["scontrol", "show", "job", "-o", "9"]]


def test_states_map():
    req = ss.parse_scontrol(SCONTROL_REQUEUED, "7")
    assert ss.to_run_state(req)[0] == "REQUEUED"  # non-terminal
    assert ss.to_run_state(ss.SlurmJob("7", "PREEMPTED", "scontrol"))[0] == "PREEMPTED"
    assert ss.to_run_state(ss.SlurmJob("7", "PENDING", "squeue")) == ("PENDING", None)
    assert ss.to_run_state(ss.SlurmJob("7", "COMPLETING", "squeue"))[0] == "RUNNING"
    state, reason = ss.to_run_state(ss.parse_scontrol(SCONTROL_TIMEOUT, "7"))
    assert state == "FAILED" and "time limit" in reason
    state, reason = ss.to_run_state(ss.SlurmJob("7", "GONE", "none"))
    assert state == "FAILED" and "gone" in reason and "sacct -c" in reason
    assert ss.to_run_state(ss.SlurmJob("7", "NODE_FAIL", "sacct"))[0] == "FAILED"


def test_ask_order_and_gone():
    run, calls = runner({"scontrol": (0, SCONTROL_RUNNING)})
    assert ss.ask_slurm("7", run).state == "RUNNING" and calls == ["scontrol"]
    run, calls = runner({"scontrol": (1, ""), "squeue": (1, ""), "sacct": (0, SACCT)})
    assert ss.ask_slurm("7", run).state == "CANCELLED" and calls == ["scontrol", "squeue", "sacct"]
    run, calls = runner({"scontrol": (1, ""), "squeue": (0, ""), "sacct": (0, "")})
    assert ss.ask_slurm("7", run).state == "GONE"
    # the shim may append a live row; a non-ended jobcomp answer is not taken as the end
    run, _ = runner({"sacct": (0, "7|RUNNING|0:0|lnode1\n")})
    assert ss.ask_slurm("7", run).state == "GONE"


def test_a_controller_that_does_not_answer_is_no_verdict():
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    run, _ = runner({"scontrol": (1, down), "squeue": (1, down), "sacct": (0, "")})
    job = ss.ask_slurm("7", run)
    assert job.state == "UNKNOWN" and "Unable to contact" in job.reason and not job.live
    run, _ = runner(
        {
            "scontrol": (124, "scontrol did not answer within 15 s"),
            "squeue": (124, "x"),
            "sacct": (0, SACCT),
        }
    )
    assert ss.ask_slurm("7", run).state == "CANCELLED"  # the jobcomp log still knows the end
    run, _ = runner(
        {
            "scontrol": (1, "slurm_load_jobs error: Invalid job id specified"),
            "squeue": (0, ""),
            "sacct": (0, ""),
        }
    )
    assert ss.ask_slurm("7", run).state == "GONE"  # an answer: Slurm does not know the job


def test_query_is_rate_limited_and_caches_ended(tmp_path):
    t = [100.0]
    run, calls = runner({"scontrol": (0, SCONTROL_RUNNING)})
    for _ in range(5):
        assert (
            ss.query("7", str(tmp_path), run, min_interval=2.0, now=lambda: t[0]).state == "RUNNING"
        )
    assert len(calls) == 1
    t[0] += 2.5
    ss.query("7", str(tmp_path), run, min_interval=2.0, now=lambda: t[0])
    assert len(calls) == 2
    run2, calls2 = runner({"scontrol": (0, SCONTROL_TIMEOUT)})
    t[0] += 5
    assert ss.query("7", str(tmp_path), run2, now=lambda: t[0]).state == "TIMEOUT"
    t[0] += 1000
    assert (
        ss.query("7", str(tmp_path), run2, now=lambda: t[0]).state == "TIMEOUT" and len(calls2) == 1
    )
    # another job id is asked about, not served from the cache
    run3, calls3 = runner({"scontrol": (0, SCONTROL_RUNNING.replace("JobId=7", "JobId=8"))})
    assert ss.query("8", str(tmp_path), run3, now=lambda: t[0]).state == "RUNNING" and calls3 == [
        "scontrol"
    ]


def test_slurm_commands_run_here_only(tmp_path, monkeypatch):
    """cmd.run: Slurm's commands only, on this machine (a cluster is viacluster's: the whole launch
    there)."""
    with pytest.raises(ValueError, match="not a Slurm command"):
        cmd.run(["rm", "-rf", "/"])
    # a missing binary is OSError (the queries: 127, unanswered)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        cmd.run(["sinfo", "-h"])
    rc, out = ss._run(["squeue", "-h"])
    assert rc == 127 and ss.unanswered(rc, out)


def test_a_shielded_command_outlives_the_jobs_sigterm(tmp_path, monkeypatch):
    """`scontrol requeue` from inside the job it requeues: Slurm's SIGTERM to the job's processes
    can reach the command before it reports the requeue it made. Shielded, it starts with SIGTERM
    blocked and reports; unshielded, the same SIGTERM kills it (-15, once read as a failed
    requeue)."""
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nkill -TERM $$\necho requeued\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    p = cmd.run(["scontrol", "requeue", "7"], shielded=True)
    assert (p.returncode, p.stdout) == (0, "requeued\n")
    assert cmd.run(["scontrol", "requeue", "7"]).returncode == -15
