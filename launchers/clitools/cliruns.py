"""`launch status|top|logs|list|cancel|wait`: the verbs that look at runs (and stop one), click
only. Registered by name in launchers.cli (LazyGroup.lazy), imported when used; what they call is
imported inside each."""

from __future__ import annotations

import sys

import click

from ..errors import LaunchError
from .clibase import one_line_errors, via_cluster
from .clihelp import EXAMPLES as VERB_EXAMPLES
from .clihelp import Shown, renamed


@click.command(epilog=VERB_EXAMPLES["status"])
@via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--ranks",
    is_flag=True,
    help="Per rank: last step, age of its last progress, step time, straggler.",
)
@click.option(
    "--manifest",
    "with_manifest",
    is_flag=True,
    help=(
        "Also what ran: manifest.json (git commit and diff hash, snapshot, image, command line, "
        "NCCL env, hosts; rank 0's Python/torch/CUDA/NCCL/DeepSpeed versions and package list "
        "hash)."
    ),
)
@one_line_errors
def status(run, as_json, ranks, with_manifest):
    """State, per-node exit codes, first failure, hang, NCCL refusals, snapshot and last step of
    RUN."""
    import json

    from .. import api, show
    from ..records import manifest

    st = api.status(run, ranks=ranks, verify=True)  # the latest checkpoint's sha256 as well
    if with_manifest:
        st["manifest"] = manifest.read(st["run_dir"])
    if as_json:
        click.echo(json.dumps(st, indent=1, sort_keys=True, default=str))
    else:
        show.status(api.format_status(st))  # a terminal: rich tables; otherwise the plain text
        if with_manifest:
            show.status(
                "\n".join(manifest.format_manifest(st["manifest"], manifest.path(st["run_dir"])))
            )


@click.command(epilog=VERB_EXAMPLES["top"])
@click.argument("runs", nargs=-1, metavar="[RUN]...", type=Shown("RUN", complete="run"))
@click.option(
    "--interval",
    default="2",
    show_default=True,
    type=Shown("SECONDS"),
    help="Seconds between refreshes.",
)
@click.option("--once", is_flag=True, help="Print the view once and exit.")
@one_line_errors
def top(runs, interval, once):
    """Live view of RUN's ranks (default: the runs not ended): step, steps/s, ETA, last seen,
    straggler, hang flags; this machine's GPUs. `q` or Ctrl-C quits; the job is never touched."""
    from ..diagnosis import top as view
    from ..options.values import parse_number

    seconds = parse_number("--interval", interval, "a number of seconds from 0.1 up")
    if seconds < 0.1:
        raise LaunchError(
            f"--interval {interval} is out of range; give a number of seconds from 0.1 up"
        )
    view.top(list(runs), seconds, once)


@click.command(epilog=VERB_EXAMPLES["logs"])
@via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option(
    "--rank", default=None, type=Shown("INTEGER"), help="Only this global rank (unprefixed)."
)
@click.option("-f", "--follow", is_flag=True, help="Keep following until the run ends.")
@click.option(
    "--raw", is_flag=True, help="Print the lines as written (terminal control sequences kept)."
)
@one_line_errors
def logs(run, rank, follow, raw):
    """Print RUN's per-rank logs, each line prefixed "[nK rR]" (the last MiB of a larger log)."""
    from .. import api
    from ..options.values import parse_int
    from ..records.rundir import TERMINAL

    tail = api.log_tail(run, parse_int("--rank", rank, 0) if rank is not None else None, raw=raw)
    if follow:
        tail.follow(lambda: api.status(run)["state"] in TERMINAL)
    else:
        tail.poll(final=True)


@click.command(name="list", epilog=VERB_EXAMPLES["list"])
@via_cluster
@click.option(
    "--runs-root",
    "root",
    default=None,
    type=Shown("DIR", complete="dir"),
    help="Runs root (default $LAUNCH_RUNS_ROOT or ./runs).",
)
@renamed("--root", "root", "--runs-root")
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (a list of objects)."
)
@one_line_errors
def list_(root, as_json):
    """Runs, newest first: those under the runs root and, from the runs index, those made
    elsewhere."""
    from .. import api, show

    rows = api.list_runs(root)
    if as_json:
        import json

        click.echo(json.dumps(rows, indent=1))
        return
    show.table(
        ("NAME", "BACKEND", "SHAPE", "STATE", "AGE"),
        [
            (
                r["name"],
                r["backend"],
                r["shape"],
                r["state"] + (f" ({r['reason']})" if r.get("reason") else ""),
                r["age"],
            )
            for r in rows
        ],
    )


@click.command(epilog=VERB_EXAMPLES["cancel"])
@via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object on stdout: the run's state, `cancelled`.",
)
@one_line_errors
def cancel(run, as_json):
    """Stop RUN on every node (scancel on Slurm); nothing of it keeps running.

    A run that already ended (COMPLETED, FAILED, CANCELLED) is left as it is: one line on stderr
    says so and the exit code is 0 (nothing of it runs, as asked).
    """
    from .. import api, runjson
    from ..records import runindex

    run = runindex.resolve(run)  # a run name or a Slurm job id too
    ended = api.cancel(run)
    if as_json:
        runjson.emit(dict(runjson.run_record(run), cancelled=not ended))
    elif ended:
        click.echo(f"launch: run {run} already ended ({ended}); nothing to cancel", err=True)
    else:
        click.echo(f"cancelled {run}")


@click.command(name="wait", epilog=VERB_EXAMPLES["wait"])
@via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option(
    "--timeout",
    default=None,
    type=Shown("SECONDS"),
    help="Seconds to wait at most; then exit 124 (as timeout(1)), the run left as it is.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object on stdout: the run's end (exit_code)."
)
@one_line_errors
def wait_(run, timeout, as_json):
    """Follow RUN until it ends; exit 0 only if every rank succeeded (124: --timeout ran out)."""
    from .. import api, runjson
    from ..records import runindex
    from ..spec import parse_seconds

    secs, run = (
        parse_seconds("--timeout", timeout) if timeout is not None else None,
        runindex.resolve(run),
    )
    sys.exit(runjson.waited(as_json, run, lambda: api.wait(run, timeout=secs)))
