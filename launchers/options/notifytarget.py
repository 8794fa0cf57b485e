"""--notify URL|COMMAND, the option: its targets read and checked (parse_targets: an http(s) URL,
else a shell command; a URL mistyped without '://' is refused, never run), is_url(), and what a log
or an error may show of a target (shown: a URL's scheme://host[:port], a command's first word; never
a path, user or token). Stdlib only; sending an event to them is launchers.records.notify's.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from ..credentials.secretshape import redact_text
from ..errors import LaunchError

SCHEMES = ("http", "https")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# a URL mistyped (`https//h/x`, `http:/h`, `https:h`): refused, never run as a shell command
_URL_TYPO = re.compile(r"^(?:https?(?=[:/])|[A-Za-z][A-Za-z0-9+.-]*(?://|:/(?!/)))", re.I)
ACCEPTED = (
    "an http:// or https:// URL (a JSON POST per event) or a shell command (the event in its "
    "environment)"
)


def parse_targets(items: Any, what: str = "--notify") -> tuple[str, ...]:
    """--notify (repeatable; a profile: a list or one str) -> the targets, each once, in the order
    given."""
    items = [items] if isinstance(items, str) else items
    if not isinstance(items, (list, tuple)):
        raise LaunchError(f"{what} of type {type(items).__name__} is not accepted; give {ACCEPTED}")
    out: list[str] = []
    for t in items:
        if not isinstance(t, str) or not t.strip() or any(c in t for c in "\0\n\r"):
            raise LaunchError(
                f"{what} {shown(t) if isinstance(t, str) else type(t).__name__!r} is not accepted "
                f"(empty or more than one line); give {ACCEPTED}"
            )
        t = t.strip()
        if not _SCHEME.match(t) and _URL_TYPO.match(t):
            # never its path
            host = redact_text(re.match(r"[A-Za-z0-9+.-]*:?/*[^/\s]*", t).group(0))
            raise LaunchError(
                f"{what} {host + '/...'!r} looks like a URL without '://' (not run as a "
                f"command); give {ACCEPTED}"
            )
        if _SCHEME.match(t):
            url = urllib.parse.urlsplit(t)
            bad = (
                f"scheme {url.scheme!r}"
                if url.scheme.lower() not in SCHEMES
                else "no host"
                if not url.hostname
                else "bad port"
                if _port(url) == -1
                else None
            )
            if bad:
                raise LaunchError(f"{what} {shown(t)!r} is not accepted ({bad}); give {ACCEPTED}")
        if t not in out:
            out.append(t)
    return tuple(out)


def _port(url: urllib.parse.SplitResult) -> int | None:
    try:
        return url.port
    except ValueError:  # not a number, or out of range
        return -1


def is_url(target: str) -> bool:
    return bool(_SCHEME.match(target))


def shown(target: str) -> str:
    """What a log or an error may show of a target: a URL's scheme://host[:port] (its path and user
    may hold a token), a command's first word."""
    if is_url(target):
        url = urllib.parse.urlsplit(target)
        port = f":{_port(url)}" if _port(url) not in (None, -1) else ""
        return f"{url.scheme}://{url.hostname or '?'}{port}/..."
    words = target.split()
    return (words[0] + (" ..." if len(words) > 1 else "")) if words else ""
