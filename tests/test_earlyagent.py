"""`launch local`'s agents started early (launchers.backends.earlyagent, nodeside.agentgate): the
agent that runs is the gate's process (its /proc environment then the node's: the sweeps find it);
a gate started early that cannot take the node's environment (it differs in what the interpreter or
torch read as they start) is replaced by one started at the plan; a refused launch leaves no gate
behind. Rank 0's wrapper writes the node's part of the manifest after the start, not during it. A
Slurm node's task starts its gate as it starts, and the gate is its agent; a node other than 0 hands
its gate the go once node 0's store listens (earlyagent.await_master)."""

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, require_cluster, run_launch
from launchers.backends.earlyagent import await_master
from launchers.nodeside import agentgate

AGENT_OF = """\
import json, os, sys
agent = os.getppid()
with open(f"/proc/{agent}/stat") as f:  # the rank wrapper's parent: the node's agent
    agent = int(f.read().rsplit(")", 1)[1].split()[1])
env = dict(e.split("=", 1) for e in open(f"/proc/{agent}/environ").read().split("\\0") if "=" in e)
print("AGENT " + json.dumps({
    "cmdline": open(f"/proc/{agent}/cmdline").read().split("\\0"),
    "tag": env.get("LAUNCH_RUN_ID"), "node": env.get("NODE_RANK"),
    "room": "LAUNCH_WARM_ROOM" in env,
    "mine": os.environ["LAUNCH_RUN_ID"], "omp": os.environ.get("OMP_NUM_THREADS"),
    "rank": os.environ["RANK"],
    "node_part": json.load(open(os.environ["LAUNCH_RUN_DIR"] + "/manifest.json")).get("node"),
}))
"""


def agents(run_dir: str) -> list[dict]:
    out = []
    for log in sorted(Path(run_dir, "logs").glob("node*/rank*.log")):
        out += [
            json.loads(ln[6:]) for ln in log.read_text().splitlines() if ln.startswith("AGENT ")
        ]
    return out


def test_the_early_agent_becomes_the_node_agent_or_execs_it_cold(workdir):
    Path("agent_of.py").write_text(AGENT_OF)
    p = run_launch(
        "local", "--nodes", "2", "--gpus-per-node", "1", "--run-dir", "runs/w", "--", "agent_of.py"
    )
    assert p.returncode == 0, p.stderr
    seen = agents("runs/w")
    assert len(seen) == 2
    for a in seen:  # the gate itself, with the node's environment as /proc shows it
        assert a["cmdline"][1:4] == ["-m", "launchers.nodeside.agentgate", "torch.distributed.run"]
        assert a["tag"] == a["mine"] and not a["room"]
    assert sorted(a["node"] for a in seen) == ["0", "1"]
    # rank 0's wrapper adds the node's part of the manifest later (rankexec.MANIFEST_AFTER_S), not
    # while the ranks start; or as its program ends
    assert [a["node_part"] for a in seen if a["rank"] == "0"] == [None]
    assert json.loads(Path("runs/w/manifest.json").read_text())["node"]["attempt"] == 0
    # a variable read as torch starts, set by the job: the early gate cannot take it; a gate
    # started at the plan, in the node's environment, does
    p = run_launch(
        "local", "--gpus-per-node", "1", "--env", "OMP_NUM_THREADS=2", "--run-dir", "runs/c",
        "--", "agent_of.py",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    (a,) = agents("runs/c")
    assert a["cmdline"][2] == "launchers.nodeside.agentgate" and a["omp"] == "2"
    assert a["tag"] == a["mine"]
    # --python as a command on PATH: the gate's python names itself by its path, so it execs the
    # node's command (found on PATH, as a cold start does)
    py = os.path.basename(sys.executable)
    path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"
    p = run_launch(
        "local", "--gpus-per-node", "1", "--python", py, "--run-dir", "runs/p", "--", "agent_of.py",
        env={"PATH": path},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    (a,) = agents("runs/p")
    assert a["cmdline"][:3] == [py, "-m", "torch.distributed.run"] and a["tag"] == a["mine"]
    # none at all: the node's command, started cold
    p = run_launch(
        "local", "--gpus-per-node", "1", "--run-dir", "runs/n", "--", "agent_of.py",
        env={"LAUNCH_EARLY_AGENTS": "0"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    (a,) = agents("runs/n")
    assert a["cmdline"][1:3] == ["-m", "torch.distributed.run"] and a["tag"] == a["mine"]


def test_a_refused_launch_leaves_no_early_agent(workdir):
    mark = uuid.uuid4().hex
    p = run_launch("local", "--nodes", "3", "--", "missing.py", env={"TEST_EARLY_MARK": mark})
    assert p.returncode == 2 and "missing.py" in p.stderr
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"TEST_EARLY_MARK={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                left.append(pid)
        except OSError:
            pass
    assert left == []


def test_what_the_gate_takes_warm():
    py = sys.executable
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    node = {**base, "MASTER_PORT": "29500", "LAUNCH_RUN_ID": "r-1", "NCCL_DEBUG": "INFO"}
    cmd = [py, "-m", "torch.distributed.run", "--nnodes", "1"]
    assert agentgate.warm(base, cmd, node)
    assert not agentgate.warm(base, cmd, {**node, "LD_PRELOAD": "/x.so"})  # read as it starts
    assert not agentgate.warm(base, cmd, {**node, "OMP_NUM_THREADS": "4"})
    assert not agentgate.warm({**base, "PYTHONPATH": "/a"}, cmd, node)  # one it lost
    assert not agentgate.warm(base, ["/other/python", *cmd[1:]], node)
    assert not agentgate.warm(base, [py, "-m", "other.module"], node)


@pytest.mark.slurm
def test_a_slurm_nodes_agent_is_the_gate_its_task_started(workdir):
    up = subprocess.run([str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True)
    require_cluster("the dev Slurm cluster", up.returncode == 0, "make slurm-up")
    Path("agent_of.py").write_text(AGENT_OF)
    p = run_launch(
        "slurm", "--nodes", "2", "--gpus-per-node", "1", "--time", "5", "--run-dir", "runs/s",
        "--wait", "--", "agent_of.py",
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    seen = agents("runs/s")
    assert sorted(a["node"] for a in seen) == ["0", "1"]
    for a in seen:
        assert a["cmdline"][1:4] == ["-m", "launchers.nodeside.agentgate", "torch.distributed.run"]
        assert a["tag"] == a["mine"] and not a["room"]


def test_a_nodes_go_waits_for_the_masters_store_to_listen(monkeypatch):
    srv = socket.create_server(("127.0.0.1", 0))
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(srv.getsockname()[1])}
    t0 = time.monotonic()
    await_master(env, lambda: False)
    assert time.monotonic() - t0 < 5  # listening: at once
    srv.close()
    monkeypatch.setattr("launchers.backends.earlyagent.LISTEN_WAIT_S", 0.3)
    t0 = time.monotonic()
    await_master(env, lambda: False)
    assert time.monotonic() - t0 >= 0.3  # nothing listens: until the deadline, then the go
    monkeypatch.setattr("launchers.backends.earlyagent.LISTEN_WAIT_S", 30)
    t0 = time.monotonic()
    await_master(env, lambda: True)
    assert time.monotonic() - t0 < 5  # a stop: at once
