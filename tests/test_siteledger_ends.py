"""The site's node ledger (issue 37 item 3) where a run ends without the launcher's loop over
attempts: a plain Slurm job's failed node is one strike on its host, recorded by the batch side's
finalize exactly once per attempt (launchers.resilience.restarts.record_end), by the same policy as
local and SSH (the program's repeated failure is no host's); `--preflight gpu`'s bad nodes are
strikes with their evidence (launchers.doctor.preflight.site_strikes); a Slurm sweep's job array
excludes the ledger's quarantined hosts as a single `launch slurm` does. The real Slurm job at the
end: its lemon node is struck, and the next run of the same ledger excludes that host."""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from conftest import read_json, run_launch
from launchers import api
from launchers.backends.slurm.nodespec import write_node_spec
from launchers.backends.slurm.requeue import finalize
from launchers.doctor.preflight import site_strikes
from launchers.doctor.targets import NodeRun
from launchers.ledgers import ledgerfile, nodeledger, siteledger
from launchers.records.rundir import RunDir
from launchers.resilience import restarts
from launchers.spec import RunSpec, build_spec


def plain_slurm_run(tmp_path, monkeypatch, ledger: str) -> RunDir:
    """A submitted 2-node Slurm run (no --spares: no loop over steps) with --node-ledger, as the
    batch side finds it after srun: job 4242 on lnode1 and lnode3."""
    spec = RunSpec("slurm", 2, 1, ("t.py",), (), str(tmp_path / "r"), "r", node_ledger=ledger)
    rd = RunDir.create(spec, "r-1", {})
    os.makedirs(os.path.join(rd.path, "slurm"))
    write_node_spec(rd, spec, "r-1", 0)
    for k, v in {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "lnode[1,3]",
        "SLURM_RESTART_COUNT": "0",
    }.items():
        monkeypatch.setenv(k, v)
    return rd


def node_ends(rd: RunDir, attempt: int, codes: dict[int, int], hosts: list[str]) -> None:
    """Each node's record of its end (node.py's), and the record of the failing node's rank (its
    wrapper's)."""
    t = time.time()
    os.makedirs(os.path.join(rd.path, "status"), exist_ok=True)
    for k, code in codes.items():
        if code not in (0, 143):
            with open(os.path.join(rd.path, "status", f"rank{k}.json"), "w") as f:
                json.dump(
                    {"rank": k, "node": k, "attempt": attempt, "exit_code": code, "time": t}, f
                )
        rd.write_node_record(
            k,
            {
                "node": k,
                "attempt": attempt,
                "host": hosts[k],
                "state": "EXITED",
                "exit_code": code,
                "time": t + k,
            },
        )


def test_a_plain_slurm_runs_failed_node_is_one_strike_on_its_host_exactly_once(
    tmp_path, monkeypatch, capsys
):
    """finalize of a plain run whose node 1 (lnode3) exited 3: FAILED, nodes.json decided by the
    policy with no restart left (a stop), one strike on lnode3 in the site ledger -- node 0 recorded
    no hosts (it failed early): the job's nodelist names them. The batch script's finalize run again
    on the same attempt (a requeued script, a retry) adds nothing, to nodes.json or to the site
    ledger. A later attempt failing the same way on the other node is the program's (the same exit
    on two slots in a row): no strike on lnode1."""
    path = str(tmp_path / "site.json")
    rd = plain_slurm_run(tmp_path, monkeypatch, path)
    node_ends(rd, 0, {0: 0, 1: 3}, ["lnode1", "lnode3"])
    assert finalize(rd.path, 0, srun_status=1) == 1
    assert rd.read_status()["state"] == "FAILED"
    assert f"launch: node ledger {path}: 1 strike(s) recorded on lnode3" in capsys.readouterr().err
    assert rd.read_run_yaml()["attempts"][0]["hosts"] == ["lnode1", "lnode3"]
    site = ledgerfile.load(path)[0]
    (s,) = site["hosts"]["lnode3"]["strikes"]
    assert (list(site["hosts"]), s["run"], s["attempt"], s["quarantined"]) == (
        ["lnode3"],
        "r-1",
        0,
        False,
    ), site
    for _ in range(2):  # once decided: finalize returns; a finalize that runs the end again
        finalize(rd.path, 0, srun_status=1)
        rd.update_status(state="RUNNING")
        finalize(rd.path, 0, srun_status=1)
    assert len(nodeledger.read(rd.path)["decisions"]) == 1
    assert ledgerfile.load(path)[0] == site
    spec = rd.spec()
    rd.update_attempt(1, {"hosts": ["lnode1", "lnode3"]}, {})
    ff = {"node": 0, "rank": 0, "exit_code": 3, "signal": None, "time": time.time()}
    restarts.record_end(spec, rd, 1, None, ff, {"0": 3, "1": 143})
    led = nodeledger.read(rd.path)
    assert (
        nodeledger.program_signs(led) == {"exit 3"}
        and "looks like a bug" in led["decisions"][-1]["why"]
    ), led
    # no strike on lnode1 for the program's
    assert list(ledgerfile.load(path)[0]["hosts"]) == ["lnode3"]


def test_a_plain_run_without_node_ledger_or_that_completed_records_nothing(tmp_path, monkeypatch):
    rd = plain_slurm_run(tmp_path, monkeypatch, "")
    node_ends(rd, 0, {0: 0, 1: 3}, ["lnode1", "lnode3"])
    finalize(rd.path, 0, srun_status=1)
    # as before: no nodes.json
    assert rd.read_status()["state"] == "FAILED" and nodeledger.read(rd.path) is None
    ok = plain_slurm_run(tmp_path / "b", monkeypatch, str(tmp_path / "site.json"))
    node_ends(ok, 0, {0: 0, 1: 0}, ["lnode1", "lnode3"])
    assert finalize(ok.path, 0, srun_status=0) == 0
    assert not (tmp_path / "site.json").exists() and nodeledger.read(ok.path) is None


def test_preflight_gpus_bad_hosts_are_strikes_with_their_evidence(tmp_path, monkeypatch):
    """--preflight gpu's verdict on an SSH plan of h1..h3: h2's GPU check failed (kind gpu, weight
    2: quarantined in the site ledger at once), h3's probe could not run (kind lost, weight 1:
    suspect); the next run avoids h2. A local run has no hosts: nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "ssh_config").write_text(
        "".join(f"Host h{k}\n  HostName 10.9.0.{k}\n" for k in range(1, 4))
    )
    flags = {
        "nodes": 3,
        "node_ledger": "site.json",
        "options": {"hosts": "h1,h2,h3", "ssh_config": "ssh_config"},
    }
    spec = build_spec("ssh", flags, ["train.py"])
    plan = api.get_backend("ssh").plan(spec, "g-1", 0)
    runs = [
        NodeRun(0, "h1", result={}),
        NodeRun(1, "h2", result={}),
        NodeRun(2, "h3", error="refused"),
    ]
    bad = {
        1: "node 1 [h2 (10.9.0.2:22)]: mlx5_7 port 1: State Down",
        2: "node 2 [h3]: the GPU preflight could not run there (refused)",
    }
    site_strikes(spec, plan, runs, bad, dict(enumerate(plan.hosts)), False)
    led = ledgerfile.load(spec.node_ledger)[0]
    assert {
        h: [(s["kind"], s["run"], s["attempt"], s["reason"]) for s in e["strikes"]]
        for h, e in led["hosts"].items()
    } == {
        "h2": [("gpu", "g-1", 0, f"--preflight gpu: {bad[1]}")],
        "h3": [("lost", "g-1", 0, f"--preflight gpu: {bad[2]}")],
    }
    assert [(r["host"], r["state"]) for r in siteledger.rows(led)] == [
        ("h2", "quarantined"),
        ("h3", "suspect"),
    ]
    # the same check: kept once
    site_strikes(spec, plan, runs, bad, dict(enumerate(plan.hosts)), False)
    assert ledgerfile.load(spec.node_ledger)[0] == led
    assert build_spec("ssh", dict(flags, nodes=2), ["train.py"]).avoid_hosts == ("h2",)
    local = build_spec("local", dict(flags, options={}, node_ledger="local.json"), ["train.py"])
    site_strikes(local, plan, runs, bad, dict(enumerate(plan.hosts)), True)
    assert not (tmp_path / "local.json").exists()


def lemon_ledger(path) -> str:
    """Another user's ledger: one strike on every dev Slurm node this week (score 1: suspect, none
    avoided), so that one more strike (2) quarantines a host."""
    now = time.time()
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "hosts": {
                    f"lnode{k}": {
                        "strikes": [
                            {
                                "time": now - 60,
                                "run": "alice-1",
                                "user": "alice",
                                "attempt": 0,
                                "kind": "rank",
                                "reason": "rank 0 on node 0, exit code 1",
                                "quarantined": False,
                            }
                        ]
                    }
                    for k in range(1, 5)
                },
            }
        )
    )
    return str(path)


@pytest.mark.slurm
def test_a_slurm_sweeps_job_array_excludes_the_quarantined_hosts_slurm_knows(workdir):
    """A --sweep on Slurm (one job array): `#SBATCH --exclude=` names the ledger's quarantined Slurm
    node, and not a quarantined name Slurm does not know (sinfo -N), as a single `launch slurm`
    does."""
    from test_recovery import require_slurm

    require_slurm()
    path = lemon_ledger(workdir / "site.json")
    led = json.loads(open(path).read())
    led["hosts"]["lnode2"]["strikes"].append(dict(led["hosts"]["lnode2"]["strikes"][0], attempt=1))
    led["hosts"]["ghost9"] = led["hosts"]["lnode2"]
    open(path, "w").write(json.dumps(led))
    dry = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--node-ledger",
        path,
        "--sweep",
        "lr=1,2",
        "--dry-run",
        "--",
        "report.py",
        check=True,
    )
    assert "#SBATCH --array=0-1%2\n" in dry.stdout and "#SBATCH --exclude=lnode2\n" in dry.stdout, (
        dry.stdout
    )
    assert "quarantined there, not used: ghost9, lnode2" in dry.stderr


@pytest.mark.slurm
def test_a_plain_slurm_runs_lemon_node_is_avoided_by_the_next_run(workdir):
    """Acceptance on Slurm without --spares (2 nodes x 1): rank 1 (node 1) exits 3; the batch side's
    finalize strikes that node's host in the ledger (it was suspect: now quarantined) -- once -- and
    the next run of the same ledger excludes it (`#SBATCH --exclude=HOST`)."""
    from test_recovery import require_slurm

    require_slurm()
    path = lemon_ledger(workdir / "site.json")
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--node-ledger",
        path,
        "--env",
        "TEST_PLAN=1:0:3",
        "--run-dir",
        "runs/lemon",
        "--wait",
        "--",
        "order_worker.py",
        timeout=600,
    )
    assert p.returncode != 0, p.stdout + p.stderr
    st = read_json("runs/lemon/status.json")
    assert (
        st["state"] == "FAILED"
        and st["first_failure"]["node"] == 1
        and st["first_failure"]["exit_code"] == 3
    ), st
    lemon = yaml.safe_load(open("runs/lemon/run.yaml"))["attempts"][0]["hosts"][1]
    led = ledgerfile.load(path)[0]
    mine = {h: [s for s in e["strikes"] if s["run"] != "alice-1"] for h, e in led["hosts"].items()}
    assert {h: [(s["attempt"], s["kind"]) for s in ss] for h, ss in mine.items() if ss} == {
        lemon: [(0, "rank")]
    }, led
    assert siteledger.quarantined(led) == [lemon]
    assert "exit code 3" in mine[lemon][0]["reason"], mine
    dry = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--node-ledger",
        path,
        "--dry-run",
        "--",
        "report.py",
        check=True,
    )
    assert f"#SBATCH --exclude={lemon}\n" in dry.stdout, dry.stdout
