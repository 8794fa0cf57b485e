"""The site's node ledger (issue 37): a node's reputation that outlives its run. Opt-in: `--node-ledger PATH` (a
profile's `node_ledger`, $LAUNCH_NODE_LEDGER, the API's JobSpec.node_ledger), one JSON file on shared storage.

Every new run reads it at its start (spec.build_spec: its quarantined hosts are the spec's `avoid_hosts`; SSH
does not use them, Slurm excludes them) and merges its own strikes in at its end (record_run: the run's nodes.json,
each slot's strikes on the host it ran on, with their evidence). Per host a list of strikes:
{time, run, user, attempt, kind, reason, quarantined}.

The rule (state()): a strike weighs 1 (2 for a kind that points at the hardware: recovery.AT_ONCE) for a week,
then halves every week (HALF_LIFE_DAYS); a host's score is the sum. Score >= 2: quarantined (two strikes within
a week, from any runs and users, or one failed GPU check); >= 0.5: suspect; else ok. A strike under 1/64 of its
weight is dropped at the next write. A run's strikes are keyed by (run, attempt, host): writing again (a resume)
adds nothing twice.

Written by many users at once: read-modify-write under an fcntl byte-range lock (lockf: NFS forwards it to the
server's lock manager; a lock dies with its process, so no stale lock) on PATH.lock, then an atomic replace
(temporary file in the same directory, fsync, rename). The file is data others write (issue 35): read strictly
(no symlink, a regular file of at most MAX_BYTES, JSON, every field checked, host names of HOST only); a bad
ledger is one warning line and is ignored (nothing avoided, nothing written over it). Stdlib only.
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
import sys
import time
from typing import Any, Callable, Iterator

from . import nodeledger
from .errors import LaunchError, brief
from .recovery import AT_ONCE, KINDS
from .secretenv import redact_text

VERSION = 1
FULL_DAYS, HALF_LIFE_DAYS = 7.0, 7.0          # full weight for a week, then halves every week
QUARANTINE, SUSPECT, FORGET = 2.0, 0.5, 1 / 64
MAX_BYTES = 8 << 20
MAX_HOSTS, MAX_STRIKES, MAX_TOTAL = 10000, 32, 10000    # strikes per host and in all (the oldest go first)
LOCK_WAIT_S = 30.0
HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")      # a Slurm node / host name: never a hostlist or option
_TEXT = re.compile(r"^[ -~]*$")                                # printable ASCII, one line
STRIKE_KEYS = {"time": (int, float), "run": str, "user": str, "attempt": int, "kind": str, "reason": str,
               "quarantined": bool}
LIMITS = {"run": 200, "user": 64, "kind": 16, "reason": 300}
DAY = 86400.0


def option(value: Any, what: str = "--node-ledger") -> str:
    """--node-ledger PATH -> its absolute path ("" = none); its directory must exist (the file is made on the
    first write)."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or "\0" in value or "\n" in value:
        raise LaunchError(f"{what} {brief(value)} is not accepted; give a file path on shared storage")
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.isdir(os.path.dirname(path)) or os.path.isdir(path):
        raise LaunchError(f"{what} {brief(value)} is not accepted: its directory {os.path.dirname(path)!r} does not "
                          "exist or it is a directory; give a file path in an existing directory")
    return path


def fields(backend: str, value: Any, what: str, out=None) -> dict[str, Any]:
    """spec.build_spec's node_ledger and avoid_hosts: the ledger read once, at the run's start (a resume keeps its
    run's list: its slots keep their hosts). A bad ledger: one warning, nothing avoided. Local nodes have no hosts."""
    path = option(value, what)
    if not path or backend == "local":
        return {"node_ledger": path, "avoid_hosts": ()}
    led, why = load(path)
    if why:
        print(f"launch: warning: {why}", file=out or sys.stderr, flush=True)
    hosts = quarantined(led) if led else []
    if hosts:
        more = f" and {len(hosts) - 8} more" if len(hosts) > 8 else ""
        print(f"launch: node ledger {path}: quarantined there, not used: {', '.join(hosts[:8])}{more}",
              file=out or sys.stderr, flush=True)
    return {"node_ledger": path, "avoid_hosts": tuple(hosts)}


# ---------------------------------------------------------------------------------------------- reading

def load(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the ledger, None); a missing file is an empty ledger; (None, the one-line why) when it cannot be used."""
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
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
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
    """What is wrong with a parsed ledger (None: nothing): its shape, each host's name, each strike's fields."""
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
        if not isinstance(entry, dict) or set(entry) != {"strikes"} or not isinstance(entry["strikes"], list) \
                or len(entry["strikes"]) > MAX_STRIKES:
            return f"host {host}: expected {{\"strikes\": [...]}} with at most {MAX_STRIKES} strikes"
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
            return f"strike {key} {brief(v)} is not one line of at most {LIMITS[key]} printable ASCII characters"
    if not (math.isfinite(s["time"]) and 0 < s["time"] <= (now or time.time()) + DAY):
        return f"strike time {brief(s['time'])} is not a time up to now"
    if s["kind"] not in KINDS or not 0 <= s["attempt"] <= 10**6:
        return f"strike kind {brief(s['kind'])} or attempt {brief(s['attempt'])} is not accepted"
    return None


def empty() -> dict[str, Any]:
    return {"version": VERSION, "hosts": {}}


# ---------------------------------------------------------------------------------------------- the rule

def weight(strike: dict[str, Any], now: float) -> float:
    """A strike's weight now: 1 (2: a hardware kind) for FULL_DAYS, then halving every HALF_LIFE_DAYS."""
    base = 2.0 if strike["kind"] in AT_ONCE else 1.0
    age = max(0.0, (now - strike["time"]) / DAY)
    return base if age <= FULL_DAYS else base * 0.5 ** ((age - FULL_DAYS) / HALF_LIFE_DAYS)


def score(entry: dict[str, Any], now: float) -> float:
    return sum(weight(s, now) for s in entry.get("strikes") or [])


def state(points: float) -> str:
    return "quarantined" if points >= QUARANTINE else "suspect" if points >= SUSPECT else "ok"


def quarantined(led: dict[str, Any], now: float | None = None) -> list[str]:
    """The hosts a new run does not use, sorted."""
    now = time.time() if now is None else now
    return sorted(h for h, e in led["hosts"].items() if state(score(e, now)) == "quarantined")


def rows(led: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    """`launch nodes`: per host (worst first) its strikes, score, state and newest evidence."""
    now = time.time() if now is None else now
    out = []
    for host, e in led["hosts"].items():
        last = max(e["strikes"], key=lambda s: s["time"], default=None)
        points = score(e, now)
        out.append({"host": host, "strikes": len(e["strikes"]), "score": round(points, 2), "state": state(points),
                    "last": last and evidence(last), "when": last and last["time"], "last_strike": last})
    return sorted(out, key=lambda r: (-r["score"], r["host"]))


def evidence(s: dict[str, Any]) -> str:
    """A strike in one line: `run R (user U), attempt A: kind: reason`."""
    return f"run {s['run']} ({s['user']}), attempt {s['attempt']}: {s['kind']}: {s['reason']}"


# ---------------------------------------------------------------------------------------------- merging

def host_name(word: Any) -> str | None:
    """A run.yaml host (`user@name:port`, a Slurm node) -> the ledger's name for it; None if not a HOST."""
    if not isinstance(word, str):
        return None
    name = word.rsplit("@", 1)[-1]
    name = name.split(":", 1)[0] if name.count(":") == 1 else name
    return name if HOST.match(name) else None


def clean(text: Any, limit: int) -> str:
    """Any text -> one line of printable ASCII of at most `limit` characters, secrets redacted."""
    text = redact_text(str(text or ""))
    return re.sub(r"[^ -~]", "?", " ".join(text.split()))[:limit]


def run_strikes(led: dict[str, Any] | None, attempts: list[dict[str, Any]], run_id: str, user: str,
                now: float) -> dict[str, list[dict[str, Any]]]:
    """A run's nodes.json -> its strikes per host (each slot's failed attempts on the host that attempt ran it
    on; a Slurm requeue's earlier allocations too). A slot never run (a preflight's) names no host: left out."""
    times = {d.get("attempt"): d.get("decided") or d.get("fault") for d in (led or {}).get("decisions") or []}
    out: dict[str, list[dict[str, Any]]] = {}
    blocks = [(led or {}).get("slots") or {}, *((e or {}).get("slots") or {} for e in (led or {}).get("earlier") or [])]
    for slots in blocks:
        for entry in slots.values():
            struck = [a for a in entry.get("attempts") or [] if a.get("strike") and isinstance(a.get("node"), int)
                      and not a.get("program")]    # the program's failure (recovery.program): no host's fault
            for i, a in enumerate(struck):
                n, k = a.get("attempt"), a["node"]
                hosts = attempts[n].get("hosts") or [] if isinstance(n, int) and 0 <= n < len(attempts) else []
                host = host_name(hosts[k]) if 0 <= k < len(hosts) else None
                if host is None:
                    continue
                t = times.get(n)
                out.setdefault(host, []).append({
                    "time": float(t) if isinstance(t, (int, float)) and 0 < t <= now else now,
                    "run": clean(run_id, LIMITS["run"]), "user": clean(user, LIMITS["user"]), "attempt": n,
                    "kind": a.get("kind") if a.get("kind") in KINDS else "rank",
                    "reason": clean(a.get("failure"), LIMITS["reason"]),
                    "quarantined": bool(entry.get("quarantined")) and i == len(struck) - 1})
    return out


def merge(led: dict[str, Any], new: dict[str, list[dict[str, Any]]], now: float) -> dict[str, Any]:
    """The ledger with `new` strikes added (none twice: run, attempt, host), faded ones dropped, the newest kept
    within MAX_STRIKES per host and MAX_TOTAL in all."""
    hosts: dict[str, list[dict[str, Any]]] = {h: list(e["strikes"]) for h, e in led["hosts"].items()}
    for host, strikes in new.items():
        have = {(s["run"], s["attempt"]) for s in hosts.setdefault(host, [])}
        for s in strikes:
            if (s["run"], s["attempt"]) not in have:
                hosts[host].append(s)
                have.add((s["run"], s["attempt"]))
    for host, strikes in hosts.items():
        kept = sorted((s for s in strikes if weight(s, now) >= FORGET * (2 if s["kind"] in AT_ONCE else 1)),
                      key=lambda s: s["time"])
        hosts[host] = kept[-MAX_STRIKES:]
    every = sorted(((s["time"], h, i) for h, ss in hosts.items() for i, s in enumerate(ss)), reverse=True)
    drop = {(h, i) for _, h, i in every[MAX_TOTAL:]}
    hosts = {h: [s for i, s in enumerate(ss) if (h, i) not in drop] for h, ss in sorted(hosts.items())}
    return {"version": VERSION, "hosts": {h: {"strikes": ss} for h, ss in hosts.items() if ss}}


# ---------------------------------------------------------------------------------------------- writing

@contextlib.contextmanager
def locked(path: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """An exclusive fcntl lock on PATH.lock (made as writable as its directory is: every user of a shared
    directory can take it); TimeoutError after wait_s."""
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
        os.close(fd)                                # closing releases the lock


def _try_lock(fd: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):     # held by another process (NFS says either)
            return False
        raise


def write(path: str, led: dict[str, Any]) -> None:
    """Replace the ledger at once (readers see the old or the new one): a new file beside it, then rename."""
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            os.fchmod(f.fileno(), 0o644)            # every user reads it
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
    """change(ledger) -> the new ledger, read, changed and written under the lock; None, or the one line why
    nothing was written (a bad ledger is left as it is for its owner to mend)."""
    try:
        with locked(path):
            led, why = load(path)
            if why:
                return f"{why}; not written"
            write(path, change(led))
    except (OSError, TimeoutError) as e:
        return f"node ledger {path!r} not written: {_oserror(e) if isinstance(e, OSError) else e}"
    return None


def user_name() -> str:
    import getpass
    try:
        return clean(getpass.getuser(), LIMITS["user"]) or str(os.getuid())
    except (KeyError, OSError):
        return str(os.getuid())


def record_run(path: str, run_dir: str, run_id: str, attempts: list[dict[str, Any]], out=None) -> str | None:
    """At a run's end: its strikes (its nodes.json, mapped to hosts) merged into the site ledger at `path`
    (record). Never raises; nothing without a strike."""
    now = time.time()
    try:
        new = run_strikes(nodeledger.read(run_dir), attempts, run_id, user_name(), now)
    except (OSError, ValueError, TypeError, AttributeError, LaunchError) as e:
        return said(f"launch: warning: node ledger {path!r} not written: {type(e).__name__}: {e}", out)
    return record(path, new, now, out)


def record(path: str, new: dict[str, list[dict[str, Any]]], now: float, out=None) -> str | None:
    """Strikes per host (run_strikes' shape; --preflight gpu's: doctor.preflight) merged into the site ledger at
    `path`; the line said on `out` (stderr): what was recorded, or why not. Never raises; nothing when no strike."""
    if not new:
        return None
    why = update(path, lambda led: merge(led, new, now))
    return said(f"launch: warning: {why}" if why else f"launch: node ledger {path}: {sum(map(len, new.values()))} "
                "strike(s) recorded on " + ", ".join(sorted(new)), out)


def said(line: str, out=None) -> str:
    print(line, file=out or sys.stderr, flush=True)
    return line


def drain_argv(host: str, led: dict[str, Any]) -> list[str]:
    """`scontrol update` that drains a host with its newest evidence as the reason (argv: no shell)."""
    if not HOST.match(host or "") or host not in led["hosts"] or not led["hosts"][host]["strikes"]:
        known = ", ".join(sorted(h for h, e in led["hosts"].items() if e["strikes"])) or "none"
        raise LaunchError(f"--drain {brief(host)}: no strike of that host in the node ledger; accepted: {known}")
    last = max(led["hosts"][host]["strikes"], key=lambda s: s["time"])
    reason = f"launch node ledger: {evidence(last)}"[:250]
    return ["scontrol", "update", f"nodename={host}", "state=drain", f"reason={reason}"]


def _oserror(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__
