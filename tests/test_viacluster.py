"""`--cluster NAME` (issue 25 item 1, the client side): the ssh argv and the login node's command
lines (golden, pure), the submit's rewritten options, ssh's failures in one line; and a real round
trip through two throwaway sshd (a bastion and a login node on 127.0.0.1) whose login node runs this
tree's `launch`."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, LAUNCH, ROOT, run_launch
from launchers.errors import LaunchError
from launchers.records.rundir import RunDir
from launchers.spec import RunSpec
from launchers.ssh import clusters, clusterssh, viacluster

OPTS = (
    "-o BatchMode=yes -o StrictHostKeyChecking=yes -o UpdateHostKeys=no -o ConnectTimeout=10 "
    "-o ServerAliveInterval=5 -o ServerAliveCountMax=2 -o UserKnownHostsFile={d}/kh "
    "-o GlobalKnownHostsFile=/dev/null -i {d}/id -o IdentitiesOnly=yes -F {d}/cfg"
)


def cluster_file(d: Path, text: str) -> str:
    for f in ("id", "kh", "cfg"):
        (d / f).touch()
    (d / "clusters.yaml").write_text(text)
    return str(d / "clusters.yaml")


def test_ssh_argv_verifies_every_hop_golden(tmp_path):
    path = cluster_file(
        tmp_path,
        "dev:\n  login: login1\n  port: 2222\n  user: alice\n  identity: id\n"
        "  jump: [bob@bastion:2200, gw2]\n  known_hosts: kh\n  ssh_config: cfg\n"
        "  runs_root: /shared/alice/runs\n  launch: env PYTHONPATH='/opt/my src' /opt/bin/launch\n",
    )
    c = clusters.get("dev", path)
    o = OPTS.format(d=tmp_path)
    gw1 = f"ssh {o} -T -W '[%h]:%p' -p 2200 -l bob bastion"
    gw2 = f"ssh {o} -o {shlex.quote('ProxyCommand=' + gw1.replace('%', '%%'))} -T -W '[%h]:%p' gw2"
    assert clusterssh.ssh_argv(c, "true") == [
        "ssh",
        *o.split(),
        "-o",
        "ProxyCommand=" + gw2,
        "-T",
        "-p",
        "2222",
        "-l",
        "alice",
        "login1",
        "true",
    ]
    assert clusterssh.ssh_argv(c, control="/t/s", master=True)[-11:] == [
        "-o",
        "ControlPath=/t/s",
        "-o",
        "ControlMaster=yes",
        "-T",
        "-N",
        "-p",
        "2222",
        "-l",
        "alice",
        "login1",
    ]
    line = clusterssh.remote_line(c, ["status", "r 1"])
    assert shlex.split(line)[:2] == ["sh", "-c"]
    assert shlex.split(line)[2] == (
        "cd /shared/alice/runs 2>/dev/null || cd /; LAUNCH_RUNS_ROOT=/shared/alice/runs; export "
        "LAUNCH_RUNS_ROOT; exec 3<&0; env 'PYTHONPATH=/opt/my src' /opt/bin/launch status 'r 1' "
        "3<&- & p=$!; { while read -r _; do :; done; kill -TERM $p; } <&3 >/dev/null 2>&1 & "
        "w=$!; exec 3<&-; wait $p; r=$?; kill $w 2>/dev/null; exit $r"
    )
    assert shlex.split(clusterssh.remote_line(c, ["list", "--json"], cwd="/u/x", watch=False))[
        2
    ] == (
        "cd /u/x || exit 2; LAUNCH_RUNS_ROOT=/shared/alice/runs; export LAUNCH_RUNS_ROOT; "
        "exec env 'PYTHONPATH=/opt/my src' /opt/bin/launch list --json"
    )
    # the submit's options on the login node: run dirs under the runs root, the profile's copy, the
    # program as is
    assert viacluster.without_cluster(
        ["--nodes", "2", "--cluster", "dev", "--", "t.py", "--cluster", "x"]
    ) == ["--nodes", "2", "--", "t.py", "--cluster", "x"]
    assert viacluster.submit_words(
        c,
        [
            "--run-dir=runs/exp1",
            "--after",
            "runs/prep:afterany",
            "--profile",
            "p.yaml",
            "--wait",
            "--after",
            "42",
            "t.py",
            "--run-dir",
            "keep",
        ],
        "p.yaml",
    ) == [
        "--profile",
        ".launch-profile.yaml",
        "--cluster",
        "",
        "--run-dir",
        "/shared/alice/runs/exp1",
        "--after",
        "/shared/alice/runs/prep:afterany",
        "--wait",
        "--after",
        "42",
        "t.py",
        "--run-dir",
        "keep",
    ]


def test_ssh_config_proxyjump_hops_each_verified(tmp_path):
    """Without `jump:`, the login's ssh-config ProxyJump hops, first hop first, each an ssh of its
    own with the cluster's host-key options (never ssh's ProxyJump, which would not verify them); a
    first hop with its own ProxyJump refused in one line."""
    path = cluster_file(
        tmp_path,
        "cfg:\n  login: viacfg\n  known_hosts: kh\n  ssh_config: cfg\n  runs_root: /r\n"
        "hop:\n  login: l1\n  jump: hopA\n  known_hosts: kh\n  ssh_config: cfg\n  runs_root: /r\n",
    )
    (tmp_path / "cfg").write_text(
        "Host viacfg\n  HostName 10.2.2.2\n  ProxyJump hopC,carol@hopB:2201\n"
        "Host hopA\n  ProxyJump elsewhere\n"
    )
    c = clusters.get("cfg", path)
    assert [e.word for e in clusterssh.hops(c)] == ["hopC", "carol@hopB:2201"]
    argv = clusterssh.ssh_argv(c, "true")
    pc = argv[argv.index("-T") - 1]
    assert pc.startswith("ProxyCommand=ssh ") and pc.endswith(
        "-T -W '[%h]:%p' -p 2201 -l carol hopB"
    )
    assert (
        pc.count("StrictHostKeyChecking=yes") == 2
        and pc.count(f"UserKnownHostsFile={tmp_path}/kh") == 2
    )
    inner = [
        w for w in shlex.split(pc.removeprefix("ProxyCommand=")) if w.startswith("ProxyCommand=")
    ]
    # hopC: the first hop
    assert inner[0].endswith("-T -W '[%%h]:%%p' hopC") and argv[-2:] == ["viacfg", "true"]
    with pytest.raises(
        LaunchError,
        match=(
            r"^cluster hop: jump host hopA has its own ProxyJump in the ssh config; "
            r"accepted: every hop listed in the cluster's jump: \(first hop first\)$"
        ),
    ):
        clusterssh.ssh_argv(clusters.get("hop", path), "true")


SSH_SAID = [  # ssh 9.2's own lines
    (
        "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict "
        "checking.\nHost key verification failed.",
        "login node 127.0.0.1: host key unknown (not in {kh});",
    ),
    (
        "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nHost key for "
        "[127.0.0.1]:2200 has changed and you have requested strict checking.\nHost key "
        "verification failed.",
        "jump host 127.0.0.1:2200 (hop 1): host key CHANGED (not the one in {kh});",
    ),
    (
        "ssh: connect to host 127.0.0.1 port 2200: Connection refused\nConnection closed by "
        "UNKNOWN port 65535",
        "jump host 127.0.0.1:2200 (hop 1): unreachable (Connection refused);",
    ),
    (
        "ssh: Could not resolve hostname nowhere.invalid: Name or service not known",
        "host nowhere.invalid: name does not resolve (Name or service not known);",
    ),
    (
        "ssh: Could not resolve hostname jump.invalid: Name or service not known",
        "jump host jump.invalid:2200 (hop 1): name does not resolve (Name or service not known);",
    ),
    (
        "kex_exchange_identification: read: Connection reset by peer",
        "kex_exchange_identification: read: Connection reset by peer; nothing was run",
    ),
]


@pytest.mark.parametrize("said,says", SSH_SAID)
def test_ssh_failures_one_line_naming_the_hop(tmp_path, said, says):
    jump = "jump.invalid" if "jump.invalid" in said else "127.0.0.1"
    path = cluster_file(
        tmp_path,
        f"c:\n  login: 127.0.0.1\n  port: 2222\n  jump: {jump}:2200\n  known_hosts: kh\n"
        "  ssh_config: cfg\n  runs_root: /r\n",
    )
    e = clusterssh.explain(clusters.get("c", path), said)
    assert isinstance(e, LaunchError) and "\n" not in str(e)
    assert str(e).startswith(
        f"cluster c (login 127.0.0.1:2222 via {jump}:2200): " + says.format(kh=tmp_path / "kh")
    )


def test_launch_key_checked(tmp_path):
    path = cluster_file(tmp_path, 'c:\n  login: l\n  runs_root: /r\n  launch: "\'unclosed"\n')
    with pytest.raises(
        LaunchError, match=r"cluster 'c': launch .* is not accepted \(No closing quotation\)"
    ):
        clusters.load(path)
    assert (
        clusters.get("c", cluster_file(tmp_path, "c:\n  login: l\n  runs_root: /r\n")).launch
        == "launch"
    )


def test_dry_run_prints_ssh_and_the_login_nodes_line_runs_nothing(tmp_path):
    path = cluster_file(
        tmp_path,
        "dev:\n  login: 127.0.0.1\n  port: 9\n  known_hosts: kh\n  runs_root: /nonexistent/r\n",
    )
    (tmp_path / "t.py").write_text("print(1)\n")
    env = {"PATH": str(BIN), "LAUNCH_CLUSTERS_FILE": path}
    assert shutil.which("sbatch", path=env["PATH"]) is None  # a client with no Slurm binary
    p = run_launch(
        "slurm",
        "--cluster",
        "dev",
        "--nodes",
        "2",
        "--dry-run",
        "--",
        "t.py",
        cwd=tmp_path,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[1].startswith("# ssh: ssh -o BatchMode=yes") and lines[1].endswith(
        " -T -p 9 127.0.0.1 " + shlex.quote(lines[2].removeprefix("# on the login node: "))
    )
    assert "launch slurm --nodes 2 -- t.py" in lines[2] and "--dry-run" not in lines[2]
    assert not (tmp_path / "runs").exists()
    # the profile names the cluster: it goes along
    (tmp_path / "p.yaml").write_text("slurm:\n  cluster: dev\n")
    p = run_launch("slurm", "--profile", "p.yaml", "--dry-run", "t.py", cwd=tmp_path, env=env)
    assert p.returncode == 0 and ", and the profile) -> /nonexistent/r/.uploads/" in p.stdout, (
        p.stderr
    )
    there = shlex.split(p.stdout.splitlines()[2].removeprefix("# on the login node: "))[2]
    assert "launch slurm --profile .launch-profile.yaml --cluster '' t.py 3<&-" in there
    p = run_launch(
        "status", "--cluster", "prod", "r", cwd=tmp_path, env={"LAUNCH_CLUSTERS_FILE": path}
    )
    assert p.returncode == 2 and "--cluster 'prod' is not in clusters file" in p.stderr


# ------------------------------------------------------------------------------------ two real sshd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def sshd(d: Path, name: str, port: int) -> subprocess.Popen:
    key = keygen(d / f"host_{name}")
    (d / f"sshd_{name}").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_{name}\nAuthorizedKeysFile "
        f"{d}/authorized_keys\nStrictModes no\nPasswordAuthentication "
        "no\nKbdInteractiveAuthentication no\nUsePAM no\nPidFile none\nPermitRootLogin "
        "prohibit-password\nAllowTcpForwarding yes\n"
    )
    p = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(d / f"sshd_{name}")], stderr=subprocess.DEVNULL
    )
    p.host_key = key
    return p


@pytest.fixture
def two_sshd(tmp_path):
    """A bastion and a login node (sshd as this user, keys in tmp_path); clusters `x` (through the
    bastion) and `gone` (a closed port); the login node's `launch` is this tree's."""
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation dir (Debian)
    pb, pl, closed = free_port(), free_port(), free_port()
    (tmp_path / "authorized_keys").write_text(keygen(tmp_path / "id") + "\n")
    daemons = [sshd(tmp_path, "bastion", pb), sshd(tmp_path, "login", pl)]
    try:
        (tmp_path / "kh").write_text(
            f"[127.0.0.1]:{pb} {daemons[0].host_key}\n[127.0.0.1]:{pl} {daemons[1].host_key}\n"
        )
        (tmp_path / "cfg").write_text("")
        launch = f"env PYTHONPATH={ROOT} LAUNCH_STATE_DIR={tmp_path}/state {LAUNCH}"
        common = (
            f"  user: {os.environ.get('USER') or 'root'}\n  identity: id\n  known_hosts: "
            "kh\n  ssh_config: cfg\n"
        )
        (tmp_path / "clusters.yaml").write_text(
            f"x:\n  login: 127.0.0.1\n  port: {pl}\n  jump: 127.0.0.1:{pb}\n{common}  runs_root: "
            f"{tmp_path}/runs\n  launch: {launch}\ngone:\n  login: 127.0.0.1\n  port: "
            f"{closed}\n{common}  runs_root: /r\n"
        )
        for port in (pb, pl):
            for _ in range(200):
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.05)
        yield tmp_path
    finally:
        for p in daemons:
            p.terminate()
            p.wait(10)


def remote_launches(cwd: Path) -> list[int]:
    """The login node's `launch` processes running in cwd."""
    return [int(pid) for pid in filter(str.isdigit, os.listdir("/proc")) if launch_in(pid, cwd)]


def launch_in(pid: str, cwd: Path) -> bool:
    try:
        return (
            os.readlink(f"/proc/{pid}/cwd") == str(cwd)
            and b"launch" in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
    except OSError:  # gone meanwhile
        return False


def ended(p: subprocess.Popen, timeout: float) -> int | None:
    """p's exit status within timeout; else its Python stack (py-spy) and its children in the
    failure (it is killed)."""
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        spy = os.path.join(os.path.dirname(LAUNCH), "py-spy")
        stack = subprocess.run(
            [spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=60
        )
        kids = subprocess.run(
            ["ps", "--ppid", str(p.pid), "-o", "pid,stat,args"], capture_output=True, text=True
        )
        p.kill()
        pytest.fail(
            f"not ended {timeout:g} s after Ctrl-C:\n{stack.stdout}{stack.stderr}\n{kids.stdout}"
        )


@pytest.mark.slow
def test_verbs_through_a_bastion_on_a_real_login_node(two_sshd):
    d = two_sshd
    env = {"LAUNCH_CLUSTERS_FILE": str(d / "clusters.yaml"), "LAUNCH_RUNS_ROOT": str(d / "here")}
    rd = RunDir.create(RunSpec("local", 1, 1, ("t.py",), (), str(d / "runs" / "r"), "r"), "r-1", {})
    rd.update_status(state="RUNNING", attempt=0)
    p = run_launch("status", "--cluster", "x", "r", "--json", env=env, timeout=60)
    assert p.returncode == 0 and f'"run_dir": "{d}/runs/r"' in p.stdout, p.stderr
    p = run_launch("list", "--cluster", "all", env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    rows = [ln.split() for ln in p.stdout.splitlines()]
    assert (
        rows[0][:2] == ["CLUSTER", "NAME"] and ["x", "r", "local", "1x1", "RUNNING"] == rows[2][:5]
    )
    assert " ".join(rows[1]).startswith(
        "gone unreachable (login node 127.0.0.1: unreachable (Connection refused))"
    )
    # a submit: the tree into <runs root>/.uploads/<hash>, then the login node's launch slurm there
    # (refusing --nodes two before any Slurm command: the dev Slurm cluster is not this test's); its
    # exit code and line
    (d / "work").mkdir()
    (d / "work" / "t.py").write_text("print(1)\n")
    p = run_launch(
        "slurm",
        "--cluster",
        "x",
        "--nodes",
        "two",
        "--",
        "t.py",
        cwd=d / "work",
        env=env,
        timeout=60,
    )
    assert p.returncode == 2 and "launch: error: --nodes 'two' is not accepted" in p.stderr, (
        p.stderr
    )
    ups = list((d / "runs" / ".uploads").iterdir())
    assert (
        len(ups) == 1 and (ups[0] / "t.py").read_text() == "print(1)\n" and len(ups[0].name) == 64
    )
    # logs -f streams until Ctrl-C here; then the login node's launch ends too (the connection's
    # end)
    client = subprocess.Popen(
        [LAUNCH, "logs", "--cluster", "x", "-f", "r"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    end = time.monotonic() + 30
    while not remote_launches(d / "runs") and time.monotonic() < end:
        time.sleep(0.1)
    assert remote_launches(d / "runs"), "the login node's launch logs -f never started"
    client.send_signal(signal.SIGINT)
    assert ended(client, 30) == 130
    end = time.monotonic() + 15
    while remote_launches(d / "runs") and time.monotonic() < end:
        time.sleep(0.1)
    assert remote_launches(d / "runs") == []
    # a changed host key of the login node: refused, one line naming it, nothing run
    (d / "kh").write_text(
        (d / "kh").read_text().splitlines()[0] + f"\n[127.0.0.1]:{two_sshd_port(d)} "
        f"{keygen(d / 'other')}\n"
    )
    p = run_launch("cancel", "--cluster", "x", "r", env=env, timeout=60)
    assert p.returncode == 2 and "login node 127.0.0.1: host key CHANGED" in p.stderr, p.stderr
    assert rd.read_status()["state"] == "RUNNING"


def two_sshd_port(d: Path) -> int:
    return clusters.get("x", str(d / "clusters.yaml")).port
