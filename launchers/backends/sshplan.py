"""The SSH backend's plan (pure: no network; what --dry-run prints): the pool's hosts resolved, the
nodes' hosts (--spares: the pool slots given), the node shape (slots= of the hostfile), the
host-local staging dir without shared storage, and each host's exact line (`python -m
launchers.remote run ...` around the shared builder's argv). Also the line that stops a node's
processes on its host (kill_line: `launchers.remote kill`)."""

from __future__ import annotations

import os
import shlex
import signal
from dataclasses import dataclass, field
from typing import Any

from .. import ports
from ..containers import container
from ..errors import LaunchError
from ..nodeagent import env_file
from ..spec import RunSpec, redact_env
from ..ssh.hostfile import ResolvedHost, avoiding, hosts_from_options, pool_hosts, resolve
from ..ssh.sshmodel import SSHSettings
from ..ssh.sshmodel import settings as ssh_settings
from .base import Plan, node_commands

STAGING_ROOT = "/tmp/launch-staging"


@dataclass
class SSHPlan(Plan):
    rhosts: list[ResolvedHost] = field(default_factory=list)
    # every host of the pool (nodes, spares)
    rpool: list[ResolvedHost] = field(default_factory=list)
    settings: SSHSettings = field(default_factory=SSHSettings)
    cwd: str = ""
    node_dir: str = ""  # LAUNCH_RUN_DIR on the hosts: the run dir, or a host-local staging dir
    port_fixed: bool = False

    @property
    def staged(self) -> bool:
        return self.node_dir != self.spec.run_dir

    def pid_file(self, k: int) -> str:
        return f"/tmp/.launch-{self.run_id}-node{k}.pid"

    def remote_line(self, k: int, redact: bool = True) -> str:
        """The exact line sshd runs on host k: cd, the node's env (its secrets go in
        remote.env_file, 0600, which the host agent reads and deletes: shown *** here), the host
        agent, the builder's argv."""
        nc = self.nodes[k]
        env = redact_env(nc.env_dict, nc.secret) if redact else nc.public_env()
        ef = ["--env-file", env_file(self.run_id, self.attempt, k)] if nc.secret_env() else []
        words = [
            "env",
            *(f"{a}={b}" for a, b in env.items()),
            self.spec.python,
            "-m",
            "launchers.remote",
            "run",
            "--node",
            str(k),
            "--pid-file",
            self.pid_file(k),
            *ef,
            "--",
            *(nc.shown_argv() if redact else nc.argv),
        ]
        return f"cd {shlex.quote(self.cwd)} 2>/dev/null; exec " + " ".join(
            shlex.quote(w) for w in words
        )

    def render(self) -> str:
        out = [
            f"# run dir: {self.spec.run_dir}",
            f"# run id:  {self.run_id}  attempt {self.attempt}",
            self.world_line(),
            f"# master:  {self.master_addr}:{self.master_port} (probed at launch)",
            *self.spares_lines(),
            *self.cpu_bind_lines(),
        ]
        if self.spec.avoid_hosts:  # the site's node ledger (launchers.ledgers.siteledger)
            out.append(
                f"# node ledger {self.spec.node_ledger}: quarantined, not used: "
                + ", ".join(self.spec.avoid_hosts)
            )
        if self.staged:
            out.append(
                f"# storage: not shared; hosts write {self.node_dir}, collected into the run dir "
                "over SFTP"
            )
        for k, h in enumerate(self.rhosts):
            slot = f" (slot {self.slots[k]})" if self.spec.spares else ""
            out += ["", f"# node {k} on {h.user}@{h.label}{slot}:", self.remote_line(k)]
        return "\n".join(out) + "\n"

    def record(self) -> dict[str, Any]:
        return dict(
            super().record(),
            addresses=[f"{h.hostname}:{h.port}" for h in self.rhosts],
            node_dir=self.node_dir,
            cwd=self.cwd,
        )


def make_plan(spec: RunSpec, run_id: str, attempt: int, slots: list[int] | None = None) -> SSHPlan:
    """slots: the pool's slots the nodes run on, in node order (--spares, --nodes MIN:MAX:
    launchers.resilience.recovery; one node per slot); slot k is the k-th host of MAX + spares, node
    0 (the master) the host of slots[0]. Default: the first hosts, every one when --nodes is not
    given (less the spares)."""
    opts, settings = spec.opts, ssh_settings(spec.opts)
    # --nodes MIN:MAX: MAX's hosts
    want = (spec.max_nodes or spec.nodes) if "nodes" in spec.explicit else None
    entries = avoiding(
        hosts_from_options(opts), spec.avoid_hosts, (want or 1) + spec.spares, spec.node_ledger
    )
    nodes, pool = pool_hosts(entries, want, spec.spares)
    slots = list(slots) if slots is not None else list(range(nodes))
    if bad := [s for s in slots if not 0 <= s < len(pool)]:
        raise LaunchError(
            f"node slot {bad[0]} has no host: the pool has {len(pool)} hosts (--nodes + --spares)"
        )
    # every host of the pool: two names of one host refused
    rpool = resolve(pool, settings.ssh_config)
    rhosts, gpn = [rpool[s] for s in slots], gpus_per_node(spec, pool)
    spec = spec.replace(nodes=len(slots), gpus_per_node=gpn, explicit=("nodes", "gpus_per_node"))
    node_dir = spec.run_dir
    if opts.get("shared_storage") is False and spec.hang_timeout:
        raise LaunchError(
            "--hang-timeout needs the run dir on shared storage (the hosts' progress meets "
            "there); it is not accepted with --no-shared-storage"
        )
    if opts.get("shared_storage") is False:
        node_dir = os.path.join(opts.get("staging_dir") or STAGING_ROOT, run_id)
    master, port, dist = (
        rhosts[0].hostname,
        spec.master_port or ports.derive_port(run_id),
        spec.dist_backend,
    )
    return SSHPlan(
        spec=spec,
        run_id=run_id,
        attempt=attempt,
        master_addr=master,
        master_port=port,
        dist_backend=dist,
        hosts=[h.entry.word for h in rhosts],
        nodes=commands(spec, node_dir, run_id, attempt, master, port, dist, slots),
        rhosts=rhosts,
        rpool=rpool,
        settings=settings,
        cwd=os.getcwd(),
        node_dir=node_dir,
        port_fixed=spec.master_port is not None,
        slots=slots,
    )


def gpus_per_node(spec: RunSpec, pool) -> int:
    """--gpus-per-node when given, else the hostfile's slots= (the spares' too: one shape for the
    run), else the spec's default; hosts with different slots= are refused."""
    counts = {e.slots for e in pool if e.slots is not None}
    if "gpus_per_node" in spec.explicit or not counts:
        return spec.gpus_per_node
    if len(counts) > 1:
        raise LaunchError(
            f"hosts have different slots= ({', '.join(map(str, sorted(counts)))}); "
            "torchrun needs the same count per node: give --gpus-per-node"
        )
    return counts.pop()


def commands(spec, node_dir, run_id, attempt, master, port, dist, slots):
    """The shared builder's commands, each node's run dir the hosts' (the run dir, or a staging
    dir)."""
    return node_commands(
        spec.replace(run_dir=node_dir), run_id, attempt, master, port, dist, slots=slots
    )


def kill_line(plan: SSHPlan, k: int, sig: int, wait_s: float) -> str:
    """`launchers.remote kill` of node k on its host: one `sig` to its agent, up to wait_s, then the
    sweep."""
    return (
        f"cd {shlex.quote(plan.cwd)} 2>/dev/null; {shlex.quote(plan.spec.python)} -m "
        f"launchers.remote kill {shlex.quote(plan.run_id)} --node {k} --run-dir "
        f"{shlex.quote(plan.node_dir)} --pid-file {shlex.quote(plan.pid_file(k))} --signal "
        f"{signal.Signals(sig).name} --wait "
        f"{wait_s:g}{container.cleanup_line(plan.spec, plan.run_id, k)}"
    )
