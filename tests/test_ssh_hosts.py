"""The SSH test hosts themselves (clusters/ssh-hosts.sh; `make ssh-up` first): real sshds in network
namespaces, verified host keys, the shared venv, private node-local dirs, and the fault commands."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fabric
import paramiko
import pytest

from conftest import ROOT, require_cluster

pytestmark = [pytest.mark.ssh, pytest.mark.exclusive]  # hosts killed, cut, brought up and down

SCRIPT = ROOT / "clusters" / "ssh-hosts.sh"
STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH_CONFIG, KNOWN_HOSTS, HOSTFILE = STATE / "ssh_config", STATE / "known_hosts", STATE / "hostfile"
NODE_LOCAL = "/var/tmp/launch-node-local"
HOSTS = [f"sshhost{k}" for k in range(1, 5)]
VENV_PY = ROOT / ".venv" / "bin" / "python"


def hosts_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module", autouse=True)
def hosts_up():
    st = hosts_cmd("status")
    said = " / ".join((st.stdout.strip() or st.stderr.strip()).splitlines())
    require_cluster(
        f"the SSH test hosts sshhost1..4 (clusters/ssh-hosts.sh status: {said})",
        st.returncode == 0 and KNOWN_HOSTS.exists(),
        "make ssh-up",
    )


def connect(host: str, known_hosts: Path = KNOWN_HOSTS, timeout: float = 5) -> fabric.Connection:
    """The way the launcher must connect: names through ssh_config, host keys strictly verified.
    One Config per Connection (a shared one accumulates IdentityFile entries)."""
    c = fabric.Connection(
        host,
        config=fabric.Config(runtime_ssh_path=str(SSH_CONFIG)),
        connect_timeout=timeout,
        connect_kwargs={"look_for_keys": False, "allow_agent": False},
    )
    # Fabric's default is AutoAddPolicy
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.client.load_system_host_keys(str(known_hosts))  # read-only: never written back
    return c


def run(host: str, cmd: str, **kw) -> str:
    with connect(host) as c:
        return c.run(cmd, hide=True, in_stream=False, **kw).stdout.strip()


def test_hostfile_and_printed_options_point_at_real_files():
    lines = [ln for ln in HOSTFILE.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == [f"{h} slots=2" for h in HOSTS]
    opts = hosts_cmd("options").stdout.split()
    assert opts == [
        "--hostfile",
        str(HOSTFILE),
        "--ssh-config",
        str(SSH_CONFIG),
        "--known-hosts",
        str(KNOWN_HOSTS),
    ]
    assert all(Path(p).is_file() for p in opts[1::2])


def test_every_host_has_its_own_name_address_and_network():
    probe = "hostname; ip -4 -o addr show dev eth0 | awk '{print $4}'; readlink /proc/self/ns/net"
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda h: run(h, probe).split(), HOSTS))
    assert [o[0] for o in outs] == HOSTS
    assert [o[1] for o in outs] == [f"10.216.0.{10 + k}/24" for k in range(1, 5)]
    assert len({o[2] for o in outs}) == 4 and os.readlink("/proc/self/ns/net") not in {
        o[2] for o in outs
    }


def test_hosts_reach_each_other_by_name():
    out = run(
        "sshhost3",
        f"{VENV_PY} -c \"import socket; s = socket.create_connection(('sshhost1', 22), 3); "
        "print(s.recv(7).decode(), socket.gethostbyname('sshhost3'))\"",
    )
    assert out == "SSH-2.0 10.216.0.13"


def test_host_missing_from_known_hosts_is_refused(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "".join(
            ln + "\n"
            for ln in KNOWN_HOSTS.read_text().splitlines()
            if not ln.startswith("sshhost3,")
        )
    )
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect("sshhost3", known_hosts=kh).open()
    connect("sshhost2", known_hosts=kh).open()  # the others still verify


def test_changed_host_key_is_refused(tmp_path):
    lines = KNOWN_HOSTS.read_text().splitlines()
    other_key = lines[0].split(" ", 1)[1]  # sshhost1's key claimed for sshhost3
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "".join(
            (f"sshhost3,10.216.0.13 {other_key}" if ln.startswith("sshhost3,") else ln) + "\n"
            for ln in lines
        )
    )
    with pytest.raises(paramiko.BadHostKeyException):
        connect("sshhost3", known_hosts=kh).open()


def test_openssh_client_uses_the_same_files_strictly(tmp_path):
    ok = subprocess.run(
        ["ssh", "-F", str(SSH_CONFIG), "sshhost4", "hostname"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert (ok.returncode, ok.stdout.strip()) == (0, "sshhost4")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    bad = subprocess.run(
        [
            "ssh",
            "-F",
            str(SSH_CONFIG),
            "-o",
            f"UserKnownHostsFile={empty}",
            "-o",
            "LogLevel=INFO",
            "sshhost4",
            "hostname",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert bad.returncode == 255 and "Host key verification failed" in bad.stderr


def test_shared_venv_imports_torch_remotely():
    out = run("sshhost2", f"{VENV_PY} -c 'import torch, launchers; print(torch.__version__)'")
    assert out.startswith("2.13.0")


def test_node_local_dir_is_private_while_the_rest_is_shared():
    tok = uuid.uuid4().hex
    shared = f"/tmp/ssh-hosts-test-{tok}"
    try:
        run("sshhost2", f"echo node2 > {NODE_LOCAL}/{tok}; echo shared > {shared}")
        # a new session on the same host sees it
        assert run("sshhost2", f"cat {NODE_LOCAL}/{tok}") == "node2"
        assert (
            run(
                "sshhost1",
                f"ls -A {NODE_LOCAL}; test -e {NODE_LOCAL}/{tok} && echo visible || echo absent",
            ).splitlines()[-1]
            == "absent"
        )
        assert not Path(NODE_LOCAL, tok).exists()  # nor does the launcher's (root) namespace
        # other hosts' backing dirs are hidden
        assert run("sshhost1", f"ls {STATE}/local | wc -l") == "0"
        assert Path(shared).read_text() == "shared\n"  # /tmp is shared like NFS
        assert (
            run("sshhost3", f"cat {shared}; test -f {SCRIPT} && echo repo-visible")
            == "shared\nrepo-visible"
        )
    finally:
        run("sshhost2", f"rm -f {NODE_LOCAL}/{tok} {shared}")


def test_each_host_sees_only_its_own_processes_and_shm():
    # carried in the environment, found the way a launcher sweeps for its run id
    tok = uuid.uuid4().hex
    run(
        "sshhost2",
        f"SSH_HOSTS_TEST_TAG={tok} setsid sleep 300 >/dev/null 2>&1 </dev/null & : > "
        f"/dev/shm/{tok}",
    )
    tagged = f"grep -lsxz SSH_HOSTS_TEST_TAG={tok} /proc/[0-9]*/environ | cut -d/ -f3"
    try:
        find = f"{tagged} | wc -l; ls /dev/shm | grep -c {tok}; cat /proc/1/comm"
        assert run("sshhost2", find + " || true").split() == ["1", "1", "sshd"]
        assert run("sshhost1", find + " || true").split() == ["0", "0", "sshd"]
    finally:
        run("sshhost2", f"kill $({tagged}); rm -f /dev/shm/{tok}", warn=True)


def _open_error(host: str, timeout: float) -> tuple[BaseException | None, float]:
    t0 = time.monotonic()
    try:
        connect(host, timeout=timeout).open()
        return None, time.monotonic() - t0
    except Exception as e:  # noqa: BLE001 - the test inspects the type
        return e, time.monotonic() - t0


def test_kill_host_crashes_it_and_revive_brings_it_back_with_the_same_key():
    run("sshhost4", "setsid nohup sleep 600 >/dev/null 2>&1 </dev/null &")
    try:
        assert hosts_cmd("kill-host", "4").returncode == 0
        assert (
            subprocess.run(["ip", "netns", "pids", "lssh4"], capture_output=True, text=True).stdout
            == ""
        )
        err, took = _open_error("sshhost4", timeout=5)
        assert isinstance(err, paramiko.ssh_exception.NoValidConnectionsError) and took < 2, (
            err,
            took,
        )
        assert run("sshhost3", "hostname") == "sshhost3"  # the others are untouched
    finally:
        rv = hosts_cmd("revive-host", "4")
    assert rv.returncode == 0, rv.stderr
    assert run("sshhost4", "hostname") == "sshhost4"  # same known_hosts: the host key survived


def test_cut_host_times_out_and_revive_restores_it():
    try:
        assert hosts_cmd("cut-host", "2").returncode == 0
        err, took = _open_error("sshhost2", timeout=2)
        assert err is not None and 1.5 < took < 4, (err, took)
    finally:
        rv = hosts_cmd("revive-host", "2")
    assert rv.returncode == 0, rv.stderr
    assert run("sshhost2", "hostname") == "sshhost2"


def test_fault_commands_reject_a_bad_host_number():
    p = hosts_cmd("kill-host", "7")
    assert (
        p.returncode == 2
        and "host '7' is not a test host" in p.stderr
        and len(p.stderr.splitlines()) == 1
    )


def test_a_stale_pyenv_rehash_lock_does_not_stall_the_hosts():
    """bash reads root's ~/.bashrc for every command sshd runs; this machine's runs `pyenv init` ->
    `pyenv rehash`, which waits up to 60 s for a lock file in the one ~/.pyenv every host shares. A
    host killed mid-rehash (kill-host, a SIGKILL sweep) left that lock behind once in CI, and every
    later ssh command of the run then took 60 s. The hosts read their own copy of the file with the
    pyenv eval lines commented out (clusters/ssh-hosts.sh host_bashrc): with the lock planted, a
    command still answers at once."""
    home = Path(os.path.expanduser("~root"))
    rc = home / ".bashrc"
    # no pyenv here: the hosts' rc is the machine's
    if not (rc.exists() and "pyenv init" in rc.read_text()):
        assert run("sshhost3", "cat ~/.bashrc 2>/dev/null || true") == (
            rc.read_text().strip() if rc.exists() else ""
        )
        return
    lock = home / ".pyenv" / "shims" / ".pyenv-shim"
    planted = not lock.exists()
    if planted:
        lock.write_text(
            "#!/bin/sh\n# planted by tests/test_ssh_hosts.py: a stale pyenv rehash lock\n"
        )
    try:
        t = time.monotonic()
        assert run("sshhost3", "hostname") == "sshhost3"
        assert time.monotonic() - t < 20, "the hosts' shells waited on pyenv's rehash lock"
    finally:
        if planted:
            lock.unlink(missing_ok=True)
