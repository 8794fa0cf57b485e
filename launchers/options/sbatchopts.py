"""sbatch's own option grammar: the one validator of `--sbatch-arg` and a profile's `sbatch_lines`
(stdlib only).

A table of sbatch's long options (those of sbatch 22.05 -- the dev cluster's -- and the few later
ones sites pass: `--segment`, `--tres-per-task`, `--tres-bind`, `--spread-segments`) and whether
each takes a value; its short letters; and the options launch itself writes or owns as a typed
option (refused here, naming what to give instead). parse() turns entries like '--gres=gpu:8',
'--reservation maint', '#SBATCH --exclusive' into {name: value | True}; misplaced() is the one line
for `launch slurm --gres gpu:8` (an sbatch option given to launch itself).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from ..errors import LaunchError, brief

# takes a value / takes none / may take one (--exclusive[=user])
V, F, O = "value", "flag", "optional"

LONG: dict[str, str] = {
    **dict.fromkeys(
        (
            "account",
            "acctg-freq",
            "array",
            "batch",
            "bb",
            "bbf",
            "begin",
            "chdir",
            "cluster-constraint",
            "clusters",
            "comment",
            "constraint",
            "container",
            "core-spec",
            "cores-per-socket",
            "cpu-freq",
            "cpus-per-gpu",
            "cpus-per-task",
            "deadline",
            "delay-boot",
            "dependency",
            "distribution",
            "error",
            "exclude",
            "export",
            "export-file",
            "extra-node-info",
            "gid",
            "gpu-bind",
            "gpu-freq",
            "gpus",
            "gpus-per-node",
            "gpus-per-socket",
            "gpus-per-task",
            "gres",
            "gres-flags",
            "hint",
            "input",
            "job-name",
            "kill-on-invalid-dep",
            "licenses",
            "mail-type",
            "mail-user",
            "mcs-label",
            "mem",
            "mem-bind",
            "mem-per-cpu",
            "mem-per-gpu",
            "mincpus",
            "network",
            "nodefile",
            "nodelist",
            "nodes",
            "ntasks",
            "ntasks-per-core",
            "ntasks-per-gpu",
            "ntasks-per-node",
            "ntasks-per-socket",
            "open-mode",
            "output",
            "partition",
            "power",
            "prefer",
            "priority",
            "profile",
            "qos",
            "reservation",
            "signal",
            "sockets-per-node",
            "switches",
            "thread-spec",
            "threads-per-core",
            "time",
            "time-min",
            "tmp",
            "uid",
            "wait-all-nodes",
            "wckey",
            "wrap",
            "segment",
            "tres-per-task",
            "tres-bind",
        ),
        V,
    ),
    **dict.fromkeys(
        (
            "contiguous",
            "hold",
            "ignore-pbs",
            "no-requeue",
            "overcommit",
            "oversubscribe",
            "parsable",
            "quiet",
            "reboot",
            "requeue",
            "spread-job",
            "test-only",
            "use-min-nodes",
            "verbose",
            "wait",
            "help",
            "usage",
            "version",
            "spread-segments",
        ),
        F,
    ),
    **dict.fromkeys(("exclusive", "get-user-env", "nice", "no-kill", "propagate"), O),
}

SHORT: dict[str, str] = {
    "A": "account",
    "a": "array",
    "b": "begin",
    "D": "chdir",
    "M": "clusters",
    "C": "constraint",
    "S": "core-spec",
    "c": "cpus-per-task",
    "d": "dependency",
    "m": "distribution",
    "e": "error",
    "x": "exclude",
    "B": "extra-node-info",
    "G": "gpus",
    "H": "hold",
    "i": "input",
    "J": "job-name",
    "L": "licenses",
    "F": "nodefile",
    "w": "nodelist",
    "N": "nodes",
    "k": "no-kill",
    "n": "ntasks",
    "o": "output",
    "O": "overcommit",
    "s": "oversubscribe",
    "p": "partition",
    "q": "qos",
    "Q": "quiet",
    "t": "time",
    "v": "verbose",
    "W": "wait",
    "h": "help",
    "V": "version",
}

# what launch writes itself or takes as its own option: given here, one line names what to give
# instead
OWNED: dict[str, str] = {
    "partition": "--partition",
    "time": "--time",
    "account": "--account",
    "qos": "--qos",
    "constraint": "--constraint",
    "exclusive": "--exclusive",
    "mem": "--mem",
    "mem-per-gpu": "--mem-per-gpu",
    "cpus-per-task": "--cpus-per-task",
    "cpus-per-gpu": "--cpus-per-gpu",
    "gpus-per-node": "--gpus-per-node",
    "nodes": "--nodes",
    "dependency": "--after",
    "array": "--sweep",
    "job-name": "the profile key job_name",
    "signal": "--signal-seconds",
    "wait": "--wait",
    **dict.fromkeys(
        ("ntasks", "ntasks-per-node"),
        "nothing: launch runs one task per node, its agent starts the ranks",
    ),
    **dict.fromkeys(
        ("output", "error", "open-mode"), "nothing: each node's output goes to the run dir"
    ),
    **dict.fromkeys(("requeue", "no-requeue"), "--max-requeues"),
    **dict.fromkeys(
        ("wrap", "parsable", "test-only", "help", "usage", "version", "quiet", "verbose", "hold"),
        "nothing: launch submits the script itself",
    ),
}

_ENTRY = re.compile(r"^(--?)([A-Za-z][A-Za-z0-9-]*)(?:(=| +)(.*))?$")
SEE = "see `sbatch --help`"


def _split(entry: Any, what: str) -> tuple[str, str, str | None]:
    """'--name=value' | '--name value' | '--flag' | '-x value' | '#SBATCH ...' -> (dashes, name,
    value or None)."""
    text = str(entry).strip()
    if text.startswith("#SBATCH"):
        text = text[len("#SBATCH") :].strip()
    m = _ENTRY.match(text)
    if not isinstance(entry, str) or not m or any(c in text for c in "\n\r\0"):
        raise LaunchError(
            f"{what} {brief(entry)} is not an sbatch option; accepted: one option in its long "
            "form, e.g. '--gres=gpu:8', '--reservation=maint' or '#SBATCH --exclusive' ("
            + SEE
            + ")"
        )
    value = m.group(4)
    return m.group(1), m.group(2), None if m.group(3) is None else value.strip()


def check(entry: Any, what: str) -> tuple[str, Any]:
    """One entry -> (long name, value or True), refused in one line when sbatch would not take it or
    launch owns it."""
    dashes, name, value = _split(entry, what)
    if dashes == "-":
        long = SHORT.get(name[0]) if len(name) == 1 or value is None else None
        if long in OWNED:
            raise LaunchError(
                f"{what} {brief(entry)}: -{name[0]} (--{long}) is set by launch; give "
                f"{OWNED[long]} instead"
            )
        hint = (
            f"its long form '--{long}{'' if LONG[long] == F else '=...'}'"
            if long
            else "its long form"
        )
        raise LaunchError(f"{what} {brief(entry)}: give {hint} ({SEE})")
    kind = LONG.get(name)
    if kind is None:
        raise LaunchError(
            f"{what} {brief(entry)}: --{name} is not an option of sbatch (22.05's long options "
            f"and --segment, --tres-per-task, --tres-bind, --spread-segments; {SEE})"
        )
    if name in OWNED:
        raise LaunchError(
            f"{what} {brief(entry)}: --{name} is set by launch; give {OWNED[name]} instead"
        )
    if kind == V and not value:
        raise LaunchError(
            f"{what} {brief(entry)}: --{name} takes a value, e.g. '--{name}=VALUE' ({SEE})"
        )
    if kind == F and value is not None:
        raise LaunchError(
            f"{what} {brief(entry)}: --{name} takes no value; give '--{name}' ({SEE})"
        )
    return name, True if value is None or value == "" and kind == O else value


def parse(entries: Iterable[Any] | None, what: str) -> dict[str, Any]:
    """Entries (a profile's sbatch_lines, --sbatch-arg) -> {long name: value | True}, in order, each
    checked."""
    if entries is not None and (
        isinstance(entries, (str, bytes)) or not isinstance(entries, (list, tuple))
    ):
        raise LaunchError(
            f"{what} {brief(entries)} is not a list; accepted: a list of sbatch options, "
            "e.g. ['--gres=gpu:8', '--reservation=maint']"
        )
    return dict(check(e, what) for e in entries or ())


def misplaced(backend: str, words: list[str]) -> str | None:
    """`launch slurm --gres gpu:8 ...`: an sbatch option given to launch itself -> the line pointing
    at --sbatch-arg (None: not an sbatch option, or not `launch slurm`)."""
    if backend != "slurm" or not words or not words[0].startswith("-") or words[0] == "--":
        return None
    m = _ENTRY.match(words[0])
    if not m:
        return None
    dashes, name, value = m.group(1), m.group(2), m.group(4)
    if dashes == "-":
        name, value = SHORT.get(name[0], ""), (name[1:] or value)
    kind = LONG.get(name)
    if kind is None:
        return None
    if value is None and kind == V and len(words) > 1 and words[1] != "--":
        value = words[1]
    given = f"--{name}" + (f"={value}" if value is not None and kind != F else "")
    if name in OWNED:
        return f"{words[0]} is an sbatch option that launch sets itself; give {OWNED[name]} instead"
    return (
        f"{words[0]} is an sbatch option, not one of `launch slurm`: pass it on as --sbatch-arg "
        f"{_quote(given)} (repeatable; a profile: slurm: {{sbatch_lines: [...]}})"
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
