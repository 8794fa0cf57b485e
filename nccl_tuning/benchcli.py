"""`launch nccl bench` and `launch nccl sweep` (click commands only): one bench job through the
launcher, or one per candidate preset and the recommendation. Registered on the `nccl` group by
nccl_tuning.cli. Each option's text goes as given to the bench's own parsers (runner.BenchConfig,
sweep.plan): help only shows its kind."""

from __future__ import annotations

import json
import os
import sys

import click

from launchers.clitools.clihelp import renamed

from .cliopts import OPS, PASS, Shown, bench_config, bench_options, fail
from .errors import NcclTuningError


@click.command("bench", context_settings=PASS)
@bench_options
@click.option(
    "--repeats",
    default=1,
    show_default=True,
    type=int,
    help="Timed blocks per size (their spread is the noise estimate).",
)
@click.option(
    "--nccl-preset",
    "preset",
    default=None,
    type=Shown("PRESET[,PRESET]"),
    help="NCCL preset(s) for the job, e.g. moe or moe,roce or ./mine.yaml (as `launch BACKEND`'s).",
)
@renamed("--preset", "preset", "--nccl-preset")
@click.option(
    "--run-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Run directory (default: <runs root>/nccl-bench-...).",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help=(
        "Directory to also write results.csv into (made if missing; a results.csv there is never "
        "overwritten)."
    ),
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=(
        "One JSON object on stdout (run dir, results file, exit code, rows); the job's output "
        "on stderr."
    ),
)
def bench_cmd(
    backend,
    nodes,
    gpus_per_node,
    ops,
    min_bytes,
    max_bytes,
    warmup,
    iters,
    launch_args,
    repeats,
    preset,
    run_dir,
    out_dir,
    as_json,
):
    """Run nccl_tuning.bench through the launcher; results.csv lands in the run dir (and in --out
    DIR).

    Other options (e.g. --partition gpu --time 00:20:00, --hostfile hosts, --env K=V) go to
    `launch BACKEND`."""
    from . import runner

    try:
        cfg = bench_config(
            backend,
            nodes,
            gpus_per_node,
            ops,
            min_bytes,
            max_bytes,
            warmup,
            iters,
            repeats,
            launch_args,
        )
        run_dir = _new_run_dir(run_dir, preset)
        out_csv = _out_csv(out_dir)
        runner.dry_run(cfg, run_dir, preset)
    except NcclTuningError as e:
        fail(e)
    click.echo(
        f"nccl bench: {cfg.backend} {cfg.nodes}x{cfg.gpus_per_node}, preset "
        f"{preset or '(none)'}, run dir {run_dir}",
        err=True,
    )
    code, rows = runner.run(cfg, run_dir, preset, stdout=sys.stderr if as_json else None)
    _report(code, rows, run_dir, out_csv, preset, as_json)


def _new_run_dir(run_dir, preset) -> str:
    """--run-dir (default: <runs root>/nccl-bench-<preset>), absolute; an existing one is never
    reused."""
    from . import runner

    run_dir = os.path.abspath(
        run_dir
        or runner.default_run_dir(
            "nccl-bench-" + (preset or "none").replace(",", "+").replace("/", "_")
        )
    )
    if os.path.exists(run_dir):
        raise NcclTuningError(f"--run-dir {run_dir} exists; results are never overwritten")
    return run_dir


def _report(code, rows, run_dir, out_csv, preset, as_json) -> None:
    """The bench job's end: its table (or one JSON object), results.csv copied to --out, exit its
    code if it failed."""
    from . import results as R

    if rows and not as_json:
        click.echo(
            R.format_table(rows, f"nccl_tuning.bench  preset {preset or '(none)'}  {run_dir}"),
            nl=False,
        )
    failed = code != 0 or not rows
    if failed:
        click.echo(
            f"launch: error: the bench job failed (exit {code}); see: launch status "
            f"{run_dir} ; launch logs {run_dir}",
            err=True,
        )
    elif out_csv:
        os.makedirs(os.path.dirname(out_csv), exist_ok=True)
        R.write_csv(out_csv, rows)
    results = None if failed else out_csv or os.path.join(run_dir, "results.csv")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "run_dir": run_dir,
                    "preset": preset,
                    "results": results,
                    "exit_code": (code or 1) if failed else 0,
                    "rows": rows,
                }
            )
        )
    elif results:
        click.echo(f"results: {results}")
    if failed:
        sys.exit(code or 1)


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


SWEEP_NOTE = (
    "launch: note: --presets is renamed --nccl-preset, given once per candidate (`,` combines, as "
    "everywhere: --nccl-preset moe,roce); --presets will be refused in the next release"
)


@click.command("sweep", context_settings=PASS)
@bench_options
@click.option(
    "--repeats",
    default=3,
    show_default=True,
    type=int,
    help="Timed blocks per size (their spread is the noise estimate).",
)
@click.option(
    "--nccl-preset",
    "candidates",
    multiple=True,
    type=Shown("PRESET[,PRESET]"),
    help=(
        "A candidate (repeatable), e.g. --nccl-preset moe --nccl-preset moe,roce --nccl-preset "
        "./mine.yaml; `,` combines presets into one candidate; default is always run as the "
        "baseline."
    ),
)
@renamed("--presets", "presets", "--nccl-preset", SWEEP_NOTE)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="New directory for everything the sweep writes (results.csv, plots/, runs/, ...).",
)
@click.option(
    "--workload",
    default=None,
    type=Shown(choices=("moe", "dense")),
    help="moe (all_to_all dominates) or dense (all_reduce, reduce_scatter, all_gather).",
)
@click.option(
    "--dominant",
    default=None,
    type=Shown("OP[,OP]", OPS, listed=True),
    help="Ops the recommendation weighs (default: from --workload, else all).",
)
@click.option(
    "--noise",
    default=5.0,
    show_default=True,
    type=float,
    help="Minimum gain in percent that counts (raised to the measured spread).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=(
        "recommendation.yaml's content as one JSON object on stdout (with the out dir); "
        "progress on stderr."
    ),
)
def sweep_cmd(
    backend,
    nodes,
    gpus_per_node,
    ops,
    min_bytes,
    max_bytes,
    warmup,
    iters,
    launch_args,
    repeats,
    candidates,
    out,
    workload,
    dominant,
    noise,
    presets=None,
    as_json=False,
):
    """Bench every preset (one job each), then results.csv, plots, recommendation.yaml,
    tuner.csv."""
    from . import sweep as S

    try:
        if not candidates and not presets:
            raise NcclTuningError(
                "no candidate preset; give --nccl-preset PRESET once per candidate, e.g. "
                "--nccl-preset moe --nccl-preset moe,roce"
            )
        presets = ",".join(c.replace(",", "+") for c in candidates) if candidates else presets
        cfg = bench_config(
            backend,
            nodes,
            gpus_per_node,
            ops,
            min_bytes,
            max_bytes,
            warmup,
            iters,
            repeats,
            launch_args,
        )
        if noise < 0:
            raise NcclTuningError(f"--noise {noise} must be >= 0 (percent)")
        names, dom, envs = S.plan(presets, out, workload, dominant, ops=cfg.ops)
        say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
        done = S.run(cfg, names, out, echo=say)
        rec = S.write_outputs(out, done, dom, noise, workload, envs, cfg.nodes)
    except NcclTuningError as e:
        fail(e)
    if as_json:
        click.echo(json.dumps({"out": os.path.abspath(out), **rec}, default=str))
    say(f"recommended: {rec['recommended']} ({rec['reason']})")
    for key in ("caveat", "caveat_backend"):
        if rec.get(key):
            say(f"caveat: {rec[key]}")
    say(f"wrote {out}/results.csv, {out}/plots/, {out}/recommendation.yaml, {out}/tuner.csv")
    if rec["failed_presets"]:
        click.echo(f"launch: error: preset(s) {', '.join(rec['failed_presets'])} failed", err=True)
        sys.exit(1)
