"""`launch ssh` on the real sshd test hosts (clusters/ssh-hosts.sh, `make ssh-up`): sshhost1..4,
each its own network/UTS/mount/pid namespace; /work and /tmp are shared like NFS,
/var/tmp/launch-node-local is private. The root namespace sees every host's processes, so
procs.tagged_pids(run id) == [] proves nothing is left."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCH, ROOT, rank_lines, read_json, require_cluster, run_launch
from launchers import procs

pytestmark = pytest.mark.ssh

SCRIPT = ROOT / "clusters" / "ssh-hosts.sh"
STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH_CONFIG, KNOWN_HOSTS, HOSTFILE = STATE / "ssh_config", STATE / "known_hosts", STATE / "hostfile"
OPTS = ["--ssh-config", str(SSH_CONFIG), "--known-hosts", str(KNOWN_HOSTS)]
NODE_LOCAL = Path("/var/tmp/launch-node-local")
HOSTS4 = "sshhost1,sshhost2,sshhost3,sshhost4"  # no slots=: one process per host
IPS = {f"sshhost{k}": f"10.216.0.{10 + k}" for k in range(1, 5)}


@pytest.fixture(scope="module", autouse=True)
def hosts_up():
    st = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True, timeout=60)
    said = " / ".join((st.stdout.strip() or st.stderr.strip()).splitlines())
    require_cluster(
        f"the SSH test hosts sshhost1..4 (clusters/ssh-hosts.sh status: {said})",
        st.returncode == 0 and KNOWN_HOSTS.exists(),
        "make ssh-up",
    )


def reports(run_dir):
    return [json.loads(ln[len("REPORT ") :]) for ln in rank_lines(run_dir, "REPORT ")]


def run_id_of(run_dir):
    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]


def one_line_error(p, *words):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: error: "), p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def wait_lines(run_dir, marker, n, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while len(rank_lines(run_dir, marker)) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(
                f"gave up waiting for {n} {marker!r} lines (rc "
                f"{proc.returncode})\n{out[-3000:]}\n{err[-3000:]}"
            )
        time.sleep(0.3)


def test_4_hosts_world_node_ranks_allreduce_verbatim_args(workdir):
    weird = ["a b", "quote'\"", "$(touch pwned)", "line1\nline2", "ünïcødé ✓", "", "--flag=x y"]
    # a newline is refused (issue 21 item 7)
    env_val = "sp ace 'q' \"dq\" $(touch pwned2) `x` \t tab"
    p = run_launch(
        "ssh",
        "--hostfile",
        str(HOSTFILE),
        *OPTS,
        "--run-dir",
        "runs/r",
        "--env",
        f"TEST_WEIRD={env_val}",
        "--env",
        "TEST_SECRET_TOKEN=hunter2",
        "--",
        "report.py",
        *weird,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    reps = sorted(reports("runs/r"), key=lambda r: r["rank"])
    assert [r["rank"] for r in reps] == list(range(8))  # 4 hosts x slots=2
    assert {r["world"] for r in reps} == {8} and {r["sum"] for r in reps} == {36.0}
    for r in reps:
        k = r["rank"] // 2
        assert r["node_rank"] == str(k) and r["host"] == f"sshhost{k + 1}"
        assert r["argv"] == weird and r["env"]["TEST_WEIRD"] == env_val
        assert r["env"]["MASTER_ADDR"] == IPS["sshhost1"]  # the master's address, not localhost
        assert (
            (workdir / f"runs/r/logs/node{k}/rank{r['rank']}.log")
            .read_text()
            .startswith(f"===== launch attempt 0 | rank {r['rank']} of 8 | node {k}")
        )
    assert not (workdir / "pwned").exists() and not (workdir / "pwned2").exists()
    st = read_json("runs/r/status.json")
    assert st["state"] == "COMPLETED" and st["nodes"] == {"0": 0, "1": 0, "2": 0, "3": 0}
    assert "hunter2" not in (workdir / "runs/r/run.yaml").read_text()
    assert "[sshhost4] [n3 r7] REPORT" in p.stdout  # each host's output streamed, prefixed
    assert procs.tagged_pids(run_id_of("runs/r")) == []


DRY_GOLDEN = """# torch extensions: {CWD}/runs/.torch_extensions/KEY (shared by every node and run; made at submit)
# run dir: {CWD}/runs/dry
# run id:  RUNID  attempt 0
# world:   2 nodes x 3 processes = 6; auto: decided on each node (nccl where the node has GPUs, else gloo)
# master:  10.9.9.1:23456 (probed at launch)
# cpu-bind auto: decided on each node from its topology (launchers.cpubind)

# node 0 on root@gpu1 (10.9.9.1:22):
cd {CWD} 2>/dev/null; exec env OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR={CWD}/runs/.torch_extensions/KEY LAUNCH_TORCH_EXTENSIONS_DIR={CWD}/runs/.torch_extensions/KEY 'TEST_X=a b' 'TEST_SECRET_KEY=***' MASTER_ADDR=10.9.9.1 MASTER_PORT=23456 NODE_RANK=0 NNODES=2 LAUNCH_NODE_SLOT=0 LAUNCH_RUN_DIR={CWD}/runs/dry LAUNCH_RUN_ID=RUNID LAUNCH_CHECKPOINT_DIR={CWD}/runs/dry/checkpoints LAUNCH_ATTEMPT=0 LAUNCH_DIST_BACKEND=auto PYTHONUNBUFFERED=1 LAUNCH_STOP_GRACE=30 PET_SHUTDOWN_TIMEOUT=40 LAUNCH_STOP_SIGNAL=SIGTERM LAUNCH_CPU_BIND=auto {PY} -m launchers.remote run --node 0 --pid-file /tmp/.launch-RUNID-node0.pid --env-file /tmp/.launch-RUNID-a0-node0.env -- {PY} -m torch.distributed.run --nnodes 2 --nproc-per-node 3 --node-rank 0 --master-addr 10.9.9.1 --master-port 23456 --max-restarts 0 --monitor-interval 0.1 --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2 -m launchers.rankexec -- {CWD}/report.py '$(x)'

# node 1 on bob@gpu2:2200:
cd {CWD} 2>/dev/null; exec env OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR={CWD}/runs/.torch_extensions/KEY LAUNCH_TORCH_EXTENSIONS_DIR={CWD}/runs/.torch_extensions/KEY 'TEST_X=a b' 'TEST_SECRET_KEY=***' MASTER_ADDR=10.9.9.1 MASTER_PORT=23456 NODE_RANK=1 NNODES=2 LAUNCH_NODE_SLOT=1 LAUNCH_RUN_DIR={CWD}/runs/dry LAUNCH_RUN_ID=RUNID LAUNCH_CHECKPOINT_DIR={CWD}/runs/dry/checkpoints LAUNCH_ATTEMPT=0 LAUNCH_DIST_BACKEND=auto PYTHONUNBUFFERED=1 LAUNCH_STOP_GRACE=30 PET_SHUTDOWN_TIMEOUT=40 LAUNCH_STOP_SIGNAL=SIGTERM LAUNCH_CPU_BIND=auto {PY} -m launchers.remote run --node 1 --pid-file /tmp/.launch-RUNID-node1.pid --env-file /tmp/.launch-RUNID-a0-node1.env -- {PY} -m torch.distributed.run --nnodes 2 --nproc-per-node 3 --node-rank 1 --master-addr 10.9.9.1 --master-port 23456 --max-restarts 0 --monitor-interval 0.1 --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2 -m launchers.rankexec -- {CWD}/report.py '$(x)'
"""  # noqa: E501


def test_dry_run_golden_connects_nowhere(workdir):
    cfg = workdir / "cfg"
    # 10.9.9.1 does not exist: no connect
    cfg.write_text("Host gpu1\n  HostName 10.9.9.1\n  User root\n")
    (workdir / "hf").write_text("gpu1 slots=3\nbob@gpu2:2200 slots=3\n")
    t0 = time.monotonic()
    p = run_launch(
        "ssh",
        "--hostfile",
        "hf",
        "--ssh-config",
        str(cfg),
        "--run-dir",
        "runs/dry",
        "--master-port",
        "23456",
        "--env",
        "TEST_X=a b",
        "--env",
        "TEST_SECRET_KEY=s3cret",
        "--python",
        "/opt/py/bin/python3",
        "--dry-run",
        "--",
        "report.py",
        "$(x)",
    )
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 30
    out = re.sub(r"dry-[0-9a-f]{8}", "RUNID", p.stdout)
    # the environment's key (launchers.frozen.extcache)
    out = re.sub(r"(\.torch_extensions/)[0-9a-f]{16}", r"\1KEY", out)
    assert out == DRY_GOLDEN.format(CWD=workdir, PY="/opt/py/bin/python3")
    assert not (workdir / "runs").exists()


def test_host_key_unknown_and_changed_are_refused(workdir):
    lines = KNOWN_HOSTS.read_text().splitlines()
    unknown = workdir / "kh_unknown"
    unknown.write_text("\n".join(ln for ln in lines if not ln.startswith("sshhost3,")) + "\n")
    p = run_launch(
        "ssh",
        "--hostfile",
        str(HOSTFILE),
        "--ssh-config",
        str(SSH_CONFIG),
        "--known-hosts",
        str(unknown),
        "--run-dir",
        "runs/k1",
        "--",
        "report.py",
        timeout=120,
    )
    one_line_error(p, "sshhost3", "host key unknown", "refusing")
    changed = workdir / "kh_changed"
    key1 = lines[0].split(" ", 1)[1]
    changed.write_text(
        "\n".join(
            ln.split(" ", 1)[0] + " " + key1 if ln.startswith("sshhost2,") else ln for ln in lines
        )
        + "\n"
    )
    p = run_launch(
        "ssh",
        "--hostfile",
        str(HOSTFILE),
        "--ssh-config",
        str(SSH_CONFIG),
        "--known-hosts",
        str(changed),
        "--run-dir",
        "runs/k2",
        "--",
        "report.py",
        timeout=120,
    )
    one_line_error(p, "sshhost2", "host key CHANGED")
    # never written
    assert changed.read_text().count(key1) == 2 and unknown.read_text().count("sshhost3") == 0
    assert not (workdir / "runs").exists()


def test_unreachable_host_fails_within_connect_timeout(workdir):
    t0 = time.monotonic()
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,root@10.216.0.99",
        *OPTS,
        "--connect-timeout",
        "2",
        "--run-dir",
        "runs/u",
        "--",
        "report.py",
        timeout=120,
    )
    took = time.monotonic() - t0
    one_line_error(p, "10.216.0.99", "unreachable")
    assert took < 20, took  # 2 s connect timeout + start-up on a loaded 2-core box
    assert not (workdir / "runs").exists()


def test_bad_hostfiles_one_line_errors(workdir):
    for text, words in (
        ("# nothing\n", "lists no hosts"),
        ("sshhost1\nsshhost1\n", "listed twice"),
        ("sshhost1 slots=two\n", "malformed 'slots=two'"),
    ):
        (workdir / "hf").write_text(text)
        one_line_error(
            run_launch("ssh", "--hostfile", "hf", *OPTS, "--run-dir", "runs/b", "--", "report.py"),
            *words,
        )
    one_line_error(
        run_launch(
            "ssh", "--hosts", "sshhost1", *OPTS, "--connect-timeout", "0", "--", "report.py"
        ),
        "--connect-timeout",
    )
    assert not (workdir / "runs").exists()


def test_remote_python_torch_program_auth_checked_before_anything_starts(workdir):
    base = ["ssh", "--hosts", "sshhost1,sshhost2", *OPTS, "--run-dir", "runs/p"]
    one_line_error(
        run_launch(*base, "--python", "/nonexistent/python3", "--", "report.py"),
        "sshhost1",
        "python '/nonexistent/python3' not found",
    )
    one_line_error(
        run_launch(*base, "--python", "/usr/bin/python3", "--", "report.py"),
        "sshhost2",
        "cannot import torch",
    )
    # exists in the root namespace, not on the hosts
    prog = NODE_LOCAL / f"only-here-{os.getpid()}.py"
    prog.write_text("print('hi')\n")
    try:
        one_line_error(
            run_launch(*base, "--", str(prog)),
            "sshhost1",
            f"program file {prog} does not exist there",
        )
    finally:
        prog.unlink()
    key = workdir / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (workdir / "empty_cfg").write_text("")
    one_line_error(
        run_launch(
            "ssh",
            "--hosts",
            "root@10.216.0.12",
            "--ssh-config",
            "empty_cfg",
            "--known-hosts",
            str(KNOWN_HOSTS),
            "--identity",
            str(key),
            "--run-dir",
            "runs/p",
            "--",
            "report.py",
        ),
        "10.216.0.12",
        "authentication failed",
    )
    assert not (workdir / "runs").exists()


def test_preflight_gpu_names_the_one_bad_host_and_starts_nothing(workdir):
    """--preflight gpu over SSH: every host runs the GPU check (the doctor's probe, the code local
    and Slurm nodes run) over its connection before anything starts. The stand-in tools
    (tests/gpu_standins.py: real outputs, picked by hostname; on PATH through a --python wrapper)
    show a Down InfiniBand port on sshhost2 only: one line naming node 1, its host, the port and the
    fact; no run dir. With --node-ledger the host is quarantined there at once (issue 37: a strike
    of kind gpu, the line its evidence)."""
    from gpu_standins import per_host_tools, python_with_tools

    bin_dir = per_host_tools(
        workdir / "gpubin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {"sshhost2": "ibstat/network-operator-issue-249-ib-down.txt"},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    py = python_with_tools(workdir / "py-gpu", bin_dir)
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,sshhost2,sshhost3",
        *OPTS,
        "--python",
        py,
        "--preflight",
        "gpu",
        "--node-ledger",
        "site.json",
        "--run-dir",
        "runs/g",
        "--",
        "report.py",
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert (
        f"launch: node ledger {workdir / 'site.json'}: 1 strike(s) recorded on sshhost2\n"
        in p.stderr
    )
    err = [
        ln
        for ln in p.stderr.splitlines()
        if not ln.startswith(("launch: preflight gpu: warning: ", "launch: node ledger "))
    ]
    assert err[0] == "launch: error: --preflight gpu: 1 bad node(s) of 3, nothing started", p.stderr
    (bad,) = err[1:]
    assert bad.startswith("node 1 [sshhost2 (") and bad.endswith(
        "]: mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand)"
    ), bad
    assert not (workdir / "runs").exists() and not rank_lines(workdir / "runs/g", "REPORT ")
    from launchers.ledgers.siteledger import load, quarantined

    led = load(str(workdir / "site.json"))[0]
    assert [
        (h, [(s["kind"], s["reason"]) for s in e["strikes"]]) for h, e in led["hosts"].items()
    ] == [("sshhost2", [("gpu", f"--preflight gpu: {bad}")])] and quarantined(led) == [
        "sshhost2"
    ], led


def test_preflight_gpu_with_a_spare_swaps_the_bad_host_of_node_0(workdir):
    """--preflight gpu --nodes 2 --spares 1 over SSH: every host of the pool (sshhost1..3) is
    checked before anything starts; the stand-in ibstat (picked by hostname) shows a Down port on
    sshhost1 (slot 0, node 0's host) only: the policy quarantines slot 0 (kind gpu) and the run
    starts on sshhost2 (node 0) and sshhost3, world 2, COMPLETED; nothing ran on sshhost1; the
    ledger says no person was involved; the site's node ledger has sshhost1 quarantined (issue
    37)."""
    from gpu_standins import check_slot0_swapped, per_host_tools, python_with_tools

    bin_dir = per_host_tools(
        workdir / "gpubin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {"sshhost1": "ibstat/network-operator-issue-249-ib-down.txt"},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    py = python_with_tools(workdir / "py-gpu", bin_dir)
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,sshhost2,sshhost3",
        "--nodes",
        "2",
        "--spares",
        "1",
        *OPTS,
        # the stand-in GPUs are not real
        "--python",
        py,
        "--preflight",
        "gpu",
        "--dist-backend",
        "gloo",
        "--node-ledger",
        "site.json",
        "--run-dir",
        "runs/g",
        "--",
        "report.py",
    )
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert read_json("runs/g/status.json")["state"] == "COMPLETED"
    run = yaml.safe_load(Path("runs/g/run.yaml").read_text())
    assert [(a["slots"], a["hosts"]) for a in run["attempts"]] == [
        ([1, 2], ["sshhost2", "sshhost3"])
    ]
    reps = sorted(reports("runs/g"), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"], r["host"]) for r in reps] == [
        (0, 2, "sshhost2"),
        (1, 2, "sshhost3"),
    ]
    check_slot0_swapped("runs/g", "sshhost1 (")
    out = run_launch("status", "runs/g", check=True).stdout
    assert (
        "before attempt 0 (--preflight gpu; person: no): replace -- slot 0: failed the GPU check"
        in out
    ), out
    # issue 37: the quarantine is the site's too
    from launchers.ledgers.siteledger import load, quarantined

    led = load(str(workdir / "site.json"))[0]
    assert [
        (h, [(s["kind"], s["quarantined"]) for s in e["strikes"]]) for h, e in led["hosts"].items()
    ] == [("sshhost1", [("gpu", True)])] and quarantined(led) == ["sshhost1"], led


def test_failing_rank_stops_every_node(workdir):
    p = run_launch(
        "ssh",
        "--hosts",
        HOSTS4,
        *OPTS,
        "--run-dir",
        "runs/f",
        "--env",
        "TEST_FAIL_RANK=2",
        "--env",
        "TEST_SLEEP=120",
        "--",
        "report.py",
        timeout=240,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    st = read_json("runs/f/status.json")
    assert st["state"] == "FAILED"
    ff = st["first_failure"]
    assert (ff["node"], ff["rank"], ff["exit_code"], ff["host"]) == (2, 2, 3, "sshhost3")
    assert procs.tagged_pids(run_id_of("runs/f")) == []


# Ctrl-C and a host dying mid-run (kill-host): rows of the fault suite,
# tests/faults/test_faults_ssh.py.


CKPT_PROG = """import os, torch.distributed as dist
from launchers.ckptptr import write_latest
dist.init_process_group("gloo"); r = dist.get_rank()
d = os.path.join(os.environ["LAUNCH_CHECKPOINT_DIR"], "step-00000001"); os.makedirs(d, exist_ok=True)
open(os.path.join(d, f"shard-{r}"), "w").write(str(r))
print("STAGED", os.environ["LAUNCH_RUN_DIR"], flush=True)
dist.barrier()
if r == 0:
    write_latest(os.environ["LAUNCH_CHECKPOINT_DIR"], "step-00000001")
dist.destroy_process_group()
"""  # noqa: E501


def test_no_shared_storage_collects_logs_and_checkpoints(workdir):
    (workdir / "ckpt.py").write_text(CKPT_PROG)
    stage = NODE_LOCAL / "stage"
    (workdir / "prof.yaml").write_text(f"ssh:\n  staging_dir: {stage}\n")
    p = run_launch(
        "ssh",
        "--hosts",
        HOSTS4,
        *OPTS,
        "--no-shared-storage",
        "--profile",
        "prof.yaml",
        "--run-dir",
        "runs/n",
        "--",
        "ckpt.py",
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    run = workdir / "runs/n"
    run_id = run_id_of(run)
    staged = f"{stage}/{run_id}"
    assert not Path(staged).exists()  # the hosts' staging dirs are private to them
    for k in range(4):
        log = (run / f"logs/node{k}/rank{k}.log").read_text()
        assert f"STAGED {staged}" in log and (run / f"logs/node{k}/agent.log").exists()
        assert (run / f"checkpoints/step-00000001/shard-{k}").read_text() == str(k)
        assert read_json(run / f"status/rank{k}.json")["exit_code"] == 0
    assert (run / "checkpoints/latest").read_text().strip() == "step-00000001"
    st = run_launch("status", "runs/n", check=True).stdout
    assert "COMPLETED" in st and "step-00000001" in st
    assert procs.tagged_pids(run_id) == []
    done = sorted(
        ln.split(": ", 2)[1:] for ln in p.stderr.splitlines() if ln.startswith("launch: collect ")
    )
    assert [c for c, _ in done] == ["collect 1/4", "collect 2/4", "collect 3/4", "collect 4/4"], (
        p.stderr
    )
    assert sorted(w for _, w in done) == [
        f"node {k} (sshhost{k + 1}) files copied" for k in range(4)
    ], p.stderr


def test_launch_cancel_stops_every_host(workdir):
    proc = subprocess.Popen(
        [
            LAUNCH,
            "ssh",
            "--hosts",
            HOSTS4,
            *OPTS,
            "--run-dir",
            "runs/x",
            "--env",
            "TEST_SLEEP=300",
            "--",
            "report.py",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_lines("runs/x", "sleeping", 4, proc)
    run_launch("cancel", "runs/x", check=True, timeout=120)
    proc.communicate(timeout=60)
    assert proc.returncode == 143  # terminated (130 is Ctrl-C)
    assert read_json("runs/x/status.json")["state"] == "CANCELLED"
    assert procs.tagged_pids(run_id_of("runs/x")) == []


def test_cpu_bind_cores_two_ranks_disjoint(workdir):
    """--cpu-bind cores: the rank wrapper on the host binds each of its two local ranks to its own
    core(s)."""
    from launchers.cpubind import parse_cpulist

    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1",
        *OPTS,
        "--gpus-per-node",
        "2",
        "--cpu-bind",
        "cores",
        "--run-dir",
        "runs/cb",
        "--",
        "affinity.py",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    reps = sorted(
        (json.loads(ln[len("AFFINITY ") :]) for ln in rank_lines("runs/cb", "AFFINITY ")),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in reps] == [0, 1] and all(r["cpus"] for r in reps)
    assert not set(reps[0]["cpus"]) & set(reps[1]["cpus"])
    for r in reps:
        rec = read_json(f"runs/cb/status/rank{r['rank']}.json")
        assert rec["cpu_bind"] == "cores" and list(parse_cpulist(rec["cpus"])) == r["cpus"]
