"""`launch nodes`: the site's node ledger (launchers.ledgers.siteledger) -- each host's strikes,
score, state and newest evidence -- and `--drain HOST`, the admin's hook that drains a Slurm node
with that evidence as its reason (`scontrol update nodename=HOST state=drain reason=...`, an argv:
no shell). Click only; registered by name in launchers.cli (LazyGroup.lazy), imported when used.
"""

from __future__ import annotations

import json
import sys
import time

import click

from ..errors import LaunchError
from ..ledgers import ledgerfile, siteledger
from .clihelp import Shown, examples

EXAMPLES = examples(
    "launch nodes --node-ledger /shared/launch/nodes.json",
    "LAUNCH_NODE_LEDGER=/shared/launch/nodes.json launch nodes --json",
    "launch nodes --drain lnode3 --dry-run       # the scontrol command; nothing drained",
)


@click.command("nodes", epilog=EXAMPLES)
@click.option(
    "--node-ledger",
    "path",
    envvar="LAUNCH_NODE_LEDGER",
    show_envvar=True,
    default=None,
    type=Shown("FILE", complete="file"),
    help="The site's node ledger (what `launch BACKEND --node-ledger` reads and writes).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=(
        "A JSON list on stdout: host, state, score, strikes, last, "
        "when (epoch seconds), last_strike."
    ),
)
@click.option(
    "--drain",
    "drain",
    default=None,
    metavar="HOST",
    help=(
        "Drain HOST in Slurm with its newest strike "
        "as the reason (scontrol update nodename=HOST state=drain)."
    ),
)
@click.option(
    "--dry-run", is_flag=True, help="With --drain: print the scontrol command; run nothing."
)
def nodes(path, as_json, drain, dry_run):
    """The site's node ledger: per host its strikes (decayed score), state ok/suspect/quarantined
    and last evidence."""
    try:
        sys.exit(_nodes(path, as_json, drain, dry_run))
    except LaunchError as e:
        click.echo(f"launch: error: {e}", err=True)
        sys.exit(e.exit_code)


def _nodes(path, as_json: bool, drain: str | None, dry_run: bool) -> int:
    if not path:
        raise LaunchError("no node ledger: give --node-ledger FILE or set LAUNCH_NODE_LEDGER")
    path = siteledger.option(path)
    led, why = ledgerfile.load(path)
    if why:
        raise LaunchError(why)
    if drain is not None:
        return _drain(siteledger.drain_argv(drain, led), dry_run)
    rows = siteledger.rows(led)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return 0
    from ..runjson import age
    from ..show import table

    now = time.time()
    table(
        ("HOST", "STATE", "SCORE", "STRIKES", "LAST", "WHEN"),
        [
            (
                r["host"],
                r["state"],
                f"{r['score']:g}",
                r["strikes"],
                r["last"] or "-",
                f"{age(now - r['when'])} ago" if r["when"] else "-",
            )
            for r in rows
        ],
    )
    if not rows:
        click.echo(f"launch: node ledger {path}: no strike recorded", err=True)
    return 0


def _drain(argv: list[str], dry_run: bool) -> int:
    import shlex

    click.echo(shlex.join(argv), err=not dry_run)
    if dry_run:
        return 0
    from ..backends.slurm import cmd

    try:
        p = cmd.run(argv, timeout=60)
    except OSError as e:
        raise LaunchError(
            f"scontrol cannot run here ({e.strerror or e}); drain from a host with Slurm"
        ) from None
    if p.returncode != 0:
        msg = " ".join((p.stderr or p.stdout or "").split())[:300]
        raise LaunchError(f"{argv[2]} not drained: scontrol exit {p.returncode}: {msg}")
    click.echo(f"launch: {argv[2].split('=', 1)[1]} drained", err=True)
    return 0
