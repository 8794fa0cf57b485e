"""`--cluster NAME`: a verb run on that cluster's login node by the cluster's own `launch` (issue 25
item 1).

The login node has Slurm's client and the project installed (the clusters file's `launch:` names its
command); this machine needs only `ssh`. forward() runs `launch VERB ARGS` there over one verified
connection (launchers.ssh.clusterssh.Session), LAUNCH_RUNS_ROOT = the cluster's runs root, output
streamed through, the remote exit code returned as ours; Ctrl-C here (or a dropped link) ends the
login node's launch.

    launch slurm --cluster NAME [opts] -- prog args   submit(): the working tree
                                                      (snapshot.tree_files' selection:
        git ls-files -co --exclude-standard, else less .launchignore; never the runs root) goes as a
        tar stream into <runs root>/.uploads/<its sha256> (skipped when there), then `launch slurm
        [opts] -- prog args` runs in that directory; --run-dir and --after's run dir name runs under
        the runs root, --profile goes with the tree (as .launch-profile.yaml, its `slurm: {cluster}`
        overridden by `--cluster ''`: the login node's own Slurm). --dry-run prints the ssh command
        and the login node's command line; nothing runs there.
    launch status|logs|wait|cancel|resume|list|doctor --cluster NAME ...   the arguments as given, in the runs
        root (a run's name resolves there)
    launch list --cluster all   every cluster of the file in parallel, each within LIST_S; a CLUSTER
                                column; a
        cluster that does not answer in time is one row `NAME  unreachable (why)`; exit 0 when one answered, else 1
"""  # noqa: E501

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import posixpath
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor

from .. import layout
from ..errors import LaunchError
from ..frozen import snapshot, statcache
from ..runopts import BACKEND_OPTIONS, COMMON
from . import clusters
from .clusters import Cluster
from .clusterssh import (
    CONNECT_S,
    Session,
    Unreachable,
    end_ssh,
    model,
    remote_line,
    shell_line,
    ssh_argv,
)

# `launch list --cluster all`: a cluster answers within this, else unreachable (listed within 10 s)
LIST_S = 9.0
UPLOADS = ".uploads"
PROFILE = ".launch-profile.yaml"  # the profile's copy in the upload
VALUE_FLAGS = {
    o.cli_flag
    for o in (*COMMON, *BACKEND_OPTIONS["slurm"])
    if o.cli_flag and o.kind not in ("flag", "switch")
}


def forward(verb: str, args: list[str], name: str, profile: str | None = None, out=None) -> int:
    """Run `launch VERB ARGS` (ARGS: as given, --cluster NAME left out) on the cluster; its exit
    code. out: a file for the login node's stdout (the Python API's cluster=:
    launchers.ssh.clusterrun), else this terminal's."""
    args = without_cluster(args)
    if verb == "list" and name in clusters.RESERVED:
        return list_all(args)
    c = clusters.get(name)
    if verb == "slurm":
        return submit(c, args, profile, out)
    with ended_by_sigterm(), Session(c) as s:
        s.open(open_timeout(c))
        return stream(c, s.argv(remote_line(c, [verb, *args])), out=out)


def without_cluster(args: list[str]) -> list[str]:
    """args less the first `--cluster NAME` / `--cluster=NAME` before `--` (the option click
    read)."""
    for i, a in enumerate(args):
        if a == "--":
            break
        if a == "--cluster":
            return args[:i] + args[i + 2 :]
        if a.startswith("--cluster="):
            return args[:i] + args[i + 1 :]
    return list(args)


def open_timeout(c: Cluster) -> float:
    """Each hop of the route (the cluster's jump: or the ssh config's ProxyJump hops, then the login
    node) its connect timeout, and 5 s more."""
    return CONNECT_S * len(model(c).hops) + 5.0


def stream(c: Cluster, argv: list[str], feed: bytes = b"", out=None) -> int:
    """Run one call with this terminal's output (or into the file `out`); stdin gets `feed` first,
    then stays open (its end ends the login node's side)."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out)
    try:
        if feed:
            p.stdin.write(feed)
            p.stdin.flush()
        rc = p.wait()
    except KeyboardInterrupt:
        end_ssh(p)
        return 130
    finally:
        p.stdin.close()
    if rc == 255:
        raise LaunchError(
            f"cluster {c.name} (login {c.route}): the SSH connection ended (ssh exit 255)"
        )
    return rc


class ended_by_sigterm:
    """SIGTERM to this launch ends it as Ctrl-C would: the connection (ControlMaster) is closed on
    the way out."""

    def __enter__(self):
        self.old = signal.signal(signal.SIGTERM, self.raise_) if is_main_thread() else None

    @staticmethod
    def raise_(*_):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)


def is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ------------------------------------------------------------------------------------------ submit


def submit_words(c: Cluster, args: list[str], profile: str | None) -> list[str]:
    """`launch slurm`'s arguments for the login node: --run-dir / --after's run dir under the runs
    root, --profile the upload's copy (and `--cluster ''`: the login node's own Slurm); the program
    after it untouched."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--" or not a.startswith("-"):  # the program (click takes no option after it)
            out += args[i:]
            break
        flag, eq, val = a.partition("=")
        if flag not in VALUE_FLAGS:
            out.append(a)
            i += 1
            continue
        if not eq:
            i += 1
            val = args[i] if i < len(args) else ""
        i += 1
        if flag != "--profile":
            out += [flag, on_cluster(c, flag, val)]
    return (["--profile", PROFILE, "--cluster", ""] if profile else []) + out


def on_cluster(c: Cluster, flag: str, value: str) -> str:
    if flag == "--run-dir":
        return c.run_dir(value)
    if flag == "--after":
        run, sep, kind = value.rpartition(":")
        run, sep, kind = (
            (run, sep, kind) if kind in ("afterok", "afterany", "afternotok") else (value, "", "")
        )
        return run + sep + kind if run.isdigit() else c.run_dir(run) + sep + kind
    return value


def submit(c: Cluster, args: list[str], profile: str | None, out=None) -> int:
    snap = snapshot.scan(os.getcwd(), exclude=(layout.runs_root(),))
    prof = open(profile, "rb").read() if profile else None
    digest = (
        hashlib.sha256((snap.digest + hashlib.sha256(prof).hexdigest()).encode()).hexdigest()
        if prof
        else snap.digest
    )
    up = posixpath.join(c.runs_root, UPLOADS, digest)
    opts = args[: args.index("--")] if "--" in args else args
    dry = "--dry-run" in opts
    if dry:  # what a submit would run there
        args = [a for i, a in enumerate(args) if a != "--dry-run" or i >= len(opts)]
    # secret values: over the connection's stdin, never in its command line
    args, secret = carried(args)
    secret.update(profile_secrets(profile, secret))
    line = remote_line(c, ["slurm", *submit_words(c, args, profile)], cwd=up, receive=tuple(secret))
    if dry:
        print(
            f"# cluster {c.name}: login {c.route}; the tree {snap.root} ({len(snap.files)} files, "
            f"{snap.size} bytes{', and the profile' if prof else ''}) -> {up} unless there\n"
            f"# ssh: {shlex.join(ssh_argv(c, line))}\n# on the login node: {line}"
        )
        return 0
    statcache.flush()  # the tree's stat cache: the next submit of an unchanged tree reads nothing
    with ended_by_sigterm(), Session(c) as s:
        s.open(open_timeout(c))
        if subprocess.run(
            s.argv(shell_line(f"test -d {shlex.quote(up)}")), stdin=subprocess.DEVNULL
        ).returncode:
            upload(c, s, snap, prof, up)
        return stream(c, s.argv(line), feed=secret_feed(secret), out=out)


def carried(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The submit's options with every secret value taken out: `--secret NAME[=@FILE]` (read here)
    and an `--env NAME=VALUE` whose value is secret (launchers.credentials.secretenv: by name or by
    content) become `--secret NAME` there; name -> value, for the login node's stdin (the same door
    as the local path: its environment)."""
    from ..credentials.secretenv import parse_secrets, resolve, secret_keys

    out, secret, i = [], {}, 0
    while i < len(args) and args[i] != "--" and args[i].startswith("-"):
        flag, eq, val = args[i].partition("=")
        n = 1 if eq or flag not in VALUE_FLAGS else 2
        word, val, i = args[i : i + n], val if eq else " ".join(args[i + 1 : i + n]), i + n
        name, _, value = val.partition("=")
        if flag == "--secret":
            secret.update(resolve(parse_secrets([val], os.environ).items(), os.environ))
        elif flag == "--env" and secret_keys({name: value}):
            secret[name] = value
        else:
            out += word
    return out + [w for n in secret for w in ("--secret", n)] + args[i:], secret


def profile_secrets(profile: str | None, given: dict[str, str]) -> dict[str, str]:
    """The profile's `secrets: [NAME]` (from this environment) not given already: carried like
    --secret NAME (the uploaded profile names them; the login node's launch finds them in its
    environment). NAME=@FILE stays the profile's, read there."""
    if not profile:
        return {}
    from ..options.profiles import load_profile

    names = [
        s for s in load_profile(profile).get("secrets") or () if isinstance(s, str) and "=" not in s
    ]
    return {n: os.environ[n] for n in names if n in os.environ and n not in given}


def secret_feed(secret: dict[str, str]) -> bytes:
    """What the login node's line (clusterssh.remote_line's receive) reads first on stdin: one
    base64 line each."""
    return b"".join(base64.b64encode(v.encode()) + b"\n" for v in secret.values())


def upload(c: Cluster, s: Session, snap: snapshot.Snapshot, prof: bytes | None, up: str) -> None:
    """The tree as a tar stream into a temporary directory beside `up`, renamed into place (a
    concurrent upload of the same tree: the first rename wins, the other copy is removed)."""
    parent, q = shlex.quote(posixpath.dirname(up)), shlex.quote(up)
    script = (
        f"set -e; mkdir -p {parent}; t=$(mktemp -d {parent}/.tmp-XXXXXX); tar -x --no-same-owner "
        f'-f - -C "$t" || {{ rm -rf "$t"; exit 1; }}; mv -T "$t" {q} 2>/dev/null || rm -rf "$t"'
    )
    with open(os.path.join(s.dir, "upload.err"), "w+b") as err:
        p = subprocess.Popen(
            s.argv(shell_line(script)), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err
        )
        try:
            with tarfile.open(fileobj=p.stdin, mode="w|") as tar:
                for rel in snap.files:
                    tar.add(os.path.join(snap.root, rel), arcname=rel, recursive=False)
                if prof is not None:
                    info = tarfile.TarInfo(PROFILE)
                    info.size, info.mode, info.mtime = len(prof), 0o600, int(time.time())
                    tar.addfile(info, io.BytesIO(prof))
            p.stdin.close()
        except BrokenPipeError:
            pass
        rc = p.wait()
        err.seek(0)
        said = [ln for ln in err.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    if rc:
        raise LaunchError(
            f"cluster {c.name}: the upload of {snap.root} into {up} failed "
            f"({said[-1] if said else f'exit {rc}'}); nothing was submitted"
        )


# ------------------------------------------------------------------------------- list --cluster all


def ask_list(name: str, words: list[str]) -> tuple[list[dict] | None, str | None]:
    """One cluster's `launch list --json` within LIST_S: (rows, None) or (None, why it did not
    answer)."""
    end = time.monotonic() + LIST_S
    try:
        c = clusters.get(name)
        with Session(c) as s:
            s.open(LIST_S)
            p = subprocess.Popen(
                s.argv(remote_line(c, words, watch=False)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                out, err = p.communicate(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                return None, f"no answer within {LIST_S:g} s"
    except Unreachable as e:
        return None, e.cause
    except LaunchError as e:
        return None, str(e)
    if p.returncode != 0:
        return None, (err.strip().splitlines() or [f"launch list exited {p.returncode}"])[-1]
    try:
        return json.loads(out), None
    except ValueError:
        return None, "its launch list --json did not answer JSON"


def list_all(args: list[str]) -> int:
    from .. import show

    names = sorted(clusters.load())
    as_json = "--json" in args
    words = ["list", "--json", *(a for a in args if a != "--json")]
    with ThreadPoolExecutor(max_workers=len(names)) as ex:
        answers = list(ex.map(lambda n: ask_list(n, words), names))
    rows = []
    for name, (found, why) in zip(names, answers):
        rows += (
            [{"cluster": name, **r} for r in found]
            if found is not None
            else [{"cluster": name, "state": "UNREACHABLE", "reason": why}]
        )
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        show.table(
            ("CLUSTER", "NAME", "BACKEND", "SHAPE", "STATE", "AGE"),
            [
                (r["cluster"], f"unreachable ({r['reason']})", "", "", "", "")
                if r["state"] == "UNREACHABLE"
                else (
                    r["cluster"],
                    r["name"],
                    r["backend"],
                    r["shape"],
                    r["state"] + (f" ({r['reason']})" if r.get("reason") else ""),
                    r["age"],
                )
                for r in rows
            ],
        )
    sys.stdout.flush()
    return 0 if any(found is not None for found, _ in answers) else 1
