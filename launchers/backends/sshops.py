"""What the SSH launcher does on its hosts besides running the nodes (launchers.backends.ssh): stop
and sweep a node's processes (`launchers.remote kill` over the open connection, else a fresh one; in
parallel), copy the hosts' staged files into the run dir (--no-shared-storage, SFTP), drop a host's
memory checkpoint store."""

from __future__ import annotations

import json
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from ..records.rundir import RunDir
from ..show import counted
from ..ssh.hostfile import ResolvedHost
from ..ssh.sshconn import describe, get_tree, make_connection
from ..ssh.sshmodel import SSHSettings
from .sshplan import SSHPlan, kill_line

# how long the end of a --memory-checkpoint run waits for its hosts to drop their stores
FORGET_S = 15.0


def stop_nodes(
    plan: SSHPlan, conns, nodes, sig: int = signal.SIGTERM, wait_s: float = 0.0, final: bool = False
) -> None:
    """`launchers.remote kill` on each host (over the open connection, else a fresh one), in
    parallel: one `sig` to the node's agent, up to wait_s for the node to end, then the sweep."""
    nodes = list(nodes)

    def one(k: int) -> None:
        for attempt in range(2):
            try:
                c = conns[k] if attempt == 0 else make_connection(plan.rhosts[k], plan.settings)
                r = c.run(
                    kill_line(plan, k, sig, wait_s),
                    hide=True,
                    warn=True,
                    in_stream=False,
                    timeout=wait_s + 30,
                )
                rec = json.loads(r.stdout.strip().splitlines()[-1])
                if rec.get("forced") or (final and rec.get("before")):
                    print(
                        f"launch: node {k} ({plan.rhosts[k].entry.name}): stopped {rec['before']}, "
                        f"killed {rec['forced']}, left {rec['after']}",
                        file=sys.stderr,
                        flush=True,
                    )
                return
            except Exception:  # noqa: BLE001 - the host is gone: nothing of the run is left running there
                continue

    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as ex:
        list(ex.map(one, nodes))


def collect(plan: SSHPlan, conns, rd: RunDir) -> None:
    """Copy every host's staged files (logs, status, checkpoints, metrics...) into the run dir."""

    def one(k: int) -> str | None:
        try:
            sftp = conns[k].sftp()
        except Exception:  # noqa: BLE001
            try:
                c = make_connection(plan.rhosts[k], plan.settings)
                c.open()
                sftp = c.sftp()
            except Exception as e:  # noqa: BLE001
                return describe(e, plan.rhosts[k], plan.settings)
        get_tree(sftp, plan.node_dir, rd.path)
        return None

    say = counted("collect", len(conns))

    def step(k: int) -> str | None:
        err = one(k)
        say(f"node {k} ({plan.rhosts[k].entry.name})", "files copied" if err is None else "failed")
        return err

    with ThreadPoolExecutor(max_workers=len(conns)) as ex:
        for k, err in enumerate(ex.map(step, range(len(conns)))):
            if err:
                print(
                    f"launch: could not collect node {k}'s files: {err}",
                    file=sys.stderr,
                    flush=True,
                )


def forget_on(h: ResolvedHost, settings: SSHSettings, line: str) -> None:
    """One host's part of forget_memory: its own connection, so that a host that is down costs only
    itself."""
    try:
        c = make_connection(h, settings)
        try:
            c.run(line, hide=True, warn=True, in_stream=False, timeout=FORGET_S)
        finally:
            c.close()
    except Exception:  # noqa: BLE001 - best effort: the store is tmpfs, gone at the host's next boot
        pass
