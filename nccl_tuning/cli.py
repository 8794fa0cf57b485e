"""`launch nccl ...`: list, show and check NCCL presets (click commands only: parse, call, print).

Registered in launchers/cli.py with `main.add_command(nccl)`; also runs as
`python -m nccl_tuning.cli`.
"""
from __future__ import annotations

import os
import sys

import click

from . import apply as A
from . import presets as P
from .errors import NcclTuningError
from .knowledge import vstr
from .validate import has_errors, validate

_preset_dirs = click.option("--preset-dir", "preset_dirs", multiple=True,
                            type=click.Path(file_okay=False),
                            help="Extra directory of preset YAML files (searched first).")


def _fail(err: Exception):
    click.echo(f"launch: error: {err}", err=True)
    sys.exit(2)


@click.group("nccl")
def nccl():
    """NCCL presets: list, show and check them."""


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
@_preset_dirs
def check_cmd(preset, env_items, env_file, nccl_version, production, preset_dirs):
    """Validate a preset, variables, an env file, or (given none) this shell's NCCL_* variables.

    Exits 1 when any finding is an error."""
    try:
        version = A.select_version(nccl_version)
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
            env = {k: v for k, v in os.environ.items()
                   if k.startswith(("NCCL_", "TORCH_NCCL_"))}
            if not env:
                click.echo(f"no NCCL_* variables in the environment (NCCL {vstr(version)} rules)")
                return
    except NcclTuningError as e:
        _fail(e)
    findings += validate(env, version, production)
    for f in findings:
        click.echo(str(f))
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "note")}
    click.echo(f"checked {len(env)} variable(s) with NCCL {vstr(version)} rules: "
               f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['note']} note(s)")
    if has_errors(findings):
        sys.exit(1)


if __name__ == "__main__":
    nccl(prog_name="python -m nccl_tuning.cli")
