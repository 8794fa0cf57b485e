"""Which values of a job's environment are secrets, and what a run dir keeps of them (only their
names).

A value is secret when its variable is one of the job's --secret names, or when its name or the
value itself looks like one (launchers.credentials.secretshape: secret_name, looks_secret). A secret
is written nowhere (run.yaml, status, logs, the dry-run): REDACTED stands for its value, and a
resume takes it again from the caller's environment (missing(): the names it still needs). The
values the process knows to be secret (known_values: its --secret and secret env values, those of
NAMES_ENV in a rank's environment) are hidden in any text with the credentials found by their shape
(secretshape.redact_text). Program arguments are redacted in every record and dry-run only
(redact_args); the program gets them as given. Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any, Callable, Iterable, Mapping

from ..errors import LaunchError, brief
from ..options.values import check_env_value
from . import NAMES_ENV  # the secrets each rank's wrapper checks (their names)
from .secretshape import REDACTED, arg_secrets, looks_secret, redact_args, redact_text, secret_name

ENV_REF = "env"  # a --secret's reference: the variable of that name where it is used
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_FILE_MAX = 64 * 1024  # --secret NAME=@FILE: at most this many bytes


def known_values(env: Mapping[str, str], names: Iterable[str] = ()) -> list[str]:
    """The values of env that are secret (secret_keys), for redact_text: never REDACTED itself,
    never empty."""
    hidden = secret_keys(env, names)  # once: not again for each variable
    return [v for k, v in env.items() if k in hidden and v and v != REDACTED and k != NAMES_ENV]


def rank_known(environ: Mapping[str, str]) -> list[str]:
    """In a rank (or a Slurm job's step): the values of its secrets -- NAMES_ENV's, and the
    variables of its environment secret by name or value -- for redacting what it records."""
    names = [n for n in (environ.get(NAMES_ENV) or "").split(",") if n]
    return known_values(dict(environ), names)


# a Slurm job's environment: the program arguments records keep redacted (JSON)
ARGS_ENV = "LAUNCH_SECRET_ARGS"


def without_values(d: dict[str, Any], values: Mapping[str, str]) -> dict[str, Any]:
    """A spec's dict (RunSpec.to_dict) holding no secret value: secret env values as REDACTED, the
    program's arguments with their credentials and any known secret value (values: the --secret
    ones) as REDACTED; its `secrets` are references already."""
    names = list(d.get("secrets") or ())
    known = known_values({**(d.get("env") or {}), **values}, names)
    return {
        **d,
        "env": redact(d.get("env") or {}, names),
        "program_args": redact_args(d.get("program_args") or (), known),
    }


def record_spec(d: dict[str, Any]) -> dict[str, Any]:
    """A spec's to_dict() (which holds no secret value) as records keep it: --secret by name
    only."""
    return {**d, "secrets": list(d.get("secrets") or ())}


def real_args(recorded: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """The program arguments of a record, those it keeps redacted given again by ARGS_ENV (a Slurm
    job's environment) when that holds the same arguments; else as recorded."""
    recorded = list(recorded or ())
    try:
        given = json.loads(environ.get(ARGS_ENV) or "null")
    except ValueError:
        return recorded
    ok = (
        isinstance(given, list)
        and len(given) == len(recorded)
        and all(isinstance(g, str) and (g == r or REDACTED in r) for g, r in zip(given, recorded))
    )
    return given if ok else recorded


def args_env(program_args: Iterable[str]) -> dict[str, str]:
    """{ARGS_ENV: the arguments as JSON} when records keep some of them redacted, else {}."""
    args = list(program_args)
    return {ARGS_ENV: json.dumps(args)} if arg_secrets(args) else {}


REASON_FIELDS = ("reason", "first_failure", "exception", "stopped_by")


def redact_fields(fields: Mapping[str, Any], known: Callable[[], Iterable[str]]) -> dict[str, Any]:
    """A status record's update with its free-text fields (REASON_FIELDS, their strings at any
    depth) as redact_text gives them (known(): the secret values, asked only when there is such a
    field): a reason or an exception line never holds a secret's value."""
    if not any(fields.get(k) for k in REASON_FIELDS):
        return dict(fields)
    known = list(known())

    def text(v: Any) -> Any:
        if isinstance(v, str):
            return redact_text(v, known)
        if isinstance(v, dict):
            return {k: text(x) for k, x in v.items()}
        return [text(x) for x in v] if isinstance(v, list) else v

    return {k: (text(v) if k in REASON_FIELDS else v) for k, v in fields.items()}


def secret_keys(env: Mapping[str, str], names: Iterable[str] = ()) -> set[str]:
    """The variables of env whose value is secret: named in `names`, by their name, or by their
    value; NAMES_ENV too (the secrets' names stay off command lines as well)."""
    names = {*names, NAMES_ENV}
    return {k for k, v in env.items() if k in names or secret_name(k) or looks_secret(v)}


def redact(env: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str]:
    """env with every secret value (secret_keys) replaced by REDACTED."""
    hidden = secret_keys(env, names)
    return {k: (REDACTED if k in hidden else v) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A launch command line's words with secret-looking `NAME=VALUE` values (by name or by value)
    shown as REDACTED, credentials anywhere in its words too (redact_text), the program's after `--`
    as redact_args."""
    argv = list(argv)
    cut = argv.index("--") + 1 if "--" in argv else len(argv)
    out = []
    for w in argv[:cut]:
        name, eq, value = w.partition("=")
        out.append(
            f"{name}={REDACTED}"
            if eq and (secret_name(name) or looks_secret(value))
            else redact_text(w)
        )
    return out + redact_args(argv[cut:])


def content_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """name -> why, for the variables treated as secrets only because of their value (the user is
    told once)."""
    return {k: why for k, v in env.items() if not secret_name(k) and (why := looks_secret(v))}


def parse_secrets(
    items: Any,
    environ: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    what: str = "--secret",
) -> dict[str, str]:
    """--secret NAME (the value from the caller's environment) or NAME=@FILE (the file's content,
    one trailing newline dropped) -> name -> its reference (ENV_REF, or `@` and the file's absolute
    path): never the value, which is read here once, to refuse a missing or bad one before anything
    starts, and again where it is used (resolve). A list of such words (CLI, profile `secrets:`, the
    API's JobSpec.secrets); a name is neither one launch sets
    (launchers.options.values.RESERVED_ENV) nor one of the job's env."""
    if isinstance(items, str) or not isinstance(items, (list, tuple)):
        raise LaunchError(
            f"{what} {brief(items)} is not accepted; give a list of NAME or NAME=@FILE"
        )
    out: dict[str, str] = {}
    for item in items:
        name, eq, src = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not _NAME.match(name) or (eq and not src.startswith("@")) or (eq and len(src) < 2):
            raise LaunchError(
                f"{what} {brief(item)} is not accepted; give NAME (its value from your "
                "environment) or NAME=@FILE (read from FILE), NAME a variable name"
            )
        value = _read_file(what, name, src[1:]) if eq else _from_env(what, name, environ)
        out[name] = "@" + os.path.abspath(src[1:]) if eq else ENV_REF
        if "\0" in value:  # not named with its value: a secret is never printed
            raise LaunchError(
                f"{what} {name} holds a NUL byte; an environment value cannot hold one"
            )
        check_env_value(what, name, "")
        if name in (env or {}):
            raise LaunchError(
                f"{what} {name} is also given with --env / profile env; give it once, as {what} "
                f"{name}"
            )
    return out


def resolve(secrets: Iterable[tuple[str, str]], environ: Mapping[str, str]) -> dict[str, str]:
    """The values of a spec's --secret references (RunSpec.secrets: name -> ENV_REF or `@FILE`): the
    one place a --secret's value is read. A name the environment lacks (or a file gone since the
    launch read it) gives REDACTED, which a rank's wrapper refuses in one line naming it (unusable);
    any other reference is ENV_REF."""
    out: dict[str, str] = {}
    for name, ref in secrets:
        if ref.startswith("@"):
            try:
                out[name] = _read_file("--secret", name, ref[1:])
            except LaunchError:
                out[name] = REDACTED
        else:
            out[name] = environ.get(name, REDACTED)
    return out


def values_of(spec: Any, environ: Mapping[str, str]) -> list[str]:
    """The secret values of a spec (its secret --env values and its --secrets'), for redacting what
    is recorded."""
    return known_values(
        {**dict(spec.env), **resolve(spec.secrets, environ)}, [k for k, _ in spec.secrets]
    )


def handover(spec: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment that gives another process every secret of spec that its records hold as ***
    or by name (a Slurm job: sbatch's environment; the API's detached launcher: its own): the secret
    --env values, the --secret values (resolve) and the program's arguments (ARGS_ENV when they hold
    a credential). The receiver takes them back from its environment
    (launchers.records.rundir.spec_from_record). The one door out of a process."""
    env, names = dict(spec.env), [k for k, _ in spec.secrets]
    hidden = secret_keys(env, names)
    given = {k: v for k, v in resolve(spec.secrets, environ).items() if v != REDACTED}
    return {
        **{k: v for k, v in env.items() if k in hidden and v != REDACTED},
        **given,
        **args_env(spec.program_args),
    }


def taken_back(recorded: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """A spec's dict as records and handover keep it (secret env values as ***, credentials in the
    program's arguments as ***, --secret by name or reference) with the values environ gives again:
    the receiving side of handover. Each --secret becomes ENV_REF (its value: resolve, where it is
    used)."""
    d = dict(recorded)
    d["env"] = {
        k: environ[k] if v == REDACTED and k in environ else v
        for k, v in (d.get("env") or {}).items()
    }
    d["program_args"] = real_args(d.get("program_args") or (), environ)
    d["secrets"] = {k: ENV_REF for k in d.get("secrets") or ()}
    return d


def _from_env(what: str, name: str, environ: Mapping[str, str]) -> str:
    if name not in environ:
        raise LaunchError(
            f"{what} {name} is not set in your environment; export it, or give {name}=@FILE"
        )
    return environ[name]


def _read_file(what: str, name: str, path: str) -> str:
    """At most SECRET_FILE_MAX bytes of a regular file (a FIFO or device is refused, never read:
    O_NONBLOCK)."""
    limit = f"at most {SECRET_FILE_MAX // 1024} KiB"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LaunchError(
                    f"{what} {name}=@{path} is not a regular file; give a regular UTF-8 file of "
                    f"{limit}"
                )
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(SECRET_FILE_MAX + 1)
        finally:
            os.close(fd)
        if len(data) > SECRET_FILE_MAX:
            raise LaunchError(
                f"{what} {name}=@{path} is over the limit of {limit} ({SECRET_FILE_MAX} bytes); "
                f"give a file of {limit}"
            )
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not UTF-8"
        raise LaunchError(
            f"{what} {name}=@{path}: the file cannot be read ({why}); give a readable UTF-8 file"
        ) from None
    return text[:-1] if text.endswith("\n") else text


def missing(recorded: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """The variables a recorded spec (run.yaml's) holds redacted that the environment does not give
    again."""
    env = recorded.get("env") or {}
    names = [k for k, v in env.items() if v == REDACTED] + list(recorded.get("secrets") or ())
    held = REDACTED in " ".join(map(str, recorded.get("program_args") or ()))
    args = (
        [ARGS_ENV]
        if held and real_args(recorded.get("program_args"), environ) == recorded.get("program_args")
        else []
    )
    return sorted({k for k in names if k not in environ}) + args


def refuse_missing(recorded: Mapping[str, Any], environ: Mapping[str, str], path: str) -> None:
    """A resume's one line when a secret of the run is not in the caller's environment (nothing
    started)."""
    gone = missing(recorded, environ)
    if ARGS_ENV in gone:
        raise LaunchError(
            f"run {path!r} cannot be resumed: its program arguments held a credential, not kept "
            "in the run dir; start a new run giving it as --secret NAME (the program reads "
            "$NAME)"
        )
    if gone:
        one = len(gone) == 1
        raise LaunchError(
            f"run {path!r} needs {', '.join(gone)} from your environment "
            f"({'a secret' if one else 'secrets'}: not kept in the run dir); export "
            f"{'it' if one else 'them'} and resume again"
        )


def needed(env: Mapping[str, str], names: Iterable[str]) -> list[str]:
    """The variables a rank must be given a real value of (NAMES_ENV): the --secret names, and the
    job's env values still REDACTED (a spec read back from run.yaml whose value nothing gave
    again)."""
    return sorted({*names, *(k for k, v in env.items() if v == REDACTED)})


def unusable(environ: Mapping[str, str]) -> str | None:
    """A rank's wrapper, before its program starts: why a secret of NAMES_ENV cannot be handed to
    the program (not set, or the placeholder REDACTED), one line naming it; None when every one has
    a value."""
    for name in filter(None, (environ.get(NAMES_ENV) or "").split(",")):
        if environ.get(name) in (None, REDACTED):
            what = "is not set" if name not in environ else f"is the placeholder {REDACTED}"
            return (
                f"secret {name} {what} in this rank's environment (run dirs keep no secret); "
                "give it where the job starts (resume: your environment; Slurm: the job's) -- "
                "the program was not started"
            )
    return None
