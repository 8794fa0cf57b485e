"""The sbatch script of the Slurm backend and its srun lines, pure (golden-tested); the options it
renders are validated by launchers.backends.slurm.options.

The script has submitit's layout (its `_make_sbatch_string`: sorted, quoted `#SBATCH` flags,
`--signal`, `--open-mode=append`, output inside the submitit folder; a test holds the two equal),
with a header naming the command that produced it, `--requeue`, and a teardown line that records the
attempt's result from the batch side. Everything here is a function of its arguments: no clock, no
environment, no Slurm needed (that is the dry-run).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from ... import layout
from ...containers import container
from ...credentials.secretenv import redact_argv, secret_keys
from ...ledgers.siteledger import HOST
from ...spec import RunSpec
from .options import dependency, node_cpus, slurm_options

# the node entry point (launchers.slurmnode: the old name)
NODE_ENTRY = "launchers.backends.slurm.task"


# ---------------------------------------------------------------------------------------- rendering


def sbatch_parameters(spec: RunSpec) -> dict[str, Any]:
    """submitit `_make_sbatch_string` keyword arguments for one homogeneous allocation of spec.nodes
    nodes."""
    so = slurm_options(spec)
    o = spec.opts
    extra = dict(so["extra"])
    params: dict[str, Any] = {
        "job_name": o.get("job_name") or spec.name,
        # --spares: idle nodes in the allocation (backends.slurm.steps)
        "nodes": spec.nodes + spec.spares,
        "ntasks_per_node": 1,  # one task per node: the node task that runs torchrun
        "signal_delay_s": so["signal_seconds"],
        "stderr_to_stdout": True,
        "wckey": None,  # submitit's default "submitit" would be an arbitrary wckey
    }
    # Slurm >= 19.05 with select/cons_tres takes --gpus-per-node; clusters on cons_res need
    # --gres=gpu:N, which a profile gives through sbatch_lines (then --gpus-per-node is left out).
    if "gres" not in extra:
        params["gpus_per_node"] = spec.gpus_per_node
    for key in ("partition", "account", "qos", "constraint", "mem", "mem_per_gpu"):
        if o.get(key) is not None:
            params[key] = o[key]
    # the node's one task holds every rank: their CPUs (docs/SLURM.md)
    if node_cpus(spec) is not None:
        params["cpus_per_task"] = node_cpus(spec)
    if o.get("exclusive"):
        params["exclusive"] = True
    # without --time submitit would write its own default (5 minutes): leave the cluster's default
    # instead
    params["time"] = (
        (str(o["time"]) if so["timeout_min"] else "UNLIMITED") if "timeout_min" in so else None
    )
    # quarantined in the site's node ledger: never allocated
    avoid = [h for h in spec.avoid_hosts if HOST.match(h)]
    if avoid:
        extra["exclude"] = ",".join(
            [*([str(extra["exclude"])] if extra.get("exclude") else []), *avoid]
        )
    extra.setdefault("requeue", True)
    if step_loop(spec):
        # a node's loss does not end the allocation: a spare or a shrink
        extra.setdefault("no-kill", True)
    if dependency(spec):
        extra["dependency"] = dependency(spec)
    params["additional_parameters"] = extra
    params["srun_args"] = srun_binding(spec) + step_container(spec)
    params["setup"] = so["setup"] or None  # submitit's `setup`: lines before the command
    return params


def srun_binding(spec: RunSpec) -> list[str]:
    """srun's own binding left off when the rank wrapper binds (--cpu-bind other than none): the
    node task gets its allocation's CPUs and the wrapper splits them among the ranks, so no rank is
    bound twice or bound to the one core srun's task/affinity would give a task of one CPU."""
    return ["--cpu-bind=none"] if spec.cpu_bind != "none" else []


def step_container(spec: RunSpec) -> list[str]:
    """srun's container flags (launchers.containers.container: pyxis, Slurm's OCI); the secrets
    cross by name only."""
    names = secret_keys({**dict(spec.env), **dict(spec.secrets)}, [k for k, _ in spec.secrets])
    return container.srun_args(spec, tuple(sorted(names)))


def node_task_command(python: str, run_dir: str, base_attempt: int, array: bool = False) -> str:
    """What srun runs on every node: the node task submitit pickled (NodeTask(run dir, base
    attempt)), called from its arguments so the node does not import submitit to unpickle it. With
    array, run_dir is a sweep dir and each array task runs the sweep's run number
    SLURM_ARRAY_TASK_ID."""
    words = (python, "-u", "-m", NODE_ENTRY, "task", run_dir, "--base-attempt", str(base_attempt))
    return " ".join(shlex.quote(w) for w in words + (("--array",) if array else ()))


def step_loop(spec: RunSpec) -> bool:
    """The job runs each attempt as a step of its allocation (launchers.backends.slurm.steps): with
    --spares (a spare takes a lost node's place) or --nodes MIN:MAX (the run shrinks to the
    survivors, never below MIN)."""
    return bool(spec.spares or spec.min_nodes)


def restarts_warning(spec: RunSpec) -> str | None:
    """--max-restarts on a run with no loop over steps: one line (dry-run: `# warning: ...`; submit:
    stderr). Only that loop restarts inside the job; a plain job's failed attempt ends the run."""
    if not spec.max_restarts or step_loop(spec):
        return None
    return (
        f"warning: --max-restarts {spec.max_restarts} is not used by this Slurm run: it restarts "
        "inside its job only with --spares K or --nodes MIN:MAX; without them a failed attempt "
        "ends the run (`launch resume RUN` starts the next; Slurm requeues a preempted job)"
    )


def steps_command(python: str, run_dir: str, base_attempt: int) -> str:
    """With --spares, the batch script's command: the loop over attempts inside the allocation, each
    an srun step on the pool's active nodes (launchers.backends.slurm.steps: it records each
    attempt's end itself)."""
    words = (python, "-u", "-m", NODE_ENTRY, "steps", run_dir, "--base-attempt", str(base_attempt))
    return " ".join(shlex.quote(w) for w in words)


def step_log(spec: RunSpec) -> str:
    return os.path.join(layout.path(spec.run_dir, "slurm"), "%j_%t_log.out")


def step_srun_argv(spec: RunSpec, hosts: list[str], task_command: str) -> list[str]:
    """One attempt's srun step on these hosts of the allocation (--spares:
    launchers.backends.slurm.steps)."""
    n = len(hosts)
    return [
        "srun",
        "--unbuffered",
        "--output",
        step_log(spec),
        *sbatch_parameters(spec)["srun_args"],
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(hosts)}",
        # --overlap: a failed step whose node was lost holds its survivors until Slurm has cleaned
        # it up ("step creation temporarily disabled ... Requested nodes are busy" for minutes); the
        # loop runs one step at a time and each node sweeps what the step before left
        # (launchers.backends.slurm.node)
        "--overlap",
        *shlex.split(task_command),
    ]


def finalize_command(python: str, run_dir: str, base_attempt: int, array: bool = False) -> str:
    """Batch-side last line: record the attempt's result (per-node exit codes, first failure)."""
    words = (python, "-m", NODE_ENTRY, "finalize", run_dir, "--base-attempt", str(base_attempt))
    words += ("--array",) if array else ()
    return " ".join(shlex.quote(w) for w in words) + ' --srun-status "$?"'  # $?: srun's exit status


def sbatch_flag(key: str, value: Any) -> str:
    """One `#SBATCH` line, formatted as submitit's _as_sbatch_flag does."""
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def render_sbatch(
    spec: RunSpec, *, base_attempt: int, header: str, array: tuple[int, int] | None = None
) -> str:
    """The exact sbatch script `launch slurm` submits (and --dry-run prints).

    The layout is submitit's `_make_sbatch_string` for these parameters (sorted `#SBATCH` flags,
    USR2 --signal, output in the submitit folder, `--open-mode=append`, srun line, teardown); the
    equivalence is a test (tests/test_slurm_render.py). Rendering it here keeps submitit's ~60 ms
    import off the launcher's start-up; submitit itself submits the script (submit.py). array=(runs,
    at once): a job array of a sweep (spec.run_dir is then the sweep dir), in submitit's array
    layout (`--array=0-N%P`, %A_%a outputs)."""
    params = {k: v for k, v in sbatch_parameters(spec).items() if v is not None}
    params.pop("stderr_to_stdout")  # our scripts always merge stderr into stdout
    signal_delay_s = params.pop("signal_delay_s")
    extra = params.pop("additional_parameters")
    srun_args = params.pop("srun_args")
    setup = params.pop("setup", None)
    stdout = step_log(spec)
    if array:
        params["array"] = f"0-{array[0] - 1}%{min(array)}"
        stdout = stdout.replace("%j", "%A_%a")
    params["signal"] = f"USR2@{signal_delay_s}"
    params["output"] = stdout.replace("%t", "0")
    params["open-mode"] = "append"
    params.update(extra)
    srun = " ".join(
        shlex.quote(w) for w in ("srun", "--unbuffered", "--output", stdout, *srun_args)
    )
    head = [
        "#!/bin/bash",
        *[f"# {line}" if line else "#" for line in header.splitlines()],
        "",
        "# Parameters",
        *[sbatch_flag(k, params[k]) for k in sorted(params)],
        *(["", "# setup", *setup] if setup else []),
        "",
        "# command",
        "export SUBMITIT_EXECUTOR=slurm",
    ]
    # each attempt a step on the pool's nodes, recorded by the loop
    if step_loop(spec) and not array:
        return "\n".join([*head, steps_command(spec.python, spec.run_dir, base_attempt)]) + "\n"
    lines = [
        *head,
        f"{srun} "
        f"{node_task_command(container.step_python(spec), spec.run_dir, base_attempt, bool(array))}",  # noqa: E501
        "",
        "",
        "# teardown",
        finalize_command(spec.python, spec.run_dir, base_attempt, bool(array)),
    ]
    return "\n".join(lines) + "\n"


def header_for(argv: list[str] | tuple[str, ...], version: str) -> str:
    """'produced by: launch slurm ...' with secret-looking --env values (by name or value) shown as
    ***."""
    return (
        f"produced by: {shlex.join(['launch', *redact_argv(argv)])}\nlaunchers {version}; "
        "submitted with submitit"
    )


def allocation_env(signal_seconds: int) -> dict[str, str]:
    """Environment the node task adds to torchrun's agent (shown in the dry-run too)."""
    grace = max(5, int(signal_seconds) - 15)
    return {"PET_SHUTDOWN_TIMEOUT": str(grace)}


def srun_argv(spec: RunSpec, *, run_id: str, job_id: str, base_attempt: int) -> list[str]:
    """In-allocation mode: one node task per allocated node, in the current allocation."""
    out = os.path.join(layout.path(spec.run_dir, "slurm"), f"alloc-{job_id}-%s-%t.out")
    return [
        "srun",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1",
        *srun_binding(spec),
        *step_container(spec),
        "--kill-on-bad-exit=0",
        f"--job-name=launch-{run_id}",
        f"--output={out}",
        "--open-mode=append",
        container.step_python(spec),
        "-u",
        "-m",
        NODE_ENTRY,
        "run",
        spec.run_dir,
        "--base-attempt",
        str(base_attempt),
        "--in-allocation",
    ]
