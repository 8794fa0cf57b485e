"""The dev Slurm cluster itself (slurm/dev-cluster.sh): 4 nodes in 4 network namespaces, fake gpu:8
gres, a filesystem every node shares, and a real 4-node torchrun job from
slurm/examples/torchrun-4node.sbatch.

Needs the cluster up (`make slurm-up`; `make test` does it). When it is not up these tests FAIL,
never skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT, require_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.exclusive]  # every node, whole-cluster checks

NODES = ["lnode1", "lnode2", "lnode3", "lnode4"]
EXAMPLES = ROOT / "slurm" / "examples"
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


def run(*argv: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def need_cluster() -> None:
    """Fail (never skip) unless slurmctld answers and lnode1..4 are all usable."""
    detail = "sinfo is not installed"
    ok = False
    if shutil.which("sinfo"):
        p = run("sinfo", "-h", "-N", "-o", "%N %t")
        states = dict(line.split()[:2] for line in p.stdout.splitlines() if line.strip())
        ok = p.returncode == 0 and all(
            states.get(n) in ("idle", "mix", "alloc", "comp") for n in NODES
        )
        detail = (p.stderr.strip().splitlines() or [f"node states {states}"])[-1]
    require_cluster(f"the dev Slurm cluster (lnode1..4; {detail})", ok, "make slurm-up")


def submit(argv: list[str], env: dict | None = None) -> str:
    p = run("sbatch", "--parsable", *argv, env=env)
    assert p.returncode == 0, f"sbatch {argv} failed: {p.stderr.strip()}"
    return p.stdout.strip().split(";")[0]


def wait_job(job_id: str, timeout: float) -> dict:
    """Poll scontrol (finished jobs stay visible for MinJobAge=300 s) until the job ends; its fields
    as a dict."""
    deadline = time.monotonic() + timeout
    while True:
        p = run("scontrol", "show", "job", "-o", job_id)
        fields = dict(re.findall(r"(\w+)=(\S*)", p.stdout))
        if fields.get("JobState") in TERMINAL:
            return fields
        if time.monotonic() > deadline:
            run("scancel", job_id)
            pytest.fail(
                f"job {job_id} did not end within {timeout:.0f}s (state "
                f"{fields.get('JobState')}); cancelled"
            )
        time.sleep(0.2)


def test_four_namespaced_nodes_with_fake_gpus_and_shared_fs(tmp_path):
    need_cluster()
    task = tmp_path / "task.sh"  # lives on the host filesystem: the nodes must see it to run it
    task.write_text(
        "#!/bin/bash\n"
        'echo "TASK host=$(hostname) netns=$(readlink /proc/self/ns/net) node=$SLURM_NODEID'
        " cvd=$CUDA_VISIBLE_DEVICES gpus=$SLURM_GPUS_ON_NODE"
        f' python=$({sys.executable} -c "import sys; print(sys.executable)")"\n'
        f"touch {tmp_path}/seen-$(hostname)\n"
    )
    out = tmp_path / "job.out"
    job = submit(
        [
            "-N4",
            "--ntasks-per-node=1",
            "--gpus-per-node",
            "8",
            "-o",
            str(out),
            "--wrap",
            f"srun bash {task}",
        ]
    )
    info = wait_job(job, timeout=60)
    text = out.read_text() if out.exists() else "(no output file)"
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), (
        f"job {job}: {info}\n{text}"
    )

    tasks = [
        dict(re.findall(r"(\w+)=(\S*)", line))
        for line in text.splitlines()
        if line.startswith("TASK ")
    ]
    assert sorted(t["host"] for t in tasks) == NODES, text
    netns = {t["netns"] for t in tasks}
    assert len(netns) == 4 and os.readlink("/proc/self/ns/net") not in netns, (
        f"not 4 node namespaces:\n{text}"
    )
    assert {t["cvd"] for t in tasks} == {"0,1,2,3,4,5,6,7"} and {t["gpus"] for t in tasks} == {
        "8"
    }, text
    assert {t["python"] for t in tasks} == {sys.executable}, text
    assert sorted(p.name for p in tmp_path.glob("seen-*")) == [f"seen-{n}" for n in NODES]


def test_more_gpus_than_a_node_has_is_refused():
    need_cluster()
    p = run("sbatch", "--parsable", "-N1", "--gpus-per-node", "9", "--wrap", "true")
    assert p.returncode != 0 and "Requested node configuration is not available" in p.stderr, (
        p.stderr
    )


def test_torchrun_four_nodes_allreduce(tmp_path):
    need_cluster()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {"RUN_DIR": str(run_dir), "PYTHON": sys.executable, "NPROC_PER_NODE": "2"}
    t0 = time.monotonic()
    job = submit(
        [
            "-o",
            f"{run_dir}/slurm-%j.out",
            str(EXAMPLES / "torchrun-4node.sbatch"),
            str(EXAMPLES / "allreduce.py"),
        ],
        env=env,
    )
    info = wait_job(job, timeout=240)
    elapsed = time.monotonic() - t0
    logs = sorted(run_dir.glob("logs/node*/*.log"))
    dump = "\n".join(
        f"--- {p.relative_to(run_dir)}\n{p.read_text()[-1500:]}"
        for p in [*run_dir.glob("slurm-*.out"), *logs]
    )
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), (
        f"job {job}: {info}\n{dump}"
    )

    lines = [
        dict(re.findall(r"(\w+)=(\S*)", m))
        for p in logs
        for m in re.findall(r"ALLREDUCE [^\n]*", p.read_text())
    ]
    assert sorted(int(x["rank"]) for x in lines) == list(range(8)), dump
    assert all(x["world_size"] == "8" and x["sum"] == "36" and x["ok"] == "True" for x in lines), (
        dump
    )
    by_host = {n: sorted(int(x["rank"]) for x in lines if x["host"] == n) for n in NODES}
    assert by_host == {"lnode1": [0, 1], "lnode2": [2, 3], "lnode3": [4, 5], "lnode4": [6, 7]}, dump
    assert len({x["netns"] for x in lines}) == 4 and {x["python"] for x in lines} == {
        sys.executable
    }, dump
    print(f"4-node torchrun job {job}: submit -> done {elapsed:.1f}s")
