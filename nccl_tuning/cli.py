"""`launch nccl ...`: list, show, check presets (click commands only); bench and sweep (benchcli),
import and infolog (importcli) are added to the group here.

Registered in launchers/cli.py with `main.add_command(nccl)`; also runs as
`python -m nccl_tuning.cli`.
"""

from __future__ import annotations

import json
import os
import sys

import click

from launchers.errors import LaunchError

from . import apply as A
from . import presets as P
from .benchcli import bench_cmd, sweep_cmd
from .cliopts import fail
from .errors import NcclTuningError
from .importcli import import_cmd, infolog_cmd
from .knowledge import vstr
from .validate import has_errors, validate

IF_VARS = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")

_preset_dirs = click.option(
    "--preset-dir",
    "preset_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Extra directory of preset YAML files (searched first).",
)


@click.group("nccl", invoke_without_command=True)
@click.pass_context
def nccl(ctx):
    """NCCL presets (list, show, check); collective bench, preset sweep, nccl-tests import."""
    if ctx.invoked_subcommand is None:  # bare `launch nccl`: the help, exit 0
        click.echo(ctx.get_help())


nccl.add_command(bench_cmd)
nccl.add_command(sweep_cmd)
nccl.add_command(import_cmd)
nccl.add_command(infolog_cmd)


@nccl.command("list")
@_preset_dirs
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="A JSON list on stdout: name, vars, affects, description.",
)
def list_cmd(preset_dirs, as_json):
    """Presets with their purpose and the collectives they affect."""
    try:
        items = P.list_presets(preset_dirs)
    except NcclTuningError as e:
        fail(e)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": p.name,
                        "affects": list(p.affects),
                        "vars": {
                            k: v[0] if isinstance(v, (tuple, list)) else v
                            for k, v in p.vars.items()
                        },
                        "description": p.description,
                    }
                    for p in items
                ],
                indent=1,
            )
        )
        return
    width = max(len(p.name) for p in items)
    for p in items:
        affects = ",".join(p.affects) or "-"
        click.echo(
            f"{p.name:<{width}}  {len(p.vars):>2} vars  affects {affects:<28}  {p.description}"
        )


@nccl.command("show")
@click.argument("preset")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(A.FORMATS),
    default="env",
    show_default=True,
    help=(
        "env (NAME=value lines), yaml (a profile's env), conf (nccl.conf) or sbatch (export lines)."
    ),
)
@click.option(
    "--run-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Fill the {run_dir} placeholder.",
)
@_preset_dirs
def show_cmd(preset, fmt, run_dir, preset_dirs):
    """The variables of PRESET (e.g. moe or moe,roce or ./mine.yaml), each with its reason."""
    try:
        click.echo(A.render(preset, fmt, run_dir, preset_dirs), nl=False)
    except NcclTuningError as e:
        fail(e)


@nccl.command("check")
@click.argument("preset", required=False)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="A variable to check (repeatable); overrides the preset's value.",
)
@click.option(
    "--env-file",
    type=click.Path(dir_okay=False),
    help="A file of NAME=value lines (env file or nccl.conf).",
)
@click.option(
    "--nccl-version",
    default=None,
    metavar="VERSION",
    help="Rules of this NCCL version (default: installed nvidia-nccl, else newest known).",
)
@click.option(
    "--production/--testing",
    default=True,
    show_default=True,
    help="In production, debugging-class variables are warnings.",
)
@click.option(
    "--on",
    "on_nodes",
    multiple=True,
    metavar="NODE",
    help=(
        "A node `launch doctor` has seen (repeatable): say which of its interfaces and HCA "
        "ports NCCL_SOCKET_IFNAME and NCCL_IB_HCA select there."
    ),
)
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
        fail(e)
    findings += _on_nodes(env, version, production, nodes)
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "note")}
    from .ncclsrc import rules_tag

    tag = vstr(rules_tag(version)[0])
    rules = f"NCCL {vstr(version)}" + ("" if tag == vstr(version) else f" (rules read from {tag})")
    where = f" on {', '.join(r['node'] for r in nodes)}" if nodes else ""
    click.echo(
        f"checked {len(env)} variable(s) with {rules} rules{where}: "
        f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['note']} note(s)"
    )
    if has_errors(findings):
        sys.exit(1)


def _check_env(preset, env_file, env_items, version, preset_dirs):
    """(the variables to check, the preset's own findings); (None, []) when there are none at
    all."""
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
    """--on NODE...: each node's facts from launch doctor's cache
    (launchers.diagnosis.nodefacts)."""
    if not names:
        return []
    from launchers.diagnosis import nodefacts

    return [nodefacts.find(n) for n in dict.fromkeys(names)]


def _on_nodes(env, version, production, nodes) -> list:
    """Prints the findings and returns them: without --on, validate(env) as is; with it, the
    findings of NCCL_SOCKET_IFNAME and NCCL_IB_HCA per node, with what they select among that node's
    devices."""
    findings = validate(env, version, production)
    if nodes:
        findings = [f for f in findings if f.variable not in IF_VARS]
    for f in findings:
        click.echo(str(f))
    picked = {k: v for k, v in env.items() if k in IF_VARS}
    from launchers.diagnosis import nodefacts

    for rec in nodes:
        click.echo(nodefacts.describe(rec))
        mine = [
            f
            for f in validate(picked, version, production, devices=nodefacts.devices(rec))
            if f.variable in IF_VARS
        ]
        for f in mine:
            click.echo(f"  {f}")
        findings += mine
    return findings


if __name__ == "__main__":
    nccl(prog_name="python -m nccl_tuning.cli")
