"""Issue 33 item 6: three real kinds of site as goldens (pure: no cluster). Each profile of
examples/sites/ (a DGX-style cluster with pyxis, a university cluster with modules, --gres and
Apptainer, AWS ParallelCluster with EFA; the pages each line comes from are in docs/SITES.md) gives,
through the real `launch slurm --profile X --dry-run`, the exact sbatch script and node commands in
tests/golden/site_<name>.txt -- minus what depends on this machine (the scratch dir, this checkout,
the interpreter, hashes, the run id's random part), and with no sbatch on PATH (the dry-run then
says Slurm did not check it).

Regenerate after an intended change (e.g. the `world:` line):  UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/test_sites.py
"""  # noqa: E501

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_launch

GOLDEN = Path(__file__).resolve().parent / "golden"
SITES = ("dgx-pyxis", "university-apptainer", "aws-parallelcluster")


def normalised(text: str, cwd: Path) -> str:
    for real, shown in ((sys.executable, "<PYTHON>"), (str(cwd), "<CWD>"), (str(ROOT), "<REPO>")):
        text = text.replace(real, shown)
    for pattern, shown in (
        (r"\.snapshots/[0-9a-f]{64}", ".snapshots/<SNAPSHOT>"),
        (r"\.torch_extensions/[0-9a-f]{16}", ".torch_extensions/<KEY>"),
        (r"\bsite-[0-9a-f]{8}\b", "site-<ID>"),
        (r"launchers \d+\.\d+\.\d+[\w.+-]*", "launchers <VERSION>"),
    ):
        text = re.sub(pattern, shown, text)
    return text


def dry_run(site: str, cwd: Path) -> str:
    (cwd / "train.py").write_text("print('train')\n")
    env = {k: "" for k in os.environ if k.startswith(("LAUNCH_SLURM_", "SLURM_"))}
    env.update(PATH="/nonexistent-bin", LAUNCH_RUNS_ROOT="")
    p = run_launch(
        "slurm",
        "--profile",
        str(ROOT / "examples" / "sites" / f"{site}.yaml"),
        "--run-dir",
        "runs/site",
        "--dry-run",
        "--",
        "train.py",
        cwd=cwd,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert not (cwd / "runs").exists()  # a dry-run creates nothing
    return normalised(p.stdout, cwd)


@pytest.mark.parametrize("site", SITES)
def test_site_golden(site, tmp_path):
    text = dry_run(site, tmp_path)
    path = GOLDEN / f"site_{site}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    assert "# sbatch --test-only: not checked (sbatch is not on PATH here" in text
    assert "# warning:" not in text  # every site gives each rank at least one CPU


def test_each_site_asks_for_its_cpus_and_memory(tmp_path):
    """The CPU/memory lines each kind of site gets (docs/SITES.md lists them)."""
    lines = {
        s: [
            ln
            for ln in dry_run(s, tmp_path).splitlines()
            if re.match(r"#SBATCH --(cpus|mem|exclusive|gres|gpus)", ln)
        ]
        for s in SITES
    }
    assert lines == {
        "dgx-pyxis": ["#SBATCH --exclusive", "#SBATCH --gpus-per-node=8", "#SBATCH --mem=0"],
        "university-apptainer": ["#SBATCH --cpus-per-task=6", "#SBATCH --gres=gpu:4"],
        "aws-parallelcluster": [
            "#SBATCH --cpus-per-task=96",
            "#SBATCH --exclusive",
            "#SBATCH --gpus-per-node=8",
        ],
    }
