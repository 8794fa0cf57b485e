"""The SSH fan-out's start-up (issue 38 item 3): launchers.ssh.sshconn's Connection on paramiko
alone. A fan-out process imports neither Fabric nor invoke (nor launchers.spec, nor
importlib.metadata: launchers.ssh.sshimport) and an ssh config's `Match exec` still runs (invoke
then, on use), paramiko's version the same; on the SSH test hosts: exit codes, stdout and stderr
apart (together on a pty), UTF-8 split across reads, a timeout, an unknown host key refused, and
the connection's socket prompt (TCP_NODELAY, quick ACKs)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, require_cluster

STATE = Path("/run/launch-ssh-hosts")
CFG, KH = STATE / "ssh_config", STATE / "known_hosts"

FANOUT_IMPORTS = """
import json, sys
from launchers.ssh.hostfile import parse_hosts_option, resolve
from launchers.ssh.sshconn import SSHSettings, make_connection
h = resolve(parse_hosts_option("a,b"), sys.argv[1])
make_connection(h[0], SSHSettings(ssh_config=sys.argv[1]))
seen = sorted(m for m in ("fabric", "invoke", "launchers.spec", "importlib.metadata") if m in sys.modules)
import importlib.metadata, paramiko
assert paramiko.__version__ == importlib.metadata.version("paramiko") == paramiko.Transport._CLIENT_ID[9:]
print(json.dumps([h[0].hostname, h[1].hostname, seen]))
"""  # noqa: E501


def test_fanout_imports_no_fabric_no_invoke_and_match_exec_still_runs(tmp_path):
    mark = tmp_path / "ran"
    cfg = tmp_path / "cfg"
    cfg.write_text(
        f'Match host a exec "touch {mark}"\n  HostName 10.9.9.1\nHost b\n  HostName 10.9.9.2\n'
    )
    p = subprocess.run(
        [sys.executable, "-c", FANOUT_IMPORTS, str(cfg)], capture_output=True, text=True, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr
    # Match exec
    assert (
        json.loads(p.stdout)[:2] == ["10.9.9.1", "10.9.9.2"] and "invoke" in json.loads(p.stdout)[2]
    )
    assert mark.exists()
    cfg.write_text("Host a\n  HostName 10.9.9.1\nHost b\n  HostName 10.9.9.2\n")
    p = subprocess.run(
        [sys.executable, "-c", FANOUT_IMPORTS, str(cfg)], capture_output=True, text=True, cwd=ROOT
    )
    assert json.loads(p.stdout) == ["10.9.9.1", "10.9.9.2", []], p.stderr


@pytest.fixture
def host():
    st = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"], capture_output=True, text=True
    )
    require_cluster(
        "the SSH test hosts sshhost1..4", st.returncode == 0 and KH.exists(), "make ssh-up"
    )
    from launchers.ssh.hostfile import parse_hosts_option, resolve

    return resolve(parse_hosts_option("sshhost1"), str(CFG))[0]


@pytest.mark.ssh
def test_connection_runs_streams_times_out_and_refuses_unknown_keys(host, tmp_path):
    from launchers.errors import LaunchError
    from launchers.ssh.sshconn import (
        CommandTimedOut,
        PromptSocket,
        SSHSettings,
        connect_all,
        make_connection,
    )

    c = make_connection(host, SSHSettings(ssh_config=str(CFG), known_hosts=str(KH)))
    try:
        r = c.run(
            "printf 'a\\xc3'; sleep 0.2; printf '\\xa9b\\n'; echo oops >&2; exit 3", hide=True
        )
        assert (r.exited, r.stdout, r.stderr) == (3, "a\u00e9b\n", "oops\n")
        seen = []
        sink = type(
            "Sink", (), {"write": lambda self, s: seen.append(s), "flush": lambda self: None}
        )()
        r = c.run("echo out; echo err >&2", pty=True, out_stream=sink)
        assert r.exited == 0 and r.stdout.replace("\r", "") == "out\nerr\n" == "".join(
            seen
        ).replace("\r", "")
        t0 = time.monotonic()
        with pytest.raises(CommandTimedOut):
            c.run("sleep 30", hide=True, timeout=0.5)
        assert time.monotonic() - t0 < 5
        assert c.run("true", hide=True).exited == 0  # the connection still serves
        # writes sent and reads acknowledged at once (sshd's small packets in a row, no pty, wait
        # for our ACK: a delayed one cost ~40 ms a round trip)
        sock = c.transport.sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert isinstance(sock, PromptSocket)
    finally:
        c.close()
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(LaunchError) as e:
        connect_all([host], SSHSettings(ssh_config=str(CFG), known_hosts=str(empty)))
    assert "host key unknown" in str(e.value) and empty.read_text() == ""  # refused, nothing added
