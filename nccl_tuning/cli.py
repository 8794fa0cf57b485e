"""`launch nccl ...`: list, show, check presets; bench, sweep, import (click commands only).

Registered in launchers/cli.py with `main.add_command(nccl)`; also runs as
`python -m nccl_tuning.cli`.
"""
from __future__ import annotations

import json
import os
import sys

import click

from launchers.clihelp import renamed
from launchers.errors import LaunchError

from . import apply as A
from . import presets as P
from .benchcli import bench_cmd, sweep_cmd
from .errors import NcclTuningError
from .knowledge import vstr
from .validate import has_errors, validate

IF_VARS = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")

_preset_dirs = click.option("--preset-dir", "preset_dirs", multiple=True,
                            type=click.Path(file_okay=False),
                            help="Extra directory of preset YAML files (searched first).")


def _fail(err: Exception):
    click.echo(f"launch: error: {err}", err=True)
    sys.exit(2)


@click.group("nccl", invoke_without_command=True)
@click.pass_context
def nccl(ctx):
    """NCCL presets (list, show, check); collective bench, preset sweep, nccl-tests import."""
    if ctx.invoked_subcommand is None:            # bare `launch nccl`: the help, exit 0
        click.echo(ctx.get_help())


nccl.add_command(bench_cmd)
nccl.add_command(sweep_cmd)


@nccl.command("list")
@_preset_dirs
@click.option("--json", "as_json", is_flag=True, help="A JSON list on stdout: name, vars, affects, description.")
def list_cmd(preset_dirs, as_json):
    """Presets with their purpose and the collectives they affect."""
    try:
        items = P.list_presets(preset_dirs)
    except NcclTuningError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps([{"name": p.name, "affects": list(p.affects), "vars": {k: v[0] if isinstance(
                                    v, (tuple, list)) else v for k, v in p.vars.items()},
                                "description": p.description} for p in items], indent=1))
        return
    width = max(len(p.name) for p in items)
    for p in items:
        affects = ",".join(p.affects) or "-"
        click.echo(f"{p.name:<{width}}  {len(p.vars):>2} vars  affects {affects:<28}  "
                   f"{p.description}")


@nccl.command("show")
@click.argument("preset")
@click.option("--format", "fmt", type=click.Choice(A.FORMATS), default="env", show_default=True,
              help="env (NAME=value lines), yaml (a profile's env), conf (nccl.conf) or sbatch (export lines).")
@click.option("--run-dir", default=None, type=click.Path(file_okay=False), help="Fill the {run_dir} placeholder.")
@_preset_dirs
def show_cmd(preset, fmt, run_dir, preset_dirs):
    """The variables of PRESET (e.g. moe or moe,roce or ./mine.yaml), each with its reason."""
    try:
        click.echo(A.render(preset, fmt, run_dir, preset_dirs), nl=False)
    except NcclTuningError as e:
        _fail(e)


@nccl.command("check")
@click.argument("preset", required=False)
@click.option("--env", "env_items", multiple=True, metavar="NAME=VALUE",
              help="A variable to check (repeatable); overrides the preset's value.")
@click.option("--env-file", type=click.Path(dir_okay=False),
              help="A file of NAME=value lines (env file or nccl.conf).")
@click.option("--nccl-version", default=None, metavar="VERSION",
              help="Rules of this NCCL version (default: installed nvidia-nccl, else newest known).")
@click.option("--production/--testing", default=True, show_default=True,
              help="In production, debugging-class variables are warnings.")
@click.option("--on", "on_nodes", multiple=True, metavar="NODE",
              help="A node `launch doctor` has seen (repeatable): say which of its interfaces and HCA "
                   "ports NCCL_SOCKET_IFNAME and NCCL_IB_HCA select there.")
@_preset_dirs
def check_cmd(preset, env_items, env_file, nccl_version, production, on_nodes, preset_dirs):
    """Validate a preset, variables, an env file, or (given none) this shell's NCCL_* variables.

    Exits 1 when any finding is an error."""
    try:
        version = A.select_version(nccl_version)
        nodes = _nodes(on_nodes)
        env, findings = _check_env(preset, env_file, env_items, version, preset_dirs)
        if env is None:
            click.echo(f"no NCCL_* variables in the environment (NCCL {vstr(version)} rules)")
            return
    except (NcclTuningError, LaunchError) as e:
        _fail(e)
    findings += _on_nodes(env, version, production, nodes)
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "note")}
    from .ncclsrc import rules_tag
    tag = vstr(rules_tag(version)[0])
    rules = f"NCCL {vstr(version)}" + ("" if tag == vstr(version) else f" (rules read from {tag})")
    where = f" on {', '.join(r['node'] for r in nodes)}" if nodes else ""
    click.echo(f"checked {len(env)} variable(s) with {rules} rules{where}: "
               f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['note']} note(s)")
    if has_errors(findings):
        sys.exit(1)


def _check_env(preset, env_file, env_items, version, preset_dirs):
    """(the variables to check, the preset's own findings); (None, []) when there are none at all."""
    env, findings = {}, []
    if preset:
        presets, env, _ = P.combine(preset, preset_dirs)
        findings += A.check_min_nccl(presets, version)
    if env_file:
        try:
            text = open(env_file).read()
        except OSError as e:
            raise NcclTuningError(f"--env-file {env_file}: cannot read it ({e.strerror})")
        env.update(A.parse_env_lines(text, env_file))
    env.update(A.parse_env_args(env_items))
    if not (preset or env_file or env_items):
        env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))}
    return (env, findings) if env else (None, [])


def _nodes(names):
    """--on NODE...: each node's facts from launch doctor's cache (launchers.nodefacts)."""
    if not names:
        return []
    from launchers import nodefacts
    return [nodefacts.find(n) for n in dict.fromkeys(names)]


def _on_nodes(env, version, production, nodes) -> list:
    """Prints the findings and returns them: without --on, validate(env) as is; with it, the findings of
    NCCL_SOCKET_IFNAME and NCCL_IB_HCA per node, with what they select among that node's devices."""
    findings = validate(env, version, production)
    if nodes:
        findings = [f for f in findings if f.variable not in IF_VARS]
    for f in findings:
        click.echo(str(f))
    picked = {k: v for k, v in env.items() if k in IF_VARS}
    from launchers import nodefacts
    for rec in nodes:
        click.echo(nodefacts.describe(rec))
        mine = [f for f in validate(picked, version, production, devices=nodefacts.devices(rec))
                if f.variable in IF_VARS]
        for f in mine:
            click.echo(f"  {f}")
        findings += mine
    return findings


@nccl.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--csv", "out", default=None, type=click.Path(dir_okay=False),
              help="Write the rows to this CSV file (a results.csv; never overwrites).")
@renamed("--out", "out", "--csv", type=click.Path(dir_okay=False))
@click.option("--nccl-preset", "label", default=None, metavar="PRESET",
              help="The preset the rows were measured with (adds a preset column).")
@renamed("--preset", "label", "--nccl-preset")
@click.option("--op", default=None, metavar="OP", help="Collective of the tables whose text names none (all_reduce, "
              "all_gather, reduce_scatter, all_to_all, broadcast, reduce, sendrecv, ...).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout: every run read (its rows, "
              "average bus bandwidth, NCCL version, warnings, notes) and the errors; the tables are not printed.")
def import_cmd(files, out, label, op, as_json):
    """Read nccl-tests output (all_reduce_perf & co, text) into bench rows; print the table.

    Every table of a file is one run (a `run` column) with its own collective; a row that is cut,
    mixed with other output or split by log lines is reported as one error line and the command
    exits 1 (nothing written with --csv). Notes say what the paste lacks (ranks, rows the file's
    footer counted)."""
    from . import nccltests
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
                    click.echo(R.format_table(run.rows, f"imported from {path}, run {run.index} "
                                              f"(table at line {run.line})"), nl=False)
                    click.echo(_avg_line(run))
                for note in run.notes():
                    click.echo(f"note: {note}")
                rows += run.rows
        if as_json:
            click.echo(json.dumps({"runs": runs, "errors": errors}, default=str))
        for e in errors:
            click.echo(f"launch: error: {e}", err=True)
        if not rows:
            raise NcclTuningError(f"{', '.join(files)}: no complete nccl-tests row"
                                  + (f" ({len(errors)} row(s) could not be read, above)"
                                     if errors else ""))
        if errors:
            if out:
                click.echo(f"launch: error: {out} not written: {len(errors)} row(s) could not be "
                           f"read", err=True)
            sys.exit(1)
        if out:
            cols = nccltests.CSV_COLUMNS
            if label:
                rows = [{**r, "preset": label} for r in rows]
                cols = ("preset", *cols)
            R.write_csv(out, rows, cols)
    except NcclTuningError as e:
        _fail(e)


def _run_json(path, run) -> dict:
    """One run of a file as `launch nccl import --json` gives it."""
    return {"file": path, "run": run.index, "line": run.line, "op": run.op, "rows": run.rows,
            "avg_busbw": run.avg_busbw if run.rows else None, "nccl_version": run.nccl_version,
            "warnings": list(run.warnings), "errors": list(run.errors) + list(run.failures),
            "notes": list(run.notes())}


def _said(run) -> None:
    """What the file says besides its rows: the NCCL version of the banner, each NCCL WARN line."""
    if run.nccl_version:
        click.echo(f"# run {run.index}: NCCL {run.nccl_version} (the nccl-tests banner's nccl-library)")
    for w in run.warnings:
        click.echo(f"launch: warning: {w}", err=True)


def _avg_line(run) -> str:
    said = f"; the file says {run.printed_avg:g}" if run.printed_avg is not None else ""
    oob = f"; its out of bounds values: {run.printed_oob}" if run.printed_oob else ""
    return (f"# run {run.index} ({run.op}): {len(run.rows)} row(s), average bus bandwidth "
            f"{run.avg_busbw:.6g} GB/s (mean of out-of-place and in-place, as nccl-tests "
            f"computes it{said}){oob}")


@nccl.command("infolog")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout: what the log says, and `choices` "
              "summarized per collective and size range (`summary`).")
def infolog_cmd(file, as_json):
    """Summarize an NCCL_DEBUG=INFO log: version, network, channels, chosen algo/proto, refusals."""
    from . import infolog
    try:
        text = open(file, errors="replace").read()
    except OSError as e:
        _fail(NcclTuningError(f"{file}: cannot read it ({e.strerror})"))
    info = infolog.parse_info_log(text)
    if as_json:
        click.echo(json.dumps(dict(info, summary=infolog.summarize_choices(info["choices"])), indent=1, default=str))
        sys.exit(1 if info.get("refusals") or info.get("failures") else 0)
    click.echo(f"NCCL {info['version'] or '?'}  network {info['network'] or '?'}  channels "
               f"{info['channels'] or '?'} (coll {info['coll_channels'] or '?'}, p2p "
               f"{info['p2p_channels'] or '?'})")
    for g in infolog.summarize_choices(info["choices"]):
        click.echo(f"  {g['collective']:<14} {g['min_bytes']:>12}..{g['max_bytes']:<12} "
                   f"{g['algo']}/{g['proto']}  ({g['calls']} calls)")
    if not info["choices"]:
        click.echo("  no algorithm choice lines ('... Bytes -> Algo ... proto ...') in the log: "
                   "they are printed with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS including TUNING")
    elif any(c["collective"] is None for c in info["choices"]):
        click.echo(f"  {infolog.UNNAMED}: choice lines without the collective's name (NCCL "
                   f"2.20-2.22 print them so, for rank 0)")
    if info["ib"]:
        click.echo(f"  NET/IB: {', '.join(info['ib']['devices']) or '?'} (OOB {info['ib']['oob']})")
    for msg, n, first in info["warnings"]:
        click.echo(f"warning: {first}" + (f" ({n} times)" if n > 1 else ""))
    for line in info["refusals"] + [f"failed: {f}" for f in info["failures"]]:
        click.echo(line if line.startswith("failed: ") else f"refused: {line}")
    if info["refusals"] or info["failures"]:
        sys.exit(1)


if __name__ == "__main__":
    nccl(prog_name="python -m nccl_tuning.cli")
