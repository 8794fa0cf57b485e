"""What the `launch nccl` click commands share: the error exit (fail), the Shown parameter type (a
text passed as given, help showing its kind), and the options of `launch nccl bench` and `sweep`
with their check (bench_config: runner.BenchConfig, and the options passed on to `launch BACKEND`).
"""

from __future__ import annotations

import sys

import click

from .errors import NcclTuningError


class Shown(click.ParamType):
    """The text as given; help shows METAVAR or [a|b]; completion offers the choices (a,b lists: the
    next one)."""

    name = "text"

    def __init__(
        self, metavar: str = "", choices: tuple[str, ...] = (), listed: bool = False
    ) -> None:
        self.metavar, self.choices, self.listed = metavar, choices, listed

    def get_metavar(self, param, ctx=None):
        return self.metavar or "[" + "|".join(self.choices) + "]"

    def convert(self, value, param, ctx):
        return value

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        head, _, last = incomplete.rpartition(",") if self.listed else ("", "", incomplete)
        return [
            CompletionItem(head + ("," if head else "") + c)
            for c in self.choices
            if c.startswith(last)
        ]


def fail(err: Exception):
    """The one error line of every `launch nccl` command, exit 2."""
    click.echo(f"launch: error: {err}", err=True)
    sys.exit(2)


PASS = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": True,
    "help_option_names": ["-h", "--help"],
}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
_OPS = ",".join(OPS)


def bench_options(fn):
    """The options `launch nccl bench` and `sweep` share (their texts go to runner.BenchConfig as
    given)."""
    opts = [
        click.option(
            "--backend",
            default="local",
            show_default=True,
            type=Shown(choices=("local", "ssh", "slurm")),
            help="The `launch BACKEND` that runs the bench job.",
        ),
        click.option(
            "--nodes",
            default="1",
            show_default=True,
            type=Shown("INTEGER"),
            help="Nodes of the job.",
        ),
        click.option(
            "--gpus-per-node",
            default="1",
            show_default=True,
            type=Shown("INTEGER"),
            help="Ranks per node.",
        ),
        click.option(
            "--ops",
            default=_OPS,
            show_default=True,
            type=Shown("OP[,OP]", OPS, listed=True),
            help="Collectives to time.",
        ),
        click.option(
            "--min-bytes",
            default="1K",
            show_default=True,
            type=Shown("SIZE"),
            help="Smallest message size (bytes, or with a K, M or G suffix).",
        ),
        click.option(
            "--max-bytes",
            default="256M",
            show_default=True,
            type=Shown("SIZE"),
            help="Largest message size (sizes double from --min-bytes).",
        ),
        click.option(
            "--warmup", default=5, show_default=True, type=int, help="Untimed iterations per size."
        ),
        click.option(
            "--iters", default=20, show_default=True, type=int, help="Timed iterations per block."
        ),
        click.argument("launch_args", nargs=-1, type=click.UNPROCESSED),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def bench_config(
    backend, nodes, gpus_per_node, ops, min_bytes, max_bytes, warmup, iters, repeats, launch_args
):
    """The bench job's runner.BenchConfig; the options after them must be `launch BACKEND`
    options."""
    from .runner import BenchConfig

    extra = list(launch_args)
    if "--" in extra:
        raise NcclTuningError(
            "nothing goes after `--`: the program is nccl_tuning.bench; pass "
            "backend options (e.g. --partition gpu) before it"
        )
    cfg = BenchConfig.build(
        backend, nodes, gpus_per_node, ops, min_bytes, max_bytes, warmup, iters, repeats, extra
    )
    _check_launch_args(backend, extra)
    return cfg


def _check_launch_args(backend, extra):
    """Options we pass on must be `launch BACKEND` options (else it would take them as a
    program)."""
    # the one declaration of every backend's options
    from launchers.runopts import BACKENDS, cli_flags

    if backend not in BACKENDS:
        return
    ours = {
        "--nodes",
        "--gpus-per-node",
        "--run-dir",
        "--nccl-preset",
        "--dry-run",
        # a bench is one run (its results.csv), never a sweep
        "--sweep",
        "--max-parallel",
        "--after",
    }
    known = cli_flags(backend) - ours - {"-h", "--help"}
    for a in extra:
        name = a.split("=", 1)[0]
        if a.startswith("-") and name not in known:
            import difflib

            mine = [
                o
                for p in click.get_current_context().command.params
                for o in p.opts
                if o.startswith("--")
            ]
            close = difflib.get_close_matches(name, [*mine, *known], n=1)
            mean = f" (did you mean {close[0]}?)" if close else ""
            raise NcclTuningError(
                f"option {name!r} is neither a bench option nor one `launch "
                f"{backend}` accepts{mean} (accepted there: {', '.join(sorted(known))})"
            )
