"""Clusters reached over SSH (issue 25 item 1): the clusters file, and a profile's `slurm: {cluster:
NAME}`, which only the CLI follows (tests/test_viacluster.py): the Python API and the Slurm backend
refuse it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import launchers
from launchers import api
from launchers.backends.slurm import array
from launchers.backends.slurm.backend import SlurmBackend
from launchers.errors import LaunchError
from launchers.spec import build_spec
from launchers.ssh import clusters

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
    assert (dev.login, dev.port, dev.user, dev.runs_root) == (
        "login1.example.org",
        2222,
        "alice",
        "/shared/alice/runs",
    )
    # file's dir
    assert (dev.identity, dev.known_hosts) == (
        str(tmp_path / "keys" / "id_dev"),
        str(tmp_path / "kh"),
    )
    assert [(j.name, j.user, j.port) for j in dev.jump] == [
        ("bastion.example.org", "bob", 2200),
        ("gw2", None, None),
    ]
    assert dev.route == "alice@login1.example.org:2222 via bob@bastion.example.org:2200, gw2"
    small = found["small"]
    assert (small.port, small.user, small.jump, small.known_hosts) == (None, None, (), None)
    assert dev.run_dir("/home/me/runs/r1") == "/shared/alice/runs/r1"
    assert dev.run_dir("/shared/alice/runs/sweep/r2") == "/shared/alice/runs/sweep/r2"


ENTRY = "c1:\n  login: l1\n  runs_root: /r\n"
BAD = [  # (file text, what the one line must say besides the file's name)
    (
        "c1:\n  login: l1\n  runs_root: /r\n  partition: gpu\n",
        ["cluster 'c1'", "unknown key 'partition'", "accepted: login, port"],
    ),
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
    with pytest.raises(
        LaunchError, match=r"--cluster 'prod' is not in clusters file .*; accepted: dev, small"
    ):
        clusters.get("prod")
    with pytest.raises(
        LaunchError, match=r"cluster 'dev': identity '.*keys/id_dev' does not exist"
    ):
        clusters.get("dev")
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", str(tmp_path / "none.yaml"))
    with pytest.raises(
        LaunchError, match=r"clusters file '.*none.yaml' does not exist; accepted: a YAML mapping"
    ):
        clusters.get("dev")
    monkeypatch.delenv("LAUNCH_CLUSTERS_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert clusters.default_path() == str(tmp_path / "cfg" / "launchers" / "clusters.yaml")


def test_profile_names_the_cluster_only_the_cli_follows_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_CLUSTERS_FILE", write(tmp_path, GOOD))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    (tmp_path / "p.yaml").write_text("slurm:\n  cluster: small\n")
    spec = build_spec("slurm", {"snapshot": False}, ["t.py"], profile="p.yaml")
    assert spec.opts["cluster"] == "small"
    # the Python API (and any path to the Slurm backend) never submits such a spec here: one line,
    # nothing written
    said = (
        "slurm option cluster 'small' is not accepted here: a cluster is reached by the CLI, "
        "`launch slurm --cluster small` (launch runs on its login node); accepted: no cluster "
        "option, or cluster '' (this machine's Slurm)"
    )
    api_spec = launchers.JobSpec(
        backend="slurm", program=("t.py",), profile="p.yaml", snapshot=False
    )
    resolved = api_spec.resolve()
    for refused in (
        lambda: launchers.submit(api_spec, dry_run=True),
        lambda: api.submit(resolved),
        lambda: array.plan_array([spec], {"sweep_dir": str(tmp_path / "sw")}, None),
    ):
        with pytest.raises(LaunchError) as e:
            refused()
        assert str(e.value) == said
    assert sorted(os.listdir(tmp_path)) == ["clusters.yaml", "keys", "kh", "p.yaml", "t.py"]
    assert not os.path.exists(resolved.run_dir)
    # `--cluster ''` over the profile's (what viacluster gives the login node's launch): this
    # machine's Slurm
    here = build_spec(
        "slurm", {"snapshot": False, "options": {"cluster": ""}}, ["t.py"], profile="p.yaml"
    )
    assert (
        here.opts["cluster"] == ""
        and "#SBATCH" in SlurmBackend().plan(here, "t-1", attempt=0).render()
    )
    (tmp_path / "p.yaml").write_text("slurm:\n  cluster: [small]\n")
    with pytest.raises(LaunchError, match="cluster has a value of the wrong type"):
        build_spec("slurm", {}, ["t.py"], profile="p.yaml")
