"""What the verb modules of `launch` share (cli, cliruns, clidoctor): a LaunchError as one line and
its exit code (one_line_errors), --cluster NAME running the verb on that cluster's login node
(via_cluster, forward) and a bad value from a LAUNCH_* variable named next to its flag (env_named).
Click only; imports nothing of the launcher's work at module level."""

from __future__ import annotations

import contextlib
import functools
import re
import sys

import click

from ..errors import LaunchError


def one_line_errors(fn):
    """One-line error and exit code 2 for bad input; nothing has been started when it is raised."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except LaunchError as e:
            click.echo(f"launch: error: {e}", err=True)
            sys.exit(e.exit_code)

    return wrapper


def via_cluster(fn):
    """--cluster NAME: the verb runs on that cluster's login node, its words as given
    (launchers.ssh.viacluster)."""

    @functools.wraps(fn)
    def wrapper(*a, cluster=None, **kw):
        if not cluster:
            return fn(*a, **kw)
        return one_line_errors(forward)(cluster)

    return click.option(
        "--cluster",
        default=None,
        metavar="NAME",
        help=(
            "Run it on that cluster's login node over "
            "SSH (the clusters file); `launch list --cluster all`: every cluster."
        ),
    )(wrapper)


def forward(cluster: str, profile: str | None = None) -> None:
    from ..ssh import viacluster

    ctx = click.get_current_context()
    verb, *args = ctx.find_root().meta["launch.argv"]
    sys.exit(viacluster.forward(verb, args, cluster, profile))


@contextlib.contextmanager
def env_named(variables: dict[str, tuple[str | None, str | None]]):
    """A bad value that came from a LAUNCH_* variable (variables: option key -> its flag and
    variable): the error names the variable next to its flag."""
    ctx = click.get_current_context()
    env = {
        flag: var
        for key, (flag, var) in variables.items()
        if flag and var and ctx.get_parameter_source(key) == click.core.ParameterSource.ENVIRONMENT
    }
    try:
        yield
    except LaunchError as e:
        msg = str(e)
        for flag, var in env.items():
            if re.search(re.escape(flag) + r"\b(?!-)", msg):
                msg = re.sub(re.escape(flag) + r"\b(?!-)", f"{flag} (from ${var})", msg, count=1)
        raise type(e)(msg) from None  # its kind kept (RunDirGone: exit 1)
