"""Recovery without a human (issue 23, local slice): the one policy (launchers.recovery) as a table, the options,
the node ledger and its `launch status` block from a hand-made run dir, and one real `launch local` run of a lemon
node: slot 1 crashes at the same step in every attempt, is quarantined after 2 strikes, a spare takes its place
and the run ends with the uninterrupted run's weights."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from conftest import read_json, run_launch
from launchers import api, nodeledger, procs, recovery
from launchers.errors import LaunchError
from launchers.recovery import Failure, Pool
from launchers.rundir import RunDir
from launchers.spec import JobSpec

P = Pool
# id: (failure: (slot, kind) or None, pool, strikes before, quarantine_after, restarts left)
#  -> (action, the next pool, what the why says)
POLICY = {
    "killed-worker-is-one-strike": (((1, "rank"), P((0, 1), (2,)), {}, 2, 3),
                                    ("restart", P((0, 1), (2,)), "strike 1 of 2: restart on the same slots")),
    "lemon-second-strike-quarantined": (((1, "rank"), P((0, 1), (2,)), {1: 1}, 2, 3),
                                        ("replace", P((0, 2), (), (1,)), "quarantined; replaced by spare slot 2")),
    "lemon-no-spare-stops": (((1, "rank"), P((0, 1)), {1: 1}, 2, 3),
                             ("stop", P((0, 1), (), (1,)), "quarantined, and no spare left")),
    "agent-died-replaced-benched": (((1, "agent"), P((0, 1), (2,)), {}, 2, 3),
                                    ("replace", P((0, 2), (1,)), "its agent died, strike 1 of 2: replaced by spare")),
    "node0-lost-survivor-is-node0": (((0, "lost"), P((0, 1), (2, 3)), {}, 2, 3),
                                     ("replace", P((1, 2), (3, 0)), "slot 0: lost")),
    "hang-replaced": (((1, "hang"), P((0, 1), (2,)), {}, 2, 3), ("replace", P((0, 2), (1,)), "hung")),
    "lost-no-spare-restarts": (((1, "lost"), P((0, 1)), {}, 2, 3),
                               ("restart", P((0, 1)), "restart on the same slots (no spare left)")),
    "budget-spent-stops": (((1, "rank"), P((0, 1), (2,)), {}, 2, 0), ("stop", P((0, 1), (2,)), "no restart left")),
    "replace-without-budget-stops": (((1, "rank"), P((0, 1), (2,)), {1: 1}, 2, 0),
                                     ("stop", P((0, 2), (), (1,)), "no restart left")),
    "quarantine-after-1": (((0, "rank"), P((0, 1), (2,)), {}, 1, 3), ("replace", P((1, 2), (), (0,)), "strike 1 of 1")),
    "quarantine-after-3-second-strike": (((1, "rank"), P((0, 1), (2,)), {1: 1}, 3, 3),
                                         ("restart", P((0, 1), (2,)), "strike 2 of 3")),
    "benched-slot-back-then-quarantined": (((1, "agent"), P((0, 1), (2,)), {1: 1}, 2, 3),
                                           ("replace", P((0, 2), (), (1,)), "quarantined")),
    "no-node-named": ((None, P((0, 1), (2,)), {}, 2, 3), ("restart", P((0, 1), (2,)), "no node named")),
}


@pytest.mark.parametrize("case", POLICY, ids=list(POLICY))
def test_policy_table(case):
    (fail, pool, strikes, after, left), (action, nxt, why) = POLICY[case]
    d = recovery.decide(Failure(*fail) if fail else None, pool, strikes, after, left)
    assert (d.action, d.pool) == (action, nxt) and why in d.why, d
    if fail:
        assert d.strikes[fail[0]] == strikes.get(fail[0], 0) + 1          # the failing slot, one strike more
        assert (fail[0] in d.quarantined) == (strikes.get(fail[0], 0) + 1 >= after)
    assert "\n" not in d.why


KINDS = [({"rank": 1, "node": 1, "exit_code": 1, "signal": None}, "rank"),
         ({"rank": 1, "node": 1, "exit_code": None, "signal": "SIGKILL", "reason": "out of memory"}, "rank"),
         ({"rank": 1, "node": 1, "exit_code": None, "reason": "hang: process stopped"}, "hang"),
         ({"rank": None, "node": 1, "reason": "lost: silent for 30 s (network cut or host hung)"}, "lost"),
         ({"rank": None, "node": 1, "reason": "connection lost (host h2: reset)"}, "lost"),
         ({"rank": None, "node": 0, "reason": "did not finish"}, "lost"),
         ({"rank": None, "node": 1, "exit_code": None, "signal": "SIGKILL"}, "agent")]


def test_first_failure_kinds_and_slots():
    assert [recovery.kind_of(ff) for ff, _ in KINDS] == [k for _, k in KINDS]
    pool = Pool((1, 2), (0,))
    assert recovery.failure_of({"rank": 3, "node": 0}, pool, "x") == Failure(1, "rank", "x")   # node 0 on slot 1
    assert recovery.failure_of({"rank": None, "node": 2}, pool) is None        # not a node of the attempt
    assert recovery.failure_of(None, pool) is None


OPTIONS = [("local", {}, {"spares": 0, "quarantine_after": 2, "max_restarts": 0}),
           ("local", {"spares": "2"}, {"spares": 2, "quarantine_after": 2, "max_restarts": 3}),
           ("local", {"spares": "1", "max_restarts": "5", "quarantine_after": "3"},
            {"spares": 1, "quarantine_after": 3, "max_restarts": 5}),
           ("local", {"spares": "1", "max_restarts": "0"}, {"spares": 1, "quarantine_after": 2, "max_restarts": 0}),
           ("ssh", {"spares": "0", "max_restarts": "2"}, {"spares": 0, "quarantine_after": 2, "max_restarts": 2}),
           ("local", {"spares": "-1"}, "--spares '-1' is out of range; give an integer 0-65536"),
           ("local", {"quarantine_after": "0"}, "--quarantine-after '0' is out of range"),
           ("ssh", {"spares": "1"}, "--spares 1 is not yet on this backend (ssh)"),
           ("slurm", {"spares": "2"}, "--spares 2 is not yet on this backend (slurm)")]


@pytest.mark.parametrize("backend,given,expected", OPTIONS)
def test_options(backend, given, expected):
    def pick(key, default=None):
        return given.get(key, default)

    def said(key):
        return "--" + key.replace("_", "-")
    if isinstance(expected, str):
        with pytest.raises(LaunchError) as e:
            recovery.options(backend, pick, said)
        assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    else:
        assert recovery.options(backend, pick, said) == expected


def test_ledger_and_status_block(tmp_path):
    """Two failed attempts of a lemon (slot 1) as the launcher records them; `launch status` shows the block."""
    spec = JobSpec(backend="local", nodes=2, gpus_per_node=1, program=("x.py",), program_args=(),
                   run_dir=str(tmp_path / "run"), name="x", spares=1, max_restarts=2)
    rd = RunDir.create(spec, "x-1", {"hosts": []})
    assert nodeledger.read(rd.path) is None and "slots active" not in api.format_status(api.status(rd.path))
    led, pool = None, nodeledger.pool_for(None, 2, 1)
    assert pool == Pool((0, 1), (2,))
    for attempt in (0, 1):
        ff = {"rank": 1, "node": 1, "exit_code": 1, "signal": None}
        fail = recovery.failure_of(ff, pool, "rank 1 on node 1, exit code 1")
        d = recovery.decide(fail, pool, nodeledger.strikes(led), 2, 2 - attempt)
        led = nodeledger.record(rd.path, led, attempt, pool, fail, {"0": 143, "1": 1}, d, 2)
        assert nodeledger.read(rd.path) == json.loads(json.dumps(led))
        pool = nodeledger.pool_for(nodeledger.read(rd.path), 2, 1)
        led = nodeledger.read(rd.path)
    assert pool == Pool((0, 2), (), (1,)) and nodeledger.strikes(led) == {0: 0, 1: 2}
    assert led["slots"]["1"]["quarantined"] and not led["slots"]["0"]["quarantined"]
    assert [a["failure"] for a in led["slots"]["0"]["attempts"]] == ["stopped with the run"] * 2
    assert nodeledger.pool_for(led, 1, 1) == Pool((0,), (2,), (1,))      # a resume on fewer nodes: still out
    text = api.format_status(api.status(rd.path))
    block = text[text.index("nodes:"):].splitlines()[:4]
    assert block == [
        "nodes:      slots active 0, 2; spares none; quarantined 1 (at 2 strikes)",
        "            slot 1: 2 strikes, quarantined (attempt 0: rank 1 on node 1, exit code 1; attempt 1: rank 1 on "
        "node 1, exit code 1)",
        "            attempt 0: restart -- slot 1: a rank failed, strike 1 of 2: restart on the same slots",
        "            attempt 1: replace -- slot 1: a rank failed, strike 2 of 2: quarantined; replaced by spare slot 2"]


PROGRAM = ["-m", "workloads.convnet", "--dataset", "digits", "--seed", "7", "--batch-size", "8", "--no-tensorboard",
           "--max-steps", "8", "--checkpoint-every", "2"]


@pytest.mark.slow
def test_lemon_node_is_quarantined_and_a_spare_finishes_bit_exact(workdir):
    """Slot 1's rank crashes at step 5 in every attempt: attempt 0 fails (strike 1: restart on the same slots),
    attempt 1 fails (strike 2: quarantined, spare slot 2 takes its place), attempt 2 completes on slots 0 and 2
    from checkpoints/latest with the weights of an uninterrupted run of the same world size; no person, no
    process left."""
    p = run_launch("local", "--nodes", "2", "--gpus-per-node", "1", "--spares", "1", "--run-dir", "runs/lemon",
                   "--", *PROGRAM, "--crash-at-step", "5", "--crash-slot", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    run = yaml.safe_load(Path("runs/lemon/run.yaml").read_text())
    assert [a["slots"] for a in run["attempts"]] == [[0, 1], [0, 1], [0, 2]]
    st = read_json("runs/lemon/status.json")
    assert st["state"] == "COMPLETED" and st["attempt"] == 2
    led = read_json("runs/lemon/nodes.json")
    assert led["pool"] == {"active": [0, 2], "spares": [], "quarantined": [1]}
    assert (led["slots"]["1"]["strikes"], led["slots"]["1"]["quarantined"]) == (2, True)
    assert [d["action"] for d in led["decisions"]] == ["restart", "replace"]
    crashes = Path("runs/lemon/logs/node1/rank1.log").read_text().count("fault injection: rank 1 exits")
    assert crashes == 2                                     # attempts 0 and 1 on slot 1; not attempt 2 on slot 2
    assert "slot 1: 2 strikes, quarantined" in run_launch("status", "runs/lemon", check=True).stdout
    deadline = time.monotonic() + 10                        # exits take a moment to be reaped
    while (left := procs.tagged_pids(run["run_id"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []
    fin = read_json("runs/lemon/final.json")
    ref = run_launch("local", "--nodes", "1", "--gpus-per-node", "2", "--run-dir", "runs/ref", "--", *PROGRAM)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert fin["step"] == 8 and fin["world_size"] == 2
    assert fin["param_sha256"] == read_json("runs/ref/final.json")["param_sha256"]
