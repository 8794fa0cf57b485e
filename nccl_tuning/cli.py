"""`launch nccl ...`: list, show, check presets; bench, sweep, import (click commands only).

Registered in launchers/cli.py with `main.add_command(nccl)`; also runs as
`python -m nccl_tuning.cli`.
"""
from __future__ import annotations

import os
import sys

import click

from launchers.errors import LaunchError

from . import apply as A
from . import presets as P
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


@click.group("nccl")
def nccl():
    """NCCL presets (list, show, check); collective bench, preset sweep, nccl-tests import."""


@nccl.command("list")
@_preset_dirs
def list_cmd(preset_dirs):
    """Presets with their purpose and the collectives they affect."""
    try:
        items = P.list_presets(preset_dirs)
    except NcclTuningError as e:
        _fail(e)
    width = max(len(p.name) for p in items)
    for p in items:
        affects = ",".join(p.affects) or "-"
        click.echo(f"{p.name:<{width}}  {len(p.vars):>2} vars  affects {affects:<28}  "
                   f"{p.description}")


@nccl.command("show")
@click.argument("preset")
@click.option("--format", "fmt", type=click.Choice(A.FORMATS), default="env", show_default=True)
@click.option("--run-dir", default=None, help="Fill the {run_dir} placeholder.")
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
@click.option("--nccl-version", default=None,
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


PASS = {"ignore_unknown_options": True, "allow_interspersed_args": True,
        "help_option_names": ["-h", "--help"]}
_OPS = "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast"


def _bench_options(fn):
    opts = [
        click.option("--backend", default="local", show_default=True, help="local, ssh or slurm."),
        click.option("--nodes", default="1", show_default=True),
        click.option("--gpus-per-node", default="1", show_default=True, help="Ranks per node."),
        click.option("--ops", default=_OPS, show_default=True),
        click.option("--min-bytes", default="1K", show_default=True),
        click.option("--max-bytes", default="256M", show_default=True),
        click.option("--warmup", default=5, show_default=True, type=int),
        click.option("--iters", default=20, show_default=True, type=int),
        click.argument("launch_args", nargs=-1, type=click.UNPROCESSED),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _config(backend, nodes, gpus_per_node, ops, min_bytes, max_bytes, warmup, iters, repeats,
            launch_args):
    from .runner import BenchConfig
    extra = list(launch_args)
    if "--" in extra:
        raise NcclTuningError("nothing goes after `--`: the program is nccl_tuning.bench; pass "
                              "backend options (e.g. --partition gpu) before it")
    cfg = BenchConfig.build(backend, nodes, gpus_per_node, ops, min_bytes, max_bytes, warmup,
                            iters, repeats, extra)
    _check_launch_args(backend, extra)
    return cfg


def _check_launch_args(backend, extra):
    """Options we pass on must be `launch BACKEND` options (else it would take them as a program)."""
    from launchers.runopts import BACKENDS, cli_flags   # the one declaration of every backend's options
    if backend not in BACKENDS:
        return
    ours = {"--nodes", "--gpus-per-node", "--run-dir", "--nccl-preset", "--dry-run",
            "--sweep", "--max-parallel", "--after"}     # a bench is one run (its results.csv), never a sweep
    known = cli_flags(backend) - ours - {"-h", "--help"}
    for a in extra:
        name = a.split("=", 1)[0]
        if a.startswith("-") and name not in known:
            raise NcclTuningError(f"option {name!r} is neither a bench option nor one `launch "
                                  f"{backend}` accepts (accepted there: {', '.join(sorted(known))})")


@nccl.command("bench", context_settings=PASS)
@_bench_options
@click.option("--repeats", default=1, show_default=True, type=int,
              help="Timed blocks per size (their spread is the noise estimate).")
@click.option("--preset", default=None, help="NCCL preset(s) for the job, e.g. moe or moe,roce.")
@click.option("--run-dir", default=None, help="Run directory (default: <runs root>/nccl-bench-...).")
@click.option("--out", "out_dir", default=None, help="Also write results.csv into this directory.")
def bench_cmd(backend, nodes, gpus_per_node, ops, min_bytes, max_bytes, warmup, iters, launch_args,
              repeats, preset, run_dir, out_dir):
    """Run nccl_tuning.bench through the launcher; results.csv lands in the run dir (and in --out DIR).

    Other options (e.g. --partition gpu --time 00:20:00, --hostfile hosts, --env K=V) go to
    `launch BACKEND`."""
    from . import results as R
    from . import runner
    try:
        cfg = _config(backend, nodes, gpus_per_node, ops, min_bytes, max_bytes, warmup, iters,
                      repeats, launch_args)
        run_dir = os.path.abspath(run_dir or runner.default_run_dir(
            "nccl-bench-" + (preset or "none").replace(",", "+").replace("/", "_")))
        if os.path.exists(run_dir):
            raise NcclTuningError(f"--run-dir {run_dir} exists; results are never overwritten")
        out_csv = _out_csv(out_dir)
        runner.dry_run(cfg, run_dir, preset)
    except NcclTuningError as e:
        _fail(e)
    click.echo(f"nccl bench: {cfg.backend} {cfg.nodes}x{cfg.gpus_per_node}, preset "
               f"{preset or '(none)'}, run dir {run_dir}", err=True)
    code, rows = runner.run(cfg, run_dir, preset)
    if rows:
        click.echo(R.format_table(rows, f"nccl_tuning.bench  preset {preset or '(none)'}  "
                                        f"{run_dir}"), nl=False)
    if code != 0 or not rows:
        click.echo(f"launch: error: the bench job failed (exit {code}); see: launch status "
                   f"{run_dir} ; launch logs {run_dir}", err=True)
        sys.exit(code or 1)
    if out_csv:
        os.makedirs(os.path.dirname(out_csv), exist_ok=True)
        R.write_csv(out_csv, rows)
    click.echo(f"results: {out_csv or os.path.join(run_dir, 'results.csv')}")


def _out_csv(out_dir):
    """--out DIR -> DIR/results.csv; an existing results.csv there is never overwritten."""
    if out_dir is None:
        return None
    path = os.path.join(os.path.abspath(out_dir), "results.csv")
    if os.path.exists(path):
        raise NcclTuningError(f"--out {out_dir}: {path} exists; results are never overwritten")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NcclTuningError(f"--out {out_dir} is not a directory")
    return path


@nccl.command("sweep", context_settings=PASS)
@_bench_options
@click.option("--repeats", default=3, show_default=True, type=int,
              help="Timed blocks per size (their spread is the noise estimate).")
@click.option("--presets", required=True, help="Candidates, e.g. default,moe,dense,moe+roce,"
              "./mine.yaml (default is always run as the baseline).")
@click.option("--out", required=True, help="New directory for everything the sweep writes.")
@click.option("--workload", default=None, help="moe (all_to_all dominates) or dense (all_reduce, "
              "reduce_scatter, all_gather).")
@click.option("--dominant", default=None, help="Ops the recommendation weighs (default: from "
              "--workload, else all).")
@click.option("--noise", default=5.0, show_default=True, type=float,
              help="Minimum gain in percent that counts (raised to the measured spread).")
def sweep_cmd(backend, nodes, gpus_per_node, ops, min_bytes, max_bytes, warmup, iters, launch_args,
              repeats, presets, out, workload, dominant, noise):
    """Bench every preset (one job each), then results.csv, plots, recommendation.yaml, tuner.csv."""
    from . import sweep as S
    try:
        cfg = _config(backend, nodes, gpus_per_node, ops, min_bytes, max_bytes, warmup, iters,
                      repeats, launch_args)
        if noise < 0:
            raise NcclTuningError(f"--noise {noise} must be >= 0 (percent)")
        names, dom, envs = S.plan(presets, out, workload, dominant, ops=cfg.ops)
        done = S.run(cfg, names, out, echo=click.echo)
        rec = S.write_outputs(out, done, dom, noise, workload, envs, cfg.nodes)
    except NcclTuningError as e:
        _fail(e)
    click.echo(f"recommended: {rec['recommended']} ({rec['reason']})")
    for key in ("caveat", "caveat_backend"):
        if rec.get(key):
            click.echo(f"caveat: {rec[key]}")
    click.echo(f"wrote {out}/results.csv, {out}/plots/, {out}/recommendation.yaml, {out}/tuner.csv")
    if rec["failed_presets"]:
        click.echo(f"launch: error: preset(s) {', '.join(rec['failed_presets'])} failed", err=True)
        sys.exit(1)


@nccl.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", default=None, help="Write the rows as a results.csv (never overwrites).")
@click.option("--preset", "label", default=None, help="Label the rows (adds a preset column).")
@click.option("--op", default=None, help="Collective of the tables whose text names none (all_reduce, "
              "all_gather, reduce_scatter, all_to_all, broadcast, reduce, sendrecv, ...).")
def import_cmd(files, out, label, op):
    """Read nccl-tests output (all_reduce_perf & co, text) into bench rows; print the table.

    Every table of a file is one run (a `run` column) with its own collective; a row that is cut,
    mixed with other output or split by log lines is reported as one error line and the command
    exits 1 (nothing written with --out). Notes say what the paste lacks (ranks, rows the file's
    footer counted)."""
    from . import nccltests
    from . import results as R
    rows, errors = [], []
    try:
        for path in files:
            for run in nccltests.parse_runs_file(path, op):
                errors += run.errors + run.failures
                _said(run)
                if run.rows:
                    click.echo(R.format_table(run.rows, f"imported from {path}, run {run.index} "
                                              f"(table at line {run.line})"), nl=False)
                    click.echo(_avg_line(run))
                for note in run.notes():
                    click.echo(f"note: {note}")
                rows += run.rows
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
def infolog_cmd(file):
    """Summarize an NCCL_DEBUG=INFO log: version, network, channels, chosen algo/proto, refusals."""
    from . import infolog
    try:
        text = open(file, errors="replace").read()
    except OSError as e:
        _fail(NcclTuningError(f"{file}: cannot read it ({e.strerror})"))
    info = infolog.parse_info_log(text)
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
