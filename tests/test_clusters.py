"""Clusters reached over SSH (issue 25 item 1), the client side: the clusters file, the one runner of Slurm's
commands (here vs on a login node: the command that would run, no network), the SFTP plan of a submit (the
backend's own route, reached through the Python API; the CLI's --cluster is tests/test_viacluster.py)."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from launchers import clusters
from launchers.backends.slurm import cmd, login
from launchers.backends.slurm import status as slurm_status
from launchers.errors import LaunchError
from launchers.spec import JobSpec, build_spec

GOOD = """\
dev:
  login: login1.example.org
  port: 2222
  user: alice
  identity: keys/id_dev
  jump: [bob@bastion.example.org:2200, gw2]
  known_hosts: kh
  runs_root: /shared/alice/runs/
small:
  login: 10.0.0.5
  runs_root: /scratch/runs
"""


def write(tmp_path: Path, text: str, files: bool = True) -> str:
    if files:
        (tmp_path / "keys").mkdir(exist_ok=True)
        (tmp_path / "keys" / "id_dev").write_text("key\n")
        (tmp_path / "kh").write_text("")
    p = tmp_path / "clusters.yaml"
    p.write_text(text)
    return str(p)


def test_good_file(tmp_path, monkeypatch):
    path = write(tmp_path, GOOD)
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", path)
    found = clusters.load()
    assert sorted(found) == ["dev", "small"]
    dev = clusters.get("dev")
    assert (dev.login, dev.port, dev.user, dev.runs_root) == ("login1.example.org", 2222, "alice", "/shared/alice/runs")
    assert (dev.identity, dev.known_hosts) == (str(tmp_path / "keys" / "id_dev"), str(tmp_path / "kh"))   # file's dir
    assert [(j.name, j.user, j.port) for j in dev.jump] == [("bastion.example.org", "bob", 2200), ("gw2", None, None)]
    assert dev.route == "alice@login1.example.org:2222 via bob@bastion.example.org:2200, gw2"
    small = found["small"]
    assert (small.port, small.user, small.jump, small.known_hosts) == (None, None, (), None)
    assert dev.run_dir("/home/me/runs/r1") == "/shared/alice/runs/r1"
    assert dev.run_dir("/shared/alice/runs/sweep/r2") == "/shared/alice/runs/sweep/r2"


ENTRY = "c1:\n  login: l1\n  runs_root: /r\n"
BAD = [      # (file text, what the one line must say besides the file's name)
    ("c1:\n  login: l1\n  runs_root: /r\n  partition: gpu\n", ["cluster 'c1'", "unknown key 'partition'",
                                                              "accepted: login, port"]),
    ("c1:\n  runs_root: /r\n", ["cluster 'c1'", "login is missing"]),
    ("c1:\n  login: l1\n", ["cluster 'c1'", "runs_root is missing"]),
    (ENTRY.replace("/r", "runs"), ["runs_root 'runs'", "absolute path"]),
    (ENTRY + "  port: 0\n", ["port '0'", "1-65535"]),
    (ENTRY + "  port: 70000\n", ["port '70000'", "1-65535"]),
    (ENTRY + "  port: ssh\n", ["port 'ssh'", "1-65535"]),
    (ENTRY + "  port: true\n", ["port True", "1-65535"]),
    (ENTRY + "  user: 'a b'\n", ["user 'a b'", "letters, digits"]),
    (ENTRY + "  jump: [bastion:99999]\n", ["jump", "bad port '99999'", "1-65535"]),
    (ENTRY + "  jump: []\n", ["jump is an empty list", "[user@]host[:port]"]),
    (ENTRY + "  jump: [{a: b}]\n", ["jump {", "a non-empty string"]),
    (ENTRY.replace("l1", "me@l1:22"), ["login 'me@l1:22'", "give user: and port:"]),
    (ENTRY + "  identity: ''\n", ["identity ''", "non-empty string"]),
    ("all:\n  login: l1\n  runs_root: /r\n", ["cluster name 'all'", "not all"]),
    ("'a b':\n  login: l1\n  runs_root: /r\n", ["cluster name 'a b'", "letters, digits"]),
    (ENTRY + "  port: 22\n  port: 23\n", ["key 'port' is given twice"]),
    ("c1: login1\n", ["cluster 'c1' must be a mapping", "accepted keys: login"]),
    ("- c1\n", ["must be a non-empty mapping of clusters"]),
    ("", ["must be a non-empty mapping of clusters"]),
    ("c1: [unclosed\n", ["is not valid YAML"]),
]


@pytest.mark.parametrize("text,says", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_file(tmp_path, text, says):
    path = write(tmp_path, text, files=False)
    with pytest.raises(LaunchError) as e:
        clusters.load(path)
    msg = str(e.value)
    assert "\n" not in msg and f"clusters file {path!r}" in msg
    for part in says:
        assert part in msg, msg


def test_get_refuses_unknown_cluster_and_missing_files(tmp_path, monkeypatch):
    path = write(tmp_path, GOOD, files=False)
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", path)
    with pytest.raises(LaunchError, match=r"--cluster 'prod' is not in clusters file .*; accepted: dev, small"):
        clusters.get("prod")
    with pytest.raises(LaunchError, match=r"cluster 'dev': identity '.*keys/id_dev' does not exist"):
        clusters.get("dev")
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", str(tmp_path / "none.yaml"))
    with pytest.raises(LaunchError, match=r"clusters file '.*none.yaml' does not exist; accepted: a YAML mapping"):
        clusters.get("dev")
    monkeypatch.delenv("LAUNCH_CLUSTERS_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert clusters.default_path() == str(tmp_path / "cfg" / "launchers" / "clusters.yaml")


def test_runner_command_here_and_on_the_login_node(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", write(tmp_path, GOOD))
    argv = ["squeue", "-h", "-j", "12", "-o", "%i|%T|%r|%N"]
    here = cmd.invocation(argv)
    assert (here.argv, here.cluster, here.where()) == (tuple(argv), None, "here")
    there = cmd.invocation(argv, cmd.cluster_named("dev"))
    assert there.line == "squeue -h -j 12 -o '%i|%T|%r|%N'" and shlex.split(there.line) == argv
    assert there.where() == "cluster dev (login alice@login1.example.org:2222 via bob@bastion.example.org:2200, gw2)"
    assert cmd.invocation(["scancel", "1; rm -rf ~"], cmd.cluster_named("dev")).line == "scancel '1; rm -rf ~'"
    with pytest.raises(ValueError, match="not a Slurm command"):
        cmd.invocation(["rm", "-rf", "/"])
    # here, as before the runner: a missing binary is OSError (the status queries: 127, "unanswered")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        cmd.run(["sinfo", "-h"])
    rc, out = slurm_status.runner(None)(["squeue", "-h"])
    assert rc == 127 and slurm_status.unanswered(rc, out)


def test_route_hops_verify_host_keys_like_launch_ssh(tmp_path, monkeypatch):
    import paramiko
    (tmp_path / "ssh_config").write_text("Host gw2\n  HostName 10.1.1.1\n  Port 2022\n"
                                         "Host viacfg\n  HostName 10.2.2.2\n  ProxyJump hopC,carol@hopB:2201\n"
                                         "Host hopA\n  ProxyJump elsewhere\n")
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", write(tmp_path, GOOD.replace(
        "  runs_root: /scratch/runs\n", "  runs_root: /scratch/runs\n  ssh_config: ssh_config\n")
        + "cfg:\n  login: viacfg\n  ssh_config: ssh_config\n  runs_root: /r\n"
        + "hop:\n  login: l1\n  jump: hopA\n  ssh_config: ssh_config\n  runs_root: /r\n"))
    dev = cmd.cluster_named("dev")
    hosts, conns = cmd.build_route(dev)
    assert [(h.hostname, h.port, h.user) for h in hosts][:2] == [("bastion.example.org", 2200, "bob"),
                                                                  ("gw2", 22, hosts[1].user)]
    assert [(h.hostname, h.port, h.user) for h in hosts][2] == ("login1.example.org", 2222, "alice")
    assert [c.gateway for c in conns[1:]] == conns[:-1]
    assert all(isinstance(c.client._policy, paramiko.RejectPolicy) for c in conns)
    assert [h.entry.word for h in cmd.route_hosts(cmd.cluster_named("cfg"))] == ["hopC", "carol@hopB:2201", "viacfg"]
    with pytest.raises(LaunchError, match="jump host hopA has its own ProxyJump"):
        cmd.route_hosts(cmd.cluster_named("hop"))


def test_profile_names_the_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", write(tmp_path, GOOD))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    (tmp_path / "p.yaml").write_text("slurm:\n  cluster: small\n")
    spec = build_spec("slurm", {"snapshot": False}, ["t.py"], profile="p.yaml")
    assert spec.opts["cluster"] == "small"
    assert login.on_cluster(spec)[0].run_dir == "/scratch/runs/" + Path(spec.run_dir).name
    (tmp_path / "p.yaml").write_text("slurm:\n  cluster: [small]\n")
    with pytest.raises(LaunchError, match="cluster has a value of the wrong type"):
        build_spec("slurm", {}, ["t.py"], profile="p.yaml")


def spec_for(tmp_path, **kw) -> JobSpec:
    return JobSpec(backend="slurm", nodes=2, gpus_per_node=1, program=("t.py",), program_args=(), name="t",
                   run_dir=str(tmp_path / "runs" / "t-1"), **kw)


def test_submit_plan_uploads_into_the_runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", write(tmp_path, GOOD))
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path / "runs"))
    spec, c = login.on_cluster(spec_for(tmp_path, options=(("cluster", "dev"),), snapshot=str(tmp_path / "s"),
                                        snapshot_dir=str(tmp_path / "s" / "abc")))
    assert (spec.run_dir, spec.snapshot, spec.snapshot_dir) == ("/shared/alice/runs/t-1", "/shared/alice/runs/.snapshots",
                                                                "/shared/alice/runs/.snapshots/abc")
    assert login.on_cluster(spec_for(tmp_path)) == (spec_for(tmp_path), None)
    skel = tmp_path / "skel"
    (skel / "logs").mkdir(parents=True)
    (skel / "run.yaml").write_text("run_id: t-1\n")
    items = login.uploads(c, str(skel), "/shared/alice/runs/sweep/t-1", "#!/bin/bash\n", attempt=2)
    assert [(u.path, u.text, oct(u.mode)) for u in items if u.text is not None] == [
        ("/shared/alice/runs/sweep/t-1/run.yaml", "run_id: t-1\n", oct((skel / "run.yaml").stat().st_mode & 0o777)),
        ("/shared/alice/runs/sweep/t-1/slurm/submit-a2.sh", "#!/bin/bash\n", "0o755")]
    assert [u.path for u in items if u.text is None] == [
        "/shared/alice/runs", "/shared/alice/runs/sweep", "/shared/alice/runs/sweep/t-1",
        "/shared/alice/runs/sweep/t-1/logs", "/shared/alice/runs/sweep/t-1/slurm"]
    assert login.submit_argv(items[-1].path) == ["sbatch", "--parsable", items[-1].path]
    with pytest.raises(LaunchError, match="is outside its runs root /shared/alice/runs"):
        login.uploads(c, str(skel), "/shared/alice/other/t-1", "#!/bin/bash\n", attempt=0)
    (skel / "link").symlink_to("/etc/passwd")
    with pytest.raises(LaunchError, match="is not a plain file or directory"):
        login.tree(str(skel), "/shared/alice/runs/t-1")
