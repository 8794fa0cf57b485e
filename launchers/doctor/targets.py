"""Where `launch doctor` runs its probe: this machine (local), SSH hosts (launchers.ssh.sshconn on
paramiko, verified host keys, each host on its own: an unreachable one is a row, not the end), or
Slurm nodes (one srun step, a task per node).

Every target returns one NodeRun per node: the probe's result, or why there is none, and the arrival
time of its first line (clock skew). The submitting side's own facts come from the same probe, run
here with this python in a subprocess (the launcher never imports torch).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import LaunchError
from .probe import GONE, PROBE

SLURM_QUEUE_WAIT = 120  # seconds srun may wait for the nodes (--immediate) before doctor gives up


class Lines:
    """A file-like sink (fabric's out_stream, a pipe reader): whole lines with their arrival
    time."""

    def __init__(self) -> None:
        self.buf, self.lines, self.lock = "", [], threading.Lock()

    def write(self, s: str) -> None:
        now = time.time()
        with self.lock:
            self.buf += s.replace("\r", "")
            *done, self.buf = self.buf.split("\n")
            self.lines += [(now, ln) for ln in done]

    def flush(self) -> None:
        pass


@dataclass
class NodeRun:
    node: int
    host: str
    error: str | None = None  # the node could not be reached or the probe could not run there
    result: dict | None = None  # the probe's DOCTOR record
    skew: float | None = None  # node clock - our clock at its first line's arrival (s)
    reached: bool = True  # False: no connection (error says why)

    def take(self, lines: list[tuple[float, str]]) -> None:
        parts: list[str] = []  # the record's JSON, in pieces (launchers.doctor.probe)
        for at, ln in lines:
            if ln.startswith("DOCTOR-T ") and self.skew is None:
                self.skew = float(ln.split()[1]) - at
            elif ln.startswith("DOCTOR+ "):
                parts.append(json.loads(ln[len("DOCTOR+ ") :]))
            elif ln.strip() == "DOCTOR-END":
                self.result = json.loads("".join(parts))


def probe_argv(python: str, args: dict) -> list[str]:
    return [python, "-c", PROBE, json.dumps(args)]


def run_process(
    argv: list[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[Lines, int, str]:
    """Run argv here (env: its environment, default ours); stdout lines stamped as they arrive.
    (lines, exit code, stderr)."""
    out = Lines()
    try:
        p = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
        )
    except OSError as e:
        return out, 127, f"{argv[0]}: {e.strerror or e}"
    err: list[str] = []
    t = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    t.start()
    for ln in p.stdout:
        out.write(ln)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    t.join(5)
    return out, p.returncode, "".join(err)


def reference(timeout: float, cwd: str, root: str) -> dict:
    """The submitting side's facts (this python, this cwd)."""
    lines, code, err = run_process(
        probe_argv(sys.executable, {"facts_only": True, "cwd": cwd, "root": root}), timeout
    )
    me = NodeRun(-1, "here")
    me.take(lines.lines)
    return me.result or {"error": last_line(err) or f"exit code {code}"}


def last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def why_no_result(python: str, code: int | None, err: str) -> str:
    if code == 127:
        said = last_line(err)
        return f"python {python!r} not found there" + (f" ({said})" if said else "")
    return last_line(err) or f"the probe exited {code} without a result"


def run_local(python: str, base: dict, timeout: float) -> list[NodeRun]:
    import socket

    node = NodeRun(0, socket.gethostname())
    lines, code, err = run_process(
        probe_argv(python, dict(base, node=0, expect=0, master="127.0.0.1")), timeout
    )
    node.take(lines.lines)
    if node.result is None:
        node.error = why_no_result(python, code, err)
    return [node]


def run_local_slots(
    python: str, base: dict, slots: list[int], env_of, timeout: float
) -> list[NodeRun]:
    """The GPU tools only (no imports, no port), once per simulated node slot, all at once, each in
    that slot's environment (env_of(slot): LAUNCH_NODE_SLOT told); NodeRun.node is the slot."""
    import socket

    def one(slot: int) -> NodeRun:
        node = NodeRun(slot, socket.gethostname())
        lines, code, err = run_process(
            probe_argv(python, dict(base, node=slot, tools_only=True)), timeout, env_of(slot)
        )
        node.take(lines.lines)
        if node.result is None:
            node.error = why_no_result(python, code, err)
        return node

    with ThreadPoolExecutor(max_workers=max(1, len(slots))) as ex:
        return list(ex.map(one, slots))


def run_slurm(python: str, base: dict, opts: dict, nodes: int, timeout: float) -> list[NodeRun]:
    """One srun step, one task per node; each task's lines come labelled "K: " (task K = node K).
    Not --unbuffered: then srun labels each piece it reads, cutting a line wherever a read ended."""
    argv = [
        "srun",
        "--nodes",
        str(nodes),
        "--ntasks",
        str(nodes),
        "--ntasks-per-node",
        "1",
        "--label",
        "--job-name",
        "launch-doctor",
        "--time",
        "10",
        f"--immediate={SLURM_QUEUE_WAIT}",
        "--kill-on-bad-exit=0",
    ]
    for key in ("partition", "account", "qos", "constraint"):
        if opts.get(key):
            argv += [f"--{key}", str(opts[key])]
    if opts.get("gpus_per_node"):
        argv += ["--gpus-per-node", str(opts["gpus_per_node"])]
    args = dict(base, slurm=True, master=None, expect=nodes - 1)
    lines, code, err = run_process(
        argv + probe_argv(python, args), timeout + SLURM_QUEUE_WAIT + 120
    )
    per, per_err = by_task(lines.lines), by_task([(0.0, ln) for ln in err.splitlines()])
    if not per and not per_err:
        raise LaunchError(
            f"the doctor job did not start: {last_line(err) or f'srun exited {code}'}"
        )
    out = []
    for k in range(nodes):
        n = NodeRun(k, f"node {k}")
        n.take(per.get(k, []))
        if n.result is not None:
            n.host = n.result.get("host", n.host)
            out.append(n)
            continue
        said = " ".join(ln.strip() for _, ln in per_err.get(k, []))
        host = re.search(r"slurmstepd-([^:\s]+):", said)
        n.host = host.group(1) if host else n.host
        n.error = (
            f"python {python!r} not found there ({said})"
            if "execve" in said
            else said or why_no_result(python, code, err)
        )
        out.append(n)
    return out


def by_task(lines: list[tuple[float, str]]) -> dict[int, list[tuple[float, str]]]:
    """srun --label lines ("K: text") by task K; unlabelled lines (srun's own) are left out."""
    per: dict[int, list] = {}
    for at, ln in lines:
        task, sep, rest = ln.partition(": ")
        if sep and task.strip().isdigit():
            per.setdefault(int(task), []).append((at, rest))
    return per


def run_ssh(hosts, settings, python: str, base: dict, timeout: float) -> list[NodeRun]:
    """Connect to each host on its own (a refused key or a dead host is named, the others still
    run), then the probe on every connected host at once; node 0 is the master at its address from
    the ssh config."""
    from ..ssh.sshconn import close_all, describe, make_connection

    runs = [NodeRun(k, h.label) for k, h in enumerate(hosts)]
    conns = [make_connection(h, settings) for h in hosts]

    def connect(k: int) -> None:
        try:
            conns[k].open()
        except Exception as e:  # noqa: BLE001 - every failure is a one-line reason naming the host
            runs[k].error, runs[k].reached = describe(e, hosts[k], settings), False

    with ThreadPoolExecutor(max_workers=len(hosts)) as ex:
        list(ex.map(connect, range(len(hosts))))
    live = [k for k in range(len(hosts)) if runs[k].error is None]
    master_up = bool(live) and live[0] == 0
    args = dict(
        base,
        master=hosts[0].hostname if master_up else None,
        expect=len(live) - 1 if master_up else 0,
        nnodes=len(hosts),
    )
    if len(live) < len(hosts):
        args["collective"] = False

    try:
        with ThreadPoolExecutor(max_workers=max(1, len(live))) as ex:
            list(
                ex.map(
                    lambda k: ssh_probe(
                        conns, k, runs, hosts, settings, python, dict(args, node=k), timeout
                    ),
                    live,
                )
            )
    finally:
        close_all(conns)
    return runs


def ssh_probe(
    conns, k: int, runs: list[NodeRun], hosts, settings, python: str, args: dict, timeout: float
) -> None:
    """The probe on host k; when it cannot start there, node 0 (waiting for it) hears that it is
    gone."""
    from ..ssh.sshconn import describe

    sink, err = Lines(), Lines()
    cmd = " ".join(shlex.quote(w) for w in probe_argv(python, args))
    try:
        r = conns[k].run(
            cmd,
            hide=False,
            warn=True,
            in_stream=False,
            out_stream=sink,
            err_stream=err,
            timeout=timeout + 150,
        )
        runs[k].take(sink.lines + ([(time.time(), sink.buf)] if sink.buf else []))
        if runs[k].result is None:
            runs[k].error = why_no_result(
                python, r.exited, "\n".join(ln for _, ln in err.lines) + err.buf
            )
    except Exception as e:  # noqa: BLE001 - the connection dropped: a one-line reason naming the host
        runs[k].error, runs[k].reached = describe(e, hosts[k], settings), False
    if runs[k].result is None and k and args.get("master"):
        gone = {"port": args["port"], "token": args["token"], "node": k, "wait": timeout + 30}
        try:
            conns[0].run(
                " ".join(shlex.quote(w) for w in [python, "-c", GONE, json.dumps(gone)]),
                hide=True,
                warn=True,
                in_stream=False,
                timeout=timeout + 60,
            )
        except Exception:  # noqa: BLE001 - node 0 then waits for it until the timeout
            pass
