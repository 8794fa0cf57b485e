"""`launch slurm --cluster NAME`: the client side of a cluster reached through its login node (issue 25 item 1).

    on_cluster(spec)  the spec as the cluster sees it: its run dir (and snapshot) under the cluster's runs root
    ClusterPlan       the dry-run names the cluster, the login route and the runs root
    uploads()         what a submit puts on the cluster over SFTP: the run dir skeleton (a local tree, mirrored
                      as it is) and the sbatch script, every path inside the runs root (pure: a list of Upload)
    put()/submit()    those uploads over the cluster's one connection (launchers.backends.slurm.cmd), then
                      `sbatch --parsable SCRIPT` on the login node -> the job id

Pure apart from put()/submit() (SFTP and SSH); the local machine needs no Slurm binary.
"""
from __future__ import annotations

import os
import posixpath
import stat
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ... import layout, snapshot
from ...errors import LaunchError, brief
from ...spec import JobSpec
from ..base import Plan
from . import cmd

if TYPE_CHECKING:
    from ...clusters import Cluster

SCRIPT = "slurm/submit-a{attempt}.sh"        # the sbatch script's place in the run dir on the cluster


def on_cluster(spec: JobSpec) -> tuple[JobSpec, "Cluster | None"]:
    """(spec, None) without --cluster; else the spec with its run dir under the cluster's runs root (its path
    relative to this machine's runs root kept, else its name) and its snapshot in the cluster's store."""
    c = cmd.cluster_named(spec.opts.get("cluster"))
    if c is None:
        return spec, None
    here = layout.runs_root()
    rel = os.path.relpath(spec.run_dir, here)
    run_dir = spec.run_dir if inside(spec.run_dir, c.runs_root) else posixpath.join(
        c.runs_root, rel if not rel.startswith("..") else os.path.basename(spec.run_dir))
    store = posixpath.join(c.runs_root, snapshot.STORE)
    snap = posixpath.join(store, os.path.basename(spec.snapshot_dir)) if spec.snapshot_dir else ""
    return spec.replace(run_dir=run_dir, snapshot=store if spec.snapshot else "", snapshot_dir=snap), c


def inside(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def route_lines(spec: JobSpec, c: "Cluster") -> list[str]:
    """What the dry-run adds for a cluster: where Slurm's commands run and where the files go."""
    kh = c.known_hosts or "the ssh config's UserKnownHostsFile, else ~/.ssh/known_hosts"
    out = [f"# cluster: {c.name} -- sbatch, squeue, scontrol, sacct, scancel run on its login node {c.route} "
           f"over SSH (host keys from {kh}; unknown keys refused)",
           f"# on the cluster: runs root {c.runs_root}; the run dir skeleton and the sbatch script "
           f"({SCRIPT.format(attempt='A')}) go there over SFTP"]
    if spec.python == sys.executable:
        out.append(f"# python: {spec.python} is this machine's interpreter; give --python with the cluster's")
    return out


@dataclass
class ClusterPlan(Plan):
    route: list[str] = field(default_factory=list)      # route_lines(): after the header of the render

    def render(self) -> str:
        lines = super().render().split("\n")
        lines[3:3] = self.route
        return "\n".join(lines)


@dataclass(frozen=True)
class Upload:
    path: str                   # absolute POSIX path on the cluster
    text: str | None = None     # None: a directory
    mode: int = 0o644


def tree(local_dir: str, remote_dir: str) -> list[Upload]:
    """A local run dir skeleton as uploads: its directories (parents first) and files, same relative paths; a
    symlink or special file in it is refused (nothing is followed)."""
    out = [Upload(remote_dir)]
    for top, dirs, files in os.walk(local_dir):
        dirs.sort()
        rel = os.path.relpath(top, local_dir)
        base = remote_dir if rel == "." else posixpath.join(remote_dir, *rel.split(os.sep))
        for name in sorted(dirs) + sorted(files):
            p = os.path.join(top, name)
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                out.append(Upload(posixpath.join(base, name)))
            elif stat.S_ISREG(st.st_mode):
                with open(p, encoding="utf-8") as f:
                    out.append(Upload(posixpath.join(base, name), f.read(), stat.S_IMODE(st.st_mode)))
            else:
                raise LaunchError(f"run dir skeleton {brief(p)} is not a plain file or directory; accepted: a tree "
                                  "of directories and plain files (nothing is followed)")
    return out


def uploads(c: "Cluster", local_dir: str, remote_dir: str, script: str, attempt: int) -> list[Upload]:
    """Everything a submit puts on the cluster, in order: the skeleton's tree, then the sbatch script (0755);
    refused when a path would fall outside the cluster's runs root."""
    script_path = posixpath.join(remote_dir, SCRIPT.format(attempt=attempt))
    root, parents = posixpath.normpath(c.runs_root), []
    d = posixpath.dirname(remote_dir)
    while inside(d, root) and d not in parents:        # the runs root and any directory between it and the run dir
        parents.insert(0, d)
        d = posixpath.dirname(d)
    out = [*map(Upload, parents), *tree(local_dir, remote_dir), Upload(posixpath.dirname(script_path)),
           Upload(script_path, script, 0o755)]
    for u in out:
        if not posixpath.isabs(u.path) or not inside(u.path, c.runs_root) or u.path != posixpath.normpath(u.path):
            raise LaunchError(f"cluster {c.name}: {brief(u.path)} is outside its runs root {c.runs_root}; accepted: "
                              "a run dir under the runs root")
    return out


def submit_argv(script_path: str) -> list[str]:
    return ["sbatch", "--parsable", script_path]


def put(sftp, items: list[Upload]) -> None:
    """Make each directory (an existing one kept), write each file under a temporary name and rename it into
    place (a reader never sees half of it; an existing file is replaced, never written through)."""
    for u in items:
        try:
            if u.text is None:
                if not exists_dir(sftp, u.path):
                    sftp.mkdir(u.path)
                continue
            tmp = f"{u.path}.tmp-{os.getpid()}"
            with sftp.open(tmp, "wx") as f:
                f.chmod(u.mode)
                f.write(u.text.encode("utf-8"))
            sftp.posix_rename(tmp, u.path)
        except (OSError, EOFError) as e:
            raise LaunchError(f"{brief(u.path)} cannot be written on the cluster over SFTP "
                              f"({getattr(e, 'strerror', None) or e}); accepted: a runs root you can write") from None


def exists_dir(sftp, path: str) -> bool:
    """path is a directory on the cluster (False: absent); anything else there is refused."""
    try:
        mode = sftp.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise LaunchError(f"{brief(path)} exists on the cluster and is not a directory; accepted: a run dir path "
                          "that is free or a directory")
    return True


def submit(cluster: str, items: list[Upload], script_path: str) -> str:
    """Upload, then `sbatch --parsable` on the login node; the job id (sbatch's refusal: one LaunchError)."""
    conn = cmd.connection(cmd.cluster_named(cluster))
    try:
        sftp = conn.sftp()
    except Exception as e:  # noqa: BLE001 - no SFTP subsystem, a dropped connection: one line
        raise LaunchError(f"cluster {cluster}: SFTP to its login node failed ({str(e).strip() or type(e).__name__}); "
                          "accepted: a login node with the sftp subsystem") from None
    put(sftp, items)
    p = cmd.run(submit_argv(script_path), timeout=60, cluster=cluster)
    words = (p.stdout or "").strip().split(";")
    if p.returncode != 0 or not words[0].isdigit():
        said = ((p.stderr or p.stdout).strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise LaunchError(f"cluster {cluster}: sbatch refused the job: {said.replace('sbatch: error: ', '')}")
    return words[0]
