"""The site's node ledger (issue 37 item 3, launchers.ledgers.siteledger): the decay and state rule,
a run's nodes.json turned into strikes on its hosts, hostile files (one warning line, ignored, never
written over), several processes writing at once (no write lost), what a run plans from it (SSH
leaves the hosts out, Slurm --exclude) and `launch nodes`. Pure: no run is started (the clusters'
rows are in tests/test_recovery.py and at the end here)."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import read_json, run_launch
from launchers import api
from launchers.backends.slurm.render import render_sbatch
from launchers.backends.slurm.status import known_of
from launchers.cli import main
from launchers.errors import LaunchError
from launchers.ledgers import ledgerfile, nodeledger, siteledger
from launchers.request import JobSpec as ApiSpec
from launchers.resilience import recovery
from launchers.spec import RunSpec, build_spec

DAY = siteledger.DAY
NOW = 1_800_000_000.0


def strike(
    run="r-1",
    attempt=0,
    kind="rank",
    age_days=0.0,
    user="alice",
    reason="rank 1 on node 1, exit code 3",
):
    return {
        "time": NOW - age_days * DAY,
        "run": run,
        "user": user,
        "attempt": attempt,
        "kind": kind,
        "reason": reason,
        "quarantined": False,
    }


def ledger(**hosts) -> dict:
    return {"version": 1, "hosts": {h: {"strikes": ss} for h, ss in hosts.items()}}


def test_the_rule_full_for_a_week_then_halving_weekly_two_make_a_quarantine():
    w = [siteledger.weight(strike(age_days=d), NOW) for d in (0, 7, 14, 21, 28)]
    assert w == [1.0, 1.0, 0.5, 0.25, 0.125]
    # a hardware kind weighs 2
    assert siteledger.weight(strike(kind="gpu", age_days=14), NOW) == 1.0
    states = {
        name: siteledger.state(siteledger.score({"strikes": ss}, NOW))
        for name, ss in {
            "two this week": [strike(attempt=0), strike(attempt=1)],
            "one": [strike()],
            "gpu once": [strike(kind="gpu")],
            "two, a fortnight ago": [
                strike(attempt=0, age_days=14),
                strike(attempt=1, age_days=14),
            ],
            "one, three weeks ago": [strike(age_days=21)],
        }.items()
    }
    assert states == {
        "two this week": "quarantined",
        "one": "suspect",
        "gpu once": "quarantined",
        "two, a fortnight ago": "suspect",
        "one, three weeks ago": "ok",
    }
    led = ledger(lnode2=[strike(attempt=0), strike(attempt=1)], lnode3=[strike()])
    assert siteledger.quarantined(led, NOW) == ["lnode2"]
    rows = siteledger.rows(led, NOW)
    assert [(r["host"], r["state"], r["score"], r["strikes"]) for r in rows] == [
        ("lnode2", "quarantined", 2.0, 2),
        ("lnode3", "suspect", 1.0, 1),
    ]
    assert rows[1]["last"] == "run r-1 (alice), attempt 0: rank: rank 1 on node 1, exit code 3"
    faded = siteledger.merge(ledger(old=[strike(age_days=60)], new=[strike()]), {}, NOW)
    assert list(faded["hosts"]) == ["new"]  # under 1/64 of its weight: dropped at a write


def lemon_nodes_json(run_dir: str, hosts: list[str]) -> tuple[dict, list[dict]]:
    """nodes.json of the lemon (slot 1 fails twice: restart, then quarantined and the spare in), as
    the launcher writes it, and run.yaml's attempts with each attempt's hosts."""
    pool, led = nodeledger.pool_for(None, 2, 1), None
    for attempt in (0, 1):
        fail = recovery.failure_of(
            {"rank": 1, "node": 1, "exit_code": 3}, pool, "rank 1 on node 1, exit code 3"
        )
        d = recovery.failure_decision(fail, pool, nodeledger.strikes(led), 2, 3)
        led = nodeledger.record(
            run_dir,
            led,
            attempt,
            pool,
            fail,
            {"0": 143, "1": 3},
            d,
            2,
            {
                "fault": NOW - 10 + attempt,
                "detected": NOW - 9 + attempt,
                "decided": NOW - 8 + attempt,
            },
        )
        pool = d.pool
    return led, [{"hosts": hosts[:2]}, {"hosts": hosts[:2]}, {"hosts": [hosts[0], hosts[2]]}]


def test_a_lemon_run_is_two_strikes_on_its_host_and_recording_it_again_adds_nothing(tmp_path):
    led, attempts = lemon_nodes_json(str(tmp_path), ["bob@sshhost1:22", "sshhost2", "sshhost3"])
    new = siteledger.run_strikes(led, attempts, "lemon-1", "bob", NOW)
    assert list(new) == ["sshhost2"] and [
        (s["attempt"], s["kind"], s["quarantined"], s["time"]) for s in new["sshhost2"]
    ] == [(0, "rank", False, NOW - 8), (1, "rank", True, NOW - 7)]
    assert (
        new["sshhost2"][0]["reason"] == "rank 1 on node 1, exit code 3"
        and new["sshhost2"][0]["user"] == "bob"
    )
    site = siteledger.merge(ledgerfile.empty(), new, NOW)
    assert ledgerfile.check(site, NOW) is None and siteledger.quarantined(site, NOW) == ["sshhost2"]
    assert siteledger.merge(site, new, NOW) == site  # a resume writes it again
    # a Slurm requeue: kept aside
    nodeledger.new_allocation(str(tmp_path), led, recovery.Pool.fresh(2, 1))
    assert (
        siteledger.run_strikes(nodeledger.read(str(tmp_path)), attempts, "lemon-1", "bob", NOW)
        == new
    )
    path = str(tmp_path / "site.json")  # the end of the run
    (tmp_path / "nodes.json").write_text(json.dumps(led))
    out = io.StringIO()
    siteledger.record_run(path, str(tmp_path), "lemon-1", attempts, out=out)
    assert out.getvalue() == f"launch: node ledger {path}: 2 strike(s) recorded on sshhost2\n"
    assert siteledger.quarantined(ledgerfile.load(path)[0]) == ["sshhost2"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


BAD = {
    "not JSON": b"{",
    "NaN": b'{"version": 1, "hosts": {"h": {"strikes": [NaN]}}}',
    "a key twice": b'{"version": 1, "version": 1, "hosts": {}}',
    "another version": b'{"version": 2, "hosts": {}}',
    "a list": b"[]",
    "an extra key": b'{"version": 1, "hosts": {}, "run": "rm -rf /"}',
    "a hostlist": json.dumps(ledger(**{"lnode[1-4]": [strike()]})).encode(),
    "an option as a host": json.dumps(ledger(**{"--partition=x": [strike()]})).encode(),
    "a comma": json.dumps(ledger(**{"a,b": [strike()]})).encode(),
    "a newline in a reason": json.dumps(ledger(h=[strike(reason="x\nreason=evil")])).encode(),
    "a strike from the future": json.dumps(ledger(h=[strike(age_days=-30)])).encode(),
    "an unknown kind": json.dumps(ledger(h=[strike(kind="evil")])).encode(),
    "a bool for an attempt": json.dumps(ledger(h=[dict(strike(), attempt=True)])).encode(),
    "too many strikes": json.dumps(ledger(h=[strike(attempt=a) for a in range(40)])).encode(),
    "too large": b" " * (ledgerfile.MAX_BYTES + 1),
    "deep": b"[" * 100000 + b"]" * 100000,
    "not UTF-8": b'{"version": 1, "hosts": {"\xff": 1}}',
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_hostile_ledger_is_one_warning_line_ignored_and_never_written_over(tmp_path, name):
    path, raw = (
        tmp_path / "site.json",
        BAD[name].replace(b"1800000000.0", str(time.time()).encode()),
    )
    path.write_bytes(raw)
    led, why = ledgerfile.load(str(path))
    assert (
        led is None and why.startswith(f"node ledger {str(path)!r} not used: ") and "\n" not in why
    ), why
    out = io.StringIO()
    assert siteledger.fields("slurm", str(path), "--node-ledger", out=out) == {
        "node_ledger": str(path),
        "avoid_hosts": (),
    }
    assert out.getvalue() == f"launch: warning: {why}\n"
    assert ledgerfile.update(str(path), lambda led: led) == f"{why}; not written"
    assert path.read_bytes() == raw


def test_a_ledger_that_is_no_regular_file_is_not_read(tmp_path):
    (tmp_path / "real.json").write_text(json.dumps(ledger(h=[strike()])))
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")
    # never through a symlink
    assert "not used: " in ledgerfile.load(str(tmp_path / "link.json"))[1]
    assert ledgerfile.load(str(tmp_path / "fifo.json"))[1].endswith("not used: not a regular file")
    # not there yet: empty
    assert ledgerfile.load(str(tmp_path / "none.json")) == (ledgerfile.empty(), None)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
            lambda kids: (
                st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4)
            ),
            max_leaves=30,
        ).map(lambda v: json.dumps({"version": 1, "hosts": v}).encode()),
    )
)
def test_any_bytes_are_a_ledger_or_one_line_why(raw):
    led, why = ledgerfile.parse(raw)
    assert (led is None) != (why is None)
    assert led is None or ledgerfile.check(led) is None
    assert why is None or "\n" not in why


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["lnode1", "lnode2", "h-3.x"]),
        st.lists(
            st.tuples(
                st.integers(0, 50),
                st.sampled_from(sorted(recovery.KINDS)),
                st.floats(0, 90),
                st.text(max_size=400),
            ),
            max_size=40,
        ),
        max_size=3,
    )
)
def test_whatever_a_run_adds_the_ledger_stays_valid_and_bounded(new):
    strikes = {
        h: [
            strike(run=f"r-{a}", attempt=a, kind=k, age_days=d, reason=siteledger.clean(r, 300))
            for a, k, d, r in ss
        ]
        for h, ss in new.items()
    }
    led = siteledger.merge(ledgerfile.empty(), strikes, NOW)
    assert ledgerfile.check(led, NOW) is None
    assert all(len(e["strikes"]) <= siteledger.MAX_STRIKES for e in led["hosts"].values())


def _writer(path: str, who: int, times: int) -> None:
    for k in range(times):
        new = {
            f"h{who}": [strike(run=f"run-{who}-{k}", user=f"user{who}")],
            "shared": [strike(run=f"run-{who}-{k}", user=f"user{who}")],
        }
        now = time.time()
        for ss in new.values():
            ss[0]["time"] = now
        assert ledgerfile.update(path, lambda led: siteledger.merge(led, new, now)) is None


def test_runs_of_several_users_writing_at_once_lose_no_write(tmp_path):
    """6 processes x 5 read-modify-writes of one ledger at once: every strike is there (the fcntl
    lock on PATH.lock; each write an atomic replace that readers meanwhile see whole)."""
    path = str(tmp_path / "site.json")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, who, 5)) for who in range(6)]
    for p in procs:
        p.start()
    seen = 0
    while any(p.is_alive() for p in procs):  # a reader meanwhile: always a whole ledger
        led, why = ledgerfile.load(path)
        assert why is None, why
        seen += 1
    assert [p.join() or p.exitcode for p in procs] == [0] * 6
    led = ledgerfile.load(path)[0]
    assert len(led["hosts"]["shared"]["strikes"]) == 30 and all(
        len(led["hosts"][f"h{w}"]["strikes"]) == 5 for w in range(6)
    )
    assert {s["run"] for s in led["hosts"]["shared"]["strikes"]} == {
        f"run-{w}-{k}" for w in range(6) for k in range(5)
    }
    assert seen and not [f for f in os.listdir(tmp_path) if ".tmp-" in f]


def write_ledger(path: Path, **hosts) -> str:
    now = time.time()
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "hosts": {
                    h: {"strikes": [dict(s, time=now - len(ss) + i) for i, s in enumerate(ss)]}
                    for h, ss in hosts.items()
                },
            }
        )
    )
    return str(path)


def test_a_run_reads_it_once_ssh_leaves_the_hosts_out_slurm_excludes_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "ssh_config").write_text(
        "".join(f"Host h{k}\n  HostName 10.9.0.{k}\n" for k in range(1, 5))
    )
    path = write_ledger(
        tmp_path / "site.json", h2=[strike(attempt=0), strike(attempt=1)], h4=[strike()]
    )
    flags = {
        "nodes": 2,
        "node_ledger": "site.json",
        "options": {"hosts": "h1,h2,h3", "ssh_config": "ssh_config"},
    }
    spec = build_spec("ssh", flags, ["train.py"])
    assert (spec.node_ledger, spec.avoid_hosts) == (path, ("h2",))
    plan = api.get_backend("ssh").plan(spec, "x-1", 0)
    assert (
        plan.hosts == ["h1", "h3"]
        and f"# node ledger {path}: quarantined, not used: h2" in plan.render()
    )
    # run.yaml keeps it: a resume too
    assert RunSpec.from_dict(spec.to_dict()).avoid_hosts == ("h2",)
    with pytest.raises(LaunchError) as e:
        api.get_backend("ssh").plan(spec.replace(nodes=3), "x-1", 0)
    assert str(e.value) == (
        f"host(s) h2 quarantined in the node ledger {path}: 2 of 3 hosts left, 3 needed (--nodes "
        f"+ --spares); accepted: more hosts (`launch nodes --node-ledger {path}` says why)"
    )
    # no hosts on local
    assert build_spec("local", dict(flags, options={}), ["train.py"]).avoid_hosts == ()
    assert ApiSpec(
        backend="ssh",
        program=("train.py",),
        node_ledger=Path(path),
        nodes=2,
        ssh={"hosts": "h1,h2,h3"},
    ).resolve().avoid_hosts == ("h2",)
    sl = spec.replace(
        backend="slurm", options=(("sbatch_args", ("--exclude=h9",)),), avoid_hosts=("h2", "h4")
    )
    assert "#SBATCH --exclude=h9,h2,h4\n" in render_sbatch(sl, base_attempt=0, header="h")
    assert "--exclude" not in render_sbatch(
        sl.replace(avoid_hosts=(), options=()), base_attempt=0, header="h"
    )
    # a run.yaml others wrote
    crafted = sl.replace(avoid_hosts=("--partition=x", "lnode[1-4]", "h2"), options=())
    assert "#SBATCH --exclude=h2\n" in render_sbatch(crafted, base_attempt=0, header="h")
    # not a Slurm node: left out
    assert known_of(("h2", "h4"), run=lambda argv: (0, "h1\nh2\nh3\n")) == ("h2",)
    assert known_of(("h2",), run=lambda argv: (127, "sinfo: not found")) == ("h2",)


def test_launch_nodes_shows_the_ledger_and_drains_with_the_evidence(tmp_path):
    path = write_ledger(
        tmp_path / "site.json",
        lnode3=[strike(attempt=0), strike(attempt=1, kind="lost", reason="node 1 (lnode3) lost")],
        lnode1=[strike()],
    )
    run = CliRunner()
    out = run.invoke(main, ["nodes", "--node-ledger", path])
    assert out.exit_code == 0 and out.output.splitlines()[0].split() == [
        "HOST",
        "STATE",
        "SCORE",
        "STRIKES",
        "LAST",
        "WHEN",
    ]
    assert out.output.splitlines()[1].split()[:4] == ["lnode3", "quarantined", "2", "2"], out.output
    rows = json.loads(
        run.invoke(main, ["nodes", "--json"], env={"LAUNCH_NODE_LEDGER": path}).output
    )
    assert [(r["host"], r["state"]) for r in rows] == [
        ("lnode3", "quarantined"),
        ("lnode1", "suspect"),
    ]
    dry = run.invoke(main, ["nodes", "--node-ledger", path, "--drain", "lnode3", "--dry-run"])
    assert dry.exit_code == 0 and dry.output == (
        "scontrol update nodename=lnode3 state=drain 'reason=launch node "
        "ledger: run r-1 (alice), attempt 1: lost: node 1 (lnode3) lost'\n"
    )
    for args, said in (
        (
            ["--drain", "lnode9"],
            "--drain 'lnode9': no strike of that host in the node ledger; accepted: lnode1, lnode3",
        ),
        (["--drain", "lnode[1-3]"], "--drain 'lnode[1-3]': no strike of that host"),
    ):
        bad = run.invoke(main, ["nodes", "--node-ledger", path, *args])
        assert bad.exit_code == 2 and said in bad.output, bad.output
    (tmp_path / "bad.json").write_text("{")
    bad = run.invoke(main, ["nodes", "--node-ledger", str(tmp_path / "bad.json")])
    assert (
        bad.exit_code == 2
        and bad.output.startswith("launch: error: node ledger ")
        and "not JSON" in bad.output
    )
    assert (
        "give --node-ledger FILE or set LAUNCH_NODE_LEDGER"
        in run.invoke(main, ["nodes"], env={"LAUNCH_NODE_LEDGER": ""}).output
    )


def quarantine_by_alice(path: Path, host: str) -> str:
    """A ledger another user's run left: `host` failed twice this week (quarantined)."""
    return write_ledger(
        path,
        **{
            host: [
                strike(run="alice-run", attempt=0, kind="lost", reason=f"{host} lost"),
                strike(run="alice-run", attempt=1, kind="agent", reason="its agent died"),
            ]
        },
    )


@pytest.mark.ssh
def test_an_ssh_run_does_not_use_a_host_the_ledger_quarantined(workdir):
    """alice's run left sshhost2 quarantined: a run of 2 nodes on sshhost1,2,3 plans on sshhost1 and
    sshhost3 (its dry-run says so) and runs there."""
    from test_recovery import launch_on_ssh, require_ssh

    require_ssh()
    path = quarantine_by_alice(workdir / "site.json", "sshhost2")
    hosts = (
        "sshhost1,sshhost2,sshhost3",
        "--nodes",
        "2",
        "--node-ledger",
        path,
        "--run-dir",
        "runs/avoid",
    )
    dry = launch_on_ssh(*hosts, "--dry-run", "--", "report.py")
    nodes = [
        ln.split(" on ")[1].split("@")[1].split()[0].rstrip(":")
        for ln in dry.stdout.splitlines()
        if re.match(r"# node \d+ on ", ln)
    ]
    assert dry.returncode == 0 and nodes == ["sshhost1", "sshhost3"], dry.stdout + dry.stderr
    assert f"# node ledger {path}: quarantined, not used: sshhost2" in dry.stdout
    p = launch_on_ssh(*hosts, "--", "report.py")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"launch: node ledger {path}: quarantined there, not used: sshhost2" in p.stderr
    run = yaml.safe_load((workdir / "runs/avoid/run.yaml").read_text())
    assert [a["hosts"] for a in run["attempts"]] == [["sshhost1", "sshhost3"]]


@pytest.mark.slurm
def test_a_slurm_job_excludes_the_node_the_ledger_quarantined(workdir):
    """alice's run left lnode2 quarantined: the script says `#SBATCH --exclude=lnode2` and a job of
    3 of the 4 nodes runs on the other three (run.yaml's hosts, sacct's NodeList)."""
    from test_recovery import require_slurm

    require_slurm()
    path = quarantine_by_alice(workdir / "site.json", "lnode2")
    args = (
        "slurm",
        "--nodes",
        "3",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--node-ledger",
        path,
        "--run-dir",
        "runs/avoid",
    )
    dry = run_launch(*args, "--dry-run", "--", "report.py", check=True)
    assert "#SBATCH --exclude=lnode2\n" in dry.stdout
    p = run_launch(*args, "--wait", "--", "report.py", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    run = yaml.safe_load((workdir / "runs/avoid/run.yaml").read_text())
    assert sorted(run["attempts"][0]["hosts"]) == ["lnode1", "lnode3", "lnode4"]
    job = read_json(workdir / "runs/avoid/status.json")["slurm_job_id"]
    sacct = subprocess.run(
        ["sacct", "-j", job, "-o", "JobID,NodeList", "--parsable2", "-n"],
        capture_output=True,
        text=True,
    )
    nodelist = next(ln.split("|")[1] for ln in sacct.stdout.splitlines() if ln.split("|")[0] == job)
    names = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True
    ).stdout.split()
    assert sorted(names) == ["lnode1", "lnode3", "lnode4"], (sacct.stdout, names)


def test_the_programs_failure_on_every_node_is_no_hosts_strike(tmp_path):
    """A bug of the program (the same rank failure in a row on slots 1 and 2:
    launchers.resilience.recovery.program) leaves the site ledger as it was: no host is blamed for
    it, not even the one it quarantined before it was seen twice."""
    led, pool = None, recovery.Pool.fresh(2, 1)
    for attempt in range(3):
        fail = recovery.failure_of(
            {"rank": 1, "node": 1, "exit_code": 1, "exception": "KeyError: 'lr'"}, pool, "x"
        )
        d = recovery.failure_decision(
            fail, pool, nodeledger.strikes(led), 2, 3, None, nodeledger.past(led)
        )
        led = nodeledger.record(
            str(tmp_path), led, attempt, pool, fail, {"0": 143, "1": 1}, d, 2, {"decided": NOW}
        )
        pool = d.pool
    assert nodeledger.program_signs(led) == {"exit 1"} and not led["pool"]["quarantined"], led
    attempts = [
        {"hosts": ["sshhost1", "sshhost2"]},
        {"hosts": ["sshhost1", "sshhost2"]},
        {"hosts": ["sshhost1", "sshhost3"]},
    ]
    assert siteledger.run_strikes(led, attempts, "bug-1", "bob", NOW) == {}


@pytest.mark.slurm
@pytest.mark.exclusive
def test_launch_nodes_drain_drains_the_slurm_node_with_its_evidence(tmp_path):
    """The admin's hook for real (it was only ever dry-run): lnode4 quarantined by alice's run is
    drained in the dev cluster with the ledger's newest strike as Slurm's reason, then put back
    (exclusive: no job meanwhile)."""
    from test_recovery import require_slurm

    require_slurm()
    path = quarantine_by_alice(tmp_path / "site.json", "lnode4")
    try:
        out = CliRunner().invoke(main, ["nodes", "--node-ledger", path, "--drain", "lnode4"])
        assert out.exit_code == 0, out.output
        sinfo = subprocess.run(
            ["sinfo", "-h", "-N", "-n", "lnode4", "-o", "%T|%E"], capture_output=True, text=True
        )
        state, reason = sinfo.stdout.strip().split("|", 1)
        assert state.startswith("drain") and reason.startswith("launch node ledger: run "), (
            sinfo.stdout
        )
        assert "alice" in reason, sinfo.stdout
    finally:
        subprocess.run(
            ["scontrol", "update", "nodename=lnode4", "state=resume"], capture_output=True
        )
    back = subprocess.run(
        ["sinfo", "-h", "-N", "-n", "lnode4", "-o", "%T"], capture_output=True, text=True
    ).stdout
    assert not back.strip().startswith("drain"), back
