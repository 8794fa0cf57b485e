"""What a job builds once, it keeps: torch's JIT extensions (DeepSpeed's ops) in one directory per
environment.

Every rank gets TORCH_EXTENSIONS_DIR = `<runs root>/.torch_extensions/<key>` (beside the run dir
when it is not inside the runs root, like the snapshot store: launchers.frozen.snapshot.store_for),
so an op built by one node or one run is loaded by every node and every later run instead of being
compiled again (DeepSpeed's CPU comm op: a minute or two). The key is a short hash of the
environment, read without importing torch: the job's interpreter path, this Python's version,
torch's version and the CUDA it was built for (importlib.metadata, launchers.records.manifest's
readers; once per environment: torch_build() keeps them in the user's stat cache,
launchers.frozen.statcache) -- or, for a container job, the image reference (with its digest when it
pins one) and the image's interpreter. The user's TORCH_EXTENSIONS_DIR (--env, --forward-env, or set
in the launching shell) wins: launch then sets nothing. The directory is made (mode 0o755 under the
umask, like the snapshot store) before the ranks start; a container job has it mounted at the same
path (launchers.containers.container.mounts).

torch builds an extension under `<dir>/<name>/` holding a FileBaton, the file `<dir>/<name>/lock`
created with O_CREAT|O_EXCL and removed when the build ends (torch/utils/cpp_extension.py
`_jit_compile`: `FileBaton(os.path.join(build_directory, 'lock'))`, torch/utils/file_baton.py
`try_acquire`/`release`, torch 2.13); every other rank spins until it is gone. building() reads
those files: `launch status`, `launch wait` and the hang detector say a node is building instead of
calling it stuck -- for STALE_S at most: a lock older than that may be one a killed build left
(torch then waits forever), so the hang detector counts it no more.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import time

from .. import heartbeat
from ..errors import LaunchError
from ..layout import runs_root
from ..records.manifest import torch_cuda, version
from . import statcache
from .snapshot import STORES, store_for

STORE = STORES[1]  # ".torch_extensions": never taken into a snapshot
ENV = "TORCH_EXTENSIONS_DIR"
LOCK = "lock"  # torch's FileBaton under each extension's build dir
STALE_S = 1800.0  # a lock this old: maybe left by a killed build (torch waits on it forever)
EVERY_S = 15.0  # the launcher's own building line: again after this long


def key(python: str, image: str = "", container_python: str = "") -> str:
    """A short hash of the environment the ranks run in (see the module's doc)."""
    if image:
        parts = ["image", image, container_python]
    else:
        torch, cuda = torch_build()
        parts = [
            "python",
            os.path.realpath(python),
            sys.version.split()[0],
            torch or "-",
            cuda or "cpu",
        ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# cache file -> what torch_build() learned (make() saves it: never a dry-run)
_pending: dict[str, dict] = {}


def torch_build() -> tuple[str | None, str | None]:
    """torch's version and its CUDA (None, None without torch), as launchers.records.manifest reads
    them (importlib.metadata: 15-30 ms a launch) -- remembered per environment (this interpreter,
    its sys.path) in the user's stat cache (launchers.frozen.statcache, its checks) while every
    sys.path directory (pip adds and removes packages there) and torch's version.py keep their stat
    (mtime, ctime, inode, device)."""
    name = "torch\0" + "\0".join([sys.executable, *sys.path])
    path = statcache.path_for(name)
    data, _ = statcache.read_json(path)
    if _fits(data, name) and data["stamps"] == _stamps([s[0] for s in data["stamps"]]):
        return data["torch"][0], data["torch"][1]
    # before reading
    stamps = _stamps([*(os.path.abspath(p) for p in sys.path), *filter(None, [_version_file()])])
    build = (version("torch"), torch_cuda())
    _pending[path] = {"format": 1, "root": name, "stamps": stamps, "torch": list(build)}
    return build


def _fits(data, name: str) -> bool:
    """The exact shape torch_build() writes, for this environment."""
    if (
        not isinstance(data, dict)
        or set(data) != {"format", "root", "stamps", "torch"}
        or data["format"] != 1
        or data["root"] != name
        or not isinstance(data["stamps"], list)
        or not isinstance(data["torch"], list)
    ):
        return False
    paths = [os.path.abspath(p) for p in sys.path]
    return (
        len(data["torch"]) == 2
        and all(v is None or isinstance(v, str) for v in data["torch"])
        and all(
            isinstance(s, list)
            and len(s) == 5
            and isinstance(s[0], str)
            and all(type(v) is int for v in s[1:])
            for s in data["stamps"]
        )
        and [s[0] for s in data["stamps"][: len(paths)]] == paths
    )


def _stamps(paths: list[str]) -> list[list]:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append([p, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev])
        except OSError:
            out.append([p, 0, 0, 0, 0])
    return out


def _version_file() -> str | None:
    from importlib import metadata

    try:
        return str(metadata.distribution("torch").locate_file("torch/version.py"))
    except (metadata.PackageNotFoundError, OSError, ValueError):
        return None


def users(spec, environ) -> str | None:
    """The TORCH_EXTENSIONS_DIR the user set (the job's env first, then the launching shell's), None
    if none."""
    return dict(spec.env).get(ENV) or environ.get(ENV) or None


def default_dir(spec) -> str:
    store = store_for(spec.run_dir, runs_root(), STORE)
    return os.path.join(store, key(spec.python, spec.container_image, spec.container_python))


def settle(spec, environ=None):
    """The spec with torch_extensions_dir set: launch's directory, or "" when the user set their
    own."""
    environ = os.environ if environ is None else environ
    return spec.replace(torch_extensions_dir="" if users(spec, environ) else default_dir(spec))


def dry_run_line(spec, environ=None) -> str:
    environ = os.environ if environ is None else environ
    if spec.torch_extensions_dir:
        state = "exists: reused" if os.path.isdir(spec.torch_extensions_dir) else "made at submit"
        return (
            f"# torch extensions: {spec.torch_extensions_dir} (shared by every node and run; "
            f"{state})\n"
        )
    return f"# torch extensions: {users(spec, environ)} (yours: {ENV} set; launch sets none)\n"


def make(spec) -> None:
    """Create the run's extension directory (and its store) before the ranks start, only the user's
    to write: one someone else could have written (not the user's, a symlink, writable by others) is
    refused in one line, before any rank loads what it holds; the builds torch made in it under a
    group-writable umask are made the user's alone."""
    d = spec.torch_extensions_dir
    while _pending:
        statcache.write_json(*_pending.popitem())
    if not d:
        return
    os.makedirs(os.path.dirname(d), exist_ok=True)
    try:
        os.mkdir(d, 0o755)
        os.chmod(d, 0o755)  # whatever the umask
    except FileExistsError:
        pass
    why = trust_problem(d, os.lstat(d))
    for name in [] if why else sorted(os.listdir(d)):
        p = os.path.join(d, name)
        st = os.lstat(p)
        if st.st_uid == os.getuid() and stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022:
            os.chmod(p, st.st_mode & ~0o022)
        why = why or trust_problem(p, os.lstat(p))
    if why:
        raise LaunchError(
            f"torch extension cache {why}; accepted: a directory only you can write (remove it, or "
            f"set your own with --env {ENV}=DIR)"
        )


def trust_problem(p: str, st: os.stat_result) -> str | None:
    """Why p (lstat st) could hold someone else's code: a symlink, another user's, writable by
    others."""
    if stat.S_ISLNK(st.st_mode):
        return f"{p} is a symlink"
    if st.st_uid != os.getuid():
        return f"{p} is owned by uid {st.st_uid}, not you (uid {os.getuid()})"
    return (
        f"{p} is writable by others (mode {st.st_mode & 0o777:o})" if st.st_mode & 0o022 else None
    )


def building(ext_dir: str | None, now: float | None = None) -> list[tuple[str, float]]:
    """(extension name, seconds) for each build under way in ext_dir: its FileBaton `lock` is
    there."""
    if not ext_dir or not os.path.isdir(ext_dir):
        return []
    now = time.time() if now is None else now
    out = []
    for name in sorted(os.listdir(ext_dir)):
        try:
            since = os.stat(os.path.join(ext_dir, name, LOCK)).st_mtime
        except OSError:
            continue
        out.append((name, max(0.0, now - since)))
    return out


def ext_dir(spec: dict) -> str | None:
    """The run's extension directory from its recorded spec: launch's, else the user's --env one."""
    return spec.get("torch_extensions_dir") or (spec.get("env") or {}).get(ENV) or None


def line(node: int | None, name: str, secs: float) -> str:
    who = "a node" if node is None else f"node {node}"
    stale = (
        f"; a lock left by a killed build? torch waits on <dir>/{name}/{LOCK} until it is removed"
        if secs >= STALE_S
        else ""
    )
    return f"{who}: building a torch extension ({name}, {secs:.0f}s{stale})"


class Teller:
    """The launcher's own progress lines (local): `launch: node K: building a torch extension (NAME,
    Ns)` for each build under way and each node none of whose ranks has a heartbeat this attempt,
    again every EVERY_S; call it in the launcher's wait loop (it looks at most every 2 s)."""

    def __init__(self, spec, attempt: int, out=None):
        self.dir, self.run_dir, self.attempt, self.out = (
            spec.torch_extensions_dir,
            spec.run_dir,
            attempt,
            out,
        )
        self.nodes, self.gpus = spec.nodes, spec.gpus_per_node
        self.next, self.said = 0.0, {}

    def quiet_nodes(self) -> list[int]:
        def quiet(k: int) -> bool:
            beats = (heartbeat.read(self.run_dir, k * self.gpus + i) for i in range(self.gpus))
            return not any(b and b.get("attempt") == self.attempt for b in beats)

        return [k for k in range(self.nodes) if quiet(k)]

    def __call__(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if not self.dir or now < self.next:
            return
        self.next = now + 2.0
        for name, secs in building(self.dir, now):
            for k in self.quiet_nodes() or [None]:
                if self.said.get((k, name), -EVERY_S) + EVERY_S <= secs:
                    self.said[(k, name)] = secs
                    print(f"launch: {line(k, name, secs)}", file=self.out or sys.stderr, flush=True)
