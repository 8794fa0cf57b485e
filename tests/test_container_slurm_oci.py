"""Issue 22 on the dev Slurm cluster: Slurm's own OCI support. `launch slurm --container-runtime oci
--container-image BUNDLE` renders `srun --container=BUNDLE`; slurmstepd copies the bundle's
config.json with the node task as its process and runs it with oci.conf's RunTimeRun, `runc run` as
root (slurm/dev-cluster.sh writes oci.conf; the bundle: `clusters/image.sh bundle DIR`, built here,
kept while its recipe is the same). Small shapes (2 nodes x 1 process, gloo). Each test proves every
rank ran inside (podman's marker /run/.containerenv is in the bundle's rootfs, the mount namespace
is not this one) and that nothing is left after it: no process of the run on any node (they share
this machine's pid namespace) and no runc container of the job in runc's state dir (/run/lsim-oci,
shared by the nodes). These tests fail, never skip, when the cluster, oci.conf, runc or the bundle
is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, rank_lines, read_json, require_cluster, run_launch

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))
from common import agent_pid, assert_latest_complete, convnet, metrics, orphans, progress, wait_for  # noqa: E402

pytestmark = pytest.mark.slurm
BUNDLE = os.environ.get("LAUNCH_TEST_BUNDLE", "/var/tmp/launch-oci-bundle")
OCI_CONF = "/etc/slurm/oci.conf"
OCI_ROOT = "/run/lsim-oci"  # runc's --root in oci.conf (slurm/dev-cluster.sh)
SLURM = ["slurm", "--nodes", "2", "--gpus-per-node", "1", "--time", "10"]


@pytest.fixture(scope="module")
def oci_flags() -> list[str]:
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")
    require_cluster(f"Slurm's OCI support ({OCI_CONF})", Path(OCI_CONF).is_file(), "make slurm-up")
    b = subprocess.run(
        [str(ROOT / "clusters" / "image.sh"), "bundle", BUNDLE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LAUNCH_BUNDLE_PYTHON": sys.executable},
    )
    require_cluster(
        f"runc and the OCI bundle {BUNDLE} ({b.stderr.strip()})", b.returncode == 0, "make podman"
    )
    return [
        "--container-runtime",
        "oci",
        "--container-image",
        BUNDLE,
        "--container-python",
        sys.executable,
    ]


def job_of(run_dir) -> str:
    return Path(run_dir, "slurm", "jobs").read_text().split()[-1]


def run_id_of(run_dir) -> str:
    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]


def status(run_dir) -> dict:
    return json.loads(run_launch("status", str(run_dir), "--json", check=True).stdout)


def reports(run_dir) -> list[dict]:
    return sorted(
        (json.loads(ln[len("REPORT ") :]) for ln in rank_lines(run_dir, "REPORT ")),
        key=lambda r: r["rank"],
    )


def containers_of(job: str) -> list[str]:
    """The job's runc containers (oci.conf names them lsim-JOB.STEP.NODE); [] once runc's root is
    gone too."""
    runc = shutil.which("runc") or "/usr/sbin/runc"
    p = subprocess.run(
        [runc, "--root", OCI_ROOT, "list", "-q"], capture_output=True, text=True, timeout=30
    )
    return (
        [c for c in p.stdout.split() if c.startswith(f"lsim-{job}.")] if p.returncode == 0 else []
    )


def runc_pids(job: str) -> list[int]:
    """runc processes of the job's containers (runc run is not tagged with the run id: slurmstepd
    execs it with its own environment), found by the container name on their command line."""
    needle = f"lsim-{job}.".encode()
    out = []
    for e in os.listdir("/proc"):
        try:
            if e.isdigit() and needle in Path(f"/proc/{e}/cmdline").read_bytes():
                out.append(int(e))
        except OSError:
            pass
    return out


def nothing_left(run_dir) -> None:
    """No process of the run, no runc of its job, no container of its job: runc run removes its
    container as the node task ends; slurmstepd's RunTimeQuery/Kill/Delete removes one a SIGKILLed
    runc left (a moment later)."""
    job = job_of(run_dir)
    assert orphans(run_id_of(run_dir)) == []
    wait_for(
        lambda: not containers_of(job) and not runc_pids(job), 60, f"job {job}'s containers to go"
    )


def in_the_container(reps: list[dict]) -> bool:
    ours = os.readlink("/proc/self/ns/mnt")
    return bool(reps) and all(r["container"] and r["mnt_ns"] != ours for r in reps)


def inside(pid: int) -> bool:
    """Whether pid's root directory is the bundle's rootfs (podman's marker there); False once it is
    gone."""
    return os.path.exists(f"/proc/{pid}/root/run/.containerenv")


def test_oci_2x1_completes_world_2_every_rank_inside(workdir, oci_flags):
    p = run_launch(*SLURM, "--run-dir", "runs/o", *oci_flags, "--wait", "--", "report.py")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    reps = reports("runs/o")
    assert [(r["rank"], r["world"], r["sum"], r["node_rank"]) for r in reps] == [
        (0, 2, 3.0, "0"),
        (1, 2, 3.0, "1"),
    ]
    assert in_the_container(reps), reps
    # the node's hostname: its UTS kept
    nodes = {k: read_json(f"runs/o/status/node{k}.json") for k in (0, 1)}
    assert [r["host"] for r in reps] == [nodes[0]["host"], nodes[1]["host"]] and nodes[0][
        "host"
    ] != nodes[1]["host"]
    assert reps[0]["env"]["MASTER_ADDR"].startswith("10.215.0.")  # across the bridge
    st = read_json("runs/o/status.json")
    assert (
        st["state"] == "COMPLETED"
        and st["nodes"] == {"0": 0, "1": 0}
        and st["first_failure"] is None
    ), st
    nothing_left("runs/o")


def test_oci_cancel_leaves_no_container_and_no_process(workdir, oci_flags):
    p = run_launch(
        *SLURM, "--run-dir", "runs/c", *oci_flags, "--env", "TEST_SLEEP=300", "--", "report.py"
    )
    assert p.returncode == 0, p.stderr
    job = job_of("runs/c")
    wait_for(lambda: len(rank_lines("runs/c", "sleeping")) == 2, 180, "2 sleeping ranks")
    hosts = [read_json(f"runs/c/status/node{k}.json")["host"] for k in (0, 1)]
    # step 0, one per node
    assert sorted(containers_of(job)) == sorted(f"lsim-{job}.0.{h}" for h in hosts)
    assert in_the_container(reports("runs/c"))
    c = run_launch("cancel", "runs/c")
    assert c.returncode == 0, c.stderr
    nothing_left("runs/c")
    assert (
        subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()
        == ""
    )
    st = status("runs/c")
    assert st["state"] == "CANCELLED" and st["slurm_job_id"] == job, st


def test_oci_killed_agent_leaves_nothing_and_resume_starts_from_a_checkpoint_inside(
    workdir, oci_flags
):
    """SIGKILL node 1's torchrun agent (in the container, a process of this pid namespace): the run
    FAILS naming node 1, nothing is left; `launch resume` runs attempt 1 in the container from
    checkpoints/latest to the end."""
    steps, every, hit = 30, 5, 10
    p = run_launch(
        *SLURM,
        "--run-dir",
        "runs/k",
        *oci_flags,
        "--",
        *convnet(steps, every, "--step-delay", "0.2"),
    )
    assert p.returncode == 0, p.stderr
    rid = run_id_of("runs/k")
    wait_for(
        lambda: all((progress("runs/k").get(k) or {}).get("step", 0) >= hit for k in (0, 1)),
        240,
        f"step {hit} on both ranks",
    )
    pid = agent_pid(rid, 1)
    assert pid and inside(pid), pid  # the agent's root is the bundle's
    os.kill(pid, signal.SIGKILL)
    st = wait_for(
        lambda: (s := status("runs/k"))["state"] in ("FAILED", "COMPLETED", "CANCELLED") and s,
        180,
        "the run to end",
        1.0,
    )
    assert st["state"] == "FAILED" and (st["first_failure"] or {}).get("node") == 1, st
    w = run_launch("wait", "runs/k", timeout=120)
    assert w.returncode == 1, w.stderr
    nothing_left("runs/k")
    name = assert_latest_complete("runs/k")
    run_launch("resume", "runs/k", check=True)
    wait_for(
        lambda: (a := agent_pid(rid, 0)) and inside(a), 180, "attempt 1's agent in the container"
    )
    w = run_launch("wait", "runs/k", timeout=300)
    assert w.returncode == 0, w.stderr[-3000:]
    later = [m for m in metrics("runs/k") if (m.get("attempt") or 0) >= 1 and "step" in m]
    assert later and later[0]["step"] > every, f"attempt 1 did not start from a checkpoint ({name})"
    assert (
        read_json("runs/k/final.json")["param_sha256"] and status("runs/k")["state"] == "COMPLETED"
    )
    nothing_left("runs/k")
