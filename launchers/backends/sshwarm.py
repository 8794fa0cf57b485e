"""--warm-spares on SSH hosts: a zygote (launchers.nodeside.zygote) on every host of the run's pool, the spares'
included, each on a connection of its own held for the run. Started with the first attempt (which starts cold);
ended when the launcher closes those connections at the run's end (sshd hangs up the zygote's pty; a launcher
killed outright drops them too). Its environment: node 0's public one (no secret: a forked process gets the
agent's own environment), less the run's tag, in the job's working directory."""
from __future__ import annotations

import shlex
import threading

from .. import procs, warmfork
from ..sshconn import close_all, make_connection


class Zygotes:
    def __init__(self) -> None:
        self.conns: list = []
        self.closed = False

    def ensure(self, plan) -> None:
        """plan: an SSHPlan (its pool's hosts, slot s = the pool's host s)."""
        if self.conns:
            return
        env = {k: v for k, v in plan.nodes[0].public_env().items() if k != procs.TAG}
        for s, h in enumerate(plan.rpool or plan.rhosts):
            words = ["env", *(f"{k}={v}" for k, v in env.items()), plan.spec.python, "-m", "launchers.nodeside.zygote",
                     warmfork.socket_path(plan.run_id, s), str(s)]
            line = f"cd {shlex.quote(plan.cwd)} 2>/dev/null; exec " + " ".join(map(shlex.quote, words))
            self.conns.append(make_connection(h, plan.settings))
            threading.Thread(target=self._hold, args=(self.conns[-1], line), daemon=True,
                             name="launch-zygote").start()

    def _hold(self, conn, line: str) -> None:
        try:
            if not self.closed:
                conn.run(line, pty=True, hide=True, warn=True, in_stream=False)
        except Exception:  # noqa: BLE001 - a host without a zygote starts cold
            pass

    def close(self) -> None:
        self.closed = True
        close_all(self.conns)
