"""`launch`: click commands only (parse, call, print). Never imports torch."""

from __future__ import annotations

import functools
import sys

import click

from . import __version__
from .clitools.clibase import env_named, forward, one_line_errors, via_cluster
from .clitools.clihelp import EXAMPLES as VERB_EXAMPLES
from .clitools.clihelp import Grouped, Shown, option_of
from .runopts import BACKEND_OPTIONS, COMMON, Opt, envvar, options_from_cli

EXAMPLES = """
\b
Examples:
  launch local --nodes 4 --gpus-per-node 2 --run-dir runs/demo -- -m workloads.convnet --epochs 2
  launch slurm --nodes 4 --gpus-per-node 8 --partition gpu --time 04:00:00 -- train.py --lr 3e-4
  launch ssh --hostfile hosts --run-dir /shared/runs/exp1 -- train.py --lr 3e-4
  launch slurm ... --dry-run            # print the sbatch script and each node's command
  launch status runs/demo ; launch logs runs/demo --rank 3 -f ; launch list
  launch resume runs/demo [--nodes 1 --gpus-per-node 2] [-- new program args]
  launch nccl check moe ; launch nccl show moe --format sbatch
"""

RUN_SETTINGS = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
}


def usage_exit(e: click.UsageError) -> None:
    """click's usage errors (unknown option, bad value, missing argument) in the one-line form, exit
    2; a bare `launch` or `launch nccl` (click 8.2+ makes it an error; 8.1 exits 0 itself) prints
    the help, exit 0."""
    if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())) and e.ctx:
        click.echo(e.ctx.get_help())
        sys.exit(0)
    path = e.ctx.command_path if e.ctx else "launch"
    msg = " ".join(e.format_message().split()).rstrip(".")
    if isinstance(e, click.NoSuchOption) and e.ctx:
        msg += "; accepted: " + ", ".join(
            sorted(
                {o for p in e.ctx.command.get_params(e.ctx) for o in p.opts if o.startswith("-")}
            )
        )
    elif e.ctx and isinstance(e.ctx.command, click.Group) and msg.startswith("No such command"):
        msg += "; accepted: " + ", ".join(e.ctx.command.list_commands(e.ctx))
    click.echo(f"launch: error: {path}: {msg} (see `{path} --help`)", err=True)
    sys.exit(2)


class LazyGroup(click.Group):
    """Subcommands of other modules (the run verbs, doctor, nodes, nccl) are imported only when used
    (keeps `launch local|ssh|slurm` fast); click's usage errors, here and in every subcommand, are
    printed in the project's one-line form (usage_exit)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            usage_exit(e)

    def parse_args(self, ctx, args):
        # the verb and its words as given (--cluster passes them on)
        ctx.meta["launch.argv"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            usage_exit(e)

    lazy = {
        "nccl": (
            "nccl_tuning.cli",
            "nccl",
            "NCCL presets: list, show, check; collective bench and sweep.",
        ),
        "nodes": (
            "launchers.clitools.nodescli",
            "nodes",
            "The site's node ledger: each host's strikes and state.",
        ),
    }
    # this CLI's own verbs that live in modules of their own: imported when used, "did you mean"
    # offers them
    verbs = {
        "status": ("launchers.clitools.cliruns", "status"),
        "top": ("launchers.clitools.cliruns", "top"),
        "logs": ("launchers.clitools.cliruns", "logs"),
        "list": ("launchers.clitools.cliruns", "list_"),
        "cancel": ("launchers.clitools.cliruns", "cancel"),
        "wait": ("launchers.clitools.cliruns", "wait_"),
        "doctor": ("launchers.clitools.clidoctor", "doctor"),
    }

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.lazy, *self.verbs])

    def get_command(self, ctx, name):
        if name in self.lazy or name in self.verbs:
            import importlib

            module, attr = self.verbs[name] if name in self.verbs else self.lazy[name][:2]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        # click 8.4+: "did you mean" among the verbs, as before the split
        except click.UsageError as e:
            if not isinstance(e, getattr(click.exceptions, "NoSuchCommand", ())):
                raise
            raise type(e)(
                e.command_name, possibilities=[*self.commands, *self.verbs], ctx=e.ctx
            ) from None

    def format_commands(self, ctx, formatter):
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy:
                rows.append((name, self.lazy[name][2]))
            else:
                rows.append((name, self.get_command(ctx, name).get_short_help_str(limit=70)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup, epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="launch")
def main() -> None:
    """Start multi-node PyTorch (torchrun) jobs on this machine, SSH hosts or Slurm, with one run
    directory."""


def job_options(backend: str):
    """The common options and the backend's own, generated from their one declaration
    (launchers.runopts)."""

    def wrap(fn):
        opts = [
            option_of(o, envvar(backend, o))
            for o in (*COMMON, *BACKEND_OPTIONS[backend])
            if o.cli_flag
        ]
        opts.append(click.argument("program", nargs=-1, type=click.UNPROCESSED))
        for o in reversed(opts):
            fn = o(fn)
        return fn

    return wrap


def _launch(backend: str, kw: dict) -> None:
    from . import api
    from .runjson import scripted
    from .spec import build_spec

    common = {o.key: kw.pop(o.key) for o in COMMON}
    program, dry_run, profile = kw.pop("program"), common.pop("dry_run"), common.pop("profile")
    sweep, as_json = common.pop("sweep"), common.pop("json")
    with env_named(
        {o.key: (o.cli_flag, envvar(backend, o)) for o in (*COMMON, *BACKEND_OPTIONS[backend])}
    ):
        # a LAUNCH_* value refused (here or by the backend's preflight) is named
        common["options"] = options_from_cli(backend, kw)
        # the user's job, requeued
        requeued = not sweep and api.requeued(backend, common.get("run_dir"))
        spec = build_spec(backend, common, list(program), profile, existing=bool(requeued))
        if requeued:  # its run continues (launchers.backends.slurm.inalloc)
            sys.exit(
                scripted(
                    as_json, dry_run, spec.run_dir, functools.partial(api.continue_requeued, spec)
                )
            )
        if sweep:  # one run per combination (launchers.sweeprun)
            from .sweeprun import submit_sweep

            sys.exit(
                scripted(
                    as_json, dry_run, spec.run_dir, functools.partial(submit_sweep, spec, sweep)
                )
            )
        sys.exit(scripted(as_json, dry_run, spec.run_dir, functools.partial(api.submit, spec)))


@main.command(cls=Grouped, context_settings=RUN_SETTINGS, epilog=VERB_EXAMPLES["local"])
@job_options("local")
@one_line_errors
def local(**kw):
    """Run N simulated nodes on this machine (one torchrun agent per node)."""
    _launch("local", kw)


@main.command(cls=Grouped, context_settings=RUN_SETTINGS, epilog=VERB_EXAMPLES["ssh"])
@job_options("ssh")
@one_line_errors
def ssh(**kw):
    """Run on SSH-reachable hosts without a scheduler (SSH through paramiko, verified host keys)."""
    _launch("ssh", kw)


@main.command(cls=Grouped, context_settings=RUN_SETTINGS, epilog=VERB_EXAMPLES["slurm"])
@job_options("slurm")
@one_line_errors
def slurm(**kw):
    """Submit through sbatch (submitit); inside an allocation, start one torchrun per allocated
    node."""
    # --cluster NAME ('': here), else the profile's slurm.cluster (not viacluster:
    from .spec import load_profile

    flag, prof = kw["cluster"], kw["profile"]  # a plain submit never imports that, ~60-90 ms)
    cluster = (
        flag
        if flag is not None
        else (load_profile(prof).get("slurm") or {}).get("cluster")
        if prof
        else None
    )
    if cluster:
        forward(cluster, kw["profile"])
    _launch("slurm", kw)


@main.command(epilog=VERB_EXAMPLES["resume"])
@via_cluster
@click.argument("run", type=Shown("RUN", complete="run"))
@click.option(
    "--nodes",
    default=None,
    type=Shown("INTEGER"),
    help="New node count (the checkpoint is resharded).",
)
@click.option(
    "--gpus-per-node", default=None, type=Shown("INTEGER"), help="New processes per node."
)
@click.option(
    "--max-restarts",
    default=None,
    type=Shown("INTEGER"),
    help="New number of whole-job restarts from checkpoints/latest.",
)
@click.option("--dry-run", is_flag=True, help="Print exactly what would run; start nothing.")
@click.option(
    "--adopt",
    is_flag=True,
    help="RUN is a copy of another run dir: resume it as a run of its own (a new run id).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object on stdout (launch local --help: --json).",
)
@option_of(
    Opt(
        "snapshot",
        (bool,),
        "Default: keep the run's snapshot. --snapshot: a new snapshot of the run's "
        "tree as it is now; --no-snapshot: run from the tree itself.",
        kind="switch",
    )
)
@click.argument("program_args", nargs=-1, type=click.UNPROCESSED)
@one_line_errors
def resume(
    run, nodes, gpus_per_node, max_restarts, dry_run, adopt, as_json, snapshot, program_args
):
    """Start a new attempt of RUN; the workload continues from checkpoints/latest.

    New program arguments (replacing the recorded ones) go after `--`. Every path of the attempt is
    RUN where it is now: a moved run dir resumes into itself. A copy (`cp -a`) still holds the
    original's run id and is refused, naming the original, unless --adopt gives it its own; the
    original is never written.
    """
    from . import api
    from .records import runindex
    from .runjson import scripted
    from .spec import positive_int

    changes = {
        "nodes": positive_int("--nodes", nodes) if nodes is not None else None,
        "gpus_per_node": positive_int("--gpus-per-node", gpus_per_node)
        if gpus_per_node is not None
        else None,
        "max_restarts": positive_int("--max-restarts", max_restarts, 0)
        if max_restarts is not None
        else None,
        "snapshot": snapshot,
    }
    run = runindex.resolve(run)  # a run name or a Slurm job id too
    sys.exit(
        scripted(
            as_json,
            dry_run,
            run,
            functools.partial(
                api.resume, run, changes, tuple(program_args) if program_args else None, adopt=adopt
            ),
        )
    )


@main.command(epilog=VERB_EXAMPLES["completion"])
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]), default="bash")
def completion(shell):
    """Print the shell's completion script (bash, zsh, fish).

    Use: `eval "$(launch completion bash)"` in ~/.bashrc (click's `_LAUNCH_COMPLETE=bash_source
    launch` is the same).
    """
    from click.shell_completion import get_completion_class

    comp = get_completion_class(shell)(main, {}, "launch", "_LAUNCH_COMPLETE")
    click.echo(comp.source())


if __name__ == "__main__":
    main()
