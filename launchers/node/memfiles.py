"""A node's store of memory checkpoints on tmpfs (--memory-checkpoint: launchers.memckpt): a
directory of this user's that no one else can reach (private_dir, unsafe_chain: what the store holds
is unpickled, so a store another user can reach is data, never code), each copy a file named by
world size, owner rank, step and kind (own or a peer's), written atomically, the newest KEEP of each
kept (write_copy), listed (listing). Stdlib only."""

from __future__ import annotations

import os
import re
import stat

KEEP = 2  # newest steps kept of each copy (own, peer)
_FILE = re.compile(r"^w(\d+)-r(\d+)-s(\d+)\.(own|peer)$")


def private_dir(path: str) -> str:
    """Make path and its missing parents (0700); '' when it is a directory of this user's that no
    one else may write, else why not (one line)."""
    missing, p = [], path
    while p and p != os.path.dirname(p) and not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    try:
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                pass
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return (
                f"{path} is not this user's own directory (owner uid {st.st_uid}, mode "
                f"{st.st_mode & 0o777:o})"
            )
        return unsafe_chain(os.path.realpath(path))
    except OSError as e:
        return f"{path}: {e.strerror or e}"


def unsafe_chain(real: str) -> str:
    """Why another user could swap a directory on the way to `real` (a resolved path), '' when none
    can: every directory from / down is root's or this user's, and none may be written by others
    unless it is root's and sticky (/dev/shm, /tmp). What the store holds is unpickled: a store
    anyone else can reach is data, never code."""
    p = real
    while True:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            return f"{p} became a symbolic link while it was checked"
        if st.st_uid not in (0, os.getuid()):
            return f"{p} is owned by uid {st.st_uid}, not this user or root"
        if st.st_mode & 0o022 and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
            return f"{p} may be written by others (mode {st.st_mode & 0o7777:o})"
        if os.path.dirname(p) == p:
            return ""
        p = os.path.dirname(p)


def file_name(world: int, owner: int, step: int, kind: str) -> str:
    return f"w{world}-r{owner}-s{step:08d}.{kind}"


def listing(store: str, world: int) -> list[tuple[int, int, str]]:
    """(owner rank, step, kind) of the copies of this world size in a store."""
    try:
        names = os.listdir(store)
    except OSError:
        return []
    out = []
    for n in names:
        m = _FILE.match(n)
        if m and int(m.group(1)) == world:
            out.append((int(m.group(2)), int(m.group(3)), m.group(4)))
    return out


def write_copy(store: str, world: int, owner: int, step: int, kind: str, data: bytes) -> None:
    """Atomically (temp file, rename) -- then the copies of the same owner and kind older than the
    KEEP newest go."""
    path = os.path.join(store, file_name(world, owner, step, kind))
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    mine = sorted(s for o, s, k in listing(store, world) if o == owner and k == kind)
    for s in mine[:-KEEP]:
        try:
            os.unlink(os.path.join(store, file_name(world, owner, s, kind)))
        except FileNotFoundError:
            pass
