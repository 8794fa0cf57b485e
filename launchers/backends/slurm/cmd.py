"""The one place Slurm's commands run (sbatch, squeue, scontrol, sacct, scancel, sprio, sinfo), on
this machine.

    run(argv, input=None, timeout=60, meanwhile=None, shielded=False)
        -> subprocess.CompletedProcess (text stdout/stderr)

subprocess.run(argv, capture_output=True, text=True, timeout=...): a missing binary raises OSError,
a timeout subprocess.TimeoutExpired. A cluster reached through its login node is not this module's:
`--cluster NAME` runs the whole `launch` there (launchers.ssh.viacluster), whose own Slurm commands
then run here, on the login node.
"""  # noqa: E501

from __future__ import annotations

import os
import signal
import subprocess
from typing import Callable

SLURM_COMMANDS = frozenset({"sbatch", "squeue", "scontrol", "sacct", "scancel", "sprio", "sinfo"})
DEFAULT_TIMEOUT_S = 60.0


def run(
    argv: list[str] | tuple[str, ...],
    input: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    meanwhile: Callable[[], object] | None = None,
    shielded: bool = False,
) -> subprocess.CompletedProcess:
    """Run one Slurm command here. meanwhile(): called while it runs (work the caller overlaps with
    Slurm's answer). shielded: the command starts with SIGTERM blocked -- `scontrol requeue` from
    inside the job it requeues: Slurm's SIGTERM to every process of the job can reach the command
    before it reports the requeue it made (it was read as a failed requeue)."""
    if not argv or os.path.basename(argv[0]) not in SLURM_COMMANDS:
        raise ValueError(
            f"not a Slurm command: {list(argv[:1])}; this runner runs "
            f"{', '.join(sorted(SLURM_COMMANDS))}"
        )
    argv = [str(w) for w in argv]
    if shielded:
        # a blocked signal stays blocked across fork and exec; this process's own stays pending
        # until the mask is restored, then its handler runs as before
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            return run(argv, input, timeout, meanwhile)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
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
