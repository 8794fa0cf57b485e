"""`launch nccl import` and `launch nccl infolog` (click commands only): nccl-tests output read into
bench rows (nccltests), an NCCL_DEBUG=INFO log summarized (infolog). Registered on the `nccl` group
by nccl_tuning.cli.
"""

from __future__ import annotations

import json
import sys

import click

from launchers.clitools.clihelp import renamed

from .cliopts import fail
from .errors import NcclTuningError


@click.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--csv",
    "out",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the rows to this CSV file (a results.csv; never overwrites).",
)
@renamed("--out", "out", "--csv", type=click.Path(dir_okay=False))
@click.option(
    "--nccl-preset",
    "label",
    default=None,
    metavar="PRESET",
    help="The preset the rows were measured with (adds a preset column).",
)
@renamed("--preset", "label", "--nccl-preset")
@click.option(
    "--op",
    default=None,
    metavar="OP",
    help=(
        "Collective of the tables whose text names none (all_reduce, "
        "all_gather, reduce_scatter, all_to_all, broadcast, reduce, sendrecv, ...)."
    ),
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=(
        "One JSON object on stdout: every run read (its rows, average bus bandwidth, NCCL "
        "version, warnings, notes) and the errors; the tables are not printed."
    ),
)
def import_cmd(files, out, label, op, as_json):
    """Read nccl-tests output (all_reduce_perf & co, text) into bench rows; print the table.

    Every table of a file is one run (a `run` column) with its own collective; a row that is cut,
    mixed with other output or split by log lines is reported as one error line and the command
    exits 1 (nothing written with --csv). Notes say what the paste lacks (ranks, rows the file's
    footer counted)."""
    from . import nccltable, nccltests
    from . import results as R

    rows, errors, runs = [], [], []
    try:
        for path in files:
            for run in nccltests.parse_runs_file(path, op):
                errors += run.errors + run.failures
                if as_json:
                    runs.append(_run_json(path, run))
                    rows += run.rows
                    continue
                _said(run)
                if run.rows:
                    click.echo(
                        R.format_table(
                            run.rows,
                            f"imported from {path}, run {run.index} (table at line {run.line})",
                        ),
                        nl=False,
                    )
                    click.echo(_avg_line(run))
                for note in run.notes():
                    click.echo(f"note: {note}")
                rows += run.rows
        if as_json:
            click.echo(json.dumps({"runs": runs, "errors": errors}, default=str))
        for e in errors:
            click.echo(f"launch: error: {e}", err=True)
        if not rows:
            raise NcclTuningError(
                f"{', '.join(files)}: no complete nccl-tests row"
                + (f" ({len(errors)} row(s) could not be read, above)" if errors else "")
            )
        if errors:
            if out:
                click.echo(
                    f"launch: error: {out} not written: {len(errors)} row(s) could not be read",
                    err=True,
                )
            sys.exit(1)
        if out:
            cols = nccltable.CSV_COLUMNS
            if label:
                rows = [{**r, "preset": label} for r in rows]
                cols = ("preset", *cols)
            R.write_csv(out, rows, cols)
    except NcclTuningError as e:
        fail(e)


def _run_json(path, run) -> dict:
    """One run of a file as `launch nccl import --json` gives it."""
    return {
        "file": path,
        "run": run.index,
        "line": run.line,
        "op": run.op,
        "rows": run.rows,
        "avg_busbw": run.avg_busbw if run.rows else None,
        "nccl_version": run.nccl_version,
        "warnings": list(run.warnings),
        "errors": list(run.errors) + list(run.failures),
        "notes": list(run.notes()),
    }


def _said(run) -> None:
    """What the file says besides its rows: the NCCL version of the banner, each NCCL WARN line."""
    if run.nccl_version:
        click.echo(
            f"# run {run.index}: NCCL {run.nccl_version} (the nccl-tests banner's nccl-library)"
        )
    for w in run.warnings:
        click.echo(f"launch: warning: {w}", err=True)


def _avg_line(run) -> str:
    said = f"; the file says {run.printed_avg:g}" if run.printed_avg is not None else ""
    oob = f"; its out of bounds values: {run.printed_oob}" if run.printed_oob else ""
    return (
        f"# run {run.index} ({run.op}): {len(run.rows)} row(s), average bus bandwidth "
        f"{run.avg_busbw:.6g} GB/s (mean of out-of-place and in-place, as nccl-tests "
        f"computes it{said}){oob}"
    )


@click.command("infolog")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=(
        "One JSON object on stdout: what the log says, and `choices` "
        "summarized per collective and size range (`summary`)."
    ),
)
def infolog_cmd(file, as_json):
    """Summarize an NCCL_DEBUG=INFO log: version, network, channels, chosen algo/proto, refusals."""
    from . import infolog

    try:
        text = open(file, errors="replace").read()
    except OSError as e:
        fail(NcclTuningError(f"{file}: cannot read it ({e.strerror})"))
    info = infolog.parse_info_log(text)
    if as_json:
        click.echo(
            json.dumps(
                dict(info, summary=infolog.summarize_choices(info["choices"])),
                indent=1,
                default=str,
            )
        )
        sys.exit(1 if info.get("refusals") or info.get("failures") else 0)
    click.echo(
        f"NCCL {info['version'] or '?'}  network {info['network'] or '?'}  channels "
        f"{info['channels'] or '?'} (coll {info['coll_channels'] or '?'}, p2p "
        f"{info['p2p_channels'] or '?'})"
    )
    for g in infolog.summarize_choices(info["choices"]):
        click.echo(
            f"  {g['collective']:<14} {g['min_bytes']:>12}..{g['max_bytes']:<12} "
            f"{g['algo']}/{g['proto']}  ({g['calls']} calls)"
        )
    if not info["choices"]:
        click.echo(
            "  no algorithm choice lines ('... Bytes -> Algo ... proto ...') in the log: "
            "they are printed with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS including TUNING"
        )
    elif any(c["collective"] is None for c in info["choices"]):
        click.echo(
            f"  {infolog.UNNAMED}: choice lines without the collective's name (NCCL "
            f"2.20-2.22 print them so, for rank 0)"
        )
    if info["ib"]:
        click.echo(f"  NET/IB: {', '.join(info['ib']['devices']) or '?'} (OOB {info['ib']['oob']})")
    for msg, n, first in info["warnings"]:
        click.echo(f"warning: {first}" + (f" ({n} times)" if n > 1 else ""))
    for line in info["refusals"] + [f"failed: {f}" for f in info["failures"]]:
        click.echo(line if line.startswith("failed: ") else f"refused: {line}")
    if info["refusals"] or info["failures"]:
        sys.exit(1)
