"""A run in the user's own Slurm allocation across Slurm's requeue of the job (issue 23), without a
cluster: the decision to continue or refuse as a table (launchers.backends.slurm.inalloc), the end
of an attempt stopped by Slurm's signal (PREEMPTED, never FAILED nor COMPLETED; never requeued by
launch), the CLI continuing a requeued run (--dry-run: the plan of the new attempt) or refusing a
changed command line in one line, the node's rendezvous file per run of the job, `launch status`
listing the attempts with their reasons. The same on the real cluster:
tests/faults/test_faults_slurm.py, rows `in-allocation ...` (marked slurm)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import read_json, run_launch
from launchers import api, layout
from launchers.backends.slurm import inalloc
from launchers.backends.slurm.env import SlurmEnv
from launchers.backends.slurm.node import NodeRun
from launchers.backends.slurm.requeue import finalize
from launchers.records.rundir import RunDir, new_run_id, redacted_spec
from launchers.spec import build_spec

SPEC = {
    "backend": "slurm",
    "program": ["/w/train.py"],
    "program_args": ["--lr", "3"],
    "nodes": 2,
    "gpus_per_node": 1,
}
RUN = {"run_id": "r-1", "spec": SPEC, "attempts": [{"attempt": 0}, {"attempt": 1}]}
MINE = {"state": "PREEMPTED", "in_allocation": True, "slurm_job_id": "42", "slurm_restart": 0}


def env(job="42", restart=1) -> SlurmEnv:
    return SlurmEnv.read(
        {"SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": str(restart), "SLURM_JOB_NUM_NODES": "2"}
    )


# id: (env, status.json, run.yaml, the command line given again) -> (action, attempt, what
# `why`/`line` says)
TABLE = {
    "same-job-requeued-preempted-continues": (
        (env(), MINE, RUN, SPEC),
        ("continue", 2, "requeued by Slurm (restart 1)"),
    ),
    "same-job-launcher-died-running-continues": (
        (env(restart=3), dict(MINE, state="RUNNING", slurm_restart=2), RUN, SPEC),
        ("continue", 2, "requeued by Slurm (restart 3)"),
    ),
    "same-job-failed-node-continues": (
        (env(), dict(MINE, state="FAILED"), RUN, SPEC),
        ("continue", 2, "restart 1"),
    ),
    "same-job-cancelled-by-sigterm-continues": (
        (env(), dict(MINE, state="CANCELLED"), RUN, SPEC),
        ("continue", 2, "restart 1"),
    ),
    "older-record-without-restart-continues": (
        (env(), {k: v for k, v in MINE.items() if k != "slurm_restart"}, RUN, SPEC),
        ("continue", 2, "restart 1"),
    ),
    "other-job-refused": (
        (env(job="43"), MINE, RUN, SPEC),
        ("refuse", None, "started by another job (42)"),
    ),
    "submitted-run-refused": (
        (env(), dict(MINE, in_allocation=None), RUN, SPEC),
        ("refuse", None, "another job"),
    ),
    "completed-refused": (
        (env(), dict(MINE, state="COMPLETED"), RUN, SPEC),
        ("refuse", None, "COMPLETED"),
    ),
    "restart-0-refused": ((env(restart=0), MINE, RUN, SPEC), ("refuse", None, "not a requeue")),
    "same-run-of-the-job-refused": (
        (env(), dict(MINE, slurm_restart=1), RUN, SPEC),
        ("refuse", None, "started by this run of the job (restart 1)"),
    ),
    "launch-cancel-refused": (
        (env(), dict(MINE, state="CANCELLED", cancel_requested=True), RUN, SPEC),
        ("refuse", None, "stopped by launch cancel"),
    ),
    "outside-an-allocation-refused": (
        (env(job=""), MINE, RUN, SPEC),
        ("refuse", None, "not inside an allocation"),
    ),
    "local-run-refused": (
        (env(), MINE, dict(RUN, spec=dict(SPEC, backend="local")), SPEC),
        ("refuse", None, "not a run dir of the slurm backend"),
    ),
    "program-differs-refused": (
        (env(), MINE, RUN, dict(SPEC, program=["/w/other.py"])),
        ("refuse", None, "program: recorded /w/train.py, given /w/other.py"),
    ),
    "args-differ-refused": (
        (env(), MINE, RUN, dict(SPEC, program_args=("--lr", "4"))),
        ("refuse", None, "program args: recorded --lr 3, given --lr 4"),
    ),
    "nodes-differ-refused": (
        (env(), MINE, RUN, dict(SPEC, nodes=1)),
        ("refuse", None, "--nodes: recorded 2, given 1"),
    ),
    "gpus-differ-refused": (
        (env(), MINE, RUN, dict(SPEC, gpus_per_node=2)),
        ("refuse", None, "--gpus-per-node: recorded 1, given 2"),
    ),
}


@pytest.mark.parametrize("case", list(TABLE), ids=list(TABLE))
def test_continue_or_refuse_table(case):
    (e, st, data, given), (action, attempt, says) = TABLE[case]
    v = inalloc.verdict(e, st, data, given, "/runs/x")
    assert (v.action, v.attempt) == (action, attempt), v
    assert says in (v.line or v.why), v
    if v.line:  # the spec's difference: one line naming it and what is accepted
        assert "\n" not in v.line and "/runs/x" in v.line and "accepted: the recorded one" in v.line


def make_slurm_run(base: Path, **status) -> RunDir:
    """A run dir as `launch slurm` leaves it in the user's allocation, with status.json's fields
    given."""
    (base / "report.py").write_text("print('x')\n")
    spec = build_spec(
        "slurm",
        {
            "nodes": 2,
            "gpus_per_node": 1,
            "run_dir": str(base / "runs" / "s"),
            "options": {"time": "10"},
        },
        [str(base / "report.py")],
    )
    run_id = new_run_id(spec)
    rd = RunDir.create(spec, run_id, {"backend": "slurm"})
    os.makedirs(layout.path(rd.path, "slurm"), exist_ok=True)
    Path(layout.path(rd.path, "node_spec", attempt=0)).write_text(
        json.dumps({"run_id": run_id, "spec": redacted_spec(spec)})
    )
    rd.update_status(**status)
    return rd


def set_env(monkeypatch, job="42", restart=0):
    for k, v in {
        "SLURM_JOB_ID": job,
        "SLURM_RESTART_COUNT": str(restart),
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NODEID": "0",
        "SLURM_STEP_ID": "0",
    }.items():
        monkeypatch.setenv(k, v)


def node_exits(rd: RunDir, codes: dict[int, int], signals=(), attempt=0) -> None:
    for k, c in codes.items():
        rd.write_node_record(
            k,
            {
                "node": k,
                "attempt": attempt,
                "state": "EXITED",
                "exit_code": c,
                "stop_signals": list(signals),
                "time": 1.0,
            },
        )


@pytest.mark.parametrize(
    "codes, signals, stopped_by, state",
    [
        # the --signal warning / a preemption, steps only
        ({0: 1, 1: 1}, ["SIGUSR2"], None, "PREEMPTED"),
        ({0: 1, 1: 1}, ["SIGTERM"], None, "PREEMPTED"),  # a preemption's notice to the job's steps
        # the signal came after the program had finished
        ({0: 0, 1: 0}, ["SIGUSR2"], None, "COMPLETED"),
        # the launcher itself stopped (scancel, the job's end)
        ({0: 1, 1: 1}, ["SIGTERM"], "SIGTERM", "CANCELLED"),
        ({0: 1, 1: 0}, [], None, "FAILED"),  # no stop: a failure
    ],
)
def test_end_of_an_attempt_in_the_users_allocation(
    tmp_path, monkeypatch, codes, signals, stopped_by, state
):
    """finalize(in_allocation=True): Slurm's stop of the steps is PREEMPTED (exit 1, the reason says
    the requeue continues it), never FAILED, never a made-up COMPLETED; no `scontrol requeue` is run
    (there is no Slurm here: a call would raise)."""
    rd = make_slurm_run(
        tmp_path, state="RUNNING", in_allocation=True, slurm_job_id="42", slurm_restart=0
    )
    set_env(monkeypatch)
    node_exits(rd, codes, signals)
    code = finalize(rd.path, 0, in_allocation=True, stopped_by=stopped_by)
    st = read_json(rd.status_path)
    assert st["state"] == state and code == (0 if state == "COMPLETED" else 1), st
    if state == "PREEMPTED":
        assert st["stopped_by"] == signals[0] and st["first_failure"] is None
        assert f"stopped by {signals[0]} from Slurm inside job 42" in st["reason"]
        assert f"launch resume {rd.path}" in st["reason"] and "\n" not in st["reason"]


def test_preempted_waits_for_the_requeue_while_the_job_is_queued(tmp_path):
    """`launch status` of a PREEMPTED run: unchanged while squeue lists the job live (its requeue
    pending); CANCELLED, saying so, once the job left the queue without one; squeue not answering
    (or missing) changes nothing."""
    rd = make_slurm_run(
        tmp_path, state="PREEMPTED", attempt=0, in_allocation=True, slurm_job_id="42", reason="r"
    )
    st = rd.read_status()
    assert inalloc.settle_preempted(rd, st, lambda: ["PENDING"])["state"] == "PREEMPTED"
    assert inalloc.settle_preempted(rd, st, lambda: None)["state"] == "PREEMPTED"
    assert inalloc.settle_preempted(rd, st, lambda: open("/no/squeue"))["state"] == "PREEMPTED"
    out = inalloc.settle_preempted(rd, st, lambda: [])
    assert (
        out["state"] == "CANCELLED" and out["reason"] == "r; Slurm job 42 ended without a requeue"
    )


def test_the_node_of_a_requeued_run_numbers_its_rendezvous_by_the_jobs_run(tmp_path, monkeypatch):
    """In the user's allocation the attempt is the launcher's (the base attempt), and the rendezvous
    file names the job's run: a requeued job numbers its steps from 0 again, and node 1 must never
    read the address node 0 published before the requeue."""
    rd = make_slurm_run(tmp_path)
    set_env(monkeypatch, restart=2)
    node = NodeRun(rd.path, 0, in_allocation=True)
    assert (node.attempt, node.restart) == (0, 2)
    assert NodeRun(rd.path, 0, in_allocation=False).attempt == 2


def test_cli_continues_a_requeued_run_and_refuses_a_changed_command_line(tmp_path):
    """`launch slurm --run-dir X` again in the requeued job: one line says it continues and the plan
    is attempt 1 (--dry-run: nothing runs); a changed --nodes is refused in one line naming it;
    another job's run dir, or no requeue, gets the usual refusal."""
    rd = make_slurm_run(
        tmp_path, state="PREEMPTED", in_allocation=True, slurm_job_id="42", slurm_restart=0
    )
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_RESTART_COUNT": "1",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
    }

    def again(*opts, **more):
        return run_launch(
            "slurm",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            *opts,
            "--run-dir",
            rd.path,
            "--",
            "report.py",
            cwd=tmp_path,
            env=dict(env, **more),
        )

    p = again("--dry-run")
    assert p.returncode == 0, p.stderr
    assert (
        f"launch: Slurm job 42 was requeued (restart 1): run {rd.path} continues as attempt 1, "
        "from scratch" in p.stderr
    ), p.stderr
    assert "# each node: LAUNCH_ATTEMPT = 1;" in p.stdout and "inside allocation 42" in p.stdout, (
        p.stdout
    )
    p = run_launch(
        "slurm",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--run-dir",
        rd.path,
        "--",
        "report.py",
        cwd=tmp_path,
        env=env,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert (
        "--nodes: recorded 2, given 1" in p.stderr
        and "accepted: the recorded one (run.yaml)" in p.stderr
    )
    for other in ({"SLURM_JOB_ID": "43"}, {"SLURM_RESTART_COUNT": "0"}):
        p = again("--dry-run", **other)
        assert p.returncode == 2 and "already exists; use `launch resume" in p.stderr, p.stderr
    assert len(rd.read_run_yaml()["attempts"]) == 1  # nothing added by a dry run or a refusal


def test_status_lists_the_attempts_with_their_reasons(tmp_path):
    rd = make_slurm_run(tmp_path, state="RUNNING", attempt=2)
    data = rd.read_run_yaml()
    data["attempts"] += [
        {"attempt": 1, "by": "requeued by Slurm (restart 1)", "started": "t1"},
        {"attempt": 2, "reason": "requeued by Slurm", "slurm_restart": 2, "started": "t2"},
    ]
    rd.write_run_yaml(data)
    rows = api.status(rd.path)["attempt_list"]
    assert [r["why"] for r in rows] == [
        "the launch",
        "requeued by Slurm (restart 1)",
        "requeued by Slurm (restart 2)",
    ]
    text = api.format_status(dict(api.status(rd.path)))
    assert "            1: requeued by Slurm (restart 1)  (started t1)" in text, text
