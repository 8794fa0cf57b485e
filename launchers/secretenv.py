"""Which values of a job's environment are secrets, and what a run dir keeps of them (only their names).

A value is secret when its variable is one of the job's --secret names, when the name looks like one (holds
TOKEN, KEY, SECRET or PASS) or when the value itself looks like one (looks_secret): a URL with a password
(`scheme://user:pass@host`) or a long random token (a value of >= 32 of [A-Za-z0-9_-] whose longest run between
`_`/`-` has >= 24 characters, digits and letters among them, and >= 3 bits of entropy per character: not words
joined by `_`, not a repeated pattern). A secret is written
nowhere (run.yaml, status, logs, the dry-run): REDACTED stands for its value, and a resume takes it again from
the caller's environment (missing(): the names it still needs). Stdlib only.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Iterable, Mapping

from .errors import LaunchError, brief
from .values import check_env_value

REDACTED = "***"
NAME_MARKERS = ("TOKEN", "KEY", "SECRET", "PASS")          # PASS: PASSWORD, PASSWD, MY_DB_PASS
URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:[^\s/@]+@")
TOKEN = re.compile(r"[A-Za-z0-9_-]{32,}")
MIN_RUN, MIN_BITS = 24, 3.0          # a token's longest run between separators; its entropy, bits per character
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def secret_name(name: str) -> bool:
    return any(m in name.upper() for m in NAME_MARKERS)


def _bits(text: str) -> float:
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def looks_secret(value: str) -> str | None:
    """Why a value looks like a secret by its content ("a URL with a password", "a long random token"), else None."""
    if URL_PASSWORD.search(value):
        return "a URL with a password"
    if TOKEN.fullmatch(value):
        run = max(re.split(r"[_-]", value), key=len)
        digits, letters = sum(c.isdigit() for c in run), sum(c.isalpha() for c in run)
        if len(run) >= MIN_RUN and digits >= 2 and letters >= 2 and _bits(run) >= MIN_BITS:
            return "a long random token"
    return None


def secret_keys(env: Mapping[str, str], names: Iterable[str] = ()) -> set[str]:
    """The variables of env whose value is secret: named in `names`, by their name, or by their value."""
    names = set(names)
    return {k for k, v in env.items() if k in names or secret_name(k) or looks_secret(v)}


def redact(env: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str]:
    """env with every secret value (secret_keys) replaced by REDACTED."""
    hidden = secret_keys(env, names)
    return {k: (REDACTED if k in hidden else v) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line's words with secret-looking `NAME=VALUE` values (by name or by value) shown as REDACTED."""
    out = []
    for w in argv:
        name, eq, value = w.partition("=")
        out.append(f"{name}={REDACTED}" if eq and (secret_name(name) or looks_secret(value)) else w)
    return out


def content_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """name -> why, for the variables treated as secrets only because of their value (the user is told once)."""
    return {k: why for k, v in env.items() if not secret_name(k) and (why := looks_secret(v))}


def parse_secrets(items: Any, environ: Mapping[str, str], env: Mapping[str, str] | None = None,
                  what: str = "--secret") -> dict[str, str]:
    """--secret NAME (the value from the caller's environment) or NAME=@FILE (the file's content, one trailing
    newline dropped) -> name -> value. A list of such words (CLI, profile `secrets:`, the API's JobSpec.secrets);
    a name is neither one launch sets (launchers.values.RESERVED_ENV) nor one of the job's env."""
    if isinstance(items, str) or not isinstance(items, (list, tuple)):
        raise LaunchError(f"{what} {brief(items)} is not accepted; give a list of NAME or NAME=@FILE")
    out: dict[str, str] = {}
    for item in items:
        name, eq, src = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not _NAME.match(name) or (eq and not src.startswith("@")) or (eq and len(src) < 2):
            raise LaunchError(f"{what} {brief(item)} is not accepted; give NAME (its value from your environment) "
                              "or NAME=@FILE (read from FILE), NAME a variable name")
        out[name] = _read_file(what, name, src[1:]) if eq else _from_env(what, name, environ)
        if "\0" in out[name]:              # not named with its value: a secret is never printed
            raise LaunchError(f"{what} {name} holds a NUL byte; an environment value cannot hold one")
        check_env_value(what, name, "")
        if name in (env or {}):
            raise LaunchError(f"{what} {name} is also given with --env / profile env; give it once, as {what} {name}")
    return out


def _from_env(what: str, name: str, environ: Mapping[str, str]) -> str:
    if name not in environ:
        raise LaunchError(f"{what} {name} is not set in your environment; export it, or give {name}=@FILE")
    return environ[name]


def _read_file(what: str, name: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not UTF-8"
        raise LaunchError(f"{what} {name}=@{path}: the file cannot be read ({why}); give a readable UTF-8 file") from None
    return text[:-1] if text.endswith("\n") else text


def missing(recorded: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """The variables a recorded spec (run.yaml's) holds redacted that the environment does not give again."""
    env = recorded.get("env") or {}
    names = [k for k, v in env.items() if v == REDACTED] + list(recorded.get("secrets") or ())
    return sorted({k for k in names if k not in environ})


def refuse_missing(recorded: Mapping[str, Any], environ: Mapping[str, str], path: str) -> None:
    """A resume's one line when a secret of the run is not in the caller's environment (nothing started)."""
    gone = missing(recorded, environ)
    if gone:
        one = len(gone) == 1
        raise LaunchError(f"run {path!r} needs {', '.join(gone)} from your environment ({'a secret' if one else 'secrets'}"
                          f": not kept in the run dir); export {'it' if one else 'them'} and resume again")
