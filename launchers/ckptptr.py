"""The `checkpoints/latest` pointer: a one-line text file naming the newest *complete* checkpoint,
and the manifest that proves a checkpoint complete.

Stdlib only (no torch): the launcher reads it, the workloads write it. Writing is atomic and
durable: write a temporary file in the same directory, fsync it, os.replace() it over `latest`,
fsync the directory. A reader therefore sees either the old name or the new one, never a partial
file. `launchers.records.rundir` re-exports both functions; this is the only place the format is
defined. A checkpoint is committed with commit(): its manifest (every file's size and digest), then
the pointer. A resume asks resolve() what to load (`latest` if it still matches its manifest, else
the newest complete earlier step, else one line naming the damaged file); `launch status` shows
check()'s verdict.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

try:  # a dependency (setup.cfg); the import is kept optional so that a broken
    import xxhash  # install still reads sha256 manifests and says what is missing
except ImportError:  # pragma: no cover
    xxhash = None

from .layout import no_symlink
from .records import fence

POINTER = "latest"


def _check_name(name: str) -> None:
    if not name or name != name.strip() or "/" in name or "\n" in name or name in (".", ".."):
        raise ValueError(
            f"bad checkpoint name {name!r}: expected a plain directory name like 'step-00000050'"
        )


def write_latest(ckpt_dir: str, name: str) -> None:
    """Atomically make `ckpt_dir/latest` name the checkpoint directory `name` (relative to
    ckpt_dir). In a process of an older attempt than its run's: fence.Fenced, nothing written
    (launchers.records.fence)."""
    _check_name(name)
    fence.require_env(f"checkpoints/latest -> {name}")
    os.makedirs(ckpt_dir, exist_ok=True)
    tmp = os.path.join(ckpt_dir, f".{POINTER}.tmp.{os.getpid()}")
    # a planted link is refused, never replaced
    no_symlink(ckpt_dir, os.path.join(ckpt_dir, POINTER))
    with open(no_symlink(ckpt_dir, tmp), "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt_dir, POINTER))
    _fsync_dir(ckpt_dir)


def read_latest(ckpt_dir: str) -> str | None:
    """The checkpoint name `latest` points to, or None when there is no (or an empty) pointer."""
    try:
        with open(os.path.join(ckpt_dir, POINTER), encoding="utf-8") as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return name or None


# ------------------------------------------------------------------------------------- the manifest
# Written at commit into the step dir, after every rank's files are written and before `latest`
# moves (commit()): {"version": 1, "files": {relative path: {"size": bytes, <algorithm>: hex}}}, the
# algorithm xxh3_128 (xxhash, ~10x sha256's speed) unless LAUNCH_CHECKPOINT_HASH=sha256 asks for
# sha256, which is always accepted when verifying (manifests written before xxh3_128). A writer that
# digested the files as it wrote them hands those digests to commit(known=) (the workloads' DCP
# writer): only files it did not digest are read back. `latest` is trusted only when the step it
# names still matches its manifest; otherwise a resume falls back to the newest complete earlier
# step (resolve()). Checkpoints from before manifests existed load as "unverified". Readers need the
# step dir on storage every rank shares (as loading it does): rank 0 hashes every file it sees.

MANIFEST = "manifest.json"
_STEP = re.compile(r"step-(\d+)")


# what a manifest may record per file; verified: the first one present
HASHES = ("xxh3_128", "sha256")
_CHUNK = 8 << 20


def hash_name() -> str:
    """The digest new manifests record: LAUNCH_CHECKPOINT_HASH (xxh3_128 or sha256), else
    xxh3_128."""
    algo = os.environ.get("LAUNCH_CHECKPOINT_HASH") or "xxh3_128"
    if algo not in HASHES:
        raise ValueError(
            f"LAUNCH_CHECKPOINT_HASH={algo!r} is not accepted; accepted: {', '.join(HASHES)}"
        )
    return algo


def hasher(algo: str):
    """A fresh hash object of `algo` (one of HASHES): update(bytes), hexdigest()."""
    if algo == "xxh3_128" and xxhash is None:
        raise ValueError(
            "xxh3_128 checkpoint digests need the xxhash package (pip install xxhash), or "
            "LAUNCH_CHECKPOINT_HASH=sha256"
        )
    return xxhash.xxh3_128() if algo == "xxh3_128" else hashlib.sha256()


def _digest(path: str, algo: str = "sha256") -> str:
    h = hasher(algo)
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _files(step_dir: str) -> list[str]:
    """Every file under step_dir (relative, sorted), the manifest and its temporaries left out."""
    out = []
    for root, _, names in os.walk(step_dir):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), step_dir)
            if not (rel == MANIFEST or rel.startswith(f".{MANIFEST}.tmp")):
                out.append(rel)
    return sorted(out)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(step_dir: str, attempt: int | None = None, known: dict | None = None) -> dict:
    """Hash every file of a finished checkpoint into step_dir/manifest.json (atomic, durable;
    hash_name()'s digest); returns it. `attempt`: the attempt that wrote it (its generation:
    launchers.records.fence), when known. `known`: {relative path: {"size": n, algo: hex}} digested
    while the files were written (the workloads' DCP writer): such a file, of that size and
    algorithm, is not read back; every other file is."""
    algo, known = hash_name(), known or {}
    files = {}
    for rel in _files(step_dir):
        size = os.path.getsize(os.path.join(step_dir, rel))
        got = known.get(rel) or {}
        files[rel] = {
            "size": size,
            algo: got[algo]
            if got.get("size") == size and isinstance(got.get(algo), str)
            else _digest(os.path.join(step_dir, rel), algo),
        }
    manifest = {
        "version": 1,
        "files": files,
        **({"attempt": attempt} if attempt is not None else {}),
    }
    tmp = os.path.join(step_dir, f".{MANIFEST}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(step_dir, MANIFEST))
    except OSError:
        if os.path.exists(tmp):  # a full disk: leave no temporary behind
            os.unlink(tmp)
        raise
    _fsync_dir(step_dir)
    return manifest


def commit(ckpt_dir: str, name: str, known: dict | None = None) -> None:
    """Make checkpoint `name` the latest: its manifest (with the attempt of a `launch` run; `known`:
    digests taken while writing, write_manifest()), then the pointer. Call once every rank's files
    are written (after the save's barrier), on one rank. From an older attempt than its run's:
    fence.Fenced, nothing written (launchers.records.fence)."""
    _check_name(name)
    attempt = fence.require_env(f"the checkpoint commit of {name}")
    write_manifest(os.path.join(ckpt_dir, name), attempt, known)
    write_latest(ckpt_dir, name)


@dataclass(frozen=True)
class Verdict:
    """What a checkpoint is: "complete" (matches its manifest), "unverified" (no manifest: an
    earlier version's, or a file), or "damaged"; `why` names the damaged file (or says why it is
    unverified)."""

    name: str
    state: str
    why: str = ""


def _read_manifest(path: str) -> dict | None:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    files = data.get("files") if isinstance(data, dict) else None
    ok = isinstance(files, dict) and all(
        isinstance(v, dict)
        and isinstance(v.get("size"), int)
        and any(isinstance(v.get(a), str) for a in HASHES)
        for v in files.values()
    )
    return files if ok else None


def check(ckpt_dir: str, name: str, required: tuple[str, ...] = (), hashes: bool = True) -> Verdict:
    """Verify checkpoint `name` against its manifest: every file present, sizes (cheap), then
    digests (hashes). `required`: files the format cannot do without (DCP's .metadata), checked also
    without a manifest."""
    path = os.path.join(ckpt_dir, name)
    if os.path.isfile(path):
        return Verdict(
            name, "unverified", f"{path} is a file, not a step directory with a {MANIFEST}"
        )
    if not os.path.isdir(path):
        return Verdict(name, "damaged", f"{path} is missing")
    man = os.path.join(path, MANIFEST)
    try:
        files = _read_manifest(man)
    except FileNotFoundError:
        files = {}
    except (OSError, ValueError) as e:
        return Verdict(name, "damaged", f"{man} cannot be read ({type(e).__name__})")
    if files is None:
        return Verdict(name, "damaged", f"{man} is not a checkpoint manifest")
    for rel in required:
        if not os.path.isfile(os.path.join(path, rel)):
            return Verdict(name, "damaged", f"{os.path.join(path, rel)} is missing")
        if files and rel not in files:
            return Verdict(name, "damaged", f"{man} does not list {rel}")
    if not files:
        return Verdict(
            name, "unverified", f"no {MANIFEST} (written before checkpoints were verified)"
        )
    return _check_files(path, files, hashes)


def _check_files(path: str, files: dict, hashes: bool) -> Verdict:
    name = os.path.basename(path)
    for rel, want in sorted(files.items()):
        f = os.path.join(path, rel)
        try:
            size = os.path.getsize(f)
        except OSError:
            return Verdict(name, "damaged", f"{f} is missing")
        if size != want["size"]:
            return Verdict(
                name,
                "damaged",
                f"{f} is {size} bytes, {want['size']} when written (truncated)"
                if size < want["size"]
                else f"{f} is {size} bytes, {want['size']} when written",
            )
    for rel, want in sorted(files.items()) if hashes else ():
        f = os.path.join(path, rel)
        algo = next(a for a in HASHES if isinstance(want.get(a), str))
        if _digest(f, algo) != want[algo]:
            return Verdict(
                name,
                "damaged",
                f"{f} does not match its {algo} in {MANIFEST} (its content changed)",
            )
    return Verdict(name, "complete")


def digest_of(ckpt_dir: str, name: str) -> str:
    """The digest the manifest of checkpoint `name` records (xxh3_128, sha256; "" without a readable
    one)."""
    try:
        files = _read_manifest(os.path.join(ckpt_dir, name, MANIFEST)) or {}
    except (OSError, ValueError):
        return ""
    return next((a for a in HASHES for v in files.values() if isinstance(v.get(a), str)), "")


def step_of(name: str) -> int | None:
    m = _STEP.fullmatch(name)
    return int(m.group(1)) if m else None


def earlier(ckpt_dir: str, name: str) -> list[str]:
    """The step directories before `name` (a step-<N> name), newest first."""
    top = step_of(name)
    if top is None or not os.path.isdir(ckpt_dir):
        return []
    found = [(step_of(n), n) for n in os.listdir(ckpt_dir) if step_of(n) is not None]
    return [
        n
        for s, n in sorted(found, reverse=True)
        if s < top and os.path.isdir(os.path.join(ckpt_dir, n))
    ]


@dataclass(frozen=True)
class Resolution:
    """What a resume loads: `name` (None: start fresh, or stop when `error` is set); `note`: one
    line to log (a skipped damaged checkpoint, an unverified one); `error`: one line naming the
    damaged file."""

    name: str | None
    note: str = ""
    error: str = ""
    skipped: tuple[Verdict, ...] = ()


def resolve(ckpt_dir: str, required: tuple[str, ...] = (), hashes: bool = True) -> Resolution:
    """The checkpoint to resume from: `latest` when it is complete (or unverified: no manifest),
    else the newest complete (or unverified) earlier step directory, else an error naming the
    damaged file."""
    latest = read_latest(ckpt_dir)
    if latest is None:
        return Resolution(None)
    skipped: list[Verdict] = []
    for name in [latest, *earlier(ckpt_dir, latest)]:
        v = check(ckpt_dir, name, required, hashes)
        if v.state == "damaged":
            skipped.append(v)
            continue
        notes = [f"skipped damaged checkpoint {s.name} ({s.why})" for s in skipped]
        if skipped:
            notes.append(f"resuming from {name}, the newest complete checkpoint before it")
        if v.state == "unverified":
            notes.append(f"loading checkpoint {name} unverified: {v.why}")
        return Resolution(name, "; ".join(notes), skipped=tuple(skipped))
    first = skipped[0]
    others = "; ".join(f"{s.name}: {s.why}" for s in skipped[1:]) or "none"
    return Resolution(
        None,
        error=(
            f"checkpoint {latest} (checkpoints/latest) is damaged: {first.why}; no complete "
            f"earlier checkpoint (others: {others}); remove {os.path.join(ckpt_dir, POINTER)} to "
            "start from scratch"
        ),
        skipped=tuple(skipped),
    )
