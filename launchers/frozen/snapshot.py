"""--snapshot: the program's tree frozen at submit in a content-addressed directory the ranks run
from.

The tree is the launch's working directory, as launchers.frozen.snaptree selects it (git's files,
else less `.launchignore`; never run dirs, stores, secret-looking files unless `.launchinclude`
names them): what it leaves out is said with why (Snapshot.left_out: the dry-run's line). A symlink
to a file outside the tree is frozen as that file's content. Its hash is the sha256 over each file's
path, kind (file, executable, symlink) and content sha256, in path order: the same content is the
same directory, `<store>/<hash>`, written once (into a temporary directory, made read-only: files
0444/0555, directories 0555, then renamed into place) and reused by every run, resume and array task
with that content -- only while it is the user's, writable by no one else, and still hashes to its
name (verify(): else made again, or refused in one line when it is someone else's or a symlink). The
ranks run in their run's own work/ (launchers.rankexec.work_dir), never in the store. The store is
`<runs root>/.snapshots` for a run dir inside the runs root, else `.snapshots` beside the run dir
(on the storage the run dir is on: shared where the nodes see it). A file whose stat key is
unchanged since it was hashed is not read again, by scan() nor verify() (launchers.frozen.statcache,
saved by commit()); a snapshot directory write() makes is known to it as written. Stdlib only; the
dry-run hashes (reads) but writes nothing.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from ..errors import LaunchError, brief
from . import statcache
from .snapstore import hashed, line, usable, verify, write
from .snaptree import IGNORE_FILE, SECRET, STORE, STORES, git, tree_files  # noqa: F401  (re-exported)

MAX_BYTES = 2 << 30  # a tree this big is not a program's: refuse, naming .launchignore
MAX_FILES = 200_000
# the rank wrapper runs the program from there (first on PYTHONPATH; cwd work/)
ENV = "LAUNCH_SNAPSHOT_DIR"


@dataclass(frozen=True)
class Snapshot:
    root: str  # the tree it is taken from (absolute)
    files: tuple[str, ...]  # paths relative to root, sorted
    digest: str  # sha256 of the content (see the module's doc)
    size: int  # bytes of the files
    # (path, why): what the tree holds that the snapshot does not
    left_out: tuple[tuple[str, str], ...] = ()
    sizes: tuple[int, ...] = ()  # each file's bytes (lstat), in the order of files
    # files whose content was read: 0 for a tree the cache knows
    read: int = field(default=0, compare=False)

    def dir(self, store: str) -> str:
        return os.path.join(store, self.digest)


def store_for(run_dir: str, runs_root: str, name: str = STORE) -> str:
    """Where a run's snapshots live: `<runs root>/.snapshots` when run_dir is inside the runs root,
    else `.snapshots` beside run_dir (name: another store kept the same way,
    launchers.frozen.extcache's)."""
    inside = os.path.commonpath([run_dir, runs_root]) == runs_root
    return os.path.join(runs_root if inside else os.path.dirname(run_dir), name)


def scan(root: str, exclude: tuple[str, ...] = ()) -> Snapshot:
    """The tree's files and content hash (reads the files the stat cache does not know unchanged,
    writes nothing: commit() saves the cache)."""
    root = os.path.abspath(root)
    left: list[tuple[str, str]] = []
    files = tree_files(root, exclude, left)
    stats = [_lstat(root, rel) for rel in files]
    size = sum(st.st_size for st in stats)
    if size > MAX_BYTES or len(files) > MAX_FILES:
        raise LaunchError(
            f"the program's tree {brief(root)} has {len(files)} files, {size >> 20} MiB: too big "
            f"to snapshot (accepted: up to {MAX_FILES} files, {MAX_BYTES >> 20} MiB); leave data "
            f"out with {IGNORE_FILE} (or .gitignore), or give --no-snapshot"
        )
    h, cache = hashlib.sha256(), statcache.hashes(root)
    read = cache.read if cache else 0
    for rel, st in zip(files, stats):
        try:
            kind, sha = hashed(root, rel, st, cache)
            h.update(line(rel, kind, sha))
            out = kind == "l" and os.path.commonpath(
                [os.path.realpath(root), os.path.realpath(os.path.join(root, rel))]
            ) != os.path.realpath(root)
            left += (
                [(rel, "a link out of the tree, kept as a link: what it points to is not frozen")]
                if out
                else []
            )
        except OSError as e:
            raise _unreadable(root, rel, e) from None
    return Snapshot(
        root=root,
        files=tuple(files),
        digest=h.hexdigest(),
        size=size,
        left_out=tuple(left),
        sizes=tuple(st.st_size for st in stats),
        read=cache.read - read if cache else len(files),
    )


def _lstat(root: str, rel: str) -> os.stat_result:
    try:
        return os.lstat(os.path.join(root, rel))
    except OSError as e:
        raise _unreadable(root, rel, e) from None


def _unreadable(root: str, rel: str, e: OSError) -> LaunchError:
    return LaunchError(
        f"{brief(os.path.join(root, rel))} of the program's tree cannot be read for its snapshot "
        f"({e.strerror}); accepted: readable files (leave it out with {IGNORE_FILE} or "
        ".gitignore), or --no-snapshot"
    )


def program_in(snap: Snapshot, program: tuple[str, ...]) -> None:
    """A program file must be a file of the snapshot (else the ranks could not run it from
    there)."""
    if program[0] == "-m":
        return
    rel = os.path.relpath(program[0], snap.root).replace(os.sep, "/")
    if rel not in snap.files:
        where = "outside" if rel.startswith("../") else "left out of"
        raise LaunchError(
            f"program file {brief(program[0])} is {where} the snapshot of {brief(snap.root)} "
            f"(ignored or not below it); accepted: a program in the launch directory's tree, or "
            f"--no-snapshot"
        )


# snapshot dir -> what take() scanned for it (commit() copies that)
_scanned: dict[str, Snapshot] = {}


def take(spec):
    """The spec with its snapshot named (spec.snapshot: the store, "" = none): a recorded one
    (snapshot_dir) must still be there; else the launch directory's tree (or the one recorded) is
    scanned -- nothing is written until commit(), after every check of the launch has passed.
    Duck-typed over launchers.spec.RunSpec (which imports this module)."""
    if not spec.snapshot:
        return spec
    # ssh --no-shared-storage: the hosts could not see it
    if spec.opts.get("shared_storage") is False:
        raise LaunchError(
            "--snapshot is not accepted with --no-shared-storage (the hosts run from the "
            "snapshot under the runs root, on storage they share); accepted: --no-snapshot, or "
            "shared storage"
        )
    if spec.snapshot_dir:
        if not os.path.isdir(spec.snapshot_dir):
            raise LaunchError(
                f"the run's snapshot {brief(spec.snapshot_dir)} is gone; accepted: `launch resume "
                "--snapshot` (a new one of its tree) or `--no-snapshot` (run from the tree)"
            )
        why = verify(spec.snapshot_dir)
        if why:
            raise LaunchError(
                f"the run's snapshot {spec.snapshot_dir} {why}: never run; accepted: `launch "
                "resume --snapshot` (a new one of its tree) or `--no-snapshot` (run from the "
                "tree)"
            )
        return spec
    # + every run dir, store
    snap = scan(spec.snapshot_from or os.getcwd(), exclude=(spec.snapshot, spec.run_dir))
    program_in(snap, spec.program)
    if os.path.lexists(snap.dir(spec.snapshot)):
        usable(snap.dir(spec.snapshot))  # someone else's: refused here, before anything is written
    _scanned[snap.dir(spec.snapshot)] = snap
    return spec.replace(snapshot_dir=snap.dir(spec.snapshot), snapshot_from=snap.root)


def commit(spec) -> None:
    """Write the snapshot take() named, unless it is there already and verified (else made again). A
    tree changed since take() is refused in one line (the plan names the snapshot by the content
    take() saw)."""
    if (
        not spec.snapshot_dir
        or os.path.isdir(spec.snapshot_dir)
        and spec.snapshot_dir not in _scanned
        and usable(spec.snapshot_dir)
    ):  # a resume keeping its snapshot: take() verified it
        statcache.flush()
        return
    snap = _scanned.get(spec.snapshot_dir) or scan(spec.snapshot_from)
    if write(snap, os.path.dirname(spec.snapshot_dir)) != spec.snapshot_dir:
        statcache.forget(snap.root)  # or its stat cache named a hash the content did not have
        raise LaunchError(
            f"the program's tree {brief(spec.snapshot_from)} changed while its snapshot was taken; "
            "accepted: a tree that stays as it is during the launch (launch again)"
        )
    statcache.flush()


def for_resume(spec, given: bool | None, store: str):
    """--snapshot on resume: None keeps the run's snapshot (or none), True takes a new one of its
    tree (into the run's store, else `store`), False runs from the tree itself."""
    if given is None:
        return spec
    return spec.replace(snapshot=(spec.snapshot or store) if given else "", snapshot_dir="")


def dry_run_line(spec) -> str:
    """The dry-run's lines naming the snapshot the ranks would run from and what the tree holds that
    it leaves out, with why ("" without one)."""
    if not spec.snapshot_dir:
        return ""
    why = verify(spec.snapshot_dir) if os.path.lexists(spec.snapshot_dir) else "-"
    state = (
        "written at submit"
        if why == "-"
        else "exists: reused"
        if why is None
        else f"exists but {why}: made again at submit"
    )
    left = _scanned[spec.snapshot_dir].left_out if spec.snapshot_dir in _scanned else ()
    by: dict[str, list[str]] = {}
    for path, reason in left:
        by.setdefault(reason, []).append(path)
    said = "; ".join(
        ", ".join(ps[:8]) + (f" and {len(ps) - 8} more" if len(ps) > 8 else "") + f" ({r})"
        for r, ps in by.items()
    )
    return (
        f"# snapshot: {spec.snapshot_dir} (of {spec.snapshot_from}; {state})\n"
        + (
            f"# snapshot: {held(_scanned[spec.snapshot_dir])}\n"
            if spec.snapshot_dir in _scanned
            else ""
        )
        + (f"# snapshot: left out: {said}\n" if said else "")
    )


def held(snap: Snapshot, shown: int = 3) -> str:
    """`57 files, 1.2 MiB; largest: workloads/ 600 KiB, launchers/ 500 KiB, README.md 12 KiB`: what
    is copied."""
    by: dict[str, int] = {}
    for rel, size in zip(snap.files, snap.sizes):  # as scan() saw them: no file is looked at again
        top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
        by[top] = by.get(top, 0) + size
    big = sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))[:shown]
    n = len(snap.files)
    return f"{n} file{'' if n == 1 else 's'}, {size_of(snap.size)}; largest: " + ", ".join(
        f"{k} {size_of(v)}" for k, v in big
    )


def size_of(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
