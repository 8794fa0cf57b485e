"""The snapshot store's side of --snapshot (launchers.frozen.snapshot): how a tree's entry is read
and hashed (entry, hashed, line: one line per file of the content hash), a snapshot directory
written once into the store -- copied into a temporary directory, made read-only, renamed into place
under its hash (write) -- and checked before it is reused or run (verify, usable: the user's,
writable by no one else, hashing to its name). Stdlib only."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat

from ..errors import LaunchError, brief
from . import statcache


def entry(root: str, rel: str, freeze: bool = True) -> tuple[str, bytes]:
    """(kind, content): 'l' and the link's target, 'x' (executable) or 'f' and the file's bytes
    (those of a link's target when it is a file out of the tree: frozen)."""
    path = os.path.join(root, rel)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        if (
            not freeze
            or not os.path.isfile(real)
            or os.path.commonpath([os.path.realpath(root), real]) == os.path.realpath(root)
        ):
            return "l", os.fsencode(os.readlink(path))
        path, st = real, os.stat(real)  # a link to a file out of the tree: frozen as its content
    if not stat.S_ISREG(st.st_mode):
        return "", b""
    with open(path, "rb") as f:
        return ("x" if st.st_mode & 0o111 else "f"), f.read()


def line(rel: str, kind: str, sha: str) -> bytes:
    return f"{rel}\0{kind}\0{sha}\n".encode("utf-8", "surrogateescape")


def hashed(
    root: str, rel: str, st: os.stat_result, cache: statcache.Hashes | None, freeze: bool = True
) -> tuple[str, str]:
    """(kind, content sha256) of root/rel (st: its lstat), as entry() reads it; a regular file's
    hash comes from the stat cache while its stat key is unchanged (launchers.frozen.statcache)."""
    if cache is None or not stat.S_ISREG(st.st_mode):
        kind, data = entry(root, rel, freeze)
        return kind, hashlib.sha256(data).hexdigest()
    return ("x" if st.st_mode & 0o111 else "f"), cache.sha(
        rel, st, lambda: _read(os.path.join(root, rel))
    )


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write(snap, store: str) -> str:  # snap: a launchers.frozen.snapshot.Snapshot
    """The snapshot's directory in store: reused when verify() passes, else (made again when it is
    the user's) copied into a temporary directory, made read-only (files 0444/0555, directories
    0555) and renamed into place. The copy is hashed as it is made: a tree changed since scan()
    lands under the hash of what was copied. Returns that directory."""
    if os.path.lexists(snap.dir(store)) and usable(snap.dir(store)):
        return snap.dir(store)
    try:
        os.makedirs(store, exist_ok=True)
        tmp = os.path.join(store, f".tmp-{snap.digest[:12]}-{os.getpid()}-{os.urandom(3).hex()}")
        os.mkdir(tmp, 0o755)
    except OSError as e:
        raise LaunchError(
            f"snapshot store {brief(store)} cannot be written ({e.strerror}); accepted: a runs "
            "root you can write, or --no-snapshot"
        ) from None
    try:
        h, made = hashlib.sha256(), []
        for rel in snap.files:
            kind, data = entry(snap.root, rel)
            sha = hashlib.sha256(data).hexdigest()
            h.update(line(rel, kind, sha))
            made.append((rel, _put(os.path.join(tmp, rel), kind, data), sha))
        final = os.path.join(store, h.hexdigest())
        _modes(tmp, 0o555)
        if os.path.lexists(final) and not usable(final):
            _remove(final)
        try:
            os.rename(tmp, final)
        except OSError:  # made meanwhile by another launch: the same content
            if not os.path.isdir(final):
                raise
            return final
        _seed(final, made)
        return final
    except OSError as e:
        raise LaunchError(
            f"snapshot {brief(snap.dir(store))} cannot be written ({e.strerror}); accepted: a runs "
            "root with free space you can write, or --no-snapshot"
        ) from None
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)


def _modes(d: str, mode: int) -> None:
    """Every directory below d (and d) given mode: 0o555 read-only once made, 0o755 to remove it."""
    for here, dirs, _ in os.walk(d, topdown=mode & 0o200 != 0):
        os.chmod(here, mode)


def _remove(d: str) -> None:
    """Remove a snapshot directory of the user's (read-only: made writable first)."""
    _modes(d, 0o755)
    shutil.rmtree(d)


def _put(path: str, kind: str, data: bytes) -> os.stat_result | None:
    """Write one entry of a new snapshot directory; the file's stat once written (None for a
    link)."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if kind == "l":
        os.symlink(os.fsdecode(data), path)
        return None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o555 if kind == "x" else 0o444)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        return os.fstat(f.fileno())


def _seed(d: str, made: list[tuple[str, os.stat_result | None, str]]) -> None:
    """The stat cache of a snapshot directory just made (renamed into place: its files' stat keys
    are as written), so the next launch's verify() of it reads nothing."""
    cache = statcache.hashes(d)
    for rel, st, sha in made if cache else ():
        if st is not None:
            cache.put(rel, st, sha)


def verify(d: str) -> str | None:
    """Why the snapshot directory d cannot be run (a phrase: it is a symlink, someone else's,
    writable by others, or its content does not hash to its name), None when it can. The .pyc files
    an earlier version's runs wrote into __pycache__/ (never part of a tree) do not count: like
    every entry they must be the user's."""
    try:
        return _verify(d)
    except OSError as e:
        return f"cannot be read ({e.strerror})"


def _verify(d: str) -> str | None:
    me, st = os.getuid(), os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        return "is a symlink, not a directory" if stat.S_ISLNK(st.st_mode) else "is not a directory"
    lines, parents, dirs, cache = [], set(), set(), statcache.hashes(d)
    for here, subdirs, files in os.walk(d):
        base = os.path.relpath(here, d).replace(os.sep, "/")
        pyc = os.path.basename(here) == "__pycache__"
        for n in [None, *files, *(x for x in subdirs if os.path.islink(os.path.join(here, x)))]:
            p = here if n is None else os.path.join(here, n)
            est = os.lstat(p)
            if est.st_uid != me:
                return (
                    f"is owned by uid {st.st_uid}, not you (uid {me})"
                    if n is None and base == "."
                    else f"holds {brief(p)} of uid {est.st_uid}, not you (uid {me})"
                )
            if not stat.S_ISLNK(est.st_mode) and est.st_mode & 0o022:
                return f"is writable by others ({brief(p)}: mode {est.st_mode & 0o777:o})"
            if n is not None and not (pyc and n.endswith(".pyc") and stat.S_ISREG(est.st_mode)):
                rel = n if base == "." else f"{base}/{n}"
                lines.append(line(rel, *hashed(d, rel, est, cache, freeze=False)))
                parts = rel.split("/")
                parents.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if base != "." and not pyc:
            dirs.add(base)
    h = hashlib.sha256()
    for ln in sorted(lines):
        h.update(ln)
    return (
        None
        if h.hexdigest() == os.path.basename(d) and dirs <= parents
        else "does not hash to its name"
    )


def usable(d: str) -> bool:
    """verify(d) passes; a LaunchError when d is not the user's to make again (someone else's, a
    symlink)."""
    why = verify(d)
    if why and not why.startswith(("is writable", "does not hash")):
        raise LaunchError(
            f"snapshot {d} {why}: never run; accepted: a store of your own (remove it, or give a "
            "runs root only you can write: --run-dir or $LAUNCH_RUNS_ROOT), or --no-snapshot"
        )
    return why is None
