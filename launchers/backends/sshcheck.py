"""The SSH backend's preflight, before the run dir exists, over connections already open (verified host keys):
every host checked in parallel with the job's python (launchers.nodecheck: working directory, torch and
launchers importable, the program, the node log directory, a free master port on the master), then the master
reachable at MASTER_ADDR:port from every other host (remote.REACH). Errors: one line naming each node and host.
"""
from __future__ import annotations

import json
import secrets
import shlex

from .. import container, layout, nodecheck, ports
from ..errors import LaunchError
from ..remote import REACH
from ..show import counted
from ..sshconn import describe, run_all


def check_hosts(plan, conns) -> int:
    """Every host's check (the master's also probes the port candidates); LaunchError naming each failing node
    and host, else the master port found free on the master."""
    tries = [plan.master_port] if plan.port_fixed else ports.candidates(plan.run_id, 16)
    cmds = [nodecheck.shell(nodecheck.argv(plan.spec.python, plan.cwd, plan.spec.program,
                                           [layout.path(plan.node_dir, "node_logs", node=k)], tries if k == 0 else [],
                                           container.host_check(plan.spec)))
            for k in range(len(conns))]
    say = counted("preflight", len(conns), terminal_only=True)     # a failure stays one line in a log
    results = run_all(conns, cmds, timeout=nodecheck.TIMEOUT_S, done=lambda i, r: say(
        f"host {plan.rhosts[i].label}", "checked" if getattr(r, "exited", None) == 0 else "failed"))
    errors, port = [], None
    for k, (h, r) in enumerate(zip(plan.rhosts, results)):
        if isinstance(r, BaseException):
            errors.append(describe(r, h, plan.settings))
            continue
        rec, errs = nodecheck.answer(r.stdout, r.stderr, r.exited, plan.spec.python)
        errors += [f"node {k} on host {h.label}: {e}" for e in errs]
        if k == 0 and rec is not None and not errs:
            port = rec.get("port")
            if port is None:
                raise LaunchError(f"master port {plan.master_port if plan.port_fixed else 'candidates'} in use on "
                                  f"{h.label}; pick a free --master-port")
    if errors:
        raise LaunchError("; ".join(errors))
    return port


def check_reach(plan, conns) -> None:
    """The master listens on MASTER_ADDR's port; every other host must connect, read our token and acknowledge it.
    The master serves until each distinct host acknowledged (or the timeout): not a count of connections -- at
    64 hosts on a loaded machine a client that retried after a slow read was counted twice, the master stopped
    listening and the hosts still to come were refused."""
    py = shlex.quote(plan.spec.python)
    token = secrets.token_hex(8)
    t = max(plan.settings.timeout_for(h) for h in plan.rhosts)
    base = {"port": plan.master_port, "token": token, "timeout": t, "addr": plan.master_addr}
    cmds = [f"{py} -c {shlex.quote(REACH)} " + shlex.quote(json.dumps(
        dict(base, role="master" if k == 0 else "client", clients=len(conns) - 1, id=k))) for k in range(len(conns))]
    say = counted("reach", len(conns), terminal_only=True)     # a failure stays one line in a log
    results = run_all(conns, cmds, timeout=t + 30, done=lambda i, r: say(
        f"host {plan.rhosts[i].label}", "is the master" if i == 0 else
        "reaches the master" if "REACHED" in getattr(r, "stdout", "") else "cannot reach the master"))
    bad = []
    for h, r in zip(plan.rhosts[1:], results[1:]):
        out = r.stdout.strip() if not isinstance(r, BaseException) else str(r)
        if "REACHED" not in out:
            bad.append(f"host {h.label} cannot reach the master at {plan.master_addr}:{plan.master_port} "
                       f"({out.replace('UNREACHABLE ', '') or 'no answer'})")
    if bad:
        raise LaunchError("; ".join(bad) + " - MASTER_ADDR must be the master's address as the hosts see it")
