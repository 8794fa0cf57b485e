"""The snapshot's stat cache: a file's content sha256 remembered under its stat key, so that an
unchanged tree is not read again at the next launch (issue 38 item 1).

One JSON file per directory hashed (a program's tree, or a snapshot directory verify() checks), in
the user's state directory: `$LAUNCH_STATE_DIR/statcache/<uid>-<sha256 of the directory's
path>.json` ($XDG_STATE_HOME/ launchers, else ~/.local/state/launchers, as
launchers.records.runindex). There, not in the snapshot store: the state directory is the user's
alone, while a runs root (and its store) may be shared by a group -- a cache directory there would
be someone's, or writable by all. Only the launcher on the submitting host reads it; ranks never do.

An entry is `rel path -> [size, mtime_ns, ctime_ns, inode, dev, mode, sha256]` for a regular file;
its hash is used only while all six stat values are unchanged (an edit moves ctime, which no utime()
can set back; the mode carries the kind, file or executable). Links are never cached (readlink is
cheap; a link frozen as its target is read each time). A file changed less than RACY_NS before it
was hashed is not remembered (an edit in the same clock tick would keep every stat value: git's
"racily clean" case), nor one whose times read 0 (a filesystem that keeps none). Issue 35's rule: a
file others can write is data, never trusted -- a cache file is read only when it is a regular file
(opened O_NOFOLLOW, fstat), the user's, writable by no one else, at most MAX_BYTES and valid JSON of
the exact shape naming the same directory; else it is ignored (everything hashed again) and replaced
at the next save. Anyone who can write it as the user can as well edit the tree it describes. It is
written atomically (temporary file 0600, rename), only when it changed; the user's files not used
for KEEP_S are removed then. read_json/write_json are those checks and that write, for
launchers.frozen.extcache's answer per environment too. Stdlib only.
"""

from __future__ import annotations

import os
import stat
import time

TYPE_CHECKING = False  # not typing's (~3.5 ms): the warm launcher's client imports this module
if TYPE_CHECKING:
    from typing import Callable

FORMAT = 1
MAX_BYTES = 64 << 20  # 200,000 files (snapshot.MAX_FILES) take ~40 MiB
RACY_NS = 2_000_000_000  # changed this recently before it was hashed: hashed again next time
# a cache file not used this long is removed (a tree or snapshot no longer used)
KEEP_S = 30 * 86400
ENABLED = True  # bench/snapshot_key.py turns it off to time the full hash side by side
HEX = frozenset("0123456789abcdef")


def is_sha256(s: str) -> bool:
    """64 lower-case hex digits."""
    return len(s) == 64 and HEX.issuperset(s)


def state_dir() -> str:
    """The user's state directory of launch: $LAUNCH_STATE_DIR, else $XDG_STATE_HOME/launchers
    (~/.local/state/launchers). The runs index, this cache and the warm launcher's socket live
    there."""
    d = os.environ.get("LAUNCH_STATE_DIR")
    return (
        os.path.abspath(d)
        if d
        else os.path.join(
            os.environ.get("XDG_STATE_HOME")
            or os.path.join(os.path.expanduser("~"), ".local", "state"),
            "launchers",
        )
    )


def cache_dir() -> str:
    return os.path.join(state_dir(), "statcache")


def path_for(root: str) -> str:
    # here (and in sha): the warm launcher's client imports this module for state_dir only
    import hashlib

    return os.path.join(
        cache_dir(), f"{os.getuid()}-{hashlib.sha256(os.fsencode(root)).hexdigest()}.json"
    )


def key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode]


class Hashes:
    """The cache of one directory: sha() answers from it while a file's stat key is unchanged, else
    reads it."""

    def __init__(self, root: str):
        self.root, self.path = root, path_for(root)
        self.entries, self.stamp = load(self.path, root)
        # what this process looked up or learned: saved (stale ones go)
        self.seen: dict[str, list] = {}
        self.read = 0  # files read (hashed) through this cache

    def sha(self, rel: str, st: os.stat_result, read: Callable[[], bytes]) -> str:
        """The content sha256 of the regular file rel (lstat st), read() only when the cache has no
        entry for its stat key."""
        k = key(st)
        e = self.seen.get(rel) or self.entries.get(rel)
        if e is not None and e[:6] == k:
            self.seen[rel] = e
            return e[6]
        import hashlib

        sha = hashlib.sha256(read()).hexdigest()
        self.read += 1
        if (
            st.st_mtime_ns
            and st.st_ctime_ns
            and max(st.st_mtime_ns, st.st_ctime_ns) < time.time_ns() - RACY_NS
        ):
            self.seen[rel] = [*k, sha]
        else:
            self.seen.pop(rel, None)
        return sha

    def put(self, rel: str, st: os.stat_result, sha: str) -> None:
        """Remember what launch itself just wrote (a new snapshot directory's file: made once,
        read-only)."""
        self.seen[rel] = [*key(st), sha]

    def save(self) -> None:
        """Write what this process saw (when it differs from the file), atomically, 0600; failures
        are silent: the cache is a convenience."""
        if not self.seen or self.seen == self.entries:
            _touch(self.path)  # still used: not pruned
            return
        if write_json(self.path, {"format": FORMAT, "root": self.root, "entries": self.seen}):
            self.entries, self.stamp = dict(self.seen), _stamp(self.path)


def load(path: str, root: str) -> tuple[dict[str, list], tuple | None]:
    """(entries, the file's stamp) of a cache file that passes every check, else ({}, its stamp)."""
    data, stamp = read_json(path)
    return (data["entries"] if valid(data, root) else {}), stamp


def read_json(path: str) -> tuple[object, tuple | None]:
    """(the JSON value, the file's stamp) of a file that is regular (opened O_NOFOLLOW, fstat), the
    user's, writable by no one else and at most MAX_BYTES; (None, its stamp) for any other (ignored:
    never trusted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None, None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()
            or st.st_mode & 0o022
            or st.st_size > MAX_BYTES
        ):
            return None, stamp
        try:
            import json  # here: the warm launcher's client imports this module for state_dir only

            return json.loads(f.read(MAX_BYTES + 1)), stamp
        except (OSError, ValueError):
            return None, stamp


def write_json(path: str, data: object) -> bool:
    """Write a cache file atomically (a temporary file 0600, renamed over it; links are replaced,
    never followed), then prune(); False when it cannot be written (the cache is a convenience)."""
    tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(3).hex()}"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            import json

            f.write(json.dumps(data, separators=(",", ":")))
        os.replace(tmp, path)
    except (OSError, ValueError):
        _unlink(tmp)
        return False
    prune()
    return True


def valid(data: object, root: str) -> bool:
    """The exact shape: {"format": 1, "root": root, "entries": {rel: [6 non-negative ints, sha256
    hex]}}."""
    if (
        not isinstance(data, dict)
        or set(data) != {"format", "root", "entries"}
        or data["format"] != FORMAT
        or data["root"] != root
        or not isinstance(data["entries"], dict)
    ):
        return False
    return all(
        isinstance(e, list)
        and len(e) == 7
        and all(type(v) is int and v >= 0 for v in e[:6])
        and isinstance(e[6], str)
        and is_sha256(e[6])
        for e in data["entries"].values()
    )


# root -> its cache, shared by one launch's scan, verify()s and commit
_open: dict[str, Hashes] = {}


def hashes(root: str) -> Hashes | None:
    """root's cache (None when turned off): the one this process has, unless its file changed
    meanwhile."""
    if not ENABLED:
        return None
    h = _open.get(root)
    if h is None or h.stamp != _stamp(h.path):
        h = _open[root] = Hashes(root)
    return h


def flush() -> None:
    """Save every cache this process used (a launch's commit: never the dry-run, which writes
    nothing)."""
    for h in list(_open.values()):
        h.save()


def forget(root: str) -> None:
    """Drop root's cache (it led to a hash the content did not have): the next scan reads every
    file."""
    _open.pop(root, None)
    _unlink(path_for(root))


def prune(now: float | None = None) -> None:
    """Remove the user's cache files (and temporaries) not used for KEEP_S."""
    now, mine = time.time() if now is None else now, f"{os.getuid()}-"
    try:
        names = os.listdir(cache_dir())
    except OSError:
        return
    for n in names:
        p = os.path.join(cache_dir(), n)
        try:
            if n.startswith(mine) and now - os.lstat(p).st_mtime > KEEP_S:
                os.unlink(p)
        except OSError:
            continue


def _stamp(path: str) -> tuple | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    # a chmod, chown moves ctime: read again
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _touch(path: str) -> None:
    """Mark a cache file used once a day at most (its mtime: what prune() goes by)."""
    try:
        if time.time() - os.lstat(path).st_mtime > 86400:
            os.utime(path, follow_symlinks=False)
    except OSError:
        pass
