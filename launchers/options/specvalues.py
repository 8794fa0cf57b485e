"""The parsers of a job's own values, one per flag (each raises a one-line LaunchError naming the
value and what is accepted): numbers and seconds (by launchers.options.values' parsers), --env,
--forward-env, --stop-signal, --master-port, --name, --python, --preflight, and the program: `-m
module` or a file, found here as the ranks will find it, a mistyped option of launch in its place
refused. launchers.spec.build_spec reads a job's flags with them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import Any, Mapping

from ..errors import LaunchError, brief
from ..runopts import cli_flags
from . import sbatchopts, values

DIST_BACKENDS = ("auto", "gloo", "nccl")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_NAME = 200  # --name: a run dir's name adds -<time>-<random> (NAME_MAX is 255)


def positive_int(what: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer in [minimum, maximum], by the one integer parser
    (launchers.options.values.parse_int)."""
    return values.parse_int(what, value, minimum, maximum)


def parse_env(items: Any, what: str = "--env") -> dict[str, str]:
    """`K=V` strings (CLI) or a mapping (profile, API) -> dict; the name must be a valid variable
    name, the value hold no NUL byte, the name not be one launch sets itself
    (launchers.options.values.RESERVED_ENV)."""
    if isinstance(items, Mapping):
        pairs = [(str(k), v) for k, v in items.items()]
        for k, v in pairs:
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise LaunchError(f"{what} value of {k} must be a string, got {brief(v)}")
        pairs = [(k, str(v)) for k, v in pairs]
    else:
        pairs = []
        for item in items:
            if "=" not in item:
                raise LaunchError(f"{what} {brief(item)} is malformed; expected NAME=VALUE")
            k, v = item.split("=", 1)
            pairs.append((k, v))
    for k, v in pairs:
        if not _ENV_NAME.match(k):
            raise LaunchError(
                f"{what} name {brief(k)} is not a valid variable name; expected "
                "[A-Za-z_][A-Za-z0-9_]*"
            )
        values.check_env_value(what, k, v)
    return dict(pairs)


_GLOB = re.compile(r"^[A-Za-z0-9_*?\[\]!]+$")


def parse_forward_env(globs: list[Any]) -> tuple[str, ...]:
    """--forward-env GLOB (repeatable): names of the caller's variables to pass on, e.g.
    'NCCL_*'."""
    out = []
    for g in globs:
        if not isinstance(g, str) or not _GLOB.match(g):
            raise LaunchError(
                f"--forward-env {g!r} is not accepted; give a variable name or a glob of one, "
                "e.g. 'NCCL_*' or 'WANDB_API_KEY'"
            )
        if g in values.RESERVED_ENV:
            values.check_env_value("--forward-env", g, "")
        if g not in out:
            out.append(g)
    return tuple(out)


def parse_seconds(what: str, value: Any) -> float:
    """A positive, finite number of seconds (launchers.options.values.parse_number)."""
    accepted = "a number of seconds > 0 (e.g. 300) in plain decimal digits"
    v = values.parse_number(what, value, accepted)
    if not v > 0:
        raise LaunchError(f"{what} {brief(value)} is out of range; give {accepted}")
    return v


# the stops the rank wrapper times a grace for
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def parse_stop_signal(value: Any) -> str:
    """SIGTERM / SIGINT / SIGHUP / SIGQUIT, also written TERM, int, ... (not a number)."""
    name = str(value).strip().upper() if isinstance(value, str) else ""
    name = name if name.startswith("SIG") else "SIG" + name
    if name not in STOP_SIGNALS:
        raise LaunchError(
            f"--stop-signal {brief(value)} is not accepted; choose one of: "
            f"{', '.join(STOP_SIGNALS)}"
        )
    return name


def parse_port(value: Any, what: str = "--master-port") -> int:
    return values.parse_int(what, value, 1024, 65535)


def parse_program(
    words: list[str] | tuple[str, ...], check_local: bool = True, pythonpath: str | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`-m mod args...` or `path.py args...` -> (program, args). The program must exist here: a
    module is looked up as the workers will (the launch directory first, then the job's PYTHONPATH,
    else this one's path)."""
    words = list(words)
    if not words:
        raise LaunchError(
            "missing program: give it after `--`, e.g. `-- train.py --lr 3e-4` or `-- -m "
            "workloads.convnet`"
        )
    if words[0] == "-m" or words[0].startswith("-m") and len(words[0]) > 2:
        module = words[1] if words[0] == "-m" and len(words) > 1 else words[0][2:]
        rest = words[2:] if words[0] == "-m" else words[1:]
        if not module:
            raise LaunchError("missing module after -m")
        if check_local:
            _check_module(module, pythonpath)
        return ("-m", module), tuple(rest)
    path = words[0]
    if path.startswith("-"):
        raise LaunchError(f"program {path!r} is not a file or `-m module`")
    if check_local:
        if not os.path.isfile(path):
            raise LaunchError(f"program file {path!r} does not exist")
        path = os.path.abspath(path)
    return (path,), tuple(words[1:])


def _check_module(module: str, pythonpath: str | None = None) -> None:
    # torchrun workers run `python -m` in the launch cwd (first on sys.path), with the job's
    # PYTHONPATH (--env / profile) when it gives one: search those before this process's own path.
    extra = [os.getcwd(), *(os.path.abspath(p) for p in (pythonpath or "").split(os.pathsep) if p)]
    saved = list(sys.path)
    sys.path[:0] = [p for p in extra if p not in sys.path]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path[:] = saved
    if found is None:
        where = f"; PYTHONPATH={pythonpath}" if pythonpath else ""
        raise LaunchError(f"module {module!r} cannot be found (from {os.getcwd()}{where})")


def check_choice(what: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise LaunchError(f"{what} {value!r} is not accepted; choose one of: {', '.join(choices)}")
    return value


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > MAX_NAME:
        raise LaunchError(
            f"--name {brief(name)} is not accepted; give 1-{MAX_NAME} letters, digits, '.', '_' "
            "and '-', starting with a letter or digit"
        )
    return name


def check_python(python: str, backend: str) -> str:
    """--python: on this machine (local) an executable file or a command on PATH; elsewhere not
    checkable here."""
    import shutil

    if not python or "\n" in python:
        raise LaunchError(
            f"--python {brief(python)} is not accepted; give an interpreter path, e.g. "
            "/usr/bin/python3"
        )
    if backend == "local" and not (
        shutil.which(python)
        if os.sep not in python
        else os.path.isfile(python) and os.access(python, os.X_OK)
    ):
        raise LaunchError(
            f"--python {brief(python)} is not an executable file here; give an existing Python "
            f"interpreter (default: {sys.executable})"
        )
    return python


def check_program_words(backend: str, words: list[str]) -> None:
    """A first word like `--nodez` is a mistyped option of launch (click passes unknown options on);
    an sbatch option given to `launch slurm` (`--gres gpu:8`, `-N 2`) is pointed at --sbatch-arg
    (launchers.options.sbatchopts)."""
    hint = sbatchopts.misplaced(backend, words) if words and words[0] != "-m" else None
    if hint:
        raise LaunchError(hint)
    if words and words[0].startswith("--"):
        import difflib

        known = sorted(f for f in cli_flags(backend) if f.startswith("--"))
        close = difflib.get_close_matches(words[0].split("=", 1)[0], known, n=1)
        mean = f" (did you mean {close[0]}?)" if close else ""
        raise LaunchError(
            f"unknown option {brief(words[0])} of `launch {backend}`{mean}; accepted: "
            f"{', '.join(known)} (the program goes after `--`)"
        )


PREFLIGHTS = ("gpu",)


def parse_preflight(value: Any) -> tuple[str, ...]:
    """--preflight gpu[,...] (a profile: a list) -> the checks, each once, in the order given."""
    out: list[str] = []
    for item in value if isinstance(value, (list, tuple)) else [] if value is None else [value]:
        check_choice("--preflight", str(item).strip(), PREFLIGHTS)
        if str(item).strip() not in out:
            out.append(str(item).strip())
    return tuple(out)


def default_name(program: tuple[str, ...]) -> str:
    base = (
        program[1].rsplit(".", 1)[-1]
        if program[0] == "-m"
        else os.path.splitext(os.path.basename(program[0]))[0]
    )
    return re.sub(r"[^A-Za-z0-9_.-]", "-", base).lstrip("._-")[:MAX_NAME] or "job"
