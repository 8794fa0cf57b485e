"""The Slurm backend on the real dev cluster (4 slurmd in network namespaces; `make slurm-up`).

Small shapes on purpose (2 cores): 2 nodes x 1-2 processes, gloo. These tests fail, never skip, when
the cluster is not up. The faults (a node dying, the time limit, a paused controller, ...) are rows
of the Slurm fault suite (tests/faults/test_faults_slurm.py).
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCH, ROOT, rank_lines, read_json, require_cluster, run_launch
from launchers import procs
from launchers.ports import derive_port

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def cluster():
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")


def records(run_dir, marker="REPORT "):
    return [json.loads(ln[len(marker) :]) for ln in rank_lines(run_dir, marker)]


def job_of(run_dir):
    return Path(run_dir, "slurm", "jobs").read_text().split()[-1]


def run_id_of(run_dir):
    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]


def status(run_dir):
    return json.loads(run_launch("status", run_dir, "--json", check=True).stdout)


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def expected_value(steps):
    v = 1
    for s in range(steps):
        v = (v * 31 + s) % 1000003
    return v


def test_2x2_wait_world_allreduce_nodes(workdir):
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--time",
        "10",
        "--run-dir",
        "runs/r",
        "--wait",
        "--",
        "report.py",
        "a b",
        "$(touch pwned)",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    job = job_of("runs/r")
    assert f"slurm job {job} queued; run dir {workdir}/runs/r" in p.stdout
    assert "[n1 r3] REPORT" in p.stdout  # --wait streamed the ranks' output
    reps = sorted(records("runs/r"), key=lambda r: r["rank"])
    assert [r["rank"] for r in reps] == [0, 1, 2, 3] and {r["world"] for r in reps} == {4}
    assert {r["sum"] for r in reps} == {10.0} and all(
        r["argv"] == ["a b", "$(touch pwned)"] for r in reps
    )
    assert not (workdir / "pwned").exists()
    # NODE_RANK = SLURM_NODEID, each node on its own host (network + UTS namespace)
    nodes = {k: read_json(f"runs/r/status/node{k}.json") for k in (0, 1)}
    assert {r["host"] for r in reps if r["node_rank"] == "0"} == {nodes[0]["host"]}
    assert {r["host"] for r in reps if r["node_rank"] == "1"} == {nodes[1]["host"]}
    assert nodes[0]["host"] != nodes[1]["host"] and all(
        n["slurm_job_id"] == job for n in nodes.values()
    )
    env = reps[0]["env"]
    assert env["MASTER_ADDR"].startswith("10.215.0.") and env["MASTER_PORT"] == str(
        derive_port(f"slurm-{job}")
    )
    assert env["LAUNCH_ATTEMPT"] == "0"
    for k, ranks in ((0, (0, 1)), (1, (2, 3))):
        assert (workdir / f"runs/r/logs/node{k}/agent.log").exists()
        for r in ranks:
            assert (
                (workdir / f"runs/r/logs/node{k}/rank{r}.log")
                .read_text()
                .startswith("===== launch attempt 0")
            )
    st = read_json("runs/r/status.json")
    assert (
        st["state"] == "COMPLETED" and st["nodes"] == {"0": 0, "1": 0} and st["slurm_job_id"] == job
    )
    out = run_launch("status", "runs/r", check=True).stdout
    assert "COMPLETED" in out and f"slurm job:  {job}" in out
    # submitit's files live in the run dir, nothing lands in the cwd
    assert (workdir / f"runs/r/slurm/{job}_submitted.pkl").exists()
    assert (
        sorted(x.name for x in workdir.iterdir() if x.suffix in (".out", ".err", ".pkl", ".sh"))
        == []
    )
    att = yaml.safe_load(Path("runs/r/run.yaml").read_text())["attempts"]
    assert (
        len(att) == 1
        and att[0]["slurm_job_id"] == job
        and att[0]["master_addr"] == env["MASTER_ADDR"]
    )


def test_preemption_checkpoint_requeue_resume(workdir):
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "10",
        "--run-dir",
        "runs/p",
        "--env",
        "TEST_STEPS=40",
        "--",
        "preempt_worker.py",
    )
    assert p.returncode == 0, p.stderr
    job = job_of("runs/p")
    wait_for(
        lambda: (
            "STEP 6" in Path("runs/p/logs/node0/rank0.log").read_text()
            if Path("runs/p/logs/node0/rank0.log").exists()
            else False
        ),
        120,
        "step 6",
    )
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # what a preemption notice sends
    seen = set()
    deadline = time.monotonic() + 180
    while True:
        st = status("runs/p")
        seen.add(st["state"])
        if st["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
            break
        assert time.monotonic() < deadline, f"still {st}"
        time.sleep(0.5)
    assert st["state"] == "COMPLETED", st
    assert "REQUEUED" in seen and st["attempt"] == 1 and st["slurm_job_id"] == job
    final = read_json("runs/p/final.json")
    # same result as uninterrupted
    assert final["value"] == expected_value(40) and final["attempt"] == 1
    assert final["resumed_from"].startswith("step-")
    assert rank_lines("runs/p", "CHECKPOINT attempt 0") and rank_lines("runs/p", "SIGNAL SIGUSR2")
    assert rank_lines("runs/p", "START attempt 1 rank 1 from step-")
    log = Path("runs/p/logs/node1/rank1.log").read_text()  # appended, not replaced
    assert "launch attempt 0" in log and "launch attempt 1" in log
    att = yaml.safe_load(Path("runs/p/run.yaml").read_text())["attempts"]
    assert [a["attempt"] for a in att] == [0, 1] and att[1]["slurm_restart"] == 1
    # the agent forwarded USR2
    assert "Received 12 death signal" in Path("runs/p/logs/node0/agent.log").read_text()


def test_cancel_leaves_no_process_on_any_node(workdir):
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--time",
        "10",
        "--run-dir",
        "runs/c",
        "--env",
        "TEST_SLEEP=300",
        "--",
        "report.py",
    )
    assert p.returncode == 0, p.stderr
    job, run_id = job_of("runs/c"), run_id_of("runs/c")
    wait_for(lambda: len(rank_lines("runs/c", "sleeping")) == 4, 120, "4 sleeping ranks")
    assert status("runs/c")["state"] == "RUNNING"
    assert len(procs.tagged_pids(run_id)) >= 10  # 2 agents, 4 wrappers, 4 workers (all namespaces)
    c = run_launch("cancel", "runs/c")
    assert c.returncode == 0, c.stderr
    assert procs.tagged_pids(run_id) == []
    assert (
        subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()
        == ""
    )
    st = status("runs/c")
    assert st["state"] == "CANCELLED" and st["slurm_job_id"] == job


def test_status_of_a_job_gone_everywhere(workdir):
    """No slurmdbd: a job that squeue, scontrol and sacct -c do not know is reported as gone
    (FAILED)."""
    Path("runs/g/slurm").mkdir(parents=True)
    Path("runs/g/run.yaml").write_text(
        yaml.safe_dump(
            {
                "run_id": "g-1",
                "attempts": [{"attempt": 0}],
                "spec": {
                    "backend": "slurm",
                    "nodes": 2,
                    "gpus_per_node": 1,
                    "program": ["report.py"],
                    "program_args": [],
                    "run_dir": str(workdir / "runs/g"),
                    "name": "g",
                    "python": "python3",
                },
            }
        )
    )
    Path("runs/g/status.json").write_text(
        json.dumps(
            {
                "state": "RUNNING",
                "attempt": 0,
                "nodes": {},
                "first_failure": None,
                "slurm_job_id": "987654",
            }
        )
    )
    t0 = time.monotonic()
    st = status("runs/g")
    assert (
        st["state"] == "FAILED" and "987654 is gone" in st["reason"] and st["slurm_state"] == "GONE"
    )
    assert time.monotonic() - t0 < 10
    assert read_json("runs/g/status.json")["state"] == "FAILED"  # recorded: not asked again


def test_in_allocation_runs_in_the_current_job(workdir):
    script = workdir / "mine.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=5
#SBATCH --output={workdir}/mine-%j.out
cd {workdir}
{LAUNCH} slurm --nodes 3 --run-dir {workdir}/runs/too-big -- report.py
echo "too-big rc=$?"
{LAUNCH} slurm --nodes 2 --gpus-per-node 1 --run-dir {workdir}/runs/a -- report.py
echo "inside rc=$?"
""")
    p = subprocess.run(
        ["sbatch", "--parsable", "--wait", str(script)], capture_output=True, text=True, timeout=300
    )
    job = p.stdout.strip().split(";")[0]
    out = (workdir / f"mine-{job}.out").read_text()
    assert p.returncode == 0 and "inside rc=0" in out, out
    assert "too-big rc=2" in out and "--nodes 3 is larger than the current allocation" in out
    assert not (workdir / "runs/too-big").exists()
    reps = records("runs/a")
    assert sorted(r["rank"] for r in reps) == [0, 1] and {r["sum"] for r in reps} == {3.0}
    assert len({r["host"] for r in reps}) == 2
    assert not Path("runs/a/slurm/jobs").exists()  # nothing was submitted
    nodes = [read_json(f"runs/a/status/node{k}.json") for k in (0, 1)]
    assert {n["slurm_job_id"] for n in nodes} == {job}
    st = read_json("runs/a/status.json")
    assert st["state"] == "COMPLETED" and st["slurm_job_id"] == job


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--partition", "nosuch"], "--partition 'nosuch' is unknown to Slurm; partitions: gpu"),
        (["--nodes", "9"], "Slurm refuses the job (9 nodes x 1 GPUs)"),
        (["--gpus-per-node", "9"], "Slurm refuses the job (1 nodes x 9 GPUs)"),
    ],
)
@pytest.mark.exclusive
def test_bad_input_nothing_submitted(workdir, args, msg):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    bad = str(workdir / "runs" / "bad")  # absolute: no other test's process carries this argument
    p = run_launch("slurm", *args, "--time", "5", "--run-dir", bad, "--", "report.py")
    assert p.returncode == 2 and msg in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert not (workdir / "runs").exists()
    assert (
        subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
        == before
    )
    assert not _procs_with_arg(bad), "the warm submitter (forked by the CLI) outlived the launcher"


def _procs_with_arg(arg: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if arg.encode() in f.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.mark.slow
def test_2x8_fake_gres_sets_cuda_visible_devices(workdir):
    """Every node's 8 (fake) GPUs, as Slurm's gres gives them, on 2 nodes (the one 4x8 run is the
    local e2e test: 4 nodes here would be 32 more torch processes on 2 cores for the same rule)."""
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--dist-backend",
        "gloo",
        "--time",
        "10",
        "--run-dir",
        "runs/big",
        "--wait",
        "--",
        "gres_report.py",
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr
    reps = records("runs/big", "GRES ")
    assert (
        len(reps) == 16
        and {r["WORLD_SIZE"] for r in reps} == {"16"}
        and {r["sum"] for r in reps} == {136.0}
    )
    assert {r["CUDA_VISIBLE_DEVICES"] for r in reps} == {"0,1,2,3,4,5,6,7"}
    assert all(r["NODE_RANK"] == r["SLURM_NODEID"] for r in reps)
    assert len({r["netns"] for r in reps}) == 2 and len({r["host"] for r in reps}) == 2


def test_a_job_queued_before_the_move_still_runs(workdir):
    """Jobs queued (or requeued) before the Slurm code moved carry `python -m launchers.slurmnode
    task RUN/slurm` and `... slurmnode finalize RUN`, and a node spec without `resolved`: the shim
    and the fallback run them."""
    from launchers.api import get_backend
    from launchers.layout import path
    from launchers.records.rundir import RunDir, new_run_id, redacted_spec
    from launchers.spec import build_spec

    spec = build_spec(
        "slurm",
        {"nodes": 2, "gpus_per_node": 1, "run_dir": "runs/old", "options": {"time": "10"}},
        ["report.py"],
    )
    run_id = new_run_id(spec)
    plan = get_backend("slurm").plan(spec, run_id, 0)
    script = plan.script.replace(
        f"-m launchers.backends.slurm.task task {spec.run_dir} ",
        f"-m launchers.slurmnode task {spec.run_dir}/slurm ",
    )
    script = script.replace(
        "-m launchers.backends.slurm.task finalize ", "-m launchers.slurmnode finalize "
    )
    assert "launchers.backends" not in script and script.count("launchers.slurmnode") == 2
    rd = RunDir.create(spec, run_id, plan.record())
    os.makedirs(path(rd.path, "slurm"))
    Path(path(rd.path, "node_spec", attempt=0)).write_text(
        json.dumps({"run_id": run_id, "spec": redacted_spec(spec)})
    )
    job = (
        subprocess.run(
            ["sbatch", "--parsable"], input=script, capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .split(";")[0]
    )
    Path(path(rd.path, "slurm_jobs")).write_text(f"0 {job}\n")
    rd.update_status(slurm_job_id=job)
    p = run_launch("wait", "runs/old", timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    st = read_json("runs/old/status.json")
    assert st["state"] == "COMPLETED" and st["nodes"] == {"0": 0, "1": 0}
    reps = records("runs/old")
    assert sorted(r["rank"] for r in reps) == [0, 1] and {r["world"] for r in reps} == {2}
    assert {r["sum"] for r in reps} == {3.0}


@pytest.mark.slurm
def test_cpu_bind_cores_two_ranks_disjoint_srun_does_not_bind(workdir):
    """--cpu-bind cores on Slurm: srun is told not to bind (--cpu-bind=none in the script), the rank
    wrapper binds each of the node's two ranks to its own core(s) within the CPUs the step may
    use."""
    from launchers.cpubind import parse_cpulist

    p = run_launch(
        "slurm",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--cpu-bind",
        "cores",
        "--time",
        "10",
        "--run-dir",
        "runs/cb",
        "--wait",
        "--",
        "affinity.py",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    reps = sorted(records("runs/cb", "AFFINITY "), key=lambda r: r["rank"])
    assert [r["rank"] for r in reps] == [0, 1] and all(r["cpus"] for r in reps)
    assert not set(reps[0]["cpus"]) & set(reps[1]["cpus"])
    for r in reps:
        rec = read_json(f"runs/cb/status/rank{r['rank']}.json")
        assert rec["cpu_bind"] == "cores" and list(parse_cpulist(rec["cpus"])) == r["cpus"]
    dry = run_launch(
        "slurm",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--cpu-bind",
        "cores",
        "--dry-run",
        "--",
        "affinity.py",
        check=True,
    ).stdout
    assert "--cpu-bind=none" in next(ln for ln in dry.splitlines() if ln.startswith("srun "))


def test_preflight_gpu_bad_node_with_a_spare_is_quarantined_and_the_spare_runs(workdir):
    """--preflight gpu with --spares 1: the stand-in tools show a Down InfiniBand port on lnode3
    only; the allocation is lnode1..3 (lnode1, the batch host, is the last slot: the spare), so
    attempt 0 runs the check on lnode2 and lnode3 and stops before any agent; the node that failed
    the check is quarantined at once (a fault the check will find again) and attempt 1, in the same
    job, runs on lnode2 and lnode1: COMPLETED, world 2."""
    from gpu_standins import per_host_tools, python_with_tools

    bin_dir = per_host_tools(
        workdir / "gpubin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {"lnode3": "ibstat/network-operator-issue-249-ib-down.txt"},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    py = python_with_tools(workdir / "py-gpu", bin_dir)
    Path("p.yaml").write_text('slurm:\n  sbatch_lines: ["--nodelist=lnode[1-3]"]\n')
    p = run_launch(
        "slurm",
        "--profile",
        "p.yaml",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--spares",
        "1",
        # stand-in GPUs
        "--time",
        "10",
        "--python",
        py,
        "--preflight",
        "gpu",
        "--dist-backend",
        "gloo",
        "--run-dir",
        "runs/g",
        "--wait",
        "--",
        "report.py",
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    run = yaml.safe_load(Path("runs/g/run.yaml").read_text())
    assert [a["hosts"] for a in run["attempts"]] == [["lnode2", "lnode3"], ["lnode2", "lnode1"]], (
        run["attempts"]
    )
    led = read_json("runs/g/nodes.json")
    assert [d["action"] for d in led["decisions"]] == ["replace"] and led["pool"][
        "quarantined"
    ] == [1], led
    assert (
        "failed the GPU check" in led["decisions"][0]["why"]
        and "quarantined" in led["decisions"][0]["why"]
    )
    assert sorted((r["world"], r["sum"]) for r in records("runs/g")) == [(2, 3.0), (2, 3.0)]
    assert status("runs/g")["state"] == "COMPLETED"


def test_preflight_gpu_one_bad_node_fails_the_job_before_any_agent(workdir):
    """--preflight gpu on Slurm: each node task runs the GPU check (the code local and SSH nodes
    run) before its agent and waits for every node's verdict. The stand-in tools
    (tests/gpu_standins.py: real outputs, picked by the node's hostname) show a Down InfiniBand port
    on lnode3 only: no agent starts anywhere, every node's record names lnode3's node and port, and
    the run is FAILED with that line (`launch status`). With --node-ledger, lnode3 is quarantined
    there (issue 37: the batch side's finalize, a strike of kind gpu)."""
    from gpu_standins import per_host_tools, python_with_tools

    bin_dir = per_host_tools(
        workdir / "gpubin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {"lnode3": "ibstat/network-operator-issue-249-ib-down.txt"},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    py = python_with_tools(workdir / "py-gpu", bin_dir)
    p = run_launch(
        "slurm",
        "--nodes",
        "4",
        "--gpus-per-node",
        "1",
        "--time",
        "10",
        "--python",
        py,
        "--preflight",
        "gpu",
        "--node-ledger",
        "site.json",
        "--run-dir",
        "runs/g",
        "--wait",
        "--",
        "report.py",
    )
    assert p.returncode != 0, p.stdout + p.stderr
    recs = {k: read_json(f"runs/g/status/node{k}.json") for k in range(4)}
    (bad,) = [k for k, r in recs.items() if r["host"] == "lnode3"]
    line = f"node {bad} [lnode3]: mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand)"
    assert recs[bad]["error"].startswith(
        f"--preflight gpu: 1 bad node(s) of 4, nothing started: {line}"
    ), recs
    assert [r.get("kind") for k, r in sorted(recs.items())] == [
        ("gpu" if k == bad else None) for k in range(4)
    ]
    for k, r in recs.items():
        assert r["state"] == "EXITED" and r["exit_code"] == 1 and line in r["error"], (k, r)
        assert not Path(f"runs/g/logs/node{k}/agent.log").exists()
    # no rendezvous
    assert not records("runs/g") and not list(Path("runs/g/slurm").glob("master-*.json"))
    st = status("runs/g")
    assert st["state"] == "FAILED" and line in st["reason"], st
    assert line in run_launch("status", "runs/g", check=True).stdout
    from launchers.ledgers.siteledger import load, quarantined

    led = load(str(Path("site.json").resolve()))[0]
    assert [(h, [s["kind"] for s in e["strikes"]]) for h, e in led["hosts"].items()] == [
        ("lnode3", ["gpu"])
    ], led
    assert (
        quarantined(led) == ["lnode3"] and line in led["hosts"]["lnode3"]["strikes"][0]["reason"]
    ), led


HASHME = (
    'import hashlib, torch.distributed as dist\ndist.init_process_group("gloo")\n'
    'print("CODE", hashlib.sha256(open(__file__, "rb").read()).hexdigest(), flush=True)\n'
    "dist.destroy_process_group()\n"
)


def test_after_job_waits_and_every_rank_runs_the_submitted_code_not_an_edit(workdir):
    """--after: the job waits in the queue behind another; the program is edited meanwhile; every
    rank runs the version submitted (the snapshot, default on for Slurm) and says so by the hash of
    its own file."""
    import hashlib

    Path("hashme.py").write_text(HASHME)
    submitted = hashlib.sha256(HASHME.encode()).hexdigest()
    run_launch(
        "slurm",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--time",
        "10",
        "--run-dir",
        "runs/a",
        "--env",
        "TEST_SLEEP=4",
        "--",
        "report.py",
        check=True,
    )
    run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--time",
        "10",
        "--run-dir",
        "runs/b",
        "--after",
        "runs/a",
        "--",
        "hashme.py",
        check=True,
    )
    Path("hashme.py").write_text(HASHME + "# edited after the submit\n")
    assert status("runs/b")["state"] == "PENDING"  # still waiting for runs/a when the edit landed
    run_launch("wait", "runs/b", timeout=240, check=True)
    assert [ln.split()[1] for ln in rank_lines("runs/b", "CODE ")] == [submitted, submitted]
