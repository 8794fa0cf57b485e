"""Issue 33 items 3-4 on the real dev cluster (`make slurm-up`; fails, never skips, when it is not
up): the dry-run ends with Slurm's own answer to the script (sbatch --test-only: nothing submitted,
nothing created), and a job's --setup lines, --sbatch-arg options and CPU request reach Slurm and
the nodes, recorded in the manifest."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, rank_lines, require_cluster, run_launch

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def cluster():
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")


def test_dry_run_prints_slurms_own_answer_and_submits_nothing(workdir):
    before = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    ok = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--partition",
        "gpu",
        "--run-dir",
        "runs/d",
        "--dry-run",
        "--",
        "report.py",
    )
    assert ok.returncode == 0, ok.stderr
    answer = ok.stdout.split("# sbatch --test-only", 1)[1]
    assert answer.startswith(" (Slurm would accept this job; nothing was submitted):"), answer
    assert re.search(
        r"#   sbatch: Job \d+ to start at \S+ using 4 processors on nodes \S+ in partition gpu",
        answer,
    )
    bad = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "9",
        "--run-dir",
        "runs/d",
        "--dry-run",
        "--",
        "report.py",
    )
    assert bad.returncode == 0 and "Slurm REFUSES this job as it is" in bad.stdout, bad.stdout[
        -500:
    ]
    assert "Requested node configuration is not available" in bad.stdout
    assert not (workdir / "runs").exists()
    # nothing of ours was queued (ids and names from one listing: a job another test queued can end
    # between two listings)
    assert not set(_report_jobs()) - set(before)


def _report_jobs() -> list[str]:
    """Jobs named `report` (ours; other tests' jobs are named by their run names)."""
    p = subprocess.run(
        ["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True
    ).stdout.splitlines()
    return [ln.split()[0] for ln in p if ln.split()[1:] == ["report"]]


def test_setup_sbatch_args_and_cpus_reach_slurm_and_the_nodes(workdir):
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--dist-backend",
        "gloo",
        "--time",
        "10",
        "--cpus-per-gpu",
        "2",
        "--mem-per-gpu",
        "100M",
        "--setup",
        "export TEST_SETUP=from-setup",
        "--sbatch-arg",
        "--comment=issue33",
        "--run-dir",
        "runs/s",
        "--wait",
        "--",
        "report.py",
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    reps = [json.loads(ln[len("REPORT ") :]) for ln in rank_lines("runs/s", "REPORT ")]
    assert len(reps) == 2 and {r["env"].get("TEST_SETUP") for r in reps} == {"from-setup"}
    job = Path("runs/s/slurm/jobs").read_text().split()[-1]
    fields = dict(
        re.findall(
            r"(\w+)=(\S*)",
            subprocess.run(
                ["scontrol", "show", "job", "-o", job], capture_output=True, text=True
            ).stdout,
        )
    )
    assert fields.get("Comment") == "issue33" and fields.get("NumCPUs") == "4", fields
    man = json.loads(Path("runs/s/manifest.json").read_text())
    assert man["sbatch_args"] == ["--comment=issue33"] and man["setup"] == [
        "export TEST_SETUP=from-setup"
    ]
    shown = run_launch("status", "runs/s", "--manifest", check=True).stdout
    assert (
        "sbatch args:     --comment=issue33" in shown
        and "setup:           export TEST_SETUP=from-setup" in shown
    )
