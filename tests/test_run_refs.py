"""Runs by name, nodes by host, JSON scripts can rely on (issue 36 items 3 and 4).

Pure: RUN resolved from a path, a run name (a sweep's `<sweep>/<run>` too), a Slurm job id
(slurm/jobs), an array job id (the sweep dir), refused with the candidates when two runs answer; the
node ledger's lines naming the host; ISO-8601 times; the --json of a dry run; `launch wait
--timeout` running out exits 124. One real local run: started with --json (one object on stdout, the
rank lines on stderr), then status, logs, wait, cancel by its name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import DATA
from launchers import LaunchError, runjson
from launchers.ledgers import nodeledger
from launchers.records import runindex


def fake_run(d, jobs=()):
    os.makedirs(os.path.join(d, "slurm"), exist_ok=True)
    with open(os.path.join(d, "run.yaml"), "w") as f:
        f.write("run_id: x\n")
    with open(os.path.join(d, "slurm", "jobs"), "w") as f:
        f.write("".join(f"{k} {j}\n" for k, j in enumerate(jobs)))
    return str(d)


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("LAUNCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "runs"


def test_a_run_is_found_by_path_name_or_slurm_job_id(root, tmp_path):
    a = fake_run(root / "exp-a", ["4101", "4107"])
    elsewhere = fake_run(tmp_path / "far" / "exp-b", ["5200"])
    runindex.note(elsewhere)
    os.makedirs(root / "sw")
    member = fake_run(root / "sw" / "run-0", ["6000_0"])
    with open(root / "sw" / "sweep.json", "w") as f:
        json.dump({"runs": [{"run_dir": member}], "slurm_array_job": "6000"}, f)
    assert runindex.resolve(a) == a  # a path: as given
    assert runindex.resolve("exp-a") == a and runindex.resolve("exp-b") == elsewhere
    assert runindex.resolve("4107") == a and runindex.resolve("5200") == elsewhere
    assert runindex.resolve("6000_0") == member and runindex.resolve("6000") == str(root / "sw")
    assert runindex.resolve("sw/run-0") == member and runindex.resolve("sw") == str(root / "sw")
    for word in ("nothing", "999"):
        with pytest.raises(
            LaunchError,
            match=(
                f"'{word}' is not a run dir, nor the name of a run under .*runs or in "
                "the runs index, nor a Slurm job id of one; accepted: a run dir's path"
            ),
        ):
            runindex.resolve(word)
    os.makedirs("plain")
    # a path: the verb's own message names what it lacks
    assert runindex.resolve("plain") == "plain"


def test_two_runs_answering_to_one_name_are_refused_listing_both(root, tmp_path):
    a = fake_run(root / "exp", ["77"])
    b = fake_run(tmp_path / "other" / "exp", ["78"])
    runindex.note(b)
    with pytest.raises(LaunchError) as e:
        runindex.resolve("exp")
    assert (
        "ambiguous" in str(e.value)
        and a in str(e.value)
        and b in str(e.value)
        and "\n" not in str(e.value)
    )
    fake_run(tmp_path / "third", ["77"])
    runindex.note(str(tmp_path / "third"))
    with pytest.raises(LaunchError, match="'77' is ambiguous: 2 runs"):
        runindex.resolve("77")


def test_the_ledger_names_each_slot_s_host():
    led = {
        "quarantine_after": 2,
        "pool": {"active": [0, 2], "spares": [], "quarantined": [1]},
        "slots": {
            "1": {
                "strikes": 2,
                "quarantined": True,
                "attempts": [
                    {"attempt": 0, "node": 1, "failure": "exit 3", "strike": True},
                    {"attempt": 1, "node": 1, "failure": "exit 3", "strike": True},
                ],
            }
        },
        "decisions": [
            {
                "attempt": 1,
                "action": "replace",
                "why": "slot 1: strike 2 of 2: replaced by spare slot 2",
            }
        ],
    }
    attempts = [{"hosts": ["sshhost1", "sshhost2"]}, {"hosts": ["sshhost1", "sshhost2"]}]
    lines = nodeledger.lines(nodeledger.with_hosts(led, attempts))
    assert lines == [
        "slots active 0, 2; spares none; quarantined 1 (sshhost2) (at 2 strikes)",
        "slot 1 (sshhost2): 2 strikes, quarantined (attempt 0: exit 3; attempt 1: exit 3)",
        "attempt 1: replace -- slot 1 (sshhost2): strike 2 of 2: replaced by spare slot 2",
    ]
    assert nodeledger.lines(led)[1].startswith("slot 1: 2 strikes")  # a local run: no host


def test_times_are_iso_8601_utc():
    assert runjson.iso(0) == "1970-01-01T00:00:00Z" and runjson.iso(None) is None
    assert runjson.iso_stamp("not a time") is None
    assert runjson.iso_stamp("2026-12-06T06:00:00.123").endswith("Z")


def launch(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "launchers.cli", *args], capture_output=True, text=True, **kw
    )


def test_a_dry_run_as_json(root, tmp_path):
    (tmp_path / "report.py").write_text((DATA / "report.py").read_text())
    p = launch(
        "local", "--nodes", "2", "--run-dir", "runs/d", "--dry-run", "--json", "--", "report.py"
    )
    dry = json.loads(p.stdout)
    assert p.returncode == 0 and dry["run_dir"] == str(root / "d") and len(dry["commands"]) == 2
    assert (
        dry["dry_run"] is True and dry["commands"][1] in dry["text"] and not (root / "d").exists()
    )


def test_a_local_run_by_name_with_json(root, tmp_path, monkeypatch, capsys):
    (tmp_path / "report.py").write_text((DATA / "report.py").read_text())
    p = launch("local", "--nodes", "2", "--run-dir", "runs/named", "--json", "--", "report.py")
    out = json.loads(p.stdout)  # the one object; the rank lines and the end line went to stderr
    assert (
        p.returncode == 0 and out["state"] == "COMPLETED" and out["run_dir"] == str(root / "named")
    )
    assert (
        out["exit_code"] == 0
        and out["run_id"].startswith("named-")
        and out["started"].endswith("Z")
    )
    assert "REPORT" in p.stderr and "launch: run COMPLETED" in p.stderr
    assert "state:      COMPLETED" in launch("status", "named").stdout
    assert "REPORT" in launch("logs", "named", "--rank", "1").stdout
    w = launch("wait", "named", "--json")
    assert w.returncode == 0 and json.loads(w.stdout)["exit_code"] == 0
    c = launch("cancel", "named", "--json")
    assert c.returncode == 0 and json.loads(c.stdout)["cancelled"] is False
    rows = json.loads(launch("list", "--json").stdout)
    assert (
        rows[0]["name"] == "named"
        and rows[0]["started"].endswith("Z")
        and rows[0]["modified"].endswith("Z")
    )
    r = launch("resume", "named", "--dry-run", "--json")
    dry = json.loads(r.stdout)
    assert (
        r.returncode == 0 and dry["run_dir"] == str(root / "named") and len(dry["commands"]) == 2
    ), r.stderr
    from launchers import Run

    assert Run("named").path == str(root / "named")  # the API's Run by name too
    with pytest.raises(LaunchError, match="^Run.resume nodes 0 is out of range"):
        Run("named").resume(nodes=0)
    wait_runs_out(str(root / "named"), monkeypatch, capsys)


def wait_runs_out(d, monkeypatch, capsys):
    """`launch wait --timeout` running out: exit 124 (as timeout(1)); with --json the run's record
    says so."""
    from launchers import api, runstatus

    def never_ends(path, interval, timeout, on_poll=None):
        raise TimeoutError(f"run {path!r} still RUNNING after {timeout} s")

    monkeypatch.setattr(runstatus, "wait_status", never_ends)
    with pytest.raises(LaunchError) as e:
        api.wait(d, timeout=0.1)
    assert e.value.exit_code == 124 and "still RUNNING after 0.1 s" in str(e.value)
    capsys.readouterr()
    assert runjson.waited(True, d, lambda: api.wait(d, timeout=0.1)) == 124
    out, err = capsys.readouterr()
    assert (
        json.loads(out)["timed_out"] is True
        and json.loads(out)["exit_code"] == 124
        and "still RUNNING" in err
    )


def test_nccl_tables_as_json(tmp_path):
    presets = json.loads(launch("nccl", "list", "--json").stdout)
    assert presets and all({"name", "vars", "affects", "description"} <= set(p) for p in presets)
    assert all(isinstance(v, str) for p in presets for v in p["vars"].values())
    log = tmp_path / "info.log"
    log.write_text("h1:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    p = launch("nccl", "infolog", str(log), "--json")
    assert (
        p.returncode == 0
        and json.loads(p.stdout)["version"] == "2.21.5"
        and "summary" in json.loads(p.stdout)
    )


def test_a_failure_names_its_node_s_host():
    assert (
        nodeledger.on_host("rank 3 on node 1, exit code 1", ["lnode1", "lnode2"])
        == "rank 3 on node 1 (lnode2), exit code 1"
    )
    assert nodeledger.on_host("node 4, lost", ["a"]) == "node 4, lost"  # not recorded: as it was
    # local
    assert (
        nodeledger.on_host("rank 0 on node 0, exit code 1", []) == "rank 0 on node 0, exit code 1"
    )
