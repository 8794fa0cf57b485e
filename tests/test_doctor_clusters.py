"""`launch doctor` on the real dev clusters: the 4 SSH hosts (clusters/ssh-hosts.sh; /work and /tmp
shared like NFS, /var/tmp/launch-node-local private to each host) and the 4-node Slurm cluster
(slurm/dev-cluster.sh). Passes where all is well; with one host's torch hidden, the master port held
and a node-local run root, each check fails naming the node and the cause; unknown host keys and
dead hosts are named within the timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, require_cluster, run_launch

STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH = ["--ssh-config", str(STATE / "ssh_config"), "--known-hosts", str(STATE / "known_hosts")]
HOSTS = [f"sshhost{k}" for k in range(1, 5)]


def ssh_up():
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    require_cluster(
        "the SSH test hosts sshhost1..4",
        st.returncode == 0 and (STATE / "known_hosts").exists(),
        "make ssh-up",
    )


def slurm_up():
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")


def doctor(*args, cwd=ROOT, timeout=300):
    t = time.monotonic()
    p = run_launch("doctor", *args, "--json", cwd=cwd, timeout=timeout)
    assert p.returncode in (0, 1), (p.returncode, p.stdout, p.stderr)
    return p.returncode, json.loads(p.stdout), time.monotonic() - t


def statuses(rep):
    return {(n["node"], name): c["status"] for n in rep["nodes"] for name, c in n["checks"].items()}


@pytest.mark.ssh
def test_ssh_hosts_pass_with_the_collective(tmp_path):
    ssh_up()
    code, rep, wall = doctor(
        "--hostfile",
        str(STATE / "hostfile"),
        *SSH,
        "--runs-root",
        str(tmp_path / "runs"),
        "--collective",
    )
    assert code == 0 and rep["failures"] == [], rep["failures"]
    assert [n["host"].split()[0] for n in rep["nodes"]] == HOSTS
    assert set(statuses(rep).values()) <= {"ok", "skip", "warn"}
    assert all(
        statuses(rep)[(k, name)] == "ok" for k in range(1, 4) for name in ("master", "shared")
    )
    for n in rep["nodes"]:
        assert "GB/s" in n["checks"]["collective"]["value"], n
    assert not (tmp_path / "runs").exists()
    print(f"doctor --collective on 4 SSH hosts: {wall:.1f} s")


@pytest.mark.ssh
def test_ssh_hidden_torch_held_port_node_local_root_each_fail_naming_node_and_cause(tmp_path):
    """Host 3's --python lacks torch (a venv without it, picked by hostname); the master port is
    held on host 1 by a listener started there; the run root is each host's private
    /var/tmp/launch-node-local."""
    ssh_up()
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "notorch")],
        check=True,
        timeout=120,
    )
    py = tmp_path / "py"
    py.write_text(
        f'#!/bin/sh\nif [ "$(hostname)" = sshhost3 ]; then exec {tmp_path}/notorch/bin/python '
        f'"$@"; fi\nexec {sys.executable} "$@"\n'
    )
    py.chmod(0o755)
    port = 20000 + os.getpid() % 20000
    holder = subprocess.Popen(
        [
            "ssh",
            "-F",
            str(STATE / "ssh_config"),
            "sshhost1",
            f"{sys.executable} -c "
            f'\'import socket,sys; s=socket.socket(); s.bind(("",{port})); s.listen(); '
            f'print("LISTENING", flush=True); sys.stdin.read()\'',
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "LISTENING"
        root = f"/var/tmp/launch-node-local/doctor-{os.getpid()}"
        code, rep, wall = doctor(
            "--hostfile",
            str(STATE / "hostfile"),
            *SSH,
            "--python",
            str(py),
            "--master-port",
            str(port),
            "--runs-root",
            root,
        )
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert code == 1
    st, fails = statuses(rep), rep["failures"]
    torch_fails = [f for f in fails if " torch: " in f]
    assert [k for (k, name), s in st.items() if name == "torch" and s == "fail"] == [2]
    assert (
        torch_fails[0].startswith("FAIL node 2 [sshhost3 ")
        and "cannot import torch" in torch_fails[0]
    )
    assert "ModuleNotFoundError" in torch_fails[0] and "-> install torch==" in torch_fails[0]
    port_fail = next(f for f in fails if " port: " in f)
    assert (
        port_fail.startswith("FAIL node 0 [sshhost1 ")
        and f"master port {port} is in use" in port_fail
    )
    assert "held by pid" in port_fail
    assert [k for (k, name), s in st.items() if name == "shared" and s == "fail"] == [1, 2, 3]
    assert all(
        "not shared" in f and "written on node 0 (sshhost1" in f for f in fails if " shared: " in f
    )
    assert len(fails) == 5, fails
    print(f"doctor with three faults on 4 SSH hosts: {wall:.1f} s")


@pytest.mark.ssh
def test_missing_python_on_one_host_is_named_without_waiting_for_it(tmp_path):
    """sshhost2's --python does not exist: named there, and node 0 hears at once that it will not
    come (else node 0 would wait for it until --timeout 40)."""
    ssh_up()
    py = tmp_path / "py"
    py.write_text(
        f'#!/bin/sh\nif [ "$(hostname)" = sshhost2 ]; then exec {tmp_path}/nopython "$@"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    py.chmod(0o755)
    code, rep, wall = doctor(
        "--hostfile",
        str(STATE / "hostfile"),
        *SSH,
        "--python",
        str(py),
        "--timeout",
        "40",
        "--runs-root",
        str(tmp_path / "r"),
    )
    assert code == 1
    (fail,) = rep["failures"]
    assert (
        fail.startswith("FAIL node 1 [sshhost2 ")
        and " python: " in fail
        and "not found there" in fail
    )
    assert "nopython" in fail and "-> give --python" in fail
    assert all(statuses(rep)[(k, "master")] == "ok" for k in (2, 3))
    assert wall < 40, wall


@pytest.mark.ssh
def test_unknown_host_key_and_dead_host_are_named_within_the_connect_timeout(tmp_path):
    """known_hosts without sshhost2's key: refused, never accepted; 10.216.0.99 (no host there) is
    named within the 5 s connect timeout (the SSH handshake of a loaded 2-core machine needs more
    than 2 s at times) while sshhost1 is still checked."""
    ssh_up()
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "".join(
            ln
            for ln in (STATE / "known_hosts").read_text().splitlines(True)
            if not ln.startswith("sshhost2,")
        )
    )
    before = kh.read_text()
    code, rep, wall = doctor(
        "--hosts",
        "sshhost1,sshhost2,10.216.0.99",
        "--ssh-config",
        str(STATE / "ssh_config"),
        "--known-hosts",
        str(kh),
        "--connect-timeout",
        "5",
        "--runs-root",
        str(tmp_path / "r"),
    )
    assert code == 1
    st = statuses(rep)
    assert st[(0, "reachable")] == "ok" and st[(0, "torch")] == "ok", rep["failures"]
    fails = rep["failures"]
    assert any(f.startswith("FAIL node 1 [sshhost2 ") and "host key unknown" in f for f in fails), (
        fails
    )
    assert any(f.startswith("FAIL node 2 [10.216.0.99") and "unreachable" in f for f in fails), (
        fails
    )
    assert kh.read_text() == before  # never auto-accepted
    assert wall < 60, wall


@pytest.mark.exclusive
@pytest.mark.slurm
def test_slurm_cluster_passes(tmp_path):
    slurm_up()
    code, rep, wall = doctor("--slurm", "--nodes", "4", "--runs-root", str(tmp_path / "runs"))
    assert code == 0 and rep["failures"] == [], rep["failures"]
    assert sorted(n["host"] for n in rep["nodes"]) == [f"lnode{k}" for k in range(1, 5)]
    assert all(
        statuses(rep)[(k, name)] == "ok" for k in range(1, 4) for name in ("master", "shared")
    )
    print(f"doctor on the 4-node Slurm cluster: {wall:.1f} s")


@pytest.mark.slurm
def test_slurm_bad_partition_is_one_line(tmp_path):
    slurm_up()
    p = run_launch(
        "doctor",
        "--slurm",
        "--partition",
        "nosuchpart",
        "--runs-root",
        str(tmp_path),
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    (line,) = p.stderr.strip().splitlines()
    assert (
        line.startswith("launch: error: the doctor job did not start")
        and "partition" in line.lower()
    )


@pytest.mark.exclusive
@pytest.mark.slurm
def test_slurm_missing_python_is_named_per_node(tmp_path):
    slurm_up()
    code, rep, _ = doctor(
        "--slurm",
        "--nodes",
        "2",
        "--python",
        str(tmp_path / "nopython"),
        "--runs-root",
        str(tmp_path / "r"),
    )
    assert code == 1
    assert sorted(n["host"] for n in rep["nodes"]) == ["lnode1", "lnode2"]
    fails = rep["failures"]
    assert len(fails) == 2 and all(
        " python: " in f and "nopython' not found there" in f for f in fails
    ), fails
    assert all("-> give --python" in f for f in fails)
