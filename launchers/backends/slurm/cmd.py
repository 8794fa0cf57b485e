"""The one place Slurm's commands run (sbatch, squeue, scontrol, sacct, scancel, sprio, sinfo): on this machine,
or -- with `--cluster NAME` (launchers.clusters) -- on that cluster's login node over SSH, so a machine without
any Slurm binary can drive a cluster (issue 25 item 1).

    run(argv, input=None, timeout=60, cluster=None) -> subprocess.CompletedProcess (text stdout/stderr)

Locally it is subprocess.run(argv, capture_output=True, text=True, timeout=...): a missing binary raises
OSError, a timeout subprocess.TimeoutExpired, as before. Over SSH the login node's shell runs
shlex.join(argv) (every word quoted), the script given as `input` on its stdin; the same CompletedProcess
comes back and a timeout raises the same TimeoutExpired. One connection per cluster per process (the jump
hosts first, each hop a Connection of launchers.sshconn: RejectPolicy and the known_hosts file read-only,
exactly as `launch ssh`), kept in a module-level cache keyed by cluster and reused by every command; a
failed connection is dropped from it and raises one LaunchError naming the cluster and the hop.
"""
from __future__ import annotations

import atexit
import io
import os
import shlex
import subprocess
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ...errors import LaunchError

if TYPE_CHECKING:        # the SSH side is imported when a cluster is used: a node task imports this module too
    from ...clusters import Cluster
    from ...hostfile import ResolvedHost
    from ...sshconn import SSHSettings

SLURM_COMMANDS = frozenset({"sbatch", "squeue", "scontrol", "sacct", "scancel", "sprio", "sinfo"})
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Invocation:
    """What runs: argv here, or its shell line on a cluster's login node (pure: the tests assert it)."""
    argv: tuple[str, ...]
    cluster: Cluster | None = None

    @property
    def line(self) -> str:
        """The command line the login node's shell runs: every word quoted."""
        return shlex.join(self.argv)

    def where(self) -> str:
        return "here" if self.cluster is None else f"cluster {self.cluster.name} (login {self.cluster.route})"


def invocation(argv: list[str] | tuple[str, ...], cluster: Cluster | None = None) -> Invocation:
    if not argv or os.path.basename(argv[0]) not in SLURM_COMMANDS:
        raise ValueError(f"not a Slurm command: {argv[:1]}; this runner runs {', '.join(sorted(SLURM_COMMANDS))}")
    return Invocation(tuple(str(w) for w in argv), cluster)


_CLUSTERS: dict[tuple[str, str], Cluster] = {}


def cluster_named(name: str | None) -> Cluster | None:
    """The cluster of the clusters file (read once per process and file), None for this machine."""
    if not name:
        return None
    from ... import clusters
    key = (clusters.default_path(), name)
    if key not in _CLUSTERS:
        _CLUSTERS[key] = clusters.get(name, key[0])
    return _CLUSTERS[key]


def run(argv: list[str] | tuple[str, ...], input: str | None = None, timeout: float | None = DEFAULT_TIMEOUT_S,
        cluster: str | None = None, meanwhile: Callable[[], object] | None = None) -> subprocess.CompletedProcess:
    """Run one Slurm command here or on the cluster's login node. meanwhile(): called while it runs here (work
    the caller overlaps with Slurm's answer), before it over SSH."""
    inv = invocation(argv, cluster_named(cluster))
    if inv.cluster is None:
        return run_here(list(inv.argv), input, timeout, meanwhile)
    if meanwhile is not None:
        meanwhile()
    return run_there(inv, input, timeout)


def run_here(argv: list[str], input: str | None, timeout: float | None,
             meanwhile: Callable[[], object] | None) -> subprocess.CompletedProcess:
    if meanwhile is None:
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdin.write(input or "")
    p.stdin.close()
    p.stdin = None                   # written: communicate() below only reads
    meanwhile()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def run_there(inv: Invocation, input: str | None, timeout: float | None) -> subprocess.CompletedProcess:
    from invoke.exceptions import CommandTimedOut

    c = inv.cluster
    conn = connection(c)
    try:
        r = conn.run(inv.line, hide=True, warn=True, timeout=timeout,
                     in_stream=io.StringIO(input) if input is not None else False)
    except CommandTimedOut:
        raise subprocess.TimeoutExpired(list(inv.argv), timeout) from None
    except Exception as e:  # noqa: BLE001 - a dropped connection: one line naming the cluster
        drop(c)
        said = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise LaunchError(f"{inv.where()}: {inv.argv[0]} failed over SSH: {said}") from None
    return subprocess.CompletedProcess(list(inv.argv), r.exited, r.stdout, r.stderr)


# ------------------------------------------------------------------------------------------ the connection

def settings(c: Cluster) -> SSHSettings:
    from ...sshconn import SSHSettings
    return SSHSettings(ssh_config=c.ssh_config, known_hosts=c.known_hosts, identity=c.identity)


def route_hosts(c: Cluster) -> list[ResolvedHost]:
    """The hops to the login node, first hop first, then the login node, each resolved through the ssh config.
    Without `jump:`, the login's ssh-config ProxyJump is followed here, each hop verified (Fabric's own ProxyJump
    would open the hops with its AutoAddPolicy); the first hop's own ProxyJump is refused for the same reason."""
    from ...hostfile import resolve
    from ...sshconn import jump_hops
    login = resolve([c.login_entry], c.ssh_config)[0]
    hops = ([resolve([j], c.ssh_config)[0] for j in c.jump] if c.jump else
            jump_hops(login, settings(c), check_first=False))
    if hops and str(hops[0].ssh_options.get("proxyjump", "none")).lower() != "none":
        raise LaunchError(f"cluster {c.name}: jump host {hops[0].entry.word} has its own ProxyJump in the ssh config; "
                          "accepted: every hop listed in the cluster's jump: (first hop first)")
    return [*hops, login]


def build_route(c: Cluster) -> tuple[list[ResolvedHost], list]:
    """The hops and the login node with a Connection each (not opened): each one's gateway is the hop before it,
    each verifies host keys as `launch ssh` does (launchers.sshconn.make_connection: RejectPolicy)."""
    from ...sshconn import make_connection
    hosts, conns, s = route_hosts(c), [], settings(c)
    for h in hosts:
        conns.append(make_connection(h, s, gateway=conns[-1] if conns else None))
    return hosts, conns


def open_route(c: Cluster) -> list:
    """Connect hop by hop (each through the one before it); a failure closes them and names the hop."""
    from ...sshconn import close_all, describe
    hosts, conns = build_route(c)
    try:
        for h, conn in zip(hosts, conns):
            try:
                conn.open()
            except Exception as e:  # noqa: BLE001 - every failure is one line naming the hop
                raise LaunchError(f"cluster {c.name} (login {c.route}): {describe(e, h, settings(c))}") from None
            conn.transport.set_keepalive(5)
    except BaseException:
        close_all(reversed(conns))
        raise
    return conns


_ROUTES: dict[Cluster, list] = {}
_LOCK = threading.Lock()


def connection(c: Cluster):
    """The login node's Connection for this process: opened once, reused by every command."""
    from ...sshconn import close_all
    with _LOCK:
        chain = _ROUTES.get(c)
        if chain and chain[-1].is_connected:
            return chain[-1]
        if chain:
            close_all(reversed(chain))
        _ROUTES[c] = chain = open_route(c)
        return chain[-1]


def drop(c: Cluster) -> None:
    from ...sshconn import close_all
    with _LOCK:
        close_all(reversed(_ROUTES.pop(c, [])))


@atexit.register
def close() -> None:
    """Every cached connection, the login node first, then its hops."""
    if not _ROUTES:
        return
    from ...sshconn import close_all
    with _LOCK:
        for chain in _ROUTES.values():
            close_all(reversed(chain))
        _ROUTES.clear()
