"""How `launch`'s options read and complete: one click option per runopts declaration, with its
metavar (INTEGER, [auto|gloo|nccl], FILE, ...) in help and its completion (choices, files, run
names), help sectioned by the options' groups, renamed options kept for one release with a note,
each verb's examples. The value itself is never checked here: click hands the text as given to the
option's own parser (launchers.spec, launchers.options.values), whose one-line errors stay what
users see."""

from __future__ import annotations

import functools
import os
from typing import Any

import click
from click.shell_completion import CompletionItem

from ..options.opthelp import GROUPS
from ..runopts import Opt


class Shown(click.ParamType):
    """The text as given (our parsers read it); help shows METAVAR or [a|b|c]; completion offers the
    choices, files, dirs, run names or profiles."""

    name = "text"

    def __init__(
        self, metavar: str = "", choices: tuple[str, ...] = (), complete: str = ""
    ) -> None:
        self.metavar, self.choices, self.complete = metavar, tuple(choices), complete
        self.name = (metavar or "choice").lower()

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return "[" + "|".join(self.choices) + "]" if self.choices else (self.metavar or None)

    def convert(self, value: Any, param, ctx) -> Any:
        return value

    def shell_complete(self, ctx, param, incomplete: str) -> list[CompletionItem]:
        if self.choices:
            head, _, last = (
                incomplete.rpartition(",") if self.complete == "list" else ("", "", incomplete)
            )
            return [
                CompletionItem(head + ("," if head else "") + c)
                for c in self.choices
                if c.startswith(last)
            ]
        if self.complete == "run":
            return complete_run(ctx, param, incomplete)
        if self.complete == "profile":
            return complete_profile(ctx, param, incomplete)
        if self.complete in ("file", "dir"):
            return [CompletionItem(incomplete, type=self.complete)]
        return []


def runs_root_of(ctx: click.Context | None) -> str:
    from ..layout import runs_root

    given = None
    while ctx is not None and given is None:
        given = ctx.params.get("runs_root")
        ctx = ctx.parent
    return runs_root(given)


def complete_run(ctx, param, incomplete: str) -> list[CompletionItem]:
    """A RUN: the names of the runs under the runs root (a directory holding run.yaml), else a
    directory path."""
    if os.sep not in incomplete and not incomplete.startswith("."):
        root = runs_root_of(ctx)
        try:
            names = sorted(
                n
                for n in os.listdir(root)
                if n.startswith(incomplete) and os.path.isfile(os.path.join(root, n, "run.yaml"))
            )
        except OSError:
            names = []
        if names:
            return [CompletionItem(n) for n in names]
    return [CompletionItem(incomplete, type="dir")]


def complete_profile(ctx, param, incomplete: str) -> list[CompletionItem]:
    """--profile: the YAML files where the path typed so far points, else any file."""
    where, start = os.path.split(incomplete)
    try:
        found = sorted(
            os.path.join(where, n)
            for n in os.listdir(where or ".")
            if n.startswith(start)
            and n.endswith((".yaml", ".yml"))
            and os.path.isfile(os.path.join(where or ".", n))
        )
    except OSError:
        found = []
    return [CompletionItem(p) for p in found] or [CompletionItem(incomplete, type="file")]


class GroupedOption(click.Option):
    """A click option that knows its help section (opthelp.GROUPS)."""

    def __init__(self, *args, group: str = "", **kw) -> None:
        super().__init__(*args, **kw)
        self.group = group


class Grouped(click.Command):
    """Help with the options in sections, in the order of opthelp.GROUPS (the backend's own first),
    then the rest ("Other options": --help and options without a group)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for p in self.get_params(ctx):
            rec = p.get_help_record(ctx) if isinstance(p, click.Option) else None
            if rec:
                sections.setdefault(getattr(p, "group", "") or "Other", []).append(rec)
        for name in sorted(sections, key=lambda g: GROUPS.index(g) if g in GROUPS else len(GROUPS)):
            with formatter.section(name if name in ("Targets", "Job shape") else f"{name} options"):
                formatter.write_dl(sections[name])


def option_of(o: Opt, env: str | None = None):
    """The click option of a runopts declaration: its metavar, choices and completion shown; its
    text passed on as given (None when not given) to the option's own parser."""
    common = dict(cls=GroupedOption, group=o.group, default=None, help=o.help or None)
    if o.kind == "switch":
        return click.option(f"{o.cli_flag}/--no-{o.cli_flag[2:]}", o.key, **common)
    if o.kind == "flag":
        return click.option(o.cli_flag, o.key, is_flag=True, **common)
    kind = "list" if o.kind == "list" else o.complete
    return click.option(
        o.cli_flag,
        o.key,
        type=Shown(o.metavar, o.choices, kind),
        multiple=o.kind == "multi",
        envvar=env,
        show_envvar=env is not None,
        **common,
    )


def renamed(old: str, new_key: str, new: str, note: str = "", **kw):
    """`old` (hidden) is still accepted for one release, as `new`, with a one-line note on stderr
    (`note`: other words for it; `launch nccl` uses it too)."""

    def wrap(fn):
        dest = "renamed_" + old.lstrip("-").replace("-", "_")

        @functools.wraps(fn)
        def inner(*a, **kws):
            value = kws.pop(dest)
            if value is not None and value != ():
                click.echo(
                    note
                    or f"launch: note: {old} is renamed {new}; {old} will be refused in the next "
                    "release",
                    err=True,
                )
                if kws.get(new_key) in (None, ()):
                    kws[new_key] = value
            return fn(*a, **kws)

        return click.option(old, dest, default=None, hidden=True, **kw)(inner)

    return wrap


def examples(*lines: str) -> str:
    return "\b\nExamples:\n" + "\n".join("  " + line for line in lines)


EXAMPLES = {
    "local": examples(
        "launch local --nodes 2 --gpus-per-node 2 -- -m workloads.convnet --epochs 2",
        "launch local --nodes 2:4 --spares 1 --max-restarts 3 -- train.py --lr 3e-4",
        "launch local --dry-run --nodes 2 -- train.py      # each node's command; nothing starts",
    ),
    "ssh": examples(
        "launch ssh --hostfile hosts --gpus-per-node 8 --run-dir /shared/runs/exp1 -- train.py",
        "launch ssh --hosts node1,node2 --no-shared-storage -- -m workloads.convnet",
        "LAUNCH_SSH_HOSTFILE=hosts launch ssh --dry-run -- train.py",
    ),
    "slurm": examples(
        "launch slurm --nodes 4 --gpus-per-node 8 --partition gpu --time 04:00:00 -- train.py "
        "--lr 3e-4",
        "launch slurm --sbatch-arg '--gres=gpu:8' --setup 'module load cuda' --wait -- train.py",
        "launch slurm --cluster big --nodes 2 -- train.py            # from a laptop, over SSH",
        "launch slurm --sweep lr=1e-4,3e-4 --max-parallel 2 -- train.py",
        "launch slurm --dry-run ... -- train.py      # the sbatch script and each node's command",
    ),
    "resume": examples(
        "launch resume runs/demo-20261206-0102-ab12",
        "launch resume runs/demo --nodes 1 --gpus-per-node 2 -- --lr 1e-4",
        "launch resume copy-of-demo --adopt --dry-run",
    ),
    "status": examples(
        "launch status runs/demo",
        "launch status runs/demo --ranks",
        "launch status runs/demo --json | jq .state",
    ),
    "logs": examples("launch logs runs/demo", "launch logs runs/demo --rank 3 -f"),
    "list": examples(
        "launch list", "launch list --runs-root /shared/runs --json", "launch list --cluster all"
    ),
    "cancel": examples("launch cancel runs/demo"),
    "wait": examples("launch wait runs/demo --timeout 3600 && echo done"),
    "top": examples("launch top", "launch top runs/demo --once"),
    "doctor": examples(
        "launch doctor --local --gpu",
        "launch doctor --hostfile hosts --collective",
        "launch doctor --slurm --partition gpu --nodes 2 --gpus-per-node 8 --require-gpus",
    ),
    "completion": examples(
        'eval "$(launch completion bash)"          # in ~/.bashrc',
        "launch completion fish > ~/.config/fish/completions/launch.fish",
    ),
}
