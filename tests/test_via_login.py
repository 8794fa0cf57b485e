"""`launch ... --cluster NAME` from a machine without Slurm, through a bastion and the dev cluster's
login node (issue 25 item 1), on the real dev Slurm cluster.

clusters/slurm-login.sh puts two login nodes (sshd with Slurm's client configuration, no slurmd) on
the cluster's bridge and a bastion in front of them; the client runs in its own network namespace
that reaches only the bastion, with a PATH that holds no Slurm binary. Host keys are verified on
every hop (the clusters file's known_hosts). `dev` and `dev2` are the same Slurm daemons under two
names; dev2's login node is cut off to show a cluster that does not answer.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, DATA, ROOT, require_cluster

pytestmark = pytest.mark.slurm
LOGIN = str(ROOT / "clusters" / "slurm-login.sh")
SLOW = """import sys, time, torch.distributed as dist
dist.init_process_group("gloo")
for i in range(int(sys.argv[1])):
    if dist.get_rank() == 0:
        print("STEP", i, flush=True)
    time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def login(tmp_path_factory):
    up = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", up.returncode == 0, "make slurm-up")
    d = tmp_path_factory.mktemp("login")
    state = Path("/run/launch-slurm-login")  # the script's own (its namespaces are this machine's)
    # the login nodes' launch keeps its runs index and node facts in scratch dirs, like every test's
    # launch
    env = {
        **os.environ,
        "LAUNCH_LOGIN_RUNS": str(d / "cluster-runs"),
        "LAUNCH_LOGIN_LAUNCH": (
            f"env LAUNCH_STATE_DIR={d / 'state'} "
            f"LAUNCH_NODE_FACTS_DIR={d / 'facts'} {BIN / 'launch'}"
        ),
    }
    p = subprocess.run([LOGIN, "up"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    laptop = d / "laptop"
    laptop.mkdir()
    (laptop / "report.py").write_text((DATA / "report.py").read_text())
    (laptop / "slow.py").write_text(SLOW)
    yield {"env": env, "state": state, "laptop": laptop, "runs": d / "cluster-runs"}
    subprocess.run([LOGIN, "down"], capture_output=True, text=True, env=env, timeout=120)


def client(login, *args, timeout=180, check=True):
    """`launch ARGS` as the laptop: the client namespace, no Slurm on PATH, only the clusters
    file."""
    env = [
        "env",
        "-i",
        f"HOME={os.environ.get('HOME', '/root')}",
        f"PATH={BIN}:{login['state']}/client-bin",
        f"LAUNCH_CLUSTERS_FILE={login['state']}/clusters.yaml",
    ]
    p = subprocess.run(
        [LOGIN, "client", *env, "launch", *args],
        cwd=login["laptop"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=login["env"],
    )
    if check:
        assert p.returncode == 0, (
            f"launch {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
        )
    return p


def run_named(login, prefix):
    runs = sorted(login["runs"].glob(prefix + "-*"))
    assert len(runs) == 1, runs
    return runs[0]


def test_the_verbs_through_the_bastion_and_the_login_node(login):
    which = subprocess.run(
        [
            LOGIN,
            "client",
            "env",
            "-i",
            f"PATH={BIN}:{login['state']}/client-bin",
            "sh",
            "-c",
            "command -v sbatch squeue srun || echo none",
        ],
        capture_output=True,
        text=True,
    )
    assert which.stdout.strip() == "none"
    # submit (waiting), then status / logs / list of the run on the cluster's shared storage
    p = client(
        login,
        "slurm",
        "--cluster",
        "dev",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--name",
        "first",
        "--wait",
        "--",
        "report.py",
    )
    assert "run COMPLETED" in p.stderr
    first = run_named(login, "first")
    recs = [
        json.loads(ln.split("REPORT ", 1)[1]) for ln in p.stdout.splitlines() if "REPORT " in ln
    ]
    assert sorted(r["rank"] for r in recs) == [0, 1] and {r["world"] for r in recs} == {2}
    # two Slurm nodes
    assert {r["sum"] for r in recs} == {3.0} and len({r["host"] for r in recs}) == 2
    st = json.loads(client(login, "status", "--cluster", "dev", first.name, "--json").stdout)
    assert st["state"] == "COMPLETED" and st["backend"] == "slurm"
    assert "REPORT " in client(login, "logs", "--cluster", "dev", first.name).stdout
    assert first.name in client(login, "list", "--cluster", "dev").stdout
    # --after a run of the cluster, and a --sweep (a job array): both end COMPLETED (launch wait)
    client(
        login,
        "slurm",
        "--cluster",
        "dev",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--name",
        "after",
        "--after",
        first.name,
        "--",
        "report.py",
    )
    client(
        login,
        "slurm",
        "--cluster",
        "dev",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--name",
        "sw",
        "--sweep",
        "X=1,2",
        "--",
        "report.py",
    )
    client(login, "wait", "--cluster", "dev", run_named(login, "after").name)
    sweep = run_named(login, "sw")
    assert sorted(p.name for p in sweep.iterdir() if (p / "run.yaml").exists()) == [
        "0-X-1",
        "1-X-2",
    ]
    for task in ("0-X-1", "1-X-2"):
        client(login, "wait", "--cluster", "dev", f"{sweep.name}/{task}")
    # logs -f until a step shows, Ctrl-C: the login node's `launch logs` ends with the connection
    client(
        login,
        "slurm",
        "--cluster",
        "dev",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--name",
        "slow",
        "--",
        "slow.py",
        "25",
    )
    slow = run_named(login, "slow")
    follow = subprocess.Popen(
        [
            LOGIN,
            "client",
            "env",
            "-i",
            f"PATH={BIN}:{login['state']}/client-bin",
            f"LAUNCH_CLUSTERS_FILE={login['state']}/clusters.yaml",
            "launch",
            "logs",
            "-f",
            "--cluster",
            "dev",
            slow.name,
        ],
        cwd=login["laptop"],
        stdout=subprocess.PIPE,
        text=True,
        env=login["env"],
        start_new_session=True,
    )
    for line in follow.stdout:
        if "STEP" in line:
            break
    os.killpg(follow.pid, signal.SIGINT)
    assert follow.wait(timeout=30) != 0
    # cancel it while it runs, then resume it and wait: COMPLETED in a second attempt
    client(login, "cancel", "--cluster", "dev", slow.name)
    assert (
        json.loads(client(login, "status", "--cluster", "dev", slow.name, "--json").stdout)["state"]
        == "CANCELLED"
    )
    client(login, "resume", "--cluster", "dev", slow.name)
    client(login, "wait", "--cluster", "dev", slow.name)
    st = json.loads(client(login, "status", "--cluster", "dev", slow.name, "--json").stdout)
    assert st["state"] == "COMPLETED" and st["attempt"] == 1
    left = subprocess.run(
        ["pgrep", "-f", f"launch logs -f --cluster dev {slow.name}|launch logs -f {slow.name}"],
        capture_output=True,
        text=True,
    )
    assert left.stdout == "", "a `launch logs -f` outlived its connection"
    # doctor on the cluster's nodes, run from the login node
    d = client(login, "doctor", "--cluster", "dev", "--slurm", "--nodes", "2")
    assert "every check passed on 2 node(s)" in d.stdout


API = """import json, launchers
from launchers import JobSpec
run = launchers.submit(JobSpec(backend="slurm", nodes=1, gpus_per_node=1, name="api", program=("report.py",),
                               slurm={"time": "5"}), cluster="dev")
final = run.wait(timeout=300)
print("RESULT", json.dumps({"path": run.path, "jobs": run.job_ids, "state": final.state,
                            "again": run.status().state}), flush=True)
"""  # noqa: E501


def test_the_python_api_submits_through_the_login_node(login):
    """submit(spec, cluster="dev") (issue 36): from the laptop's Python, as `launch slurm --cluster
    dev` does; the ClusterRun's wait and status are asked of the login node."""
    env = [
        "env",
        "-i",
        f"HOME={os.environ.get('HOME', '/root')}",
        f"PATH={BIN}:{login['state']}/client-bin",
        f"LAUNCH_CLUSTERS_FILE={login['state']}/clusters.yaml",
    ]
    p = subprocess.run(
        [LOGIN, "client", *env, str(BIN / "python"), "-c", API],
        cwd=login["laptop"],
        capture_output=True,
        text=True,
        timeout=420,
        env=login["env"],
    )
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    run = run_named(login, "api")
    assert (got["path"], got["state"], got["again"]) == (
        str(run),
        "COMPLETED",
        "COMPLETED",
    ) and got["jobs"], got
    recs = [
        json.loads(ln.split("REPORT ", 1)[1])
        for ln in (run / "logs/node0/rank0.log").read_text().splitlines()
        if "REPORT " in ln
    ]
    assert [(r["rank"], r["world"]) for r in recs] == [(0, 1)]


def test_list_all_marks_a_cluster_that_does_not_answer(login):
    subprocess.run([LOGIN, "cut-login", "2"], check=True, capture_output=True, env=login["env"])
    try:
        t0 = time.monotonic()
        p = client(login, "list", "--cluster", "all")
        took = time.monotonic() - t0
    finally:
        subprocess.run(
            [LOGIN, "revive-login", "2"], check=True, capture_output=True, env=login["env"]
        )
    rows = [ln.split() for ln in p.stdout.splitlines()[1:]]
    assert any(r[0] == "dev2" and r[1] == "unreachable" for r in rows), p.stdout
    assert any(r[0] == "dev" and r[1] != "unreachable" for r in rows), p.stdout
    print(f"list --cluster all with dev2 cut off: {took:.1f} s")
    assert took < 30  # bounded by its 9 s deadline per cluster (the figure is in the output above)
