"""The one place Slurm's commands run (sbatch, squeue, scontrol, sacct, scancel, sprio, sinfo), on
this machine.

    run(argv, input=None, timeout=60, meanwhile=None) -> subprocess.CompletedProcess (text stdout/stderr)

subprocess.run(argv, capture_output=True, text=True, timeout=...): a missing binary raises OSError,
a timeout subprocess.TimeoutExpired. A cluster reached through its login node is not this module's:
`--cluster NAME` runs the whole `launch` there (launchers.ssh.viacluster), whose own Slurm commands
then run here, on the login node.
"""  # noqa: E501

from __future__ import annotations

import os
import subprocess
from typing import Callable

SLURM_COMMANDS = frozenset({"sbatch", "squeue", "scontrol", "sacct", "scancel", "sprio", "sinfo"})
DEFAULT_TIMEOUT_S = 60.0


def run(
    argv: list[str] | tuple[str, ...],
    input: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    meanwhile: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess:
    """Run one Slurm command here. meanwhile(): called while it runs (work the caller overlaps with
    Slurm's answer)."""
    if not argv or os.path.basename(argv[0]) not in SLURM_COMMANDS:
        raise ValueError(
            f"not a Slurm command: {list(argv[:1])}; this runner runs "
            f"{', '.join(sorted(SLURM_COMMANDS))}"
        )
    argv = [str(w) for w in argv]
    if meanwhile is None:
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    p = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    p.stdin.write(input or "")
    p.stdin.close()
    p.stdin = None  # written: communicate() below only reads
    meanwhile()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)
