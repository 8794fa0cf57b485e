"""The node entry point of a Slurm run, and the task object submitit submits.

    python -m launchers.backends.slurm.task task RUN_DIR --base-attempt A   what srun runs on every node
    python -m launchers.backends.slurm.task run RUN_DIR --base-attempt A --in-allocation   (inside an allocation)
    python -m launchers.backends.slurm.task finalize RUN_DIR --base-attempt A --srun-status S   (batch side)
    python -m launchers.backends.slurm.task steps RUN_DIR --base-attempt A   (batch side, --spares: each attempt
                                                                             a step; launchers.backends.slurm.steps)
    ... task|finalize SWEEP_DIR --array ...          a sweep's job array: the run dir is run SLURM_ARRAY_TASK_ID
    NodeTask(RUN_DIR, A)()                         what submitit pickles (the same call as `task`)

`python -m launchers.slurmnode ...` (the entry point's old name, still in the scripts of jobs queued
or requeued before the move) is the same entry; its `task` verb was given RUN_DIR/slurm, which is
accepted too.
"""  # noqa: E501

# ruff: noqa: E402 (the node's early agent starts before the rest is imported)
from __future__ import annotations

import os
import sys

from .. import earlyagent

if __name__ == "__main__":  # a node's task: its agent's python starts now (earlyagent)
    earlyagent.prestart_node(sys.argv[1:])

from typing import Any

from ... import layout, sweep
from ...records import notify
from . import gone
from .env import SlurmEnv
from .node import run_node
from .requeue import finalize

USAGE = (
    "usage: python -m launchers.backends.slurm.task {run,finalize,task,steps} RUN_DIR "
    "[--base-attempt A] [--in-allocation] [--array] [--srun-status S]"
)


def run_dir_of(path: str) -> str:
    """RUN_DIR, also when given as RUN_DIR/slurm (the submitit folder: what scripts before the move
    pass)."""
    path = os.path.abspath(path)
    if not layout.is_run_dir(path) and layout.is_run_dir(os.path.dirname(path)):
        return os.path.dirname(path)
    return path


def _node_task_class():
    # the launcher pickles it; the nodes never import submitit
    from submitit.helpers import Checkpointable

    class NodeTask(Checkpointable):
        """What submitit submits (pickled into the submitit folder); srun's `task` runs the same
        call without unpickling it. checkpoint() (submitit's own USR2 path) resubmits the same
        task."""

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
    if name == "NodeTask":  # built on first use, so importing this module stays submitit-free
        globals()["NodeTask"] = cls = _node_task_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def submitit_task(run_dir: str, base_attempt: int) -> int:
    """What srun runs on every node: the NodeTask call (run_node) straight from the command line,
    plus submitit's per-task result pickle for submitit's Job object. Not unpickling the submitted
    NodeTask keeps submitit (and cloudpickle) out of the node's start-up, which is on the path to
    torchrun."""
    import pickle

    try:
        code = run_node(run_dir, base_attempt)
        outcome: tuple = ("success", 0) if code == 0 else ("error", f"node task exited with {code}")
        code = 0 if code == 0 else (code if 0 < code < 256 else 1)
    except Exception:  # noqa: BLE001 (recorded for submitit, then reported by exiting non-zero)
        import traceback

        code, outcome = 1, ("error", traceback.format_exc())
        print(outcome[1], file=sys.stderr, flush=True)
    env = SlurmEnv.read()
    # the run dir was removed: nothing recreated
    if not os.path.isdir(layout.path(run_dir, "slurm")):
        return code
    path = os.path.join(
        layout.path(run_dir, "slurm"), f"{env.submitit_job_id}_{env.procid}_result.pkl"
    )
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(outcome, f)
    os.replace(tmp, path)
    return code


def usage_error(msg: str) -> None:
    print(f"{USAGE}\nlaunchers.backends.slurm.task: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse_args(argv: list[str]) -> dict[str, Any]:
    """The node entry's arguments (no argparse: this runs on every node on the way to torchrun)."""
    out: dict[str, Any] = {"base_attempt": 0, "in_allocation": False, "srun_status": None}
    pos: list[str] = []
    it = iter(argv)
    try:
        for a in it:
            if a in ("--base-attempt", "--srun-status"):
                out[a[2:].replace("-", "_")] = int(next(it))
            elif a in ("--in-allocation", "--array"):
                out[a[2:].replace("-", "_")] = True
            elif a.startswith("-"):
                raise ValueError(a)
            else:
                pos.append(a)
    except (StopIteration, ValueError) as e:
        usage_error(f"bad argument {str(e) or argv[-1]!r}")
    if len(pos) != 2 or pos[0] not in ("run", "finalize", "task", "steps"):
        usage_error(f"expected one of run/finalize/task/steps and a directory, got {pos!r}")
    out["what"], out["run_dir"] = pos[0], run_dir_of(pos[1])
    if out.get("array"):  # a sweep's array task: its own run of the sweep, by SLURM_ARRAY_TASK_ID
        out["run_dir"] = sweep.array_run_dir(os.path.abspath(pos[1]), SlurmEnv.read().array_task_id)
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if not layout.is_run_dir(a["run_dir"]):
        return run_dir_gone(a)
    notify.arm(a["run_dir"])  # the job's own node task / batch side: it sends the run's events
    if a["what"] == "task":
        return submitit_task(a["run_dir"], a["base_attempt"])
    if a["what"] == "run":
        return run_node(a["run_dir"], a["base_attempt"], in_allocation=a["in_allocation"])
    try:
        if a["what"] == "steps":  # --spares: the batch side's loop over attempts
            from .steps import run_steps

            return run_steps(a["run_dir"], a["base_attempt"])
        return finalize(
            a["run_dir"],
            a["base_attempt"],
            in_allocation=a["in_allocation"],
            srun_status=a["srun_status"],
        )
    finally:  # the batch script's end: --memory-checkpoint's stores go
        if not a["in_allocation"] and layout.is_run_dir(a["run_dir"]):
            forget_job_of(a["run_dir"], a["base_attempt"])


def forget_job_of(run_dir: str, base_attempt: int) -> None:
    """--memory-checkpoint: the run's in-memory checkpoints go from every node of the job
    (backends.slurm.memory)."""
    from ...records.rundir import RunDir
    from .memory import forget_job
    from .nodespec import load_node_spec

    try:
        ns = load_node_spec(RunDir(run_dir), base_attempt)
    # the run's end is recorded already: say it only
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(
            f"launch: batch side: --memory-checkpoint's stores not removed: {run_dir}: {e}",
            file=sys.stderr,
        )
        return
    forget_job(ns.spec, ns.run_id)


def run_dir_gone(a: dict[str, Any]) -> int:
    """The run dir was removed before this node task or the batch side's teardown ran: one line in
    the job's Slurm log, nothing written, and the job cancelled (by node 0, or by the batch side) so
    Slurm does not keep running it."""
    env = SlurmEnv.read()
    batch = a["what"] in ("finalize", "steps")
    where = "batch side" if batch else f"node {env.node_id}"
    print(
        f"launch: {where}: {layout.Presence(a['run_dir']).gone_line()}", file=sys.stderr, flush=True
    )
    if batch or env.node_id == 0:
        if why := gone.cancel_own(env.job_id, env.step_id, a["in_allocation"]):
            print(
                f"launch: {where}: scancel of job {env.job_id} failed: {why}",
                file=sys.stderr,
                flush=True,
            )
    return 1


def exit_status(code: int) -> int:
    return code if 0 <= code < 256 else 1


if __name__ == "__main__":
    try:
        sys.exit(exit_status(main()))
    finally:  # a gate no agent's start took (a node that failed before it)
        earlyagent.end_all()
