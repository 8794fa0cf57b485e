"""`--dist-backend auto`, decided where the ranks run (issue 33), never on the submitting machine (a
login node without a GPU would make every node of a GPU job train on CPUs with gloo, in silence).

The node command carries LAUNCH_DIST_BACKEND=auto; on each node the rank wrapper
(launchers.rankexec) settles it before the program starts: local rank 0 counts the GPUs the node's
ranks can use (the driver's own tool, `nvidia-smi -q -x`, narrowed by CUDA_VISIBLE_DEVICES as
Slurm's GPU binding sets it) and records the node's answer (status/backend-a<attempt>-node<K>.json)
-- on Slurm the node's task has counted them already, while torchrun started (early()), so the ranks
find it there; every rank then waits for every node's record and applies one pure rule
(dist_backend_decision()), so all nodes reach the same verdict:
  - no node has a GPU: gloo, said in one line (`no GPU on any node: gloo on CPU`);
  - every node has a GPU for each of its ranks: nccl;
  - else the job stops before training: a node short of GPUs while another has them fails with one
    line naming it and what it has (kind `gpu`: with --spares it is quarantined and a spare takes
    its place); the nodes that have their GPUs start nothing and wait for the stop. Every node
    short: each fails (not one node's fault).
Stdlib only (and the pure nvidia-smi parser); the submitting side reads the records (lines()).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import namedtuple

TYPE_CHECKING = False  # typing: ~5 ms of the rank wrapper's start, which imports this module
if TYPE_CHECKING:
    from typing import Any

from . import layout

AUTO = "auto"
# what a dry-run says
PLANNED = "auto: decided on each node (nccl where the node has GPUs, else gloo)"
NO_GPU = "no GPU on any node: gloo on CPU"
SMI_TIMEOUT_S = 20.0  # a driver that does not answer in this long: the node has no usable GPU
WAIT_S = 120.0  # how long a rank waits for every node's record (torchrun's rendezvous came first)
# its looks at the records: every 2 ms at first, then less often, at most 0.1 s apart
POLL_S = (0.002, 0.1)


def usable_gpus(
    env: dict[str, str] | os._Environ, timeout: float = SMI_TIMEOUT_S
) -> tuple[int, str]:
    """(how many GPUs this node's ranks can use, why): the GPUs `nvidia-smi -q -x` lists (none when
    the tool is missing, fails or hangs), narrowed by CUDA_VISIBLE_DEVICES when it is set."""
    exe = which("nvidia-smi", env.get("PATH"))
    if not exe:
        return 0, "no nvidia-smi on PATH"
    import subprocess

    from .gpuhealth.smi import parse as parse_smi

    try:
        p = subprocess.run(
            [exe, "-q", "-x"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        return 0, f"nvidia-smi gave no answer in {timeout:g} s"
    except OSError as e:
        return 0, f"nvidia-smi could not run: {e.strerror or e}"
    if p.returncode != 0:
        said = (p.stderr.strip() or p.stdout.strip()).splitlines()
        return 0, f"nvidia-smi exit code {p.returncode}" + (f": {said[0][:160]}" if said else "")
    try:
        listed = len(parse_smi(p.stdout)["gpus"])
    except ValueError as e:
        return 0, f"nvidia-smi: {e}"[:200]
    return visible(env.get("CUDA_VISIBLE_DEVICES"), listed)


def which(name: str, path: str | None) -> str | None:
    """shutil.which's answer for an executable name on PATH (None: os.defpath) -- shutil's import
    (lzma, bz2: ~5 ms) sits on every node's rank start."""
    for d in (os.defpath if path is None else path).split(os.pathsep):
        p = os.path.join(d or os.curdir, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def visible(cvd: str | None, listed: int) -> tuple[int, str]:
    """The GPUs of `listed` that CUDA_VISIBLE_DEVICES leaves (CUDA's rule: entries up to the first
    invalid one; an index must exist, a GPU-/MIG- UUID is taken as one device); unset: all of
    them."""
    said = f"nvidia-smi lists {listed}"
    if cvd is None:
        return listed, said
    n = 0
    for word in (w.strip() for w in cvd.split(",")):
        if word.isdigit() and int(word) < listed or word.startswith(("GPU-", "MIG-")) and listed:
            n += 1
        else:
            break
    return min(n, listed), f"{said}, CUDA_VISIBLE_DEVICES={cvd!r} leaves {min(n, listed)}"


def record(run_dir: str, env, node: int, attempt: int) -> dict[str, Any]:
    """Local rank 0 (or, earlier, the node's task: early()): this node's answer, written for every
    rank of the job (atomic)."""
    gpus, why = usable_gpus(env)
    # = socket.gethostname()
    rec = {
        "node": node,
        "host": os.uname().nodename,
        "attempt": attempt,
        "gpus": gpus,
        "ranks": int(env.get("LOCAL_WORLD_SIZE") or 1),
        "backend": "nccl" if gpus else "gloo",
        "why": why,
        "time": time.time(),
    }
    layout.atomic_write(
        layout.own_path(run_dir, "node_backend", attempt=attempt, node=node), json.dumps(rec)
    )
    return rec


def collect(
    run_dir: str, attempt: int, nodes: int, got: dict[int, dict[str, Any]] | None = None
) -> dict[int, dict[str, Any]]:
    """Every node's record of this attempt that is there now (a record not whole yet is not there);
    got: the records found by an earlier look, kept (only the others are read again)."""
    got = dict(got or {})
    for k in range(nodes):
        if k in got:
            continue
        rec = layout.read_json(layout.path(run_dir, "node_backend", attempt=attempt, node=k))
        if isinstance(rec, dict) and isinstance(rec.get("gpus"), int):
            got[k] = rec
    return got


def early(run_dir: str, env, node: int, attempt: int, ranks: int):
    """The node's task (Slurm), as it starts its agent: this node's record, in a thread, while
    torchrun imports torch, so that its ranks find it there (local rank 0 records only when it is
    not: settle()). env: the agent's environment (the ranks inherit it: the same PATH and
    CUDA_VISIBLE_DEVICES); ranks: its ranks on this node."""
    import threading

    try:  # an answer left by an earlier task of this attempt is not this node's now
        os.unlink(layout.path(run_dir, "node_backend", attempt=attempt, node=node))
    except OSError:
        pass
    env = {**env, "LOCAL_WORLD_SIZE": str(ranks)}

    def run() -> None:
        try:
            record(run_dir, env, node, attempt)
        except Exception:  # noqa: BLE001  -- local rank 0 records it then (and says why it cannot)
            pass

    t = threading.Thread(target=run, daemon=True, name="launch-node-backend")
    t.start()
    return t


class Verdict(namedtuple("Verdict", "backend line failed kind", defaults=({}, None))):
    """backend: gloo | nccl, None: the job stops; line: one line, said by every rank and by `launch
    status`; failed: node -> why it fails (the job stops; never changed in place); kind: "gpus", the
    failing nodes' own fault (recovery quarantines them). (collections', not typing's NamedTuple:
    the rank wrapper imports this module as it starts.)"""

    __slots__ = ()


def _name(rec: dict[str, Any]) -> str:
    return f"node {rec['node']} ({rec.get('host')})"


def dist_backend_decision(recs: dict[int, dict[str, Any]]) -> Verdict:
    """Every node's record -> the job's verdict, the same on every node (pure)."""
    if not any(r["gpus"] for r in recs.values()):
        return Verdict("gloo", NO_GPU)
    short = {k: r for k, r in recs.items() if r["gpus"] < r.get("ranks", 1)}
    if not short:
        counts = sorted({r["gpus"] for r in recs.values()})
        return Verdict(
            "nccl", f"nccl: every node has its GPUs ({'/'.join(map(str, counts))} per node)"
        )
    full = [r for k, r in sorted(recs.items()) if k not in short]
    peer = f" while {_name(full[0])} has {full[0]['gpus']}" if full else " (so has every node)"
    failed = {
        k: f"{_name(r)} has {r['gpus']} usable GPU(s) for {r.get('ranks', 1)} rank(s) "
        f"({r['why']}){peer}; accepted with --dist-backend auto: every node with a GPU per rank, "
        "or none (gloo)"
        for k, r in sorted(short.items())
    }
    more = f" (and {len(failed) - 1} more node(s))" if len(failed) > 1 else ""
    return Verdict(
        None,
        f"the job stops before training: {failed[min(failed)]}{more}",
        failed,
        "gpus" if full else None,
    )


def settle(
    run_dir: str,
    env,
    node: int,
    attempt: int,
    nodes: int,
    local_rank: int,
    wait,
    timeout: float = WAIT_S,
) -> Verdict:
    """A rank's part: local rank 0 records its node unless the node's task did already (early());
    every rank waits for all `nodes` records (wait(s): sleeps up to s seconds, returns True when a
    stop came meanwhile -- then the verdict is None with line "stopped") and decides."""
    recs = collect(run_dir, attempt, nodes)
    if local_rank == 0 and node not in recs:
        recs[node] = record(run_dir, env, node, attempt)
    deadline, step = time.monotonic() + timeout, POLL_S[0]
    while True:
        recs = collect(run_dir, attempt, nodes, recs)
        if len(recs) == nodes:
            return dist_backend_decision(recs)
        if time.monotonic() >= deadline:
            missing = ", ".join(str(k) for k in range(nodes) if k not in recs)
            line = f"--dist-backend auto: no answer from node(s) {missing} within {timeout:g} s"
            return Verdict(None, line, {node: line})
        if wait(step):
            return Verdict(None, "stopped")
        step = min(step * 1.5, POLL_S[1])


def summary(run_dir: str, attempt: int, nodes: int) -> dict[str, Any] | None:
    """`launch status` (--json too): what each node of the attempt recorded for --dist-backend auto
    and the job's verdict; None before any node has recorded."""
    recs = collect(run_dir, attempt, nodes)
    if not recs:
        return None
    v = (
        dist_backend_decision(recs)
        if len(recs) == nodes
        else Verdict(None, f"waiting for {nodes - len(recs)} node(s)")
    )
    keep = ("node", "host", "gpus", "ranks", "backend", "why")
    return {
        "backend": v.backend,
        "verdict": v.line,
        "complete": len(recs) == nodes,
        "nodes": [{k: r.get(k) for k in keep} for _, r in sorted(recs.items())],
    }


def lines(summ: dict[str, Any] | None) -> list[str]:
    """summary() as `launch status` says it: the verdict, then one line per node."""
    if not summ:
        return []
    return [f"auto -> {summ['verdict']}"] + [
        f"  node {r['node']} ({r['host']}): {r['gpus']} GPU(s) for {r['ranks']} rank(s), {r['why']}"
        for r in summ["nodes"]
    ]


class Teller:
    """The launcher's own line while it watches an attempt (local, SSH): `launch: --dist-backend
    auto -> VERDICT`, once every node has recorded (it looks at most every 0.5 s); call it in the
    launcher's wait loop."""

    def __init__(self, run_dir: str, attempt: int, nodes: int, out=None) -> None:
        self.run_dir, self.attempt, self.nodes, self.out = run_dir, attempt, nodes, out
        self.next, self.said = 0.0, False

    def __call__(self) -> None:
        now = time.monotonic()
        if self.said or now < self.next:
            return
        self.next = now + 0.5
        summ = summary(self.run_dir, self.attempt, self.nodes)
        if summ and summ["complete"]:
            self.said = True
            print(
                f"launch: --dist-backend auto -> {summ['verdict']}",
                file=self.out or sys.stderr,
                flush=True,
            )


def program_env(backend: str, run_dir: str) -> dict[str, str]:
    """What the program is given once the verdict is in: LAUNCH_DIST_BACKEND, and with nccl the
    flight recorder's defaults (launchers.torchrun.flight_recorder; a value the job set wins) and
    its dump directory."""
    if backend != "nccl":
        return {"LAUNCH_DIST_BACKEND": backend}
    from .torchrun import flight_recorder

    os.makedirs(layout.own_path(run_dir, "nccl"), exist_ok=True)
    return {**flight_recorder(run_dir), "LAUNCH_DIST_BACKEND": backend}


def probe_line(line_prefix: str = "GPUS ") -> str:
    """`python -m launchers.nodebackend` on a node (launch ssh --no-shared-storage: the hosts cannot
    see each other's records, so the launcher gathers every host's answer in its preflight and
    decides): one line."""
    gpus, why = usable_gpus(os.environ)
    return line_prefix + json.dumps({"host": os.uname().nodename, "gpus": gpus, "why": why})


def from_probes(answers: list[str | None], hosts: list[str], ranks: int) -> Verdict:
    """Every host's probe_line() output (None: no answer) -> the verdict, as if the nodes had
    recorded it."""
    recs = {}
    for k, (out, host) in enumerate(zip(answers, hosts)):
        got = next(
            (json.loads(ln[5:]) for ln in (out or "").splitlines() if ln.startswith("GPUS ")), None
        )
        gpus, why = (
            (got["gpus"], got["why"])
            if isinstance(got, dict)
            else (0, "no answer from its GPU probe")
        )
        recs[k] = {"node": k, "host": host, "gpus": gpus, "ranks": ranks, "why": why}
    return dist_backend_decision(recs)


if __name__ == "__main__":
    print(probe_line(), flush=True)
