"""Issue 21: why a rank died, pure logic (no run; the real run is tests/test_first_failure.py, whose
failing rank prints a traceback).

- the first failure carries the exception line: the last traceback's exception line in this
  attempt's part of the rank log (its last 64 KiB only), one printable line of at most 200
  characters, shown in the end line next to the exit code;
- an OOM kill is named: the rank's memory cgroup's oom_kill counter (cgroup v2 memory.events, v1
  memory.oom_control) went up while the program ran, with the binding memory limit when one is set
  -- on fake cgroup trees (a real OOM is slow and machine-dependent);
- the hang reason names the stalled ranks and counts the waiting ones;
- an env value with a newline is refused through the API and --forward-env (flags and profiles: the
  bad-input matrix).
"""

from __future__ import annotations

import pytest

from launchers import api, jobenv
from launchers.diagnosis import firstfail
from launchers.errors import LaunchError
from launchers.hang.verdict import hang_reason
from launchers.node import rankcause
from launchers.request import JobSpec
from launchers.spec import RunSpec as RecordedSpec

TB = 'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n    {code}\n{line}\n'
CHAINED = (
    TB.format(code='raise KeyError("x")', line="KeyError: 'x'")
    + "\nDuring handling of the above exception, another exception occurred:\n\n"
    + TB.format(code="raise RuntimeError('boom')", line="RuntimeError: boom")
)


@pytest.mark.parametrize(
    "text, want",
    [
        (
            TB.format(code="raise RuntimeError('boom')", line="RuntimeError: boom"),
            "RuntimeError: boom",
        ),
        (CHAINED, "RuntimeError: boom"),  # the last traceback's
        (
            "step 1\n"
            + TB.format(code="x = 1 +", line="             ^\nSyntaxError: invalid syntax"),
            "SyntaxError: invalid syntax",
        ),  # a caret line skipped
        (
            TB.format(code="f()", line="ValueError: first line\nsecond line")
            + "[W socket] later noise\n",
            "ValueError: first line",
        ),  # a multi-line message
        (
            "".join(
                f"[rank1]: {ln}\n"
                for ln in TB.format(code="f()", line="OSError: disk").splitlines()
            ),
            "OSError: disk",
        ),  # a prefix on each line
        (
            TB.format(code="f()", line="RuntimeError: " + "x" * 500),
            "RuntimeError: " + "x" * 183 + "...",
        ),
        (TB.format(code="f()", line="RuntimeError: a\x1b[31mb\x00c"), "RuntimeError: a?[31mb?c"),
        ("exit without a traceback\nRuntimeError: not after a header\n", None),
        ('Traceback (most recent call last):\n  File "t.py", line 1\n', None),  # cut off
    ],
)
def test_last_exception(text, want):
    got = rankcause.last_exception(text)
    assert got == want and (got is None or len(got) <= rankcause.LINE_CHARS)


def test_exception_line_reads_this_attempt_and_only_the_tail(tmp_path):
    log = tmp_path / "rank1.log"
    old = TB.format(code="f()", line="RuntimeError: attempt 0") + "===== launch attempt 1 =====\n"
    log.write_text(old + "no traceback this time\n")
    assert rankcause.exception_line(str(log), 0) == "RuntimeError: attempt 0"
    assert rankcause.exception_line(str(log), len(old)) is None  # attempt 1's part only
    log.write_text(old + TB.format(code="f()", line="MemoryError") + "y" * rankcause.TAIL_BYTES)
    assert rankcause.exception_line(str(log), len(old)) is None  # beyond the last 64 KiB
    assert rankcause.exception_line(str(tmp_path / "missing.log"), 0) is None
    assert rankcause.cause(1, str(log), 0, None) == {}
    log.write_text(old)
    assert rankcause.cause(1, str(log), 0, None) == {"exception": "RuntimeError: attempt 0"}
    assert (
        rankcause.cause(0, str(log), 0, None) == {}
        and rankcause.cause(-15, str(log), 0, None) == {}
    )


def fake_cgroup(tmp_path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    (tmp_path / "proc").write_text(proc)
    for rel, text in files.items():
        (tmp_path / "cg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cg" / rel).write_text(text)
    return str(tmp_path / "proc"), str(tmp_path / "cg")


EVENTS = "low 0\nhigh 0\nmax 12\noom {n}\noom_kill {n}\noom_group_kill 0\n"
V1 = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


@pytest.mark.parametrize(
    "proc, files, events, limit",
    [
        (
            "0::/job/step\n",
            {"job/memory.max": "536870912\n", "job/step/memory.max": "max\n"},
            "job/step/memory.events",
            "; memory.max 512 MiB)",
        ),  # v2: the parent's limit binds
        (
            "0::/job/step\n",
            {"memory.max": "max\n", "job/step/memory.max": "3221225472\n"},
            "job/step/memory.events",
            "; memory.max 3 GiB)",
        ),
        (
            "12:pids:/x\n4:cpu,memory:/a/b\n0::/\n",
            {"memory/a/b/memory.limit_in_bytes": "9223372036854771712\n"},
            "memory/a/b/memory.oom_control",
            ")",
        ),  # v1, no limit (its huge number)
        (
            "4:memory:/elsewhere\n",
            {"memory/memory.limit_in_bytes": "1610612736\n"},
            "memory/memory.oom_control",
            "; memory.limit_in_bytes 1.5 GiB)",
        ),  # a cgroup namespace: the mount itself
    ],
)
def test_oom_kill_named_from_the_cgroup_counter(tmp_path, proc, files, events, limit):
    fmt = V1 if "oom_control" in events else EVENTS
    proc_path, root = fake_cgroup(tmp_path, proc, {**files, events: fmt.format(n=2)})
    watch = rankcause.OomWatch(proc_path, root)
    assert watch.before == 2 and watch.reason() is None and rankcause.cause(-9, "x", 0, watch) == {}
    (tmp_path / "cg" / events).write_text(fmt.format(n=3))
    want = "out of memory (killed by the kernel's OOM killer" + limit
    assert watch.reason() == want and rankcause.cause(-9, "x", 0, watch) == {"reason": want}
    assert rankcause.cause(-15, "x", 0, watch) == {}  # only a SIGKILL is an OOM kill


def test_no_readable_cgroup_names_nothing(tmp_path):
    proc_path, root = fake_cgroup(tmp_path, "0::/gone\n", {"other/memory.max": "max\n"})
    watch = rankcause.OomWatch(proc_path, root)
    assert watch.where is None and watch.reason() is None
    assert rankcause.OomWatch(str(tmp_path / "no-proc"), root).reason() is None


def st(ff: dict) -> dict:
    return {"state": "FAILED", "first_failure": ff}


def test_first_failure_carries_the_cause_and_the_end_line_shows_it():
    recs = [
        {"node": 0, "rank": 0, "exit_code": 0, "signal": None, "time": 1.0},
        {
            "node": 1,
            "rank": 1,
            "exit_code": 1,
            "signal": None,
            "time": 2.0,
            "exception": "RuntimeError: boom",
            "pid": 7,
            "cpus": "0-3",
        },
        {
            "node": 0,
            "rank": 2,
            "exit_code": None,
            "signal": "SIGKILL",
            "time": 3.0,
            "reason": "out of memory",
        },
    ]
    ff = firstfail.first_failure(
        recs, [{"node": 2, "exit_code": 255, "time": 5.0, "reason": "connection lost"}]
    )
    assert ff == {
        "node": 1,
        "rank": 1,
        "exit_code": 1,
        "signal": None,
        "time": 2.0,
        "exception": "RuntimeError: boom",
    }
    assert firstfail.earliest(recs) == ff
    assert (
        api.end_line(st(ff))
        == "launch: run FAILED (rank 1 on node 1, exit code 1: RuntimeError: boom)"
    )
    oom = firstfail.earliest(recs[2:])
    assert (
        api.end_line(st(oom))
        == "launch: run FAILED (rank 2 on node 0, signal SIGKILL: out of memory)"
    )
    assert (
        api.end_line(st(firstfail.earliest(recs[:1] + [dict(recs[1], exception=None)])))
        == "launch: run FAILED (rank 1 on node 1, exit code 1)"
    )
    node = firstfail.first_failure(
        [], [{"node": 2, "exit_code": 255, "time": 5.0, "reason": "connection lost"}]
    )
    # its reason: the status's
    assert api.end_line(st(node)) == "launch: run FAILED (node 2, exit code 255)"
    hang = {
        "node": 0,
        "rank": 3,
        "exit_code": None,
        "signal": None,
        "time": 1.0,
        "reason": "hang: process stopped",
    }
    assert api.end_line(st(hang)) == "launch: run FAILED (rank 3 on node 0, hang: process stopped)"


GLOO = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:4242"
)
NCCL = (
    "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a "
    "network error"
)


@pytest.mark.parametrize(
    "exception, node, heard, want",
    [
        # the killed node went first, seen late
        (GLOO, {"signal": "SIGKILL"}, [], (1, None, "SIGKILL")),
        (NCCL, {"signal": "SIGTERM"}, [], (1, None, "SIGTERM")),
        # no peer lost: the earliest stays first
        ("RuntimeError: boom", {"signal": "SIGKILL"}, [], (0, 0, None)),
        (GLOO, {"exit_code": 1}, [], (0, 0, None)),  # that node exited, no signal ended it
        (GLOO, {"signal": "SIGKILL"}, [1], (0, 0, None)),  # its ranks ended and recorded (the stop)
        (None, {"signal": "SIGKILL"}, [], (0, 0, None)),
    ],
)
def test_a_rank_that_lost_its_peer_gives_way_to_a_node_killed_by_a_signal(
    exception, node, heard, want
):
    recs = [
        {"node": 0, "rank": 0, "exit_code": 1, "signal": None, "time": 2.0, "exception": exception}
    ]
    recs += [{"node": k, "rank": 1, "exit_code": 0, "signal": None, "time": 1.0} for k in heard]
    ff = firstfail.first_failure(
        recs, [dict({"exit_code": None, "signal": None}, node=1, time=3.0, **node)], ["h0", "h1"]
    )
    assert (ff["node"], ff["rank"], ff["signal"]) == want and ff["host"] == f"h{want[0]}", ff
    assert rankcause.peer_lost(exception) == (exception in (GLOO, NCCL))


@pytest.mark.parametrize(
    "crashed, want",
    [
        ({"exception": None}, (1, 1)),  # exit 1 of its own (a crash: no exception line)
        ({"exception": "RuntimeError: boom"}, (1, 1)),
        ({"exception": GLOO}, (0, 0)),  # both lost a peer: the earliest stays first
    ],
)
def test_a_rank_that_lost_its_peer_gives_way_to_a_rank_that_failed_on_its_own_recorded_later(
    crashed, want
):
    """n22: rank 1 crashed at step 25 and rank 0's "Connection closed by peer" was stamped 3 ms
    before rank 1's own record: the crash is the first failure, not the peer's loss of it."""
    recs = [
        {"node": 0, "rank": 0, "exit_code": 1, "signal": None, "time": 2.000, "exception": GLOO},
        dict({"node": 1, "rank": 1, "exit_code": 1, "signal": None, "time": 2.003}, **crashed),
    ]
    ff = firstfail.first_failure(
        recs, [{"node": 0, "exit_code": 143, "signal": None, "time": 2.5}], ["h0", "h1"]
    )
    assert (ff["node"], ff["rank"]) == want and ff["host"] == f"h{want[0]}", ff


def end(node, rank, t, stop=None, **how):
    """A rank record: exit 0 unless `how` says otherwise; stop: the stop its wrapper gave it
    (`stopped_by`)."""
    rec = dict({"node": node, "rank": rank, "exit_code": 0, "signal": None, "time": t}, **how)
    if how.get("signal"):
        rec["exit_code"] = None
    return dict(rec, stopped_by=stop) if stop else rec


KILLED = {"signal": "SIGKILL"}
GRACE = {"signal": "SIGKILL", "killed_after_grace": 10}
NODE1_KILLED = {
    "node": 1,
    "exit_code": None,
    "signal": "SIGKILL",
    "host": "sshhost2",
    "reason": "node exited 137",
}
NODE0_STOPPED = {
    "node": 0,
    "exit_code": 1,
    "signal": None,
    "host": "sshhost1",
    "reason": "node exited 1",
    "time": 9.0,
}


@pytest.mark.parametrize(
    "recs, nodes, want",
    [
        # the SSH fault row `SIGKILL one agent` under load (n26): node 1's agent SIGKILLed; its host
        # stopped the rank it left, which did not stop within the grace; node 1's session ended
        # after that (7.0), node 0 was stopped
        (
            [end(1, 1, 5.0, "SIGTERM", **GRACE), end(0, 0, 8.5, "SIGTERM", **KILLED)],
            [dict(NODE1_KILLED, time=7.0), NODE0_STOPPED],
            (1, None, "SIGKILL"),
        ),
        (
            [end(1, 1, 5.0, "SIGTERM", **GRACE)],
            [dict(NODE1_KILLED, time=7.0), NODE0_STOPPED],
            (1, None, "SIGKILL"),
        ),
        # ... quiet: rank 1 checkpointed and exited 0 on its stop; node 0 ended well on the agreed
        # stop
        (
            [end(1, 1, 5.0, "SIGTERM"), end(0, 0, 5.1)],
            [dict(NODE1_KILLED, time=7.0)],
            (1, None, "SIGKILL"),
        ),
        # ... rank 0 lost its peer before the launcher's stop reached it: node 1 ended first, as its
        # host saw it (launchers.remote's AGENT_ENDED time, not its session's end)
        (
            [end(1, 1, 5.0, "SIGTERM", **GRACE), end(0, 0, 5.2, exit_code=1, exception=GLOO)],
            [dict(NODE1_KILLED, time=4.9), NODE0_STOPPED],
            (1, None, "SIGKILL"),
        ),
        # a rank that failed on its own goes first, even after a stopped rank's record (a clock, a
        # faster wrapper)
        (
            [
                end(0, 0, 1.0, "SIGINT", exit_code=1, exception="KeyboardInterrupt"),
                end(1, 1, 2.0, **KILLED),
            ],
            [dict(NODE0_STOPPED, time=3.0)],
            (1, 1, "SIGKILL"),
        ),
        (
            [
                end(0, 0, 1.0, "SIGTERM", **GRACE),
                end(1, 1, 2.0, exit_code=3, exception="RuntimeError: boom"),
            ],
            [],
            (1, 1, None),
        ),
        # every rank ended on a stop and no node failed on its own (Ctrl-C, launch cancel, scancel's
        # broadcast)
        ([end(0, 0, 1.0, "SIGTERM", **GRACE), end(1, 1, 1.0, "SIGINT", exit_code=130)], [], None),
        ([end(0, 0, 1.0, "SIGTERM")], [], None),
    ],
)
def test_a_rank_that_ended_on_a_stop_is_not_a_first_failure(recs, nodes, want):
    """Its wrapper gave it a stop (`stopped_by`) before it ended: however it ended then (killed
    after the grace, by the sweep, an exception in its cleanup), the failure that made the stop is
    named -- here a node's own."""
    recs = sorted(recs, key=lambda r: r["time"])
    ff = firstfail.first_failure(recs, nodes, ["sshhost1", "sshhost2"])
    assert (ff and (ff["node"], ff["rank"], ff["signal"])) == (want or None), ff
    mine = [r for r in recs if r["exit_code"] != 0 and not r.get("stopped_by")]
    assert firstfail.earliest(recs) == (firstfail.of_rank(mine[0]) if mine else None)
    if want and want[1] is None:
        assert (
            ff["host"] == f"sshhost{want[0] + 1}"
            and api.end_line(st(ff)) == f"launch: run FAILED (node {want[0]}, signal {want[2]})"
        )


def test_the_end_of_an_attempt_with_ranks_ended_on_a_stop(tmp_path):
    """RunDir.record_outcome over real records: the node that failed is named and the ranks killed
    after the grace are still said; a cancel names no failure; a hang names the hung rank (its
    verdict goes first)."""
    from launchers.records.rundir import RunDir
    from launchers.spec import RunSpec

    rd = RunDir.create(RunSpec("ssh", 2, 1, ("t.py",), (), str(tmp_path / "r"), "r"), "r-1234", {})
    for rec in (
        end(1, 1, 5.0, "SIGTERM", **GRACE, attempt=0),
        end(0, 0, 8.5, "SIGTERM", **KILLED, attempt=0),
    ):
        rd.write_rank_record(rec)
    assert (
        rd.record_outcome(
            0,
            {"0": 1, "1": 137},
            node_failures=[dict(NODE1_KILLED, time=7.0), NODE0_STOPPED],
            hosts=["sshhost1", "sshhost2"],
        )
        == 1
    )
    got = rd.read_status()
    assert (got["first_failure"]["node"], got["first_failure"]["rank"]) == (1, None), got
    assert api.end_line(got) == "launch: run FAILED (node 1, signal SIGKILL)"
    assert got["reason"] == "node exited 137; rank 1 did not stop within 10 s; killed"
    assert rd.record_outcome(0, {"0": 1, "1": 1}, stopped_by="SIGINT", stopped_at=1.0) == 130
    got = rd.read_status()
    assert got["state"] == "CANCELLED" and got["first_failure"] is None, got
    assert got["reason"] == "Ctrl-C; rank 1 did not stop within 10 s; killed"
    rd.update_status(
        hang={
            "attempt": 0,
            "stalled_ranks": [1],
            "waiting_ranks": [0],
            "since": 2.0,
            "timeout": 8,
            "dir": "d",
            "ranks": {"1": {"why": "process stopped", "node": 1}},
        }
    )
    assert (
        rd.record_outcome(
            0,
            {"0": 1, "1": 1},
            node_failures=[dict(NODE1_KILLED, time=7.0)],
            hosts=["sshhost1", "sshhost2"],
        )
        == 1
    )
    ff = rd.read_status()["first_failure"]
    assert (ff["node"], ff["rank"], ff["host"]) == (1, 1, "sshhost2") and ff["reason"].startswith(
        "hang: "
    ), ff


def hang(stalled, waiting, whys=None):
    ranks = {str(r): {"why": (whys or {}).get(r, "process stopped")} for r in stalled}
    return {
        "stalled_ranks": stalled,
        "waiting_ranks": waiting,
        "timeout": 10.0,
        "dir": "D",
        "ranks": ranks,
    }


@pytest.mark.parametrize(
    "verdict, want",
    [
        (hang([1], [0, 2, 3]), "stalled: rank 1 (process stopped); 3 ranks waiting on it"),
        (hang([1], [0]), "stalled: rank 1 (process stopped); 1 rank waiting on it"),
        (
            hang([0, 1], [], {1: "behind: step 3 while others reached 5"}),
            "stalled: rank 0 (process stopped), rank 1 (behind: step 3 while others reached 5); "
            "no rank waiting on them",
        ),
        (
            hang(list(range(6)), [6, 7]),
            "stalled: rank 0 (process stopped), rank 1 (process stopped), rank 2 (process "
            "stopped), rank 3 (process stopped) and 2 more ranks; 2 ranks waiting on them",
        ),
    ],
)
def test_hang_reason_names_the_stalled_and_counts_the_waiting(verdict, want):
    assert hang_reason(verdict) == f"hang: no rank advanced for 10 s; {want}; stacks in D"


def test_env_newline_refused_through_the_api_and_forward_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LaunchError) as e:
        JobSpec(
            backend="local", program=("-m", "json.tool"), env={"TEST_NL": "a\nb"}, run_dir="runs/q"
        ).resolve()
    assert (
        "\n" not in str(e.value)
        and "TEST_NL=" in str(e.value)
        and "NUL and newline are not accepted" in str(e.value)
    )
    assert not (tmp_path / "runs").exists()
    spec = RecordedSpec(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=("t.py",),
        program_args=(),
        name="n",
        run_dir="r",
        forward_env=("SEC_*",),
    )
    with pytest.raises(LaunchError) as e:
        jobenv.forwarded(spec, {"SEC_TOKEN": "hunter2\nmore", "OTHER": "x\ny"})
    assert str(e.value) == (
        "--forward-env: SEC_TOKEN (from your environment) holds a newline; NUL and newline "
        "are not accepted in an environment value"
    )  # the value not shown
    assert jobenv.forwarded(spec, {"SEC_TOKEN": "a\rb", "OTHER": "x\ny"}) == {"SEC_TOKEN": "a\rb"}
