"""Whether a text looks like a credential, and the text with each one hidden (REDACTED).

A variable's value is secret by its name when the name holds TOKEN, KEY, SECRET or PASS
(secret_name), or by its content (looks_secret): an Authorization header (`Bearer ...`/`Basic ...`),
an AWS-style access key (`AKIA`
+ 16) or secret key (40 of base64, mixed case and digits), a service token (`hf_`, `sk-`, `ghp_`,
  `github_pat_`,
`xoxb-`/`xoxp-`), a URL with a password (`scheme://user:pass@host`) or a long random token (a value
of >= 32 of [A-Za-z0-9_-] whose longest run between `_`/`-` has >= 24 characters, digits and letters
among them, and >= 3 bits of entropy per character: not words joined by `_`, not a repeated
pattern). The same patterns find credentials inside any text (redact_text: program arguments,
exception lines, reasons, payloads), with the values a process knows to be secret; redact_args: a
program's arguments as records and the dry-run show them. Pure, stdlib only; which of a job's values
are secret and where they go is launchers.credentials.secretenv's.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterable

REDACTED = "***"
NAME_MARKERS = ("TOKEN", "KEY", "SECRET", "PASS")  # PASS: PASSWORD, PASSWD, MY_DB_PASS
URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:[^\s/@]+@")
TOKEN = re.compile(r"[A-Za-z0-9_-]{32,}")
# a token's longest run between separators; its entropy, bits per character
MIN_RUN, MIN_BITS = 24, 3.0
MIN_KNOWN = 6  # a known secret value shorter than this is not searched for in texts
# credentials by their shape, found anywhere in a text: (why, pattern); group "v" is what is hidden
PATTERNS = (
    (
        "an Authorization header",
        re.compile(r"\b(?:Bearer|Basic|Token)\s+(?P<v>[A-Za-z0-9._~+/=-]{8,})", re.I),
    ),
    (
        "an AWS access key",
        re.compile(r"(?<![A-Za-z0-9])(?P<v>(?:AKIA|ASIA)[0-9A-Z]{16})(?![A-Za-z0-9])"),
    ),
    (
        "a service token",
        re.compile(
            r"(?<![A-Za-z0-9_-])(?P<v>(?:hf_|ghp_|gho_|ghs_|github_pat_)[A-Za-z0-9_]{16,}"
            r"|sk-[A-Za-z0-9_-]{16,}|xox[bpas]-[A-Za-z0-9-]{10,})"
        ),
    ),
    ("a URL with a password", re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:(?P<v>[^\s/@]+)@")),
    (
        "an AWS secret key",
        re.compile(
            r"(?<![A-Za-z0-9/+])(?P<v>(?=[A-Za-z0-9/+]*[a-z])(?=[A-Za-z0-9/+]*[A-Z])"
            r"(?=[A-Za-z0-9/+]*[0-9])[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
        ),
    ),
)
# a word of a text, for the long random tokens among them
_WORD = re.compile(r"[^\s()\[\]{}'\",;=:]+")
_SECRET_OPT = re.compile(
    r"^--?(?:[A-Za-z0-9]+[-_])*(?:token|password|passwd|secret|api[-_]?key|access[-_]?key)$", re.I
)  # a program option whose value is a secret whatever it looks like


def secret_name(name: str) -> bool:
    return any(m in name.upper() for m in NAME_MARKERS)


def _bits(text: str) -> float:
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def looks_secret(value: str) -> str | None:
    """Why a value looks like a secret by its content ("a URL with a password", "a long random
    token"), else None."""
    for why, pattern in PATTERNS:
        if pattern.search(value):
            return why
    if TOKEN.fullmatch(value):
        run = max(re.split(r"[_-]", value), key=len)
        digits, letters = sum(c.isdigit() for c in run), sum(c.isalpha() for c in run)
        if len(run) >= MIN_RUN and digits >= 2 and letters >= 2 and _bits(run) >= MIN_BITS:
            return "a long random token"
    return None


def _random(word: str) -> bool:
    return looks_secret(word) == "a long random token" if TOKEN.fullmatch(word) else False


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """text with each known secret value, each credential-shaped part (PATTERNS) and each long
    random word as REDACTED (`Bearer ***`, `https://u:***@h`, `--hf-token=***`)."""
    if not isinstance(text, str) or not text:
        return text
    for s in sorted(
        {k for k in known if isinstance(k, str) and len(k) >= MIN_KNOWN and k != REDACTED},
        key=len,
        reverse=True,
    ):
        text = text.replace(s, REDACTED)
    for _, pattern in PATTERNS:
        text = pattern.sub(
            lambda m: (
                m.group(0)[: m.start("v") - m.start()]
                + REDACTED
                + m.group(0)[m.end("v") - m.start() :]
            ),
            text,
        )
    return _WORD.sub(lambda m: REDACTED if _random(m.group(0)) else m.group(0), text)


def redact_args(args: Iterable[str], known: Iterable[str] = ()) -> list[str]:
    """A program's arguments as records and the dry-run show them: credentials as REDACTED
    (redact_text), and the value of an option named like a secret (`--token X`, `--api-key=X`,
    `--password X`) whatever it is."""
    out: list[str] = []
    after_opt = False
    for w in args:
        name, eq, value = w.partition("=")
        if after_opt and w and not w.startswith("-"):
            out.append(REDACTED)
        elif eq and _SECRET_OPT.match(name) and value:
            out.append(f"{name}={REDACTED}")
        else:
            out.append(redact_text(w, known))
        after_opt = not eq and bool(_SECRET_OPT.match(w))
    return out


def arg_secrets(args: Iterable[str]) -> list[int]:
    """The positions of the program arguments that redact_args changes (the user is told once)."""
    args = list(args)
    return [i for i, (a, b) in enumerate(zip(args, redact_args(args))) if a != b]
