"""The dry-run's last word from Slurm itself: `sbatch --test-only` of the exact script (it submits
nothing and creates nothing: Slurm only says when and where the job would start, or why it refuses
it -- partition, QOS, account, limits, an sbatch option it does not take). Where sbatch is not on
PATH the dry-run says it was not checked; inside an allocation nothing would be submitted, so
nothing is asked.
"""

from __future__ import annotations

import shutil
import subprocess

from . import cmd
from .env import SlurmEnv

TEST_ONLY_TIMEOUT_S = 30.0


def answer(script: str | None) -> str:
    """The dry-run's lines (each `# `) with Slurm's answer to `sbatch --test-only` of script."""
    if script is None:
        return ""
    if SlurmEnv.read().in_allocation:
        return "\n# sbatch --test-only: not asked (inside an allocation nothing is submitted)\n"
    if not shutil.which("sbatch"):
        return (
            "\n# sbatch --test-only: not checked (sbatch is not on PATH here; Slurm will "
            "check it at submit)\n"
        )
    try:
        p = cmd.run(["sbatch", "--test-only"], input=script, timeout=TEST_ONLY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return (
            f"\n# sbatch --test-only: no answer within {TEST_ONLY_TIMEOUT_S:.0f} s (is "
            "slurmctld up?)\n"
        )
    except OSError as e:
        return f"\n# sbatch --test-only: not checked ({e})\n"
    said = [ln.strip() for ln in (p.stderr + "\n" + p.stdout).splitlines() if ln.strip()] or [
        "(no output)"
    ]
    verdict = (
        "Slurm would accept this job" if p.returncode == 0 else "Slurm REFUSES this job as it is"
    )
    return f"\n# sbatch --test-only ({verdict}; nothing was submitted):\n" + "".join(
        f"#   {ln}\n" for ln in said
    )
