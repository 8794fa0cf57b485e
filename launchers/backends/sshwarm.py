"""--warm-spares on SSH hosts: a zygote (launchers.nodeside.zygote) on every host of the run's pool,
the spares' included, each on a connection of its own held for the run. Started with the first
attempt (which starts cold); ended when the launcher closes those connections at the run's end (sshd
hangs up the zygote's pty; a launcher killed outright drops them too). Its environment: node 0's
public one (no secret: a forked process gets the agent's own environment), less the run's tag, in
the job's working directory."""

from __future__ import annotations

import os
import shlex
import threading

from .. import layout, procs, warmfork
from ..ssh.sshconn import close_all, make_connection


class Zygotes:
    def __init__(self) -> None:
        self.conns: list = []
        self.held: dict[int, threading.Thread] = {}
        self.closed = False

    def ensure(self, plan) -> None:
        """plan: an SSHPlan (its pool's hosts, slot s = the pool's host s)."""
        if self.conns:
            return
        env = {k: v for k, v in plan.nodes[0].public_env().items() if k != procs.TAG}
        for s, h in enumerate(plan.rpool or plan.rhosts):
            words = [
                "env",
                *(f"{k}={v}" for k, v in env.items()),
                plan.spec.python,
                "-m",
                "launchers.nodeside.zygote",
                warmfork.socket_path(plan.run_id, s),
                str(s),
            ]
            line = f"cd {shlex.quote(plan.cwd)} 2>/dev/null; exec " + " ".join(
                map(shlex.quote, words)
            )
            self.conns.append(make_connection(h, plan.settings))
            self.held[s] = threading.Thread(
                target=self._hold, args=(self.conns[-1], line), daemon=True, name="launch-zygote"
            )
            self.held[s].start()

    def _hold(self, conn, line: str) -> None:
        try:
            if not self.closed:
                conn.run(line, pty=True, hide=True, warn=True, in_stream=False)
        except Exception:  # noqa: BLE001 - a host without a zygote starts cold
            pass

    def ready(self, plan, slot: int) -> bool:
        """Slot's zygote listens (its status/warm-slot<S>.json: the run dir on shared storage;
        without, not known: no wait), or will not (its session ended)."""
        t = self.held.get(slot)
        return (
            t is None
            or not t.is_alive()
            or plan.staged
            or os.path.exists(layout.path(plan.spec.run_dir, "warm_slot", slot=slot))
        )

    def close(self) -> None:
        self.closed = True
        close_all(self.conns)
