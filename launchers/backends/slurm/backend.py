"""Slurm backend: one homogeneous allocation (N nodes x 1 task), submitted through submitit.

submit:          the sbatch script (render, golden-tested; --dry-run prints it) runs `srun python -m
                 launchers.backends.slurm.task task <run dir> --base-attempt A` (NodeTask) on every
                 node -> the one torchrun command per node; after srun the batch side records the
                 result (requeue.finalize). `launch slurm` returns once queued (or follows with
                 --wait).
in allocation:   SLURM_JOB_ID set: no new job; `srun --ntasks-per-node=1` runs the same node task on
                 the allocated nodes, and this process waits. After Slurm requeued the user's job,
                 its run dir continues as a new attempt; a preemption is PREEMPTED, never requeued
                 by launch (.inalloc).
requeue:         Slurm's USR2 (--signal, or a preemption) -> checkpoint -> node 0 `scontrol requeue`
                 -> next attempt (LAUNCH_ATTEMPT + 1) resumes from checkpoints/latest. Slurm owns
                 restarts.
status / cancel: squeue/scontrol/`sacct -c` (status, cached); scancel and wait until nothing is
                 left.
a cluster:       not here: `launch slurm --cluster NAME` runs launch on its login node
                 (launchers.ssh.viacluster); a spec whose options name one is refused
                 (refuse_cluster), `cluster: ''` is this machine.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
from typing import Any

from ... import __version__, layout, procs
from ...containers.containeropts import check_srun_pyxis
from ...errors import LaunchError, RunDirGone, need_extra
from ...records.rundir import TERMINAL, RunDir
from ...spec import RunSpec
from ...stops import exit_code
from ..base import Backend, Plan, synced_together
from . import cmd
from . import status as slurm_status
from .after import check_parent, resolve_after
from .allocrun import run_in_allocation
from .env import SlurmEnv
from .jobctl import cancel_run, last_job, one_line, queue_states, scancel
from .nodecmd import slurm_node_command
from .nodespec import resolve_for_nodes, write_node_spec
from .options import cpu_warning
from .render import header_for, render_sbatch, restarts_warning, srun_argv, step_loop
from .submit import SubmitFailed, submit_script

MASTER_SHOWN = "<first host of the allocation, resolved to its address on that host>"
PORT_SHOWN = "<derived from the Slurm job id>"


class SlurmBackend(Backend):
    name = "slurm"
    owns_restarts = False  # Slurm requeues; the launcher does not loop over attempts

    # ------------------------------------------------------------------ plan (= dry-run)
    def plan(
        self, spec: RunSpec, run_id: str, attempt: int, slots: list[int] | None = None
    ) -> Plan:
        if spec.opts.get("max_parallel") is not None:
            raise LaunchError(
                f"--max-parallel {spec.opts['max_parallel']} applies to a --sweep only (the runs "
                "of its job array at once); accepted: --max-parallel N together with --sweep "
                "KEY=V1,V2"
            )
        refuse_cluster(spec)
        spec = resolve_after(spec, attempt)  # --after RUN_DIR -> its job id (no Slurm call)
        # the node ledger's, if nodes here
        spec = spec.replace(avoid_hosts=slurm_status.known_of(spec.avoid_hosts))
        resolved = resolve_for_nodes(spec)  # bad options fail here, dry-run included
        env = SlurmEnv.read()
        check_allocation(spec, env)
        dist = resolved["dist_backend"]
        port = spec.master_port if spec.master_port is not None else PORT_SHOWN
        nodes = [
            slurm_node_command(
                spec, k, MASTER_SHOWN, port, run_id, attempt, dist, resolved["agent_env"]
            )
            for k in range(spec.nodes)
        ]
        hosts = [
            f"SLURM_NODEID={k}" + (" (the master)" if k == 0 else "") for k in range(spec.nodes)
        ]
        script = plan_script(spec, run_id, attempt, env)
        return Plan(
            spec=spec,
            run_id=run_id,
            attempt=attempt,
            master_addr=MASTER_SHOWN,
            master_port=port,
            dist_backend=dist,
            nodes=nodes,
            hosts=hosts,
            script=script,
        )

    def preflight(self, plan: Plan) -> None:
        """Before the run dir exists: Slurm is there, knows the partition, and accepts the job (with
        pyxis: srun has its --container-image)."""
        if warned := restarts_warning(plan.spec):
            print(f"launch: {warned}", file=sys.stderr, flush=True)
        if SlurmEnv.read().in_allocation:
            if not shutil.which("srun"):
                raise LaunchError("srun is not on PATH inside this allocation")
            return check_pyxis(plan.spec)
        need_extra("submitit", "slurm", "launch slurm")
        if not shutil.which("sbatch"):
            raise LaunchError(
                "sbatch is not on PATH: Slurm is not installed here (--dry-run shows the script)"
            )
        check_parent(plan.spec)  # --after: the job exists and can still be waited on
        check_pyxis(plan.spec)
        if cpu_warning(plan.spec):
            print(f"launch: {cpu_warning(plan.spec)}", file=sys.stderr, flush=True)
        try:  # while Slurm answers: creating the run dir needs yaml next
            p = cmd.run(
                ["sbatch", "--test-only"],
                input=plan.script,
                timeout=60,
                meanwhile=lambda: __import__("yaml"),
            )
        except subprocess.TimeoutExpired:
            raise LaunchError(
                "sbatch --test-only did not answer within 60 s: is slurmctld up?"
            ) from None
        if p.returncode != 0:
            check_partition(plan.spec.opts.get("partition"))
            raise LaunchError(
                f"Slurm refuses the job ({plan.spec.nodes} nodes x {plan.spec.gpus_per_node} "
                f"GPUs): {one_line(p.stderr or p.stdout)}"
            )

    # ------------------------------------------------------------------ start
    def start(self, plan: Plan, rd: RunDir) -> int:
        try:
            with synced_together():  # on disk before the job is submitted, in one flush's wait
                rd.start_attempt(
                    state="PENDING",
                    attempt=plan.attempt,
                    nodes={},
                    first_failure=None,
                    reason=None,
                    # until it is queued
                    hang=None,
                    stopped_by=None,
                    starting=procs.self_record(),
                )
                write_node_spec(rd, plan.spec, plan.run_id, plan.attempt)
        # not flushed: nothing submitted, and at attempt 0 no run dir left behind
        except LaunchError:
            if plan.attempt == 0:
                shutil.rmtree(rd.path, ignore_errors=True)
            raise
        if SlurmEnv.read().in_allocation:
            return run_in_allocation(plan, rd)
        job_id = self._submit(plan, rd)
        with open(layout.path(rd.path, "slurm_jobs"), "a", encoding="utf-8") as f:
            f.write(f"{plan.attempt} {job_id}\n")
        rd.update_status(slurm_job_id=job_id, starting=None)
        print(f"slurm job {job_id} queued; run dir {rd.path}", flush=True)
        if plan.spec.opts.get("wait"):
            return self.follow(rd)
        return 0

    def _submit(self, plan: Plan, rd: RunDir) -> str:
        try:
            return submit_script(plan.spec, plan.script, rd.path, plan.attempt)
        except SubmitFailed as e:
            msg = str(e)
            if plan.attempt == 0:
                shutil.rmtree(rd.path, ignore_errors=True)  # nothing ran: leave no run dir behind
            else:
                rd.update_status(state="FAILED", reason=f"sbatch failed: {msg}")
            raise LaunchError(f"sbatch refused the job: {msg}") from None

    def follow(self, rd: RunDir) -> int:
        """--wait: stream the ranks' output until the run ends; 0 only if every rank succeeded."""
        from ...follow import follower
        from ...show import Progress

        progress, nnodes, here = Progress(), rd.spec().nodes, layout.Presence(rd.path)
        job_id = rd.read_status().get("slurm_job_id")

        # on stderr: the queue state and Slurm's reason, then each node as it starts
        def done() -> bool:
            try:
                st = self.refresh(rd)
            except (OSError, LaunchError):
                if not here.gone():
                    raise
                st = {}
            if here.gone():  # the nodes stop and cancel it too (launchers.backends.slurm.gone)
                if job_id:
                    with contextlib.suppress(LaunchError, OSError, subprocess.SubprocessError):
                        scancel(job_id)
                raise RunDirGone(here.gone_line())
            progress.run(st, rd.node_records(nnodes, st.get("attempt", 0)))
            return st["state"] in TERMINAL

        try:
            follower(rd.path).follow(done, interval=0.5)
        except KeyboardInterrupt:
            print(
                f"launch: stopped following; the job keeps running (`launch cancel {rd.path}` "
                "stops it)",
                file=sys.stderr,
            )
            return 130
        # the batch side's finalize ends under it: its site ledger strikes are in once we have it
        with rd.lock():
            return exit_code(rd.read_status())  # the end line: restarts.run_attempts

    def forget_memory(self, plan: Plan) -> None:
        """--memory-checkpoint in the user's own allocation: its srun has ended, the stores go from
        its nodes. A submitted job removes them at its own end (backends.slurm.memory), never while
        it is queued or runs."""
        if SlurmEnv.read().in_allocation:
            from .memory import forget_job

            forget_job(plan.spec, plan.run_id)

    # ------------------------------------------------------------------ watch / cancel
    def refresh(self, rd: RunDir) -> dict[str, Any]:
        st = rd.read_status()
        job_id = st.get("slurm_job_id") or last_job(rd)
        if st.get("in_allocation"):  # inside an allocation the launcher records the end itself
            st = rd.check_launcher()
            if st.get("state") != "PREEMPTED":
                return st
            # waiting for Slurm's requeue while the job is queued
            from .inalloc import settle_preempted

            return settle_preempted(rd, st, lambda: queue_states(job_id) if job_id else [])
        if not job_id or st.get("state") in TERMINAL:
            return st
        job = slurm_status.query(job_id, layout.path(rd.path, "slurm"))
        out = dict(st, slurm_job_id=job_id, slurm_state=job.state, slurm_reason=job.reason or None)
        if job.state == "UNKNOWN":  # a controller hiccup never turns into a verdict
            return dict(
                out,
                reason=(
                    f"Slurm does not answer ({job.reason or 'no reply'}); status unknown, retrying"
                ),
            )
        state, reason = slurm_status.to_run_state(job)
        if job.live:
            # why it waits, now
            if state != st.get("state") or not st.get("reason") or job.state == "PENDING":
                out.update(state=state, reason=reason)
            return out
        nnodes = rd.spec().nodes
        attempt = st.get("attempt", 0)
        recs = rd.node_records(nnodes, attempt)
        nodes = {str(k): r.get("exit_code") for k, r in sorted(recs.items())}
        all_ok = len(recs) == nnodes and all(r.get("exit_code") == 0 for r in recs.values())
        if state == "COMPLETED" and not all_ok:
            state, reason = (
                "FAILED",
                f"Slurm job {job_id} COMPLETED but not every node recorded exit code 0",
            )
        elif job.state == "GONE" and all_ok:  # the nodes' own records win over an absent scheduler
            state, reason = "COMPLETED", None
        with rd.lock():
            cur = rd.read_status()
            if cur.get("state") in TERMINAL:
                return cur
            return rd.update_status(
                state=state,
                reason=reason,
                nodes=nodes or st.get("nodes", {}),
                first_failure=st.get("first_failure") or rd.first_failure(attempt),
                slurm_state=job.state,
            )

    def busy(self, st: dict[str, Any]) -> str | None:
        """A job submitted and not ended (status.json's state and job id: queued or running) counts
        as running."""
        job = st.get("slurm_job_id")
        if job and not st.get("in_allocation") and st.get("state") not in TERMINAL:
            return super().busy(st) or f"queued or running as Slurm job {job} ({st.get('state')})"
        return super().busy(st)

    def cancel(self, rd: RunDir) -> None:
        """One SIGTERM (--stop-signal) to every process of the job's steps (`scancel --signal=TERM`:
        each program gets it once, from Slurm), --stop-grace for them to end and the batch side to
        record CANCELLED, then scancel."""
        cancel_run(rd)


def check_allocation(spec: RunSpec, env: SlurmEnv) -> None:
    """Inside an allocation: no loop over steps (--spares, --nodes MIN:MAX), and no more nodes than
    it has."""
    if env.in_allocation and step_loop(spec):
        what = (
            f"--spares {spec.spares}"
            if spec.spares
            else f"--nodes {spec.min_nodes}:{spec.max_nodes}"
        )
        raise LaunchError(
            f"{what} inside an allocation (Slurm job {env.job_id}) is not taken yet; accepted: "
            "--spares 0 and --nodes N here, or submit from outside (the job's allocation holds "
            "them)"
        )
    if env.in_allocation and spec.nodes > env.num_nodes:
        raise LaunchError(
            f"--nodes {spec.nodes} is larger than the current allocation (Slurm job "
            f"{env.job_id}: {env.num_nodes} nodes, {env.nodelist or '?'})"
        )


def plan_script(spec: RunSpec, run_id: str, attempt: int, env: SlurmEnv) -> str:
    """The plan's script (the dry-run's): the sbatch script, or inside an allocation its srun line;
    then how each node numbers its attempt and rank, and the too-few-CPUs warning."""
    if env.in_allocation:
        script = (
            f"# inside allocation {env.job_id} ({env.nodelist or '?'}): nothing is submitted\n"
            + shlex.join(srun_argv(spec, run_id=run_id, job_id=env.job_id, base_attempt=attempt))
        )
    else:
        script = render_sbatch(
            spec, base_attempt=attempt, header=header_for(sys.argv[1:], __version__)
        )
    script += (
        f"\n# each node: LAUNCH_ATTEMPT = {attempt}"
        + ("" if env.in_allocation else " + SLURM_RESTART_COUNT")
        + "; NODE_RANK = SLURM_NODEID\n"
        if not step_loop(spec)
        else f"\n# {spec.nodes} of the {spec.nodes + spec.spares} nodes run each "
        "attempt, an srun step (spares idle"
        + (f"; at least {spec.min_nodes} after a loss" if spec.min_nodes else "")
        + "); each node: LAUNCH_ATTEMPT = LAUNCH_STEP_ATTEMPT; NODE_RANK = its host's place in "
        "LAUNCH_STEP_HOSTS\n"
    )
    if warned := restarts_warning(spec):
        script += f"# {warned}\n"
    return script + (
        f"# {cpu_warning(spec)}\n" if cpu_warning(spec) and not env.in_allocation else ""
    )


def check_partition(part: str | None) -> None:
    """After Slurm refused a job with --partition: one sinfo call tells an unknown partition
    apart."""
    if not part:
        return
    q = cmd.run(["sinfo", "-h", "-o", "%R"], timeout=30)
    known = sorted(set(q.stdout.split()))
    if q.returncode != 0:
        raise LaunchError(f"sinfo failed: {one_line(q.stderr)}")
    if part not in known:
        raise LaunchError(
            f"--partition {part!r} is unknown to Slurm; partitions: {', '.join(known) or '(none)'}"
        )


def refuse_cluster(spec: RunSpec) -> None:
    """A spec whose options name a cluster (a profile's `slurm: {cluster: NAME}` given to the Python
    API, a recorded run): refused, never submitted to this machine's Slurm; only the CLI reaches a
    cluster."""
    name = spec.opts.get("cluster")
    if name:
        raise LaunchError(
            f"slurm option cluster {name!r} is not accepted here: a cluster is reached by the "
            f"CLI, `launch slurm --cluster {name}` (launch runs on its login node); accepted: no "
            "cluster option, or cluster '' (this machine's Slurm)"
        )


def check_pyxis(spec: RunSpec) -> None:
    """--container-runtime pyxis: this node's srun has pyxis (containeropts.check_srun_pyxis), else
    one line before anything is submitted (a job without it would end with no node's exit
    recorded)."""
    if spec.container_runtime == "pyxis":
        check_srun_pyxis()
