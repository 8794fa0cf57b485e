"""In-job recovery on Slurm (--spares K, issue 23): the batch step's loop over the attempts of one
allocation.

The allocation holds nodes + K nodes (sbatch --nodes N+K --no-kill: a node's loss does not end the
job). Each attempt is one srun step on the pool's active slots (slot k = the k-th host of the
allocation, the batch host last: slot_hosts; the spares idle), the step's hosts given in node-rank
order (LAUNCH_STEP_HOSTS: its first host is node 0, the master) with the attempt's number
(LAUNCH_STEP_ATTEMPT). When a step fails -- not stopped: a cancel, a USR2 (preemption, the time
limit: Slurm requeues the job as before) -- the one policy decides (launchers.resilience.recovery
through launchers.resilience.restarts.restart_decision: restart on the same slots, replace the
failed slot by a spare, or stop; the node ledger keeps the strikes and quarantines), and the next
attempt of the run starts in the same job, from checkpoints/latest: a new step without the lost
node, node 0 chosen anew when it was node 0 that was lost. The loop is the launcher's own
(launchers.resilience.restarts.attempt_loop); what differs is one attempt (run_step): an srun step,
and the decision made inside finalize, under the run's lock, as the step's outcome is recorded.

    python -m launchers.backends.slurm.task steps RUN_DIR --base-attempt A      (the batch script's command)
"""  # noqa: E501

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from typing import Any

from ...containers.container import step_python
from ...diagnosis.firstfail import describe
from ...records.rundir import RunDir
from ...resilience import restarts, timeline
from ...spec import RunSpec
from .env import STEP_ATTEMPT, STEP_HOSTS, STEP_SLOTS, SlurmEnv
from .nodespec import load_node_spec
from .render import node_task_command, step_srun_argv
from .requeue import finalize


def restarts_used(led: dict[str, Any] | None) -> int:
    """Restarts the policy already decided in this run (the ledger's decisions other than stop)."""
    return sum(1 for d in (led or {}).get("decisions") or [] if d.get("action") != "stop")


def first_attempt(rd: RunDir, base_attempt: int, restart_count: int) -> int:
    """The attempt this run of the batch script starts with: the submitted one, or after a Slurm
    requeue a new one past every attempt the run has (in-job restarts included)."""
    if restart_count == 0:
        return base_attempt
    return len(rd.read_run_yaml().get("attempts") or [])


def slot_hosts(allocation: list[str], batch_host: str) -> list[str]:
    """Node slot k -> its host: the allocation in Slurm's order with the batch host (where this loop
    runs) last, so that it is the last spare taken: losing it ends the job (Slurm requeues it),
    losing any other node -- node 0 of a step included -- is a restart inside the job."""
    return [h for h in allocation if h != batch_host] + [h for h in allocation if h == batch_host]


def step_env(hosts: list[str], slots: tuple[int, ...], attempt: int) -> dict[str, str]:
    return {
        **os.environ,
        STEP_HOSTS: ",".join(hosts),
        STEP_SLOTS: ",".join(map(str, slots)),
        STEP_ATTEMPT: str(attempt),
    }


def run_step(
    rd: RunDir, spec: RunSpec, env: SlurmEnv, allocation: list[str], base_attempt: int, attempt: int
) -> tuple[int, restarts.Decided | None]:
    """One attempt: an srun step on the pool's active slots; a failed one -- the policy's decision
    (in finalize's on_failure, under the run's lock), said in one line -> (its exit code, the
    decision; None: none made)."""
    from ...ledgers.nodeledger import read as read_ledger

    pool = restarts.pool_of(spec, read_ledger(rd.path))
    hosts = [allocation[s] for s in pool.active]
    argv = step_srun_argv(spec, hosts, node_task_command(step_python(spec), rd.path, base_attempt))
    print(f"launch: attempt {attempt} on {','.join(hosts)}: {shlex.join(argv)}", flush=True)
    # also when
    rd.update_attempt(
        attempt,
        {
            "hosts": hosts,
            "slots": list(pool.active),
            "nodes": len(hosts),
            # no agent ran
            "slurm_job_id": env.job_id,
        },
        {"gpus_per_node": spec.gpus_per_node},
    )
    status = subprocess.call(argv, env=step_env(hosts, pool.active, attempt))
    decided: list[restarts.Decided] = []

    def on_failure(ff: dict | None, nodes: dict) -> str | None:
        left = spec.max_restarts - restarts_used(read_ledger(rd.path))
        decided.append(restarts.restart_decision(spec, rd, attempt, ff, left, time.time(), nodes))
        d = decided[-1].decision
        if d.action == "stop":  # the run ends: its strikes in the site ledger before FAILED shows
            restarts.record_site(spec, rd)
            return None
        return (
            f"attempt {attempt} failed ({describe(ff)}); {d.why}; restarting in job {env.job_id} "
            "on "
            + ",".join(allocation[s] for s in d.pool.active)
            + restarts.backoff_said(restarts.backoff_s(decided[-1].decisions))
        )

    code = finalize(
        rd.path,
        base_attempt,
        srun_status=status,
        attempt=attempt,
        on_failure=on_failure,
        nodes_run=len(hosts),
    )
    last = decided[-1] if decided else None
    if last is not None and last.decision.action == "stop":
        print(
            f"launch: attempt {attempt} failed; not restarted: {last.decision.why}", file=sys.stderr
        )
    elif last is not None:
        print(f"launch: {rd.read_status().get('reason')}", file=sys.stderr, flush=True)
    return code, last


def run_steps(run_dir: str, base_attempt: int) -> int:
    """Attempts of the run inside this allocation until one ends without a restart
    (restarts.attempt_loop, the launcher's own loop); its exit code."""
    from ...ledgers.nodeledger import read as read_ledger

    rd, env = RunDir(run_dir), SlurmEnv.read()
    ns = load_node_spec(rd, base_attempt)
    spec: RunSpec = ns.spec
    allocation = slot_hosts(env.hostnames(), env.node_name or socket.gethostname())
    attempt = first_attempt(rd, base_attempt, env.restart_count)
    if attempt != base_attempt:  # requeued: another allocation, its slots anew (the quarantined
        # hosts were excluded from it: requeue.exclude_quarantined)
        from ...ledgers.nodeledger import new_allocation
        from ...resilience.recovery import Pool

        new_allocation(rd.path, read_ledger(rd.path), Pool.fresh(spec.nodes, spec.spares))
        rd.add_attempt(
            spec, {"backend": "slurm", "slurm_job_id": env.job_id, "reason": "requeued by Slurm"}
        )

    def restart(attempt: int, decided: restarts.Decided) -> int:
        # --nodes MIN:MAX: the run's shape is the pool's (run.yaml)
        active = decided.decision.pool.active
        return rd.add_attempt(
            spec.replace(nodes=len(active)) if spec.min_nodes else spec,
            {
                "backend": "slurm",
                "slurm_job_id": env.job_id,
                "by": timeline.BY_POLICY,
                "hosts": [allocation[s] for s in active],
            },
        )

    last: list[restarts.Decided | None] = [None]

    def run(attempt: int) -> tuple[int, restarts.Decided | None]:
        code, last[0] = run_step(rd, spec, env, allocation, base_attempt, attempt)
        return code, last[0]

    code = restarts.attempt_loop(rd, attempt, run, restart)
    # a stop: recorded before its FAILED (run_step)
    if last[0] is None or last[0].decision.action != "stop":
        restarts.record_site(spec, rd)  # its strikes into the site's node ledger (--node-ledger)
    return code
