"""--snapshot: the program's tree frozen at submit in a content-addressed directory the ranks run from.

The tree is the launch's working directory, as launchers.snaptree selects it (git's files, else less
`.launchignore`; never run dirs, stores, secret-looking files unless `.launchinclude` names them): what it leaves
out is said with why (Snapshot.left_out: the dry-run's line). A symlink to a file outside the tree is frozen as
that file's content. Its hash is the sha256 over each file's path, kind (file, executable, symlink) and content
sha256, in path order: the same content is the same directory, `<store>/<hash>`, written once (into a temporary
directory, made read-only: files 0444/0555, directories 0555, then renamed into place) and reused by every run,
resume and array task with that content -- only while it is the user's, writable by no one else, and still
hashes to its name (verify(): else made again, or refused in one line when it is someone else's or a symlink).
The ranks run in their run's own work/ (launchers.rankexec.work_dir), never in the store. The store is
`<runs root>/.snapshots` for a run dir inside the runs root, else `.snapshots` beside the run dir (on the storage
the run dir is on: shared where the nodes see it). A file whose stat key is unchanged since it was hashed is not
read again, by scan() nor verify() (launchers.statcache, saved by commit()); a snapshot directory write() makes is
known to it as written. Stdlib only; the dry-run hashes (reads) but writes nothing.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass, field

from . import statcache
from .errors import LaunchError, brief
from .snaptree import IGNORE_FILE, SECRET, STORE, STORES, git, tree_files  # noqa: F401  (re-exported)

MAX_BYTES = 2 << 30                 # a tree this big is not a program's: refuse, naming .launchignore
MAX_FILES = 200_000
ENV = "LAUNCH_SNAPSHOT_DIR"         # the rank wrapper runs the program from there (first on PYTHONPATH; cwd work/)


@dataclass(frozen=True)
class Snapshot:
    root: str                       # the tree it is taken from (absolute)
    files: tuple[str, ...]          # paths relative to root, sorted
    digest: str                     # sha256 of the content (see the module's doc)
    size: int                       # bytes of the files
    left_out: tuple[tuple[str, str], ...] = ()      # (path, why): what the tree holds that the snapshot does not
    sizes: tuple[int, ...] = ()     # each file's bytes (lstat), in the order of files
    read: int = field(default=0, compare=False)     # files whose content was read: 0 for a tree the cache knows

    def dir(self, store: str) -> str:
        return os.path.join(store, self.digest)


def store_for(run_dir: str, runs_root: str, name: str = STORE) -> str:
    """Where a run's snapshots live: `<runs root>/.snapshots` when run_dir is inside the runs root, else
    `.snapshots` beside run_dir (name: another store kept the same way, launchers.extcache's)."""
    inside = os.path.commonpath([run_dir, runs_root]) == runs_root
    return os.path.join(runs_root if inside else os.path.dirname(run_dir), name)


def _entry(root: str, rel: str, freeze: bool = True) -> tuple[str, bytes]:
    """(kind, content): 'l' and the link's target, 'x' (executable) or 'f' and the file's bytes (those of a link's
    target when it is a file out of the tree: frozen)."""
    path = os.path.join(root, rel)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        if not freeze or not os.path.isfile(real) or os.path.commonpath([os.path.realpath(root), real]) == os.path.realpath(root):
            return "l", os.fsencode(os.readlink(path))
        path, st = real, os.stat(real)          # a link to a file out of the tree: frozen as its content
    if not stat.S_ISREG(st.st_mode):
        return "", b""
    with open(path, "rb") as f:
        return ("x" if st.st_mode & 0o111 else "f"), f.read()


def _line(rel: str, kind: str, sha: str) -> bytes:
    return f"{rel}\0{kind}\0{sha}\n".encode("utf-8", "surrogateescape")


def _hashed(root: str, rel: str, st: os.stat_result, cache: statcache.Hashes | None,
            freeze: bool = True) -> tuple[str, str]:
    """(kind, content sha256) of root/rel (st: its lstat), as _entry() reads it; a regular file's hash comes from
    the stat cache while its stat key is unchanged (launchers.statcache)."""
    if cache is None or not stat.S_ISREG(st.st_mode):
        kind, data = _entry(root, rel, freeze)
        return kind, hashlib.sha256(data).hexdigest()
    return ("x" if st.st_mode & 0o111 else "f"), cache.sha(rel, st, lambda: _read(os.path.join(root, rel)))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def scan(root: str, exclude: tuple[str, ...] = ()) -> Snapshot:
    """The tree's files and content hash (reads the files the stat cache does not know unchanged, writes
    nothing: commit() saves the cache)."""
    root = os.path.abspath(root)
    left: list[tuple[str, str]] = []
    files = tree_files(root, exclude, left)
    stats = [_lstat(root, rel) for rel in files]
    size = sum(st.st_size for st in stats)
    if size > MAX_BYTES or len(files) > MAX_FILES:
        raise LaunchError(f"the program's tree {brief(root)} has {len(files)} files, {size >> 20} MiB: too big to "
                          f"snapshot (accepted: up to {MAX_FILES} files, {MAX_BYTES >> 20} MiB); leave data out "
                          f"with {IGNORE_FILE} (or .gitignore), or give --no-snapshot")
    h, cache = hashlib.sha256(), statcache.hashes(root)
    read = cache.read if cache else 0
    for rel, st in zip(files, stats):
        try:
            kind, sha = _hashed(root, rel, st, cache)
            h.update(_line(rel, kind, sha))
            out = kind == "l" and os.path.commonpath([os.path.realpath(root), os.path.realpath(
                os.path.join(root, rel))]) != os.path.realpath(root)
            left += [(rel, "a link out of the tree, kept as a link: what it points to is not frozen")] if out else []
        except OSError as e:
            raise _unreadable(root, rel, e) from None
    return Snapshot(root=root, files=tuple(files), digest=h.hexdigest(), size=size, left_out=tuple(left),
                    sizes=tuple(st.st_size for st in stats), read=cache.read - read if cache else len(files))


def _lstat(root: str, rel: str) -> os.stat_result:
    try:
        return os.lstat(os.path.join(root, rel))
    except OSError as e:
        raise _unreadable(root, rel, e) from None


def _unreadable(root: str, rel: str, e: OSError) -> LaunchError:
    return LaunchError(f"{brief(os.path.join(root, rel))} of the program's tree cannot be read for its snapshot "
                       f"({e.strerror}); accepted: readable files (leave it out with {IGNORE_FILE} or .gitignore), "
                       "or --no-snapshot")


def write(snap: Snapshot, store: str) -> str:
    """The snapshot's directory in store: reused when verify() passes, else (made again when it is the user's)
    copied into a temporary directory, made read-only (files 0444/0555, directories 0555) and renamed into place.
    The copy is hashed as it is made: a tree changed since scan() lands under the hash of what was copied.
    Returns that directory."""
    if os.path.lexists(snap.dir(store)) and usable(snap.dir(store)):
        return snap.dir(store)
    try:
        os.makedirs(store, exist_ok=True)
        tmp = os.path.join(store, f".tmp-{snap.digest[:12]}-{os.getpid()}-{os.urandom(3).hex()}")
        os.mkdir(tmp, 0o755)
    except OSError as e:
        raise LaunchError(f"snapshot store {brief(store)} cannot be written ({e.strerror}); accepted: a runs root "
                          "you can write, or --no-snapshot") from None
    try:
        h, made = hashlib.sha256(), []
        for rel in snap.files:
            kind, data = _entry(snap.root, rel)
            sha = hashlib.sha256(data).hexdigest()
            h.update(_line(rel, kind, sha))
            made.append((rel, _put(os.path.join(tmp, rel), kind, data), sha))
        final = os.path.join(store, h.hexdigest())
        _modes(tmp, 0o555)
        if os.path.lexists(final) and not usable(final):
            _remove(final)
        try:
            os.rename(tmp, final)
        except OSError:                      # made meanwhile by another launch: the same content
            if not os.path.isdir(final):
                raise
            return final
        _seed(final, made)
        return final
    except OSError as e:
        raise LaunchError(f"snapshot {brief(snap.dir(store))} cannot be written ({e.strerror}); accepted: a runs "
                          "root with free space you can write, or --no-snapshot") from None
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
    """Write one entry of a new snapshot directory; the file's stat once written (None for a link)."""
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
    """The stat cache of a snapshot directory just made (renamed into place: its files' stat keys are as
    written), so the next launch's verify() of it reads nothing."""
    cache = statcache.hashes(d)
    for rel, st, sha in made if cache else ():
        if st is not None:
            cache.put(rel, st, sha)


def verify(d: str) -> str | None:
    """Why the snapshot directory d cannot be run (a phrase: it is a symlink, someone else's, writable by others,
    or its content does not hash to its name), None when it can. The .pyc files an earlier version's runs wrote
    into __pycache__/ (never part of a tree) do not count: like every entry they must be the user's."""
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
                return f"is owned by uid {st.st_uid}, not you (uid {me})" if n is None and base == "." \
                    else f"holds {brief(p)} of uid {est.st_uid}, not you (uid {me})"
            if not stat.S_ISLNK(est.st_mode) and est.st_mode & 0o022:
                return f"is writable by others ({brief(p)}: mode {est.st_mode & 0o777:o})"
            if n is not None and not (pyc and n.endswith(".pyc") and stat.S_ISREG(est.st_mode)):
                rel = n if base == "." else f"{base}/{n}"
                lines.append(_line(rel, *_hashed(d, rel, est, cache, freeze=False)))
                parts = rel.split("/")
                parents.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if base != "." and not pyc:
            dirs.add(base)
    h = hashlib.sha256()
    for ln in sorted(lines):
        h.update(ln)
    return None if h.hexdigest() == os.path.basename(d) and dirs <= parents else "does not hash to its name"


def usable(d: str) -> bool:
    """verify(d) passes; a LaunchError when d is not the user's to make again (someone else's, a symlink)."""
    why = verify(d)
    if why and not why.startswith(("is writable", "does not hash")):
        raise LaunchError(f"snapshot {d} {why}: never run; accepted: a store of your own (remove it, or give a "
                          "runs root only you can write: --run-dir or $LAUNCH_RUNS_ROOT), or --no-snapshot")
    return why is None


def program_in(snap: Snapshot, program: tuple[str, ...]) -> None:
    """A program file must be a file of the snapshot (else the ranks could not run it from there)."""
    if program[0] == "-m":
        return
    rel = os.path.relpath(program[0], snap.root).replace(os.sep, "/")
    if rel not in snap.files:
        where = "outside" if rel.startswith("../") else "left out of"
        raise LaunchError(f"program file {brief(program[0])} is {where} the snapshot of {brief(snap.root)} "
                          f"(ignored or not below it); accepted: a program in the launch directory's tree, or "
                          f"--no-snapshot")


_scanned: dict[str, Snapshot] = {}      # snapshot dir -> what take() scanned for it (commit() copies that)


def take(spec):
    """The spec with its snapshot named (spec.snapshot: the store, "" = none): a recorded one (snapshot_dir) must
    still be there; else the launch directory's tree (or the one recorded) is scanned -- nothing is written
    until commit(), after every check of the launch has passed. Duck-typed over launchers.spec.RunSpec (which
    imports this module)."""
    if not spec.snapshot:
        return spec
    if spec.opts.get("shared_storage") is False:         # ssh --no-shared-storage: the hosts could not see it
        raise LaunchError("--snapshot is not accepted with --no-shared-storage (the hosts run from the snapshot "
                          "under the runs root, on storage they share); accepted: --no-snapshot, or shared storage")
    if spec.snapshot_dir:
        if not os.path.isdir(spec.snapshot_dir):
            raise LaunchError(f"the run's snapshot {brief(spec.snapshot_dir)} is gone; accepted: `launch resume "
                              "--snapshot` (a new one of its tree) or `--no-snapshot` (run from the tree)")
        why = verify(spec.snapshot_dir)
        if why:
            raise LaunchError(f"the run's snapshot {spec.snapshot_dir} {why}: never run; accepted: `launch resume "
                              "--snapshot` (a new one of its tree) or `--no-snapshot` (run from the tree)")
        return spec
    snap = scan(spec.snapshot_from or os.getcwd(), exclude=(spec.snapshot, spec.run_dir))   # + every run dir, store
    program_in(snap, spec.program)
    if os.path.lexists(snap.dir(spec.snapshot)):
        usable(snap.dir(spec.snapshot))                  # someone else's: refused here, before anything is written
    _scanned[snap.dir(spec.snapshot)] = snap
    return spec.replace(snapshot_dir=snap.dir(spec.snapshot), snapshot_from=snap.root)


def commit(spec) -> None:
    """Write the snapshot take() named, unless it is there already and verified (else made again). A tree changed
    since take() is refused in one line (the plan names the snapshot by the content take() saw)."""
    if not spec.snapshot_dir or os.path.isdir(spec.snapshot_dir) and spec.snapshot_dir not in _scanned \
            and usable(spec.snapshot_dir):          # a resume keeping its snapshot: take() verified it
        statcache.flush()
        return
    snap = _scanned.get(spec.snapshot_dir) or scan(spec.snapshot_from)
    if write(snap, os.path.dirname(spec.snapshot_dir)) != spec.snapshot_dir:
        statcache.forget(snap.root)          # or its stat cache named a hash the content did not have
        raise LaunchError(f"the program's tree {brief(spec.snapshot_from)} changed while its snapshot was taken; "
                          "accepted: a tree that stays as it is during the launch (launch again)")
    statcache.flush()


def for_resume(spec, given: bool | None, store: str):
    """--snapshot on resume: None keeps the run's snapshot (or none), True takes a new one of its tree (into
    the run's store, else `store`), False runs from the tree itself."""
    if given is None:
        return spec
    return spec.replace(snapshot=(spec.snapshot or store) if given else "", snapshot_dir="")


def dry_run_line(spec) -> str:
    """The dry-run's lines naming the snapshot the ranks would run from and what the tree holds that it leaves
    out, with why ("" without one)."""
    if not spec.snapshot_dir:
        return ""
    why = verify(spec.snapshot_dir) if os.path.lexists(spec.snapshot_dir) else "-"
    state = "written at submit" if why == "-" else "exists: reused" if why is None else \
        f"exists but {why}: made again at submit"
    left = _scanned[spec.snapshot_dir].left_out if spec.snapshot_dir in _scanned else ()
    by: dict[str, list[str]] = {}
    for path, reason in left:
        by.setdefault(reason, []).append(path)
    said = "; ".join(", ".join(ps[:8]) + (f" and {len(ps) - 8} more" if len(ps) > 8 else "") + f" ({r})"
                     for r, ps in by.items())
    return f"# snapshot: {spec.snapshot_dir} (of {spec.snapshot_from}; {state})\n" + \
        (f"# snapshot: {held(_scanned[spec.snapshot_dir])}\n" if spec.snapshot_dir in _scanned else "") + \
        (f"# snapshot: left out: {said}\n" if said else "")


def held(snap: Snapshot, shown: int = 3) -> str:
    """`57 files, 1.2 MiB; largest: workloads/ 600 KiB, launchers/ 500 KiB, README.md 12 KiB`: what is copied."""
    by: dict[str, int] = {}
    for rel, size in zip(snap.files, snap.sizes):       # as scan() saw them: no file is looked at again
        top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
        by[top] = by.get(top, 0) + size
    big = sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))[:shown]
    n = len(snap.files)
    return f"{n} file{'' if n == 1 else 's'}, {size_of(snap.size)}; largest: " + ", ".join(f"{k} {size_of(v)}" for k, v in big)


def size_of(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
