"""`launch doctor`: its options (generated from launchers.doctor.options, with the LAUNCH_* defaults
of the verb it checks for) and the call of launchers.doctor.main. Click only; registered by name in
launchers.cli (LazyGroup.lazy), imported when used."""

from __future__ import annotations

import sys

import click

from .clibase import env_named, one_line_errors, via_cluster
from .clihelp import EXAMPLES as VERB_EXAMPLES
from .clihelp import Grouped, option_of, renamed


def _doctor_options(fn):
    """`launch doctor`'s options, generated from their declarations (launchers.doctor.options), with
    the LAUNCH_* defaults of the verb it checks for (`launch ssh`'s LAUNCH_SSH_*, `launch slurm`'s
    LAUNCH_SLURM_*)."""
    from ..doctor.options import OPTIONS, env_default

    for o in reversed(OPTIONS):
        fn = option_of(o, (env_default(o) or (None,))[0])(fn)
    return renamed("--run-root", "run_root", "--runs-root")(fn)


@click.command(cls=Grouped, epilog=VERB_EXAMPLES["doctor"])
@via_cluster
@_doctor_options
@one_line_errors
def doctor(**kw):
    """Check nodes before a long job: --local, --hosts/--hostfile (SSH) or --slurm; exit 1 if a
    check fails.

    A LAUNCH_* default counts where the verb checked for takes it: LAUNCH_SSH_* for SSH hosts,
    LAUNCH_SLURM_* with --slurm, LAUNCH_NODES, LAUNCH_GPUS_PER_NODE and LAUNCH_PYTHON for every
    target (not LAUNCH_NODES with --local)."""
    from ..doctor.main import run
    from ..doctor.options import OPTIONS, env_applies, env_default

    ctx = click.get_current_context()
    target = "local" if kw.get("local") else "slurm" if kw.get("slurm") else "ssh"
    for key in kw:
        if ctx.get_parameter_source(
            key
        ) == click.core.ParameterSource.ENVIRONMENT and not env_applies(key, target):
            kw[key] = None  # another verb's default (LAUNCH_SSH_HOSTFILE with --slurm)
    with env_named({o.key: (o.cli_flag, (env_default(o) or (None,))[0]) for o in OPTIONS}):
        sys.exit(run(kw))
