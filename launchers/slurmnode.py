"""The per-node task of a Slurm run: one per allocated node (srun, one task per node).

    python -m launchers.slurmnode run RUN_DIR --base-attempt A [--in-allocation]   (in-allocation mode)
    NodeTask(RUN_DIR, A)()                        (the same, submitted as a submitit Checkpointable)
    python -m launchers.slurmnode task RUN_DIR/slurm --base-attempt A   (what srun runs: NodeTask's call)
    python -m launchers.slurmnode finalize RUN_DIR --base-attempt A              (batch side, after srun)

Node rank = SLURM_NODEID; attempt = A + SLURM_RESTART_COUNT. Node 0 (the first host of the allocation)
resolves its own non-loopback address, binds a small beacon socket on it (proof that the address is local),
chooses the port (--master-port, else derived from the Slurm job id, probed) and publishes both in
slurm/master-<job>-<step>-r<restart>.json; the other nodes read it and check that the beacon answers
before starting their agent, so an unreachable master is a one-line failure, never a hang. Each node runs
the command from launchers.torchrun.node_command (the one builder) and records how it ended in
status/node<K>.json; status.json is only changed under a lock (update_status).

Stop signals: Slurm signals every process of the step (the agent, each rank's wrapper, the program). The
agent is told to handle USR2 like SIGTERM (forward to its workers and wait for them), the wrappers forward
it to the program, which writes a checkpoint and exits. This task only notes the signal and waits. When
USR2 was seen (preemption or the --signal warning before the time limit), node 0 waits for every node's
record, then requeues the job with `scontrol requeue` (the next run is attempt +1 and resumes from
checkpoints/latest) -- or marks the run FAILED once --max-requeues is used up. Stdlib only on the nodes (submitit
only where NodeTask is pickled, by the launcher); no torch.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from . import procs
from .rundir import RunDir
from .torchrun import NodeCommand, derive_port, node_command

MASTER_WAIT_S = 120.0      # other nodes wait this long for node 0 to publish the master address
BEACON_WAIT_S = 60.0       # ... and this long for node 0's beacon to answer
PEERS_WAIT_S = 30.0        # node 0 waits this long for every node's record before requeueing


class NodeError(Exception):
    """A node could not start its part of the job; recorded in status/node<K>.json."""


# ------------------------------------------------------------------------------------------ run dir I/O

def slurm_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "slurm")


@contextlib.contextmanager
def _status_lock(run_dir: str):
    os.makedirs(slurm_dir(run_dir), exist_ok=True)
    with open(os.path.join(slurm_dir(run_dir), ".status.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def update_status(rd: RunDir, **fields: Any) -> dict[str, Any]:
    """status.json read-modify-write under a lock: node 0, the batch side and the launcher all write it."""
    with _status_lock(rd.path):
        return rd.write_status(**fields)


def node_file(run_dir: str, node: int) -> str:
    return os.path.join(run_dir, "status", f"node{node}.json")


def _write_json(path: str, obj: dict[str, Any]) -> None:
    """Replace path atomically (readers on other nodes see the old file or the new one)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def write_node(run_dir: str, node: int, record: dict[str, Any]) -> None:
    _write_json(node_file(run_dir, node), record)


def node_spec_file(run_dir: str, base_attempt: int) -> str:
    return os.path.join(slurm_dir(run_dir), f"spec-a{base_attempt}.json")


def write_node_spec(rd: RunDir, spec, run_id: str, base_attempt: int) -> None:
    """The submission's spec as JSON next to its sbatch script: the nodes read this instead of run.yaml, so
    their start-up (on the way to torchrun) needs no yaml. Same content as run.yaml's spec (secrets ***)."""
    from .rundir import atomic_write, redacted_spec
    os.makedirs(slurm_dir(rd.path), exist_ok=True)
    atomic_write(node_spec_file(rd.path, base_attempt),
                 json.dumps({"run_id": run_id, "spec": redacted_spec(spec)}, indent=1))


def load_node_spec(rd: RunDir, base_attempt: int):
    """(run_id, JobSpec) of this submission; run.yaml for run dirs that predate the JSON file."""
    from .rundir import spec_from_record
    try:
        with open(node_spec_file(rd.path, base_attempt), encoding="utf-8") as f:
            d = json.load(f)
    except FileNotFoundError:
        return rd.run_id, rd.spec()
    return d["run_id"], spec_from_record(d["spec"])


def read_nodes(run_dir: str, nnodes: int, attempt: int) -> dict[int, dict[str, Any]]:
    """Node records of this attempt (node -> record)."""
    out = {}
    for k in range(nnodes):
        try:
            with open(node_file(run_dir, k), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if rec.get("attempt") == attempt:
            out[k] = rec
    return out


# ------------------------------------------------------------------------------------------ master address

def master_address(first_host: str, other_host: str | None, nnodes: int) -> str:
    """The first host's address as other nodes reach it; loopback only for a one-node job."""
    try:
        ips = [ai[4][0] for ai in socket.getaddrinfo(first_host, None, socket.AF_INET, socket.SOCK_STREAM)]
    except socket.gaierror as e:
        raise NodeError(f"first host {first_host!r} does not resolve on itself: {e}") from None
    routable = [ip for ip in ips if not ip.startswith("127.")]
    if routable:
        return routable[0]
    if other_host:  # the source address this host uses to reach another node of the allocation
        try:
            peer = socket.gethostbyname(other_host)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, 9))
                ip = s.getsockname()[0]
            if not ip.startswith("127."):
                return ip
        except OSError:
            pass
    if nnodes == 1:
        return ips[0] if ips else "127.0.0.1"
    raise NodeError(f"first host {first_host!r} resolves only to loopback ({', '.join(ips)}); the other nodes "
                    "cannot reach it: fix its /etc/hosts or DNS entry")


class Beacon:
    """A listening socket on the master address: binding proves the address is local, connecting proves
    other nodes reach it."""

    def __init__(self, addr: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.bind((addr, 0))
        except OSError as e:
            raise NodeError(f"master address {addr} is not an address of this host ({socket.gethostname()}): {e}") \
                from None
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
                conn.close()
            except OSError:
                return


def check_reachable(addr: str, port: int, deadline: float, stopped) -> None:
    last = None
    while time.monotonic() < deadline and not stopped():
        try:
            with socket.create_connection((addr, port), timeout=3):
                return
        except OSError as e:
            last = e
            time.sleep(0.5)
    raise NodeError(f"master {addr} (beacon port {port}) is not reachable from {socket.gethostname()}: {last}")


def choose_master_port(spec, key: str, addr: str) -> int:
    from .backends.base import port_free
    if spec.master_port is not None:
        return spec.master_port
    for i in range(32):
        port = derive_port(key if i == 0 else f"{key}:{i}")
        if port_free(addr, port):
            return port
    raise NodeError(f"no free port on {addr} among 32 derived from {key}; give --master-port")


def slurm_node_command(spec, node: int, addr: str, port: Any, run_id: str, attempt: int, dist: str) -> NodeCommand:
    """The builder's command, plus what the agent needs to pass stop signals on (shown in the dry-run)."""
    from .backends.slurm_render import allocation_env, slurm_options
    nc = node_command(spec, node_rank=node, master_addr=addr, master_port=port, run_id=run_id,
                      attempt=attempt, dist_backend=dist)
    extra = allocation_env(slurm_options(spec)["signal_seconds"])
    return NodeCommand(node_rank=nc.node_rank, argv=nc.argv, env=nc.env + tuple(extra.items()))


# ------------------------------------------------------------------------------------------ the node task

def run_node(run_dir: str, base_attempt: int, in_allocation: bool = False) -> int:
    from .backends.base import dist_backend_for
    from .backends.slurm_render import slurm_options

    job_id, node, hosts = os.environ["SLURM_JOB_ID"], int(os.environ["SLURM_NODEID"]), job_hostnames()
    restart = 0 if in_allocation else int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    step = os.environ.get("SLURM_STEP_ID", "0")
    attempt = base_attempt + restart
    rd = RunDir(run_dir)
    run_id, spec = load_node_spec(rd, base_attempt)
    stops: list[str] = []

    def on_stop(signum, _frame):
        stops.append(signal.Signals(signum).name)

    for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_stop)
    signal.signal(signal.SIGCONT, signal.SIG_DFL)

    base_rec = {"node": node, "attempt": attempt, "host": socket.gethostname(), "pid": os.getpid(),
                "slurm_job_id": job_id, "slurm_restart": restart}
    rendezvous = os.path.join(slurm_dir(run_dir), f"master-{job_id}-{step}-r{restart}.json")
    code: int | None = None
    error = None
    try:
        if len(hosts) < spec.nodes:
            raise NodeError(f"the allocation has {len(hosts)} nodes ({os.environ.get('SLURM_JOB_NODELIST')}), "
                            f"the job needs {spec.nodes}")
        if node == 0:
            addr = master_address(hosts[0], hosts[1] if len(hosts) > 1 else None, spec.nodes)
            beacon = Beacon(addr)
            port = choose_master_port(spec, f"slurm-{job_id}" + (f".{step}" if in_allocation else ""), addr)
            _write_json(rendezvous, {"addr": addr, "port": port, "beacon": beacon.port, "host": hosts[0]})
        else:
            info = _wait_master(rendezvous, lambda: bool(stops))
            addr, port = info["addr"], info["port"]
            check_reachable(addr, info["beacon"], time.monotonic() + BEACON_WAIT_S, lambda: bool(stops))
        dist = dist_backend_for(spec)
        nc = slurm_node_command(spec, node, addr, port, run_id, attempt, dist)
        if stops:
            raise NodeError(f"stopped by {stops[0]} before starting")
        log = rd.agent_log(node)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"===== launch attempt {attempt} | node {node} on {socket.gethostname()} | slurm job {job_id} "
                    f"| {time.strftime('%F %T')} =====\n{nc.shell()}\n")
        agent = procs.start_session(nc.argv, {**os.environ, **nc.env_dict}, log)
        # bookkeeping while the agent imports torch (off the start-up critical path)
        if node == 0:
            _record_attempt(rd, spec, attempt, job_id, restart, addr, port, dist, hosts[:spec.nodes], run_id)
            update_status(rd, state="RUNNING", attempt=attempt, nodes={}, first_failure=None, reason=None,
                          slurm_job_id=job_id)
        write_node(run_dir, node, dict(base_rec, state="RUNNING", master=f"{addr}:{port}", agent_pid=agent.pid,
                                       time=time.time()))
        code = agent.wait()
    except NodeError as e:
        error, code = str(e), 1
        print(f"launch: node {node}: {error}", file=sys.stderr, flush=True)
    write_node(run_dir, node, dict(base_rec, state="EXITED", exit_code=code if code >= 0 else None,
                                   signal=signal.Signals(-code).name if code < 0 else None,
                                   stop_signals=sorted(set(stops)), error=error, time=time.time()))
    if node == 0 and "SIGUSR2" in stops:
        _after_stop(rd, spec, attempt, restart, job_id, in_allocation, slurm_options(spec)["max_requeues"])
    return code


def _wait_master(path: str, stopped) -> dict[str, Any]:
    deadline = time.monotonic() + MASTER_WAIT_S
    while time.monotonic() < deadline and not stopped():
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            time.sleep(0.02)
    raise NodeError(f"node 0 did not publish the master address within {MASTER_WAIT_S:.0f} s ({path})")


def _record_attempt(rd: RunDir, spec, attempt: int, job_id: str, restart: int, addr: str, port: int, dist: str,
                    hosts: list[str], run_id: str) -> None:
    """run.yaml: node 0 is its only writer while the job runs (the launcher wrote it before submitting)."""
    data = rd.read_run_yaml()
    attempts = data.setdefault("attempts", [])
    rec = {"master_addr": addr, "master_port": port, "dist_backend": dist, "hosts": hosts,
           "commands": [slurm_node_command(spec, k, addr, port, run_id, attempt, dist).shell() for k in range(spec.nodes)],
           "slurm_job_id": job_id, "slurm_restart": restart}
    if attempt < len(attempts):
        attempts[attempt].update(rec)
    else:
        attempts.append(dict(rec, attempt=attempt, started=time.strftime("%Y-%m-%dT%H:%M:%S"), nodes=spec.nodes,
                             gpus_per_node=spec.gpus_per_node, reason="requeued by Slurm"))
    rd.write_run_yaml(data)


def _after_stop(rd: RunDir, spec, attempt: int, restart: int, job_id: str, in_allocation: bool,
                max_requeues: int) -> None:
    """Node 0 after a USR2: wait for every node's record, then requeue (or give up)."""
    deadline = time.monotonic() + PEERS_WAIT_S
    while time.monotonic() < deadline:
        recs = read_nodes(rd.path, spec.nodes, attempt)
        if len(recs) == spec.nodes and all(r.get("state") == "EXITED" for r in recs.values()):
            break
        time.sleep(0.2)
    nodes = {str(k): r.get("exit_code") for k, r in read_nodes(rd.path, spec.nodes, attempt).items()}
    if len(nodes) == spec.nodes and all(c == 0 for c in nodes.values()):
        return      # the signal came after the job had finished: nothing to requeue (finalize records it)
    if in_allocation:
        update_status(rd, state="FAILED", nodes=nodes, reason="stopped by SIGUSR2 inside an allocation (not "
                      f"requeued); continue with `launch resume {rd.path}`")
        return
    with _status_lock(rd.path):
        _requeue_or_fail(rd, attempt, restart, job_id, max_requeues, nodes)


def _requeue_or_fail(rd: RunDir, attempt: int, restart: int, job_id: str, max_requeues: int, nodes: dict[str, Any]) -> None:
    """Called with the status lock held, after a USR2 stopped the attempt."""
    if restart >= max_requeues:
        rd.write_status(state="FAILED", attempt=attempt, nodes=nodes, reason=f"stopped by SIGUSR2 (preemption or time limit) "
                        f"after {restart} requeues; --max-requeues {max_requeues} is used up")
        return
    rd.write_status(state="REQUEUED", attempt=attempt, nodes=nodes, reason=f"SIGUSR2 (preemption or time limit): requeued "
                    f"({restart + 1} of {max_requeues})")
    p = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines()
        rd.write_status(state="FAILED", reason=f"scontrol requeue {job_id} failed: {msg[0] if msg else p.returncode}")


def _node_task_class():
    from submitit.helpers import Checkpointable        # the launcher pickles it; the nodes never import submitit

    class NodeTask(Checkpointable):
        """What submitit submits (pickled into the submitit folder); srun's `task` runs the same call without
        unpickling it. checkpoint() (submitit's own USR2 path) resubmits the same task."""

        def __init__(self, run_dir: str, base_attempt: int):
            self.run_dir, self.base_attempt = run_dir, base_attempt

        def __call__(self) -> int:
            code = run_node(self.run_dir, self.base_attempt)
            if code != 0:
                raise SystemExit(code if 0 < code < 256 else 1)
            return 0

    NodeTask.__module__, NodeTask.__qualname__ = __name__, "NodeTask"
    return NodeTask


def __getattr__(name: str):
    if name == "NodeTask":                 # built on first use, so importing this module stays submitit-free
        globals()["NodeTask"] = cls = _node_task_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def job_hostnames(nodelist: str | None = None) -> list[str]:
    """SLURM_JOB_NODELIST ("gpu[01-03,7],login1") -> host names, in Slurm's order."""
    text = os.environ.get("SLURM_JOB_NODELIST", "") if nodelist is None else nodelist
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    try:
        return [h for item in items if item for h in _expand_hosts(item)]
    except ValueError:
        raise NodeError(f"SLURM_JOB_NODELIST {text!r} is malformed") from None


def _expand_hosts(item: str) -> list[str]:
    if "[" not in item:
        if "]" in item:
            raise ValueError(item)
        return [item]
    pre, _, rest = item.partition("[")
    ranges, close, post = rest.partition("]")
    if not close or not ranges:
        raise ValueError(item)
    heads = []
    for part in ranges.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(item)
        heads += [f"{pre}{k:0{len(lo)}d}" for k in range(int(lo), int(hi) + 1)] if dash else [pre + lo]
    return [h + tail for h in heads for tail in _expand_hosts(post)]


def submitit_task(folder: str, base_attempt: int) -> int:
    """What srun runs on every node: the NodeTask call (run_node) straight from the command line, plus
    submitit's per-task result pickle for submitit's Job object. Not unpickling the submitted NodeTask keeps
    submitit (and cloudpickle) out of the node's start-up, which is on the path to torchrun."""
    import pickle
    try:
        code = run_node(os.path.dirname(os.path.abspath(folder)), base_attempt)
        outcome: tuple = ("success", 0) if code == 0 else ("error", f"node task exited with {code}")
        code = 0 if code == 0 else (code if 0 < code < 256 else 1)
    except Exception:  # noqa: BLE001 (recorded for submitit, then reported by exiting non-zero)
        import traceback
        code, outcome = 1, ("error", traceback.format_exc())
        print(outcome[1], file=sys.stderr, flush=True)
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID", "0")
    path = os.path.join(folder, f"{job}_{os.environ.get('SLURM_PROCID', '0')}_result.pkl")
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(outcome, f)
    os.replace(tmp, path)
    return code


# ------------------------------------------------------------------------------------------ batch side

def finalize(run_dir: str, base_attempt: int, in_allocation: bool = False, srun_status: int | None = None) -> int:
    """After srun: per-node exit codes and first failure into status.json, unless node 0 already decided
    (REQUEUED, FAILED after a stop). A USR2 that ended the step before node 0 could act on it (e.g. during
    start-up: srun status 128+12) is requeued from here. Returns 0 only if every node (so every rank)
    succeeded."""
    rd = RunDir(run_dir)
    spec = rd.spec()
    restart = 0 if in_allocation else int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    attempt = base_attempt + restart
    recs = read_nodes(run_dir, spec.nodes, attempt)
    nodes = {str(k): r.get("exit_code") for k, r in sorted(recs.items())}
    with _status_lock(run_dir):
        st = rd.read_status()
        if st.get("attempt") == attempt and st.get("state") in ("REQUEUED", "FAILED", "CANCELLED", "COMPLETED"):
            return 0 if st["state"] == "COMPLETED" else 1
        missing = [k for k in range(spec.nodes) if recs.get(k, {}).get("state") != "EXITED"]
        if not missing and all(r.get("exit_code") == 0 for r in recs.values()):
            rd.write_status(state="COMPLETED", attempt=attempt, nodes=nodes, first_failure=None, reason=None)
            return 0
        usr2 = srun_status == 128 + signal.SIGUSR2 or any("SIGUSR2" in r.get("stop_signals", ()) for r in recs.values())
        if usr2 and not in_allocation:
            from .backends.slurm_render import slurm_options
            _requeue_or_fail(rd, attempt, restart, os.environ.get("SLURM_JOB_ID", ""),
                             slurm_options(spec)["max_requeues"], nodes)
            return 1
        ff = rd.first_failure(attempt)
        reason = None
        if ff is None:
            for k, r in sorted(recs.items()):
                if r.get("state") == "EXITED" and r.get("exit_code") != 0:
                    ff = {"node": k, "rank": None, "exit_code": r.get("exit_code"), "signal": r.get("signal"),
                          "time": r.get("time")}
                    reason = r.get("error")
                    break
        if missing:
            reason = reason or f"node(s) {', '.join(map(str, missing))} recorded no exit"
        rd.write_status(state="FAILED", attempt=attempt, nodes=nodes, first_failure=ff, reason=reason)
        return 1


USAGE = ("usage: python -m launchers.slurmnode {run,finalize,task} RUN_DIR [--base-attempt A] [--in-allocation] "
         "[--srun-status S]")


def _usage_error(msg: str) -> None:
    print(f"{USAGE}\nlaunchers.slurmnode: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _parse(argv: list[str]) -> dict[str, Any]:
    """The node entry's arguments (no argparse: this runs on every node on the way to torchrun)."""
    out: dict[str, Any] = {"base_attempt": 0, "in_allocation": False, "srun_status": None}
    pos: list[str] = []
    it = iter(argv)
    try:
        for a in it:
            if a in ("--base-attempt", "--srun-status"):
                out[a[2:].replace("-", "_")] = int(next(it))
            elif a == "--in-allocation":
                out["in_allocation"] = True
            elif a.startswith("-"):
                raise ValueError(a)
            else:
                pos.append(a)
    except (StopIteration, ValueError) as e:
        _usage_error(f"bad argument {str(e) or argv[-1]!r}")
    if len(pos) != 2 or pos[0] not in ("run", "finalize", "task"):
        _usage_error(f"expected one of run/finalize/task and a directory, got {pos!r}")
    out["what"], out["run_dir"] = pos
    return out


def main(argv: list[str] | None = None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    if a["what"] == "task":          # run_dir is the submitit folder here
        return submitit_task(a["run_dir"], a["base_attempt"])
    if a["what"] == "run":
        return run_node(a["run_dir"], a["base_attempt"], in_allocation=a["in_allocation"])
    return finalize(a["run_dir"], a["base_attempt"], in_allocation=a["in_allocation"], srun_status=a["srun_status"])


if __name__ == "__main__":
    code = main()
    sys.exit(code if 0 <= code < 256 else 1)
