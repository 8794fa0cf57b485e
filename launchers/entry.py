"""The `launch` console script. A `launch slurm` that will submit is first handed to a warm
launcher, when this user has one for this code (launchers.warmstart: the command runs in a fork of a
process that imported everything already), and leaves one behind when it had none. Run here, the
warm submitter (backends/slurm/submit.py) is forked first, before click and the rest are imported,
so submitit's import overlaps all of that; a `launch local` that will start its nodes starts their
agents' pythons first (launchers.backends.earlyagent: torch's import overlaps the launcher's whole
start); then the click CLI (launchers.cli) takes over."""

from __future__ import annotations

import sys


def will_submit_to_slurm(argv: list[str]) -> bool:
    """`launch slurm ...` that will submit here: not a dry-run or help, not through --cluster (the
    login node submits), not inside an allocation. A guess from argv before it is parsed; a wrong
    guess only costs or saves a fork (the submitter submits only what it is handed, and exits on EOF
    when the launcher ends without handing it anything)."""
    import os

    if len(argv) < 2 or argv[1] != "slurm" or os.environ.get("SLURM_JOB_ID"):
        return False  # in an allocation: SlurmEnv.in_allocation's rule, without its import (~13 ms)
    opts = argv[2 : argv.index("--")] if "--" in argv else argv[2:]
    return not any(
        a in ("--dry-run", "-h", "--help", "--cluster") or a.startswith("--cluster=") for a in opts
    )


def will_run_local(argv: list[str]) -> bool:
    """`launch local ...` that will start its nodes here: not a dry-run or help (a guess from argv,
    as will_submit_to_slurm's: a wrong one only costs or saves an early agent,
    launchers.backends.earlyagent)."""
    if len(argv) < 2 or argv[1] != "local":
        return False
    opts = argv[2 : argv.index("--")] if "--" in argv else argv[2:]
    return bool(opts) and not any(a in ("--dry-run", "-h", "--help") for a in opts)


def main() -> None:
    import os

    # the user's umask, but nothing a run writes is ever world-writable
    os.umask(os.umask(0o022) | 0o002)
    warm = will_submit_to_slurm(sys.argv)
    served = warm and "--wait" not in sys.argv[: sys.argv.index("--") if "--" in sys.argv else None]
    if served:
        from . import warmclient

        served = warmclient.enabled()
        code = warmclient.run(sys.argv) if served else None
        if code is not None:  # served: nothing of this process is left to tear down (~3 ms)
            for f in (sys.stdout, sys.stderr):
                f.flush()
            os._exit(code)
    if warm:
        from .backends.slurm import submit as slurm_submit

        slurm_submit.prestart()
    early = will_run_local(sys.argv)
    if early:  # the nodes' agents import torch meanwhile
        from .backends import earlyagent

        earlyagent.prestart(sys.argv)
    try:
        from .cli import main as cli

        cli()
    finally:
        if warm:
            slurm_submit.discard()
        if early:
            earlyagent.end_all()
        if served:
            from . import warmstart

            warmstart.spawn()
