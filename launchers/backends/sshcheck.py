"""The SSH backend's preflight, before the run dir exists, over connections already open (verified
host keys): every host checked in parallel with the job's python (launchers.node.nodecheck: working
directory, torch and launchers importable, the program, the node log directory, a free master port
on the master), then the master reachable at MASTER_ADDR:port from every other host
(remote.reach_line); with a podman image, the image on each host (launchers.containers.imagepull:
pulled once per host when missing). Errors: one line naming each node and host.
"""

from __future__ import annotations

import io
import secrets
import sys
import threading

from .. import layout, ports
from ..containers import container, imagepull
from ..errors import LaunchError
from ..node import nodecheck
from ..nodeagent import reach_line
from ..show import counted
from ..ssh.sshconn import describe, run_all


def check_hosts(plan, conns) -> int:
    """Every host's check (the master's also probes the port candidates); LaunchError naming each
    failing node and host, else the master port found free on the master."""
    tries = [plan.master_port] if plan.port_fixed else ports.candidates(plan.run_id, 16)
    cmds = [
        nodecheck.shell(
            nodecheck.argv(
                plan.spec.python,
                plan.cwd,
                plan.spec.program,
                [layout.path(plan.node_dir, "node_logs", node=k)],
                tries if k == 0 else [],
                container.host_check(plan.spec),
            )
        )
        for k in range(len(conns))
    ]
    say = counted("preflight", len(conns), terminal_only=True)  # a failure stays one line in a log
    results = run_all(
        conns,
        cmds,
        timeout=nodecheck.TIMEOUT_S,
        done=lambda i, r: say(
            f"host {plan.rhosts[i].label}",
            "checked" if getattr(r, "exited", None) == 0 else "failed",
        ),
    )
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
                raise LaunchError(
                    f"master port {plan.master_port if plan.port_fixed else 'candidates'} in use "
                    f"on {h.label}; pick a free --master-port"
                )
    if errors:
        raise LaunchError("; ".join(errors))
    return port


def decide_backend(plan, conns) -> str:
    """--dist-backend auto with --no-shared-storage (the hosts cannot see each other's records):
    every host's usable GPUs, asked over its connection before anything starts, and the one rule
    (launchers.nodebackend); LaunchError with its line when the hosts disagree, else the backend
    every node is then given."""
    from .. import nodebackend

    cmd = nodecheck.shell([plan.spec.python, "-m", "launchers.nodebackend"])
    results = run_all(conns, [cmd] * len(conns), timeout=nodebackend.SMI_TIMEOUT_S + 30)
    v = nodebackend.from_probes(
        [None if isinstance(r, BaseException) else r.stdout for r in results],
        [h.label for h in plan.rhosts],
        plan.spec.gpus_per_node,
    )
    if v.backend is None:
        raise LaunchError(f"--dist-backend auto: {v.line}")
    print(
        f"launch: --dist-backend auto -> {v.line} (asked each host: --no-shared-storage)",
        file=sys.stderr,
        flush=True,
    )
    return v.backend


def check_image(plan, conns) -> None:
    """The job's image on every host, pulled there when missing (launchers.containers.imagepull; the
    first node of each host pulls, the hosts side by side); plan.image_digests gets each host's
    digest (the manifest records them). A failure: LaunchError naming each failing node, host and
    cause."""
    spec = plan.spec
    if not imagepull.needed(spec):
        return
    firsts = imagepull.per_host([h.label for h in plan.rhosts])
    line = imagepull.shell(spec.python, spec.container_image)
    results = run_all(
        [conns[k] for k in firsts],
        [line] * len(firsts),
        timeout=imagepull.TIMEOUT_S + imagepull.PULL_S + 30,
    )
    errors, answers = [], []
    for k, r in zip(firsts, results):
        h = plan.rhosts[k]
        if isinstance(r, BaseException):
            errors.append(describe(r, h, plan.settings))
        else:
            answers.append((f"node {k} on host {h.label}", h.label, r.stdout, r.stderr, r.exited))
    plan.image_digests = imagepull.judge(spec.container_image, answers, errors)


def check_reach(plan, conns) -> None:
    """The master listens on MASTER_ADDR's port; every other host must connect, read our token and
    acknowledge it. The clients start once the master listens (at 64 hosts on a loaded machine the
    master's python came up after the clients had given up: Connection refused); the master serves
    until each distinct host acknowledged (or the timeout) -- not a count of connections: a client
    that retried after a slow read was counted twice and the master stopped listening before the
    hosts still to come."""
    token = secrets.token_hex(8)
    t = max(plan.settings.timeout_for(h) for h in plan.rhosts)
    base = {"port": plan.master_port, "token": token, "addr": plan.master_addr}
    cmds = [
        reach_line(
            plan.spec.python,
            plan.cwd,
            dict(
                base,
                role="master" if k == 0 else "client",
                clients=len(conns) - 1,
                id=k,
                timeout=t + MASTER_EXTRA_S if k == 0 else t,
            ),
        )
        for k in range(len(conns))
    ]
    say = counted("reach", len(conns), terminal_only=True)  # a failure stays one line in a log
    master = _Master(conns[0], cmds[0], t + MASTER_EXTRA_S + 30)
    master.listening.wait(MASTER_EXTRA_S)
    say(f"host {plan.rhosts[0].label}", "is the master")
    results = run_all(
        conns[1:],
        cmds[1:],
        timeout=t + 30,
        done=lambda i, r: say(
            f"host {plan.rhosts[i + 1].label}",
            "reaches the master"
            if "REACHED" in getattr(r, "stdout", "")
            else "cannot reach the master",
        ),
    )
    master.thread.join(t + MASTER_EXTRA_S + 30)
    bad = []
    for h, r in zip(plan.rhosts[1:], results):
        out = r.stdout.strip() if not isinstance(r, BaseException) else str(r)
        if "REACHED" not in out:
            bad.append(
                f"host {h.label} cannot reach the master at {plan.master_addr}:{plan.master_port} "
                f"({out.replace('UNREACHABLE ', '') or 'no answer'})"
            )
    if bad:
        raise LaunchError(
            "; ".join(bad) + " - MASTER_ADDR must be the master's address as the hosts see it"
        )


# how long the master's side may take to start listening, on top of the clients' timeout
MASTER_EXTRA_S = 60.0


class _Master:
    """The master's side of the reach check, run in a thread; `listening` is set once it says
    LISTENING (or it ended: the clients then find nobody and say so)."""

    def __init__(self, conn, cmd: str, timeout: float) -> None:
        self.listening, self.out = threading.Event(), io.StringIO()
        self.thread = threading.Thread(target=self._run, args=(conn, cmd, timeout), daemon=True)
        self.thread.start()

    def write(self, s: str) -> int:
        self.out.write(s)
        if "LISTENING" in self.out.getvalue():
            self.listening.set()
        return len(s)

    def flush(self) -> None:
        pass

    def _run(self, conn, cmd: str, timeout: float) -> None:
        try:
            conn.run(cmd, hide=True, warn=True, in_stream=False, out_stream=self, timeout=timeout)
        except Exception:  # noqa: BLE001  -- the clients' answers say what is wrong
            pass
        finally:
            self.listening.set()
