"""Recovery without a human (issue 23) on the local backend: the fault rows tests/test_recovery.py
runs on the SSH hosts and Slurm, here with simulated nodes (2 nodes x 1, --spares 1) -- a single
killed worker (restarted on the same slots, not quarantined), node 0 killed outright (its agent and
its ranks: the spare takes its place and the survivor is node 0) and a paused node (every process of
it SIGSTOPped: named lost, killed where it stands and replaced by the spare; the SIGCONT after the
run finds nothing to wake). Each ends with the uninterrupted run's param_sha256 and no process of
the run left, and is a row of RELIABILITY.md (make reliability), with its recovery timeline. And the
paused-node rule itself (launchers.backends.local.Paused) over real stopped processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

import test_recovery
from conftest import LAUNCH, read_json, run_launch
from launchers import procs
from launchers.backends.local import PAUSED_S, Paused
from launchers.nodeagent import node_pids
from test_recovery import PROGRAM, frozen_records, gone, recovery_row, restored_and_fenced

reference_sha = test_recovery.reference_sha  # the uninterrupted run's weights: a fixture here too
from common import kill_orphans, run_id, wait_for  # noqa: E402  (tests/faults: on the path after test_recovery)
from common import read_json as read_json_or_none  # noqa: E402  (None when missing or not whole yet)


@contextlib.contextmanager
def started_with_a_spare(
    run_dir: str,
    options: tuple[str, ...] = ("--spares", "1"),
    program: tuple[str, ...] = (),
    base: tuple[str, ...] = tuple(PROGRAM),
):
    """`launch local` of PROGRAM (a 1 s step delay) on 2 simulated nodes x 1 and one spare, in the
    background (its output in <run_dir>.out/.err); a launcher still running at the end (a failed
    test) is killed, and everything of its run. options: launch's instead of the spare; program:
    more program arguments; base: another program than PROGRAM."""
    Path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{run_dir}.out", "w") as out, open(f"{run_dir}.err", "w") as err:
        p = subprocess.Popen(
            [
                LAUNCH,
                "local",
                "--nodes",
                "2",
                "--gpus-per-node",
                "1",
                *options,
                "--run-dir",
                run_dir,
                "--",
                *base,
                "--step-delay",
                "1",
                *program,
            ],
            stdout=out,
            stderr=err,
        )
    try:
        wait_for(
            lambda: Path(run_dir, "run.yaml").is_file() or p.poll() is not None, 60, "run.yaml"
        )
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            kill_orphans(run_id(run_dir))


def signal_node(p: subprocess.Popen, run_dir: str, node: int, sig: int, step: int = 3) -> list[int]:
    """Once the node's rank (1 per node) reached `step` in attempt 0 (the run still going), `sig` to
    every process of the simulated node in that attempt (tagged NODE_RANK=node: its agent, rank
    wrapper and program); their pids."""

    def there():
        assert p.poll() is None, f"the run ended before rank {node} reached step {step}"
        rec = read_json_or_none(Path(run_dir, "progress", f"rank{node}.json")) or {}
        return rec.get("attempt") == 0 and (rec.get("step") or 0) >= step

    wait_for(there, 240, f"rank {node} at step {step} of attempt 0")
    pids = node_pids(run_id(run_dir), node, attempt=0)
    assert pids, f"no process of node {node} found"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def ended(p: subprocess.Popen, run_dir: str) -> dict:
    """The launcher's end (exit 0, COMPLETED): run.yaml."""
    assert p.wait(timeout=300) == 0, Path(f"{run_dir}.err").read_text()[-3000:]
    assert read_json(Path(run_dir, "status.json"))["state"] == "COMPLETED"
    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())


def bit_exact_and_nothing_left(run_dir: str, run: dict, row: dict, reference_sha: str) -> None:
    assert read_json(Path(run_dir, "final.json"))["param_sha256"] == reference_sha
    row["orphans"] = len(gone(run["run_id"]))
    assert row["orphans"] == 0


def test_a_paused_node_is_lost_a_paused_run_is_not():
    """launchers.backends.local.Paused over real stopped processes (two `sleep`s stand for the
    nodes' agents): an agent stopped for PAUSED_S while the other runs is a lost node (its reason
    starts `lost`: the policy's kind); one woken before that is not; every agent stopped alike is a
    paused run, never a lost node."""
    agents = [subprocess.Popen(["sleep", "120"]) for _ in range(2)]

    def pause(k: int, sig: int = signal.SIGSTOP) -> None:
        os.kill(agents[k].pid, sig)
        wait_for(
            lambda: procs.stopped(agents[k].pid) == (sig == signal.SIGSTOP), 5, f"agent {k} {sig!r}"
        )

    try:
        pause(1)
        one = Paused(agents)
        assert one.check(100.0) == {} and one.check(99.0 + PAUSED_S) == {}
        assert one.check(100.0 + PAUSED_S) == {
            1: (one.since[1][1], "lost: paused for 10 s (its agent is stopped: SIGSTOP)")
        }
        woke = Paused(agents)
        woke.check(0.0)
        pause(1, signal.SIGCONT)
        assert woke.check(PAUSED_S + 1) == {}
        pause(0), pause(1)
        both = Paused(agents)
        assert (
            both.check(0.0) == {} and both.check(PAUSED_S + 1) == {} and set(both.since) == {0, 1}
        )
    finally:
        for a in agents:
            a.kill()
            a.wait()


@pytest.mark.slow
def test_single_killed_worker_is_restarted_on_the_same_slots_not_quarantined(
    workdir, reference_sha
):
    """Rank 1 crashes at step 5 in attempt 0 only: a strike on slot 1, not a quarantine; attempt 1
    runs on the same slots 0 and 1 from checkpoints/latest and finishes bit-exact; the spare (slot
    2) is never used."""
    with recovery_row(
        "local",
        "single killed worker, --spares 1",
        "runs/w",
        "restarted on the same slots (a strike, no quarantine); COMPLETED, exit 0",
    ) as row:
        p = run_launch(
            "local",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--spares",
            "1",
            "--run-dir",
            "runs/w",
            "--",
            *PROGRAM,
            "--crash-at-step",
            "5",
            "--crash-rank",
            "1",
        )
        assert p.returncode == 0, p.stderr[-3000:]
        run = yaml.safe_load(Path("runs/w/run.yaml").read_text())
        assert [a["slots"] for a in run["attempts"]] == [[0, 1], [0, 1]], run["attempts"]
        led = read_json("runs/w/nodes.json")
        assert [d["action"] for d in led["decisions"]] == ["restart"], led
        assert led["pool"] == {"active": [0, 1], "spares": [2], "quarantined": []}, led
        assert (led["slots"]["1"]["strikes"], led["slots"]["1"]["quarantined"]) == (1, False), led
        assert (
            Path("runs/w/logs/node1/rank1.log").read_text().count("fault injection: rank 1 exits")
            == 1
        )
        assert read_json("runs/w/status.json")["state"] == "COMPLETED"
        bit_exact_and_nothing_left("runs/w", run, row, reference_sha)


@pytest.mark.slow
def test_node0_killed_a_spare_takes_over_bit_exact(workdir, reference_sha):
    """Simulated node 0 (the rendezvous host) killed outright at step 3: its agent, rank wrapper and
    program SIGKILLed together (every process of attempt 0 tagged NODE_RANK=0). The policy replaces
    slot 0 by the spare, the survivor (slot 1) is the new node 0: attempt 1 on slots 1 and 2 from
    checkpoints/latest, bit-exact, no command typed, nothing of the run left."""
    with recovery_row(
        "local",
        "node 0 killed (its agent and ranks), --spares 1",
        "runs/n0",
        "the survivor is node 0 with the spare; COMPLETED, exit 0, no command typed",
    ) as row:
        with started_with_a_spare("runs/n0") as p:
            signal_node(p, "runs/n0", 0, signal.SIGKILL)
            run = ended(p, "runs/n0")
        assert [a["slots"] for a in run["attempts"]] == [[0, 1], [1, 2]], run["attempts"]
        led = read_json("runs/n0/nodes.json")
        assert [d["action"] for d in led["decisions"]] == ["replace"] and "slot 0" in led[
            "decisions"
        ][0]["why"], led
        bit_exact_and_nothing_left("runs/n0", run, row, reference_sha)


@pytest.mark.slow
def test_node_paused_a_spare_finishes_nothing_it_writes_is_taken(workdir, reference_sha):
    """Every process of simulated node 1 (its agent, rank wrapper and program) SIGSTOPped at step 3:
    a paused node, here what a cut and SIGSTOPped host is on SSH. The launcher names it lost once
    its agent was stopped for launchers.backends.local.PAUSED_S (10 s) while node 0's ran, kills it
    where it stands (on this machine nothing keeps the launcher from it: it never wakes into the run
    that went on) and the spare takes its place from checkpoints/latest, bit-exact; the SIGCONT sent
    after the run finds nothing: nothing of the run is left and nothing taken (restored_and_fenced;
    the woken write the SSH and Slurm rows may see fenced cannot happen here)."""
    with recovery_row(
        "local",
        "node paused (its agent and ranks SIGSTOPped), --spares 1",
        "runs/cut",
        "node 1 lost (paused), the spare in; COMPLETED, exit 0, no command typed",
    ) as row:
        stopped: list[int] = []
        with started_with_a_spare("runs/cut") as p:
            try:
                stopped = signal_node(p, "runs/cut", 1, signal.SIGSTOP)
                run = ended(p, "runs/cut")
                before = frozen_records("runs/cut")
                assert [pid for pid in stopped if procs.alive(pid)] == [], (
                    "the paused node was left"
                )
            finally:
                for pid in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
        assert [a["slots"] for a in run["attempts"]] == [[0, 1], [0, 2]], run["attempts"]
        said = read_json("runs/cut/nodes.json")["slots"]["1"]["attempts"][0]["failure"]
        assert said.startswith("node 1, lost: paused for ") and said.endswith(
            "(its agent is stopped: SIGSTOP)"
        ), said
        restored_and_fenced("runs/cut", run, row, reference_sha, before)


BUG = (
    "import os, time\n"
    'if os.environ["RANK"] == "1":\n'
    '    raise ValueError("bad batch: 7 rows")\n'
    "time.sleep(120)\n"
)


def test_a_bug_on_every_node_stops_after_the_budget_and_quarantines_nothing(workdir):
    """Issue 37 item 5, as a user meets it: rank 1 raises in every attempt, on whichever node it
    runs (2x1, --spares 1 --max-restarts 5 --max-restarts-per-hour 3). Attempts 0 and 1 fail on slot
    1 (its second strike quarantines it, the spare comes in); attempt 2 fails the same way (exit 1)
    on slot 2: it follows the rank, the program's, so no strike, slot 1 back out of quarantine, a
    restart; the hour's 3 restarts spent, the run stops with one line that says so; no slot is left
    quarantined or struck."""
    Path("bug.py").write_text(BUG)
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--spares",
        "1",
        "--max-restarts",
        "5",
        "--max-restarts-per-hour",
        "3",
        "--run-dir",
        "runs/bug",
        "--",
        "bug.py",
        timeout=300,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    run = yaml.safe_load(Path("runs/bug/run.yaml").read_text())
    assert [a["slots"] for a in run["attempts"]] == [[0, 1], [0, 1], [0, 2], [0, 2]], run[
        "attempts"
    ]
    stop = [ln for ln in p.stderr.splitlines() if "not restarted" in ln]
    assert stop == [
        "launch: attempt 3 failed (rank 1 on node 1, exit code 1: ValueError: bad batch: 7 "
        "rows); not restarted: looks like a bug in the program: the same failure (exit 1) in 4 "
        "attempts in a row, on slots 1, 2: it follows the ranks, not a node; no strike; but 3 "
        "restarts in the last hour (--max-restarts-per-hour 3)"
    ], p.stderr[-3000:]
    led = read_json("runs/bug/nodes.json")
    assert led["pool"]["quarantined"] == [] and {s["strikes"] for s in led["slots"].values()} == {
        0
    }, led
    # the third restart from scratch
    assert "in 1 s (backoff: the same checkpoint again)" in p.stderr


@pytest.mark.slow
def test_warm_spares_a_spare_takes_over_by_forking(workdir, reference_sha):
    """Issue 37 item 2 (--warm-spares): once `launch status` says every slot's zygote is up (they
    import torch after the first step), node 1 is killed outright in attempt 0; the spare's zygote
    and node 0's serve attempt 1: the agents and programs are forked (found by the sweeps as cold
    ones are: node_pids), bit-exact, and nothing of the run is left: no zygote, no socket."""
    with recovery_row(
        "local",
        "--warm-spares: node 1 killed, --spares 1",
        "runs/warm",
        "the spare's zygote serves attempt 1; COMPLETED, exit 0",
    ) as row:
        with started_with_a_spare(
            "runs/warm", ("--spares", "1", "--warm-spares"), ("--step-delay", "3")
        ) as p:

            def warm():
                assert p.poll() is None, "the run ended before its zygotes were up"
                return (
                    "warm:       slots 0, 1, 2 (torch imported); cold: none"
                    in run_launch("status", "runs/warm").stdout
                )

            wait_for(warm, 240, "every slot warm")
            signal_node(p, "runs/warm", 1, signal.SIGKILL, step=1)

            def there():
                assert p.poll() is None, "the run ended before attempt 1 reached its second step"
                return (read_json_or_none(Path("runs/warm/progress/rank1.json")) or {}).get(
                    "attempt"
                ) == 1

            wait_for(there, 240, "rank 1 in attempt 1")
            pids = node_pids(run_id("runs/warm"), 1, attempt=1)
            # the program, forked warm
            assert [q for q in pids if procs.forked_as(q) == "program"], pids
            run = ended(p, "runs/warm")
        assert [a["slots"] for a in run["attempts"]] == [[0, 1], [0, 2]], run["attempts"]
        assert [read_json(f"runs/warm/status/rank{r}.json").get("warm") for r in (0, 1)] == [
            True,
            True,
        ]
        bit_exact_and_nothing_left("runs/warm", run, row, reference_sha)
        test_recovery.no_zygote_left(run["run_id"], 3)
