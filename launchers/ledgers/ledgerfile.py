"""The site's node ledger's file (issue 37; the ledger's rule and what goes into it:
launchers.ledgers.siteledger): one JSON file on shared storage, per host its strikes {time, run,
user, attempt, kind, reason, quarantined}.

Read strictly, as data others write (issue 35): no symlink, a regular file of at most MAX_BYTES,
JSON without duplicate keys or NaN, every field checked, host names of HOST only; a bad file is
(None, the one-line why). Written by many users at once: read-modify-write (update) under an fcntl
byte-range lock (lockf: NFS forwards it to the server's lock manager; a lock dies with its process,
so no stale lock) on PATH.lock, then an atomic replace (temporary file in the same directory, fsync,
rename). Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import secrets
import stat
import time
from typing import Any, Callable, Iterator

from ..errors import brief
from ..resilience.recovery import KINDS

VERSION = 1
MAX_BYTES = 8 << 20
# strikes per host and in all (the oldest go first)
MAX_HOSTS, MAX_STRIKES, MAX_TOTAL = 10000, 32, 10000
LOCK_WAIT_S = 30.0
# a Slurm node / host name: never a hostlist or option
HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_TEXT = re.compile(r"^[ -~]*$")  # printable ASCII, one line
STRIKE_KEYS = {
    "time": (int, float),
    "run": str,
    "user": str,
    "attempt": int,
    "kind": str,
    "reason": str,
    "quarantined": bool,
}
LIMITS = {"run": 200, "user": 64, "kind": 16, "reason": 300}
DAY = 86400.0


def load(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the ledger, None); a missing file is an empty ledger; (None, the one-line why) when it
    cannot be used."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return empty(), None
    except OSError as e:
        return None, f"node ledger {path!r} not used: {_oserror(e)}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, f"node ledger {path!r} not used: not a regular file"
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        return None, f"node ledger {path!r} not used: {_oserror(e)}"
    finally:
        os.close(fd)
    led, why = parse(raw)
    return (led, None) if why is None else (None, f"node ledger {path!r} not used: {why}")


def parse(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The ledger's bytes -> (ledger, None) or (None, what is wrong with them)."""
    if len(raw) > MAX_BYTES:
        return None, f"larger than {MAX_BYTES} bytes"
    if not raw.strip():
        return empty(), None
    try:
        data = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant
        )
    except (ValueError, RecursionError) as e:
        return None, f"not JSON ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})"
    why = check(data)
    return (None, why) if why else (data, None)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {brief(k)} given twice")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def check(data: Any, now: float | None = None) -> str | None:
    """What is wrong with a parsed ledger (None: nothing): its shape, each host's name, each
    strike's fields."""
    if not isinstance(data, dict) or set(data) != {"version", "hosts"}:
        return "expected an object with exactly `version` and `hosts`"
    if data["version"] != VERSION or isinstance(data["version"], bool):
        return f"version {brief(data['version'])} is not {VERSION}"
    hosts = data["hosts"]
    if not isinstance(hosts, dict) or len(hosts) > MAX_HOSTS:
        return f"`hosts` must be an object of at most {MAX_HOSTS} hosts"
    total = 0
    for host, entry in hosts.items():
        if not HOST.match(host):
            return f"host name {brief(host)} is not accepted (letters, digits, '.', '_', '-')"
        if (
            not isinstance(entry, dict)
            or set(entry) != {"strikes"}
            or not isinstance(entry["strikes"], list)
            or len(entry["strikes"]) > MAX_STRIKES
        ):
            return f'host {host}: expected {{"strikes": [...]}} with at most {MAX_STRIKES} strikes'
        total += len(entry["strikes"])
        for s in entry["strikes"]:
            if why := check_strike(s, now):
                return f"host {host}: {why}"
    return f"more than {MAX_TOTAL} strikes" if total > MAX_TOTAL else None


def check_strike(s: Any, now: float | None = None) -> str | None:
    if not isinstance(s, dict) or set(s) != set(STRIKE_KEYS):
        return f"a strike must have exactly the keys {', '.join(sorted(STRIKE_KEYS))}"
    for key, types in STRIKE_KEYS.items():
        v = s[key]
        if not isinstance(v, types) or (isinstance(v, bool) and types is not bool):
            return f"strike {key} {brief(v)} has the wrong type"
        if isinstance(v, str) and (len(v) > LIMITS[key] or not _TEXT.match(v)):
            return (
                f"strike {key} {brief(v)} is not one line of at most {LIMITS[key]} printable "
                "ASCII characters"
            )
    if not (math.isfinite(s["time"]) and 0 < s["time"] <= (now or time.time()) + DAY):
        return f"strike time {brief(s['time'])} is not a time up to now"
    if s["kind"] not in KINDS or not 0 <= s["attempt"] <= 10**6:
        return f"strike kind {brief(s['kind'])} or attempt {brief(s['attempt'])} is not accepted"
    return None


def empty() -> dict[str, Any]:
    return {"version": VERSION, "hosts": {}}


@contextlib.contextmanager
def locked(path: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """An exclusive fcntl lock on PATH.lock (made as writable as its directory is: every user of a
    shared directory can take it); TimeoutError after wait_s."""
    lock = path + ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{lock} is not a regular file")
        if st.st_uid == os.getuid():
            os.fchmod(fd, 0o600 | (os.stat(os.path.dirname(path)).st_mode & 0o066))
        deadline = time.monotonic() + wait_s
        while not _try_lock(fd):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lock} held by another run for {wait_s:.0f} s")
            time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _try_lock(fd: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):  # held by another process (NFS says either)
            return False
        raise


def write(path: str, led: dict[str, Any]) -> None:
    """Replace the ledger at once (readers see the old or the new one): a new file beside it, then
    rename."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            os.fchmod(f.fileno(), 0o644)  # every user reads it
            f.write(json.dumps(led, indent=1, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def update(path: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> str | None:
    """change(ledger) -> the new ledger, read, changed and written under the lock; None, or the one
    line why nothing was written (a bad ledger is left as it is for its owner to mend)."""
    try:
        with locked(path):
            led, why = load(path)
            if why:
                return f"{why}; not written"
            write(path, change(led))
    except (OSError, TimeoutError) as e:
        return f"node ledger {path!r} not written: {_oserror(e) if isinstance(e, OSError) else e}"
    return None


def _oserror(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__
