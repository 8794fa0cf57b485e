"""The snapshot's tree: which files of the launch directory a --snapshot takes, and what it leaves
out and why (launchers.frozen.snapshot hashes and writes them). In a git work tree its tracked files
plus the untracked ones git does not ignore, elsewhere every file below it minus the `.launchignore`
patterns; never `__pycache__/`, run dirs (launch's own: a status/.lock, or a run.yaml that is a
launcher's record beside a status/ directory -- never a name alone: Hydra's configs/run.yaml stays),
snapshot and torch extension stores, launch's own temporaries being written (a name it writes +
.tmp.<a live pid>; a user's `x.tmp.12` stays), nor files that look like secrets (SECRETS, by name)
unless `.launchinclude` names them (issue 35). Stdlib only (yaml where a run.yaml is read).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import subprocess
import threading

from ..errors import LaunchError, brief

STORE = ".snapshots"
# never in a snapshot: this store, launchers.frozen.extcache's (built ops)
STORES = (STORE, ".torch_extensions")
RUN_DIR_MARKS = ("run.yaml", "status/.lock")  # where to look for a run dir (is_run_dir() decides)
ATOMIC_TEMP = re.compile(r"\.tmp\.\d+$")  # layout.atomic_write's temporary file: there for a moment
IGNORE_FILE = ".launchignore"
INCLUDE_FILE = ".launchinclude"  # names secret-looking files to take all the same
SECRETS = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.keystore",
    "*.kdbx",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".git-credentials",
    ".pypirc",
    ".htpasswd",
    "credentials",
    "credentials.*",
    "*.credentials",
    "secrets.*",
    ".secrets",
)
# .env.example: a template, no secret
NOT_SECRETS = re.compile(r"\.(example|sample|template|dist)$")
SECRET = "looks like a secret: name it in .launchinclude to take it"
ALWAYS_IGNORED = ("__pycache__/",)
# left out unless .launchinclude names them (issue 38): a virtualenv or conda env (a directory
# holding pyvenv.cfg or conda-meta/) and the output directories of the usual tools (W&B, Hydra,
# Lightning, MLflow, Jupyter)
OUTPUTS = ("wandb/", "outputs/", "multirun/", "lightning_logs/", "mlruns/", ".ipynb_checkpoints/")
OUTPUT = "an output directory, left out by default: .launchinclude takes it"
VENV = "a virtualenv, left out by default: .launchinclude takes it"


def git(root: str, *args: str) -> bytes | None:
    """`git -C root ARGS`'s output, None when git is missing, root is not in a work tree or the
    command fails."""
    if not maybe_in_git(root):
        return None  # git would say so, in a few ms a call
    try:
        p = subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def maybe_in_git(root: str) -> bool:
    """False only where git finds no repository for root: no GIT_DIR/GIT_WORK_TREE in the
    environment and no `.git` (a directory or a gitfile) in root or any directory above it."""
    if os.environ.get("GIT_DIR") or os.environ.get("GIT_WORK_TREE"):
        return True
    d = os.path.abspath(root)
    while True:
        if os.path.lexists(os.path.join(d, ".git")):
            return True
        up = os.path.dirname(d)
        if up == d:
            return False
        d = up


def patterns_of(root: str, name: str) -> list[str]:
    """The pattern lines of root/name (blank lines and # comments dropped); [] when there is
    none."""
    try:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
    except FileNotFoundError:
        lines = []
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(
            f"{brief(os.path.join(root, name))} cannot be read ({e}); accepted: a UTF-8 text "
            "file of patterns, one a line"
        ) from None
    return [ln for ln in lines if ln and not ln.startswith("#")]


def ignore_patterns(root: str) -> list[str]:
    """The .launchignore lines of root after the built-in ones."""
    return [*ALWAYS_IGNORED, *patterns_of(root, IGNORE_FILE)]


def ignored(rel: str, is_dir: bool, patterns: list[str] | tuple[str, ...]) -> bool:
    """Whether rel (a '/'-separated path below the root) matches a pattern: one with a '/' inside
    matches the path from the root, one without matches the last name; a trailing '/' matches only a
    directory (fnmatchcase, every pattern of a kind in one compiled expression)."""
    by_name, by_path = _matchers(tuple(patterns), is_dir)
    return bool(by_name and by_name.match(rel.rsplit("/", 1)[-1]) or by_path and by_path.match(rel))


@functools.lru_cache(maxsize=256)
def _matchers(
    patterns: tuple[str, ...], is_dir: bool
) -> tuple[re.Pattern | None, re.Pattern | None]:
    """(one expression for the patterns matching the last name, one for those matching the path)."""
    ps = [p.strip("/") for p in patterns if is_dir or not p.endswith("/")]
    one = lambda xs: re.compile("|".join(f"(?:{fnmatch.translate(x)})" for x in xs)) if xs else None
    return one([p for p in ps if "/" not in p]), one([p for p in ps if "/" in p])


def prime() -> None:
    """Compile the built-in patterns' expressions now (the warm launcher, once: each launch it forks
    inherits them instead of compiling them again, ~0.6 ms)."""
    for patterns in (ALWAYS_IGNORED, SECRETS):
        for is_dir in (True, False):
            _matchers(tuple(patterns), is_dir)


def walk_files(
    root: str, patterns: list[str], skip: tuple[str, ...] = (), left: list | None = None
) -> list[str]:
    """Every file and symlink below root (never following a directory link), less the ignored paths
    (added to `left` with why) and the directories in skip ('a/b/': never entered)."""
    out, left = [], [] if left is None else left
    why = lambda r, d: "always" if ignored(r, d, ALWAYS_IGNORED) else IGNORE_FILE
    for d, dirs, files in os.walk(root):
        base = os.path.relpath(d, root)
        rel = (lambda n: n) if base == os.curdir else (lambda n: f"{base}/{n}".replace(os.sep, "/"))
        left += [(rel(n) + "/", why(rel(n), True)) for n in dirs if ignored(rel(n), True, patterns)]
        left += [(rel(n), why(rel(n), False)) for n in files if ignored(rel(n), False, patterns)]
        dirs[:] = sorted(
            n for n in dirs if not ignored(rel(n), True, patterns) and rel(n) + "/" not in skip
        )
        out += [rel(n) for n in files if not ignored(rel(n), False, patterns)]
        # a link to a directory: a link
        out += [rel(n) for n in dirs if os.path.islink(os.path.join(d, n))]
        dirs[:] = [n for n in dirs if not os.path.islink(os.path.join(d, n))]
    return out


def is_run_dir(d: str) -> bool:
    """Whether d is a run dir: what only launch writes there (its lock, or its record beside
    status/)."""
    from .. import layout

    if os.path.isfile(layout.path(d, "lock")):
        return True
    return os.path.isdir(layout.path(d, "records")) and layout.load_run_yaml(d)[0] is not None


def launch_temp(rel: str) -> bool:
    """A temporary of layout.atomic_write being written right now: a name launch writes + .tmp.<a
    live pid>."""
    from .. import layout

    m = ATOMIC_TEMP.search(rel)
    if not m or not any(
        fnmatch.fnmatchcase(
            rel[: m.start()].rsplit("/", 1)[-1], re.sub(r"\{\w+\}", "*", os.path.basename(v))
        )
        for v in layout.FILES.values()
    ):
        return False
    try:
        os.kill(int(m.group()[5:]), 0)
    except (OSError, OverflowError):
        return False
    return True


def secret(rel: str, include: list[str]) -> bool:
    """A file that looks like a secret (SECRETS, by its name) that .launchinclude does not name."""
    return (
        ignored(rel, False, SECRETS)
        and not NOT_SECRETS.search(rel)
        and not (ignored(rel, False, include) or ignored_dirs(rel, tuple(include)))
    )


def tree_files(root: str, exclude: tuple[str, ...] = (), left: list | None = None) -> list[str]:
    """The tree's files (see the module's doc), sorted; paths under an `exclude` directory left out;
    what else is left out goes to `left`, (path, why)."""
    left = [] if left is None else left
    skip = tuple(
        os.path.relpath(e, root).replace(os.sep, "/") + "/"
        for e in exclude
        if os.path.commonpath([root, e]) == root and e != root
    )
    files, in_git = listed_files(root, skip, left)
    pats = ALWAYS_IGNORED if in_git else ()
    runs = sorted({f[: -len(m)] for f in files for m in RUN_DIR_MARKS if f.endswith("/" + m)})
    runs = [
        r
        for r in runs
        if not any(r.startswith(o) for o in skip) and is_run_dir(os.path.join(root, r))
    ]
    left += [(r, "a run dir") for r in runs if not any(r != o and r.startswith(o) for o in runs)]
    skip += tuple(runs)
    include = patterns_of(root, INCLUDE_FILE)
    out, said, envs = [], set(left), {}
    for f in sorted(set(files)):
        if not _file_or_link(os.path.join(root, f)) or any(f.startswith(s) for s in skip):
            continue  # a deleted file, a submodule; excluded, a run dir
        store = next(
            (
                f[: len(f) - len(f"/{f}".split(f"/{s}/", 1)[1])]
                for s in STORES
                if f"/{s}/" in f"/{f}"
            ),
            "",
        )
        why = (
            (_first_dir(f, pats), "always")
            if ignored_dirs(f, pats)
            else (store, "launch's store")
            if store
            else (f, "launch's temporary")
            if launch_temp(f)
            else (f, SECRET)
            if secret(f, include)
            else left_by_default(root, f, include, envs)
        )
        if why is None:
            out.append(f)
        elif why not in said:
            said.add(why)
            left.append(why)
    return out


def listed_files(root: str, skip: tuple[str, ...], left: list) -> tuple[list[str], bool]:
    """The candidate files under root (paths under `skip` left out) -> (files, whether git listed
    them): git's tracked and untracked-not-ignored files, what .gitignore leaves out going to
    `left`; outside a git work tree, a walk that follows .gitignore-style patterns (walk_files)."""
    pathspec = ("--", ".", *(f":(exclude){s}" for s in skip))
    ignored_out: list = []  # what .gitignore leaves out, asked at the same time
    asked = threading.Thread(
        target=lambda: ignored_out.append(
            git(root, "ls-files", "-oi", "--exclude-standard", "--directory", "-z", *pathspec)
        ),
        daemon=True,
    )
    in_git = maybe_in_git(root)
    if in_git:
        asked.start()
    listed = git(root, "ls-files", "-co", "--exclude-standard", "-z", *pathspec)
    if in_git:
        asked.join()
    if listed is None:
        return walk_files(root, ignore_patterns(root), skip, left), False
    gone = ignored_out[0] if ignored_out and ignored_out[0] else b""
    left += [(f, ".gitignore") for f in gone.decode("utf-8", "surrogateescape").split("\0") if f]
    return [f for f in listed.decode("utf-8", "surrogateescape").split("\0") if f], True


def left_by_default(
    root: str, rel: str, include: list[str], envs: dict[str, bool]
) -> tuple[str, str] | None:
    """(the directory, why) when rel lies in a virtualenv or an output directory (OUTPUTS) that
    .launchinclude does not name; envs caches each directory's answer."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        d = "/".join(parts[:i])
        if d not in envs:
            envs[d] = os.path.exists(os.path.join(root, d, "pyvenv.cfg")) or os.path.isdir(
                os.path.join(root, d, "conda-meta")
            )
        why = VENV if envs[d] else OUTPUT if ignored(d, True, OUTPUTS) else None
        if why and not (ignored(d, True, include) or ignored(rel, False, include)):
            return d + "/", why
    return None


def _first_dir(rel: str, patterns: tuple[str, ...]) -> str:
    parts = rel.split("/")
    return next(
        "/".join(parts[:i]) + "/"
        for i in range(1, len(parts))
        if ignored("/".join(parts[:i]), True, patterns)
    )


def _file_or_link(path: str) -> bool:
    return os.path.islink(path) or os.path.isfile(path)


def ignored_dirs(rel: str, patterns: tuple[str, ...]) -> bool:
    parts = rel.split("/")
    return any(ignored("/".join(parts[:i]), True, list(patterns)) for i in range(1, len(parts)))
