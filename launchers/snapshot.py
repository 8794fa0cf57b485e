"""--snapshot: the program's tree frozen at submit in a content-addressed directory the ranks run from.

The tree is the launch's working directory: in a git work tree its tracked files plus the untracked ones git does
not ignore (`git ls-files -co --exclude-standard`), elsewhere every file below it minus the `.launchignore`
patterns (gitignore-like: `name`, `*.ext`, `dir/`, `sub/path`, `# comment`); `__pycache__/`, run dirs (a
directory holding a run.yaml, wherever it is), snapshot stores and torch extension stores never belong to it. Its hash is the sha256 over each file's path, kind (file,
executable, symlink) and content sha256, in path order: the same content is the same directory,
`<store>/<hash>`, written once (into a temporary directory, then renamed into place) and reused by every run,
resume and array task with that content. The store is `<runs root>/.snapshots` for a run dir inside the runs
root, else `.snapshots` beside the run dir (on the storage the run dir is on: shared where the nodes see it).
Stdlib only; the dry-run hashes (reads) but writes nothing.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass

from .errors import LaunchError, brief

STORE = ".snapshots"
STORES = (STORE, ".torch_extensions")       # never in a snapshot: this store, launchers.extcache's (built ops)
RUN_DIR_MARKS = ("run.yaml", "status/.lock")    # a run dir (its lock comes first while one is being made)
ATOMIC_TEMP = re.compile(r"\.tmp\.\d+$")        # layout.atomic_write's temporary file: there for a moment
IGNORE_FILE = ".launchignore"
ALWAYS_IGNORED = ("__pycache__/",)
MAX_BYTES = 2 << 30                 # a tree this big is not a program's: refuse, naming .launchignore
MAX_FILES = 200_000
ENV = "LAUNCH_SNAPSHOT_DIR"         # the rank wrapper runs the program there (cwd, first on PYTHONPATH)


@dataclass(frozen=True)
class Snapshot:
    root: str                       # the tree it is taken from (absolute)
    files: tuple[str, ...]          # paths relative to root, sorted
    digest: str                     # sha256 of the content (see the module's doc)
    size: int                       # bytes of the files

    def dir(self, store: str) -> str:
        return os.path.join(store, self.digest)


def store_for(run_dir: str, runs_root: str, name: str = STORE) -> str:
    """Where a run's snapshots live: `<runs root>/.snapshots` when run_dir is inside the runs root, else
    `.snapshots` beside run_dir (name: another store kept the same way, launchers.extcache's)."""
    inside = os.path.commonpath([run_dir, runs_root]) == runs_root
    return os.path.join(runs_root if inside else os.path.dirname(run_dir), name)


def git(root: str, *args: str) -> bytes | None:
    """`git -C root ARGS`'s output, None when git is missing, root is not in a work tree or the command fails."""
    try:
        p = subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def ignore_patterns(root: str) -> list[str]:
    """The .launchignore lines of root (blank lines and # comments dropped) after the built-in ones."""
    try:
        with open(os.path.join(root, IGNORE_FILE), encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
    except FileNotFoundError:
        lines = []
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(f"{brief(os.path.join(root, IGNORE_FILE))} cannot be read ({e}); accepted: a UTF-8 text "
                          "file of patterns, one a line") from None
    return [*ALWAYS_IGNORED, *(ln for ln in lines if ln and not ln.startswith("#"))]


def ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    """Whether rel (a '/'-separated path below the root) matches a pattern: one with a '/' inside matches the
    path from the root, one without matches the last name; a trailing '/' matches only a directory."""
    for pat in patterns:
        if pat.endswith("/") and not is_dir:
            continue
        p = pat.strip("/")
        if fnmatch.fnmatchcase(rel if "/" in p else rel.rsplit("/", 1)[-1], p):
            return True
    return False


def walk_files(root: str, patterns: list[str], skip: tuple[str, ...] = ()) -> list[str]:
    """Every file and symlink below root (never following a directory link), less the ignored paths and the
    directories in skip ('a/b/': never entered)."""
    out = []
    for d, dirs, files in os.walk(root):
        base = os.path.relpath(d, root)
        rel = (lambda n: n) if base == os.curdir else (lambda n: f"{base}/{n}".replace(os.sep, "/"))
        dirs[:] = sorted(n for n in dirs if not ignored(rel(n), True, patterns) and rel(n) + "/" not in skip)
        out += [rel(n) for n in files if not ignored(rel(n), False, patterns)]
        out += [rel(n) for n in dirs if os.path.islink(os.path.join(d, n))]     # a link to a directory: a link
        dirs[:] = [n for n in dirs if not os.path.islink(os.path.join(d, n))]
    return out


def tree_files(root: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """The tree's files (see the module's doc), sorted; paths under an `exclude` directory left out."""
    skip = tuple(os.path.relpath(e, root).replace(os.sep, "/") + "/" for e in exclude
                 if os.path.commonpath([root, e]) == root and e != root)
    listed = git(root, "ls-files", "-co", "--exclude-standard", "-z", "--", ".", *(f":(exclude){s}" for s in skip))
    files = [f for f in listed.decode("utf-8", "surrogateescape").split("\0") if f] if listed is not None \
        else walk_files(root, ignore_patterns(root), skip)
    pats = ALWAYS_IGNORED if listed is not None else ()
    skip += tuple(f[:-len(m)] for f in files for m in RUN_DIR_MARKS if f.endswith("/" + m))  # other run dirs
    return sorted(f for f in set(files) if _file_or_link(os.path.join(root, f))      # not a deleted file, a submodule
                  and not any(f.startswith(s) for s in skip) and not ignored_dirs(f, pats)
                  and not any(f"/{s}/" in f"/{f}" for s in STORES) and not ATOMIC_TEMP.search(f))


def _file_or_link(path: str) -> bool:
    return os.path.islink(path) or os.path.isfile(path)


def ignored_dirs(rel: str, patterns: tuple[str, ...]) -> bool:
    parts = rel.split("/")
    return any(ignored("/".join(parts[:i]), True, list(patterns)) for i in range(1, len(parts)))


def _entry(root: str, rel: str) -> tuple[str, bytes]:
    """(kind, content): 'l' and the link's target, 'x' (executable) or 'f' and the file's bytes."""
    path = os.path.join(root, rel)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "l", os.fsencode(os.readlink(path))
    if not stat.S_ISREG(st.st_mode):
        return "", b""
    with open(path, "rb") as f:
        return ("x" if st.st_mode & 0o111 else "f"), f.read()


def _line(rel: str, kind: str, data: bytes) -> bytes:
    return f"{rel}\0{kind}\0{hashlib.sha256(data).hexdigest()}\n".encode("utf-8", "surrogateescape")


def scan(root: str, exclude: tuple[str, ...] = ()) -> Snapshot:
    """The tree's files and content hash (reads every file, writes nothing)."""
    root = os.path.abspath(root)
    files = tree_files(root, exclude)
    size = sum(os.lstat(os.path.join(root, f)).st_size for f in files)
    if size > MAX_BYTES or len(files) > MAX_FILES:
        raise LaunchError(f"the program's tree {brief(root)} has {len(files)} files, {size >> 20} MiB: too big to "
                          f"snapshot (accepted: up to {MAX_FILES} files, {MAX_BYTES >> 20} MiB); leave data out "
                          f"with {IGNORE_FILE} (or .gitignore), or give --no-snapshot")
    h = hashlib.sha256()
    for rel in files:
        try:
            h.update(_line(rel, *_entry(root, rel)))
        except OSError as e:
            raise LaunchError(f"{brief(os.path.join(root, rel))} of the program's tree cannot be read for its "
                              f"snapshot ({e.strerror}); accepted: readable files (leave it out with {IGNORE_FILE} "
                              "or .gitignore), or --no-snapshot") from None
    return Snapshot(root=root, files=tuple(files), digest=h.hexdigest(), size=size)


def write(snap: Snapshot, store: str) -> str:
    """The snapshot's directory in store: reused when there, else copied into a temporary directory (read-only
    files) and renamed into place. The copy is hashed as it is made: a tree changed since scan() lands under the
    hash of what was copied. Returns that directory."""
    if os.path.isdir(snap.dir(store)):
        return snap.dir(store)
    try:
        os.makedirs(store, exist_ok=True)
        tmp = os.path.join(store, f".tmp-{snap.digest[:12]}-{os.getpid()}-{os.urandom(3).hex()}")
        os.mkdir(tmp)
    except OSError as e:
        raise LaunchError(f"snapshot store {brief(store)} cannot be written ({e.strerror}); accepted: a runs root "
                          "you can write, or --no-snapshot") from None
    try:
        h = hashlib.sha256()
        for rel in snap.files:
            kind, data = _entry(snap.root, rel)
            h.update(_line(rel, kind, data))
            _put(os.path.join(tmp, rel), kind, data)
        final = os.path.join(store, h.hexdigest())
        try:
            os.rename(tmp, final)
        except OSError:                      # made meanwhile by another launch: the same content
            if not os.path.isdir(final):
                raise
        return final
    except OSError as e:
        raise LaunchError(f"snapshot {brief(snap.dir(store))} cannot be written ({e.strerror}); accepted: a runs "
                          "root with free space you can write, or --no-snapshot") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _put(path: str, kind: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if kind == "l":
        os.symlink(os.fsdecode(data), path)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o555 if kind == "x" else 0o444)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


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
    until commit(), after every check of the launch has passed. Duck-typed over launchers.spec.JobSpec (which
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
        return spec
    snap = scan(spec.snapshot_from or os.getcwd(), exclude=(spec.snapshot, spec.run_dir))   # + every run dir, store
    program_in(snap, spec.program)
    _scanned[snap.dir(spec.snapshot)] = snap
    return spec.replace(snapshot_dir=snap.dir(spec.snapshot), snapshot_from=snap.root)


def commit(spec) -> None:
    """Write the snapshot take() named, unless it is there already. A tree changed since take() is refused in one
    line (the plan names the snapshot by the content take() saw)."""
    if not spec.snapshot_dir or os.path.isdir(spec.snapshot_dir):
        return
    snap = _scanned.get(spec.snapshot_dir) or scan(spec.snapshot_from)
    if write(snap, os.path.dirname(spec.snapshot_dir)) != spec.snapshot_dir:
        raise LaunchError(f"the program's tree {brief(spec.snapshot_from)} changed while its snapshot was taken; "
                          "accepted: a tree that stays as it is during the launch (launch again)")


def for_resume(spec, given: bool | None, store: str):
    """--snapshot on resume: None keeps the run's snapshot (or none), True takes a new one of its tree (into
    the run's store, else `store`), False runs from the tree itself."""
    if given is None:
        return spec
    return spec.replace(snapshot=(spec.snapshot or store) if given else "", snapshot_dir="")


def dry_run_line(spec) -> str:
    """The dry-run's line naming the snapshot the ranks would run from ("" without one)."""
    if not spec.snapshot_dir:
        return ""
    state = "exists: reused" if os.path.isdir(spec.snapshot_dir) else "written at submit"
    return f"# snapshot: {spec.snapshot_dir} (of {spec.snapshot_from}; {state})\n"
