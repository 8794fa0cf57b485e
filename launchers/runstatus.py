"""A run's status, read and shown: status() (status.json as its backend refreshes it, plus what
explains it), format_status() (`launch status`'s text) and waiting for its end (wait, wait_status,
settled). launchers.api hands these out under their names there."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

from . import layout, nodebackend
from .backendof import get_backend
from .diagnosis.firstfail import describe as describe_failure
from .errors import LaunchError, RunDirGone, TimedOut
from .ledgers import nodeledger
from .records import runindex
from .records.rundir import TERMINAL, RunDir
from .resilience import timeline
from .resilience.restarts import end_line
from .stops import exit_code


def status(path: str, ranks: bool = False, verify: bool = False) -> dict[str, Any]:
    """status.json as the backend refreshes it, plus what explains it: the NCCL refusals in the rank
    logs, the latest checkpoint checked against its manifest (file sizes; with verify, their digests
    too) and, with ranks, per-rank progress (explain.rank_rows)."""
    from .diagnosis import explain

    rd = RunDir.open(runindex.resolve(path), read_only=True)
    # a run dir of a newer launchers: its status as recorded, nothing written
    data = rd.read_run_yaml()
    st = rd.read_status() if rd.newer else get_backend(data["spec"]["backend"]).refresh(rd)
    spec = data["spec"]
    st = dict(st, written_by=rd.newer) if rd.newer else dict(st)
    st.update(
        run_dir=rd.path,
        run_id=data["run_id"],
        backend=spec["backend"],
        shape=f"{spec['nodes']}x{spec['gpus_per_node']}"
        + (f" (--nodes {spec['min_nodes']}:{spec['max_nodes']})" if spec.get("min_nodes") else ""),
        last_step=explain.last_step(rd, st.get("attempt", 0)),
        latest_checkpoint=rd.latest_checkpoint(),
        attempts=len(data["attempts"]),
        attempt_list=explain.attempt_rows(data["attempts"]),
        nccl_refusals=explain.nccl_refusals(rd),
        checkpoint=explain.checkpoint(rd, hashes=verify),
        snapshot=spec.get("snapshot_dir") or None,
        node_ledger=nodeledger.read(rd.path, data["attempts"]),
        hosts=_hosts(data["attempts"], st.get("attempt", 0)),
    )
    # issue 23
    st["recovery"] = timeline.restarts(rd.path, st.get("recovery"), data, st["node_ledger"])
    if spec.get("dist_backend") == nodebackend.AUTO:  # decided on each node (issue 33)
        st["dist_backend"] = nodebackend.summary(rd.path, st.get("attempt", 0), spec["nodes"])
    st["building"] = (
        explain.building(rd, spec, st.get("attempt", 0)) if st["state"] == "RUNNING" else []
    )
    if (spec.get("options") or {}).get("warm_spares") and st["state"] == "RUNNING":
        st["warm"] = explain.warm_slots(rd, spec)
    if ranks:
        st["ranks"] = explain.rank_rows(rd, st.get("attempt", 0), hang=st.get("hang"))
    return st


def _hosts(attempts: list[dict[str, Any]], attempt: Any) -> list[str]:
    """The attempt's host per node rank (SSH hosts, Slurm node names) where recorded; [] on
    local."""
    a = attempts[attempt] if isinstance(attempt, int) and 0 <= attempt < len(attempts) else {}
    return [str(h) for h in a.get("hosts") or []] if isinstance(a, dict) else []


def format_status(st: dict[str, Any]) -> str:
    """`launch status`'s text: what the run is, its nodes, what went wrong, how far it got; then the
    next steps."""
    from .diagnosis import explain

    return "\n".join(
        [
            *_run_lines(st),
            *_node_lines(st),
            *_trouble_lines(st),
            *_progress_lines(st),
            *explain.next_steps(st),
        ]
    )


def _run_lines(st: dict[str, Any]) -> list[str]:
    """The run, its backend and shape, its state and attempts (and who wrote it, its Slurm job)."""
    from .diagnosis import explain

    lines = [
        f"run:        {st['run_dir']}",
        f"backend:    {st['backend']}  shape {st['shape']}",
        f"state:      {st['state']}" + (f"  ({st['reason']})" if st.get("reason") else ""),
        f"attempt:    {st.get('attempt', 0)} of {st['attempts']} recorded",
        *explain.format_attempts(st.get("attempt_list")),
    ]
    if st.get("written_by"):
        lines.append(
            f"written by: launchers {st['written_by']}, newer than this one: shown as recorded, "
            "not refreshed"
        )
    if st.get("slurm_job_id"):
        lines.append(f"slurm job:  {st['slurm_job_id']}")
    return lines


def _node_lines(st: dict[str, Any]) -> list[str]:
    """Each node's exit code on its host (or the node ledger), the dist backend each chose, the warm
    slots."""
    # the ledger: issue 23
    lines, nodes, ledger = [], st.get("nodes") or {}, nodeledger.lines(st.get("node_ledger"))
    if nodes or ledger:
        hosts = st.get("hosts") or []  # node K on its host: `node1=1 (sshhost2)`
        lines.append(
            "nodes:      "
            + (
                "  ".join(
                    f"node{k}={v}" + (f" ({hosts[int(k)]})" if int(k) < len(hosts) else "")
                    for k, v in sorted(nodes.items(), key=lambda kv: int(kv[0]))
                )
                or ledger.pop(0)
            )
        )
        lines += ["            " + line for line in ledger]
    lines += [
        ("dist:       " if i == 0 else "            ") + line
        for i, line in enumerate(nodebackend.lines(st.get("dist_backend")))
    ]
    if st.get("warm"):  # --warm-spares: a restart (or a spare) starts with torch imported
        lines.append(
            f"warm:       slots {', '.join(map(str, st['warm']['warm'])) or 'none'} (torch "
            f"imported); cold: {', '.join(map(str, st['warm']['cold'])) or 'none'}"
        )
    return lines


def _trouble_lines(st: dict[str, Any]) -> list[str]:
    """The first failure, the recovery, a hang, processes still alive, extensions still building."""
    from .diagnosis import explain
    from .frozen import extcache

    lines = []
    if st.get("first_failure"):
        lines.append(
            "first failure: "
            f"{nodeledger.on_host(describe_failure(st['first_failure']), st.get('hosts'))}"
        )
    lines += [
        ("recovery:   " if i == 0 else "            ") + line
        for i, line in enumerate(timeline.lines(st.get("recovery")))
    ]
    if st.get("hang"):
        lines.append(explain.format_hang(st["hang"]))
    if st.get("surviving_pids"):
        lines.append(
            f"still alive: pids {', '.join(map(str, st['surviving_pids']))} (`launch cancel "
            f"{st['run_dir']}` ends them)"
        )
    return lines + [
        extcache.line(b["node"], b["name"], b["secs"]) for b in st.get("building") or []
    ]


def _progress_lines(st: dict[str, Any]) -> list[str]:
    """The snapshot, the last step, the checkpoint, NCCL's refusals and, asked for, each rank's
    progress."""
    from .diagnosis import explain

    lines = (
        [f"snapshot:   {os.path.basename(st['snapshot'])}  ({st['snapshot']})"]
        if st.get("snapshot")
        else []
    )
    lines.append(f"last step:  {st['last_step'] if st['last_step'] is not None else '-'}")
    lines.append(
        explain.format_checkpoint(st.get("checkpoint"))
        if "checkpoint" in st
        else f"checkpoint: {st['latest_checkpoint'] or '-'}"
    )
    lines += [f"nccl:       {line}" for line in st.get("nccl_refusals", [])]
    if st.get("ranks") is not None:
        lines += explain.format_ranks(st["ranks"])
    return lines


def wait(path: str, interval: float = 2.0, timeout: float | None = None) -> int:
    """Follow until the run ends; the launcher's exit code for its verdict
    (launchers.stops.exit_code)."""
    from .show import Progress, clean

    path = runindex.resolve(path)
    progress, rd = Progress(), RunDir.open(path)
    try:  # on stderr: the state (Slurm's pending reason), each node as it starts
        st = wait_status(
            path,
            interval,
            timeout,
            on_poll=lambda s: progress.run(
                s, rd.node_records(rd.spec().nodes, s.get("attempt", 0))
            ),
        )
    except TimeoutError as e:
        raise TimedOut(str(e)) from None  # exit 124, as timeout(1)
    # a reason is data: no control sequences
    print(clean(end_line(st)), file=sys.stderr, flush=True)
    return exit_code(st)


def wait_status(
    path: str,
    interval: float = 2.0,
    timeout: float | None = None,
    on_poll: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """status() once the run has ended; TimeoutError when it has not within `timeout` seconds.
    on_poll(status) after each look (the CLI's progress lines)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    here, path = None, runindex.resolve(path)
    while True:
        try:
            st = status(path)
        except (OSError, LaunchError):
            if here is None or not here.gone():
                raise
            st = {}
        if here is not None and here.gone():  # removed while we waited: one line, nothing recreated
            raise RunDirGone(here.gone_line())
        here = here or layout.Presence(st["run_dir"])
        if on_poll is not None:
            on_poll(st)
        if st["state"] in TERMINAL:
            return settled(path, st)
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {path!r} still {st['state']} after {timeout} s")
        time.sleep(
            interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
        )


def settled(path: str, st: dict[str, Any]) -> dict[str, Any]:
    """An ended run's status once its end is whole: a Slurm batch side's finalize writes the
    verdict, then the node ledgers, under the run dir's lock; a reader who may not take it keeps
    what it read."""
    try:
        with RunDir(st.get("run_dir") or path).lock():
            return status(path)
    except (OSError, LaunchError):
        return st
