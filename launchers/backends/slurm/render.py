"""Pure pieces of the Slurm backend: option validation and the sbatch script (golden-tested).

The script has submitit's layout (its `_make_sbatch_string`: sorted, quoted `#SBATCH` flags, `--signal`,
`--open-mode=append`, output inside the submitit folder; a test holds the two equal), with a header naming
the command that produced it, `--requeue`, and a teardown line that records the attempt's result from the batch side. Everything
here is a function of its arguments: no clock, no environment, no Slurm needed (that is the dry-run).
"""
from __future__ import annotations

import os
import re
import shlex
from typing import Any

from ... import container, layout, sbatchopts
from ...errors import LaunchError, brief
from ...secretenv import redact_argv, secret_keys
from ...siteledger import HOST
from ...spec import RunSpec

DEFAULT_SIGNAL_SECONDS = 120
DEFAULT_MAX_REQUEUES = 3
DEFAULT_CPUS_PER_GPU = 1        # CPUs per rank when neither --cpus-per-task nor --cpus-per-gpu is given (docs/SLURM.md)
NODE_ENTRY = "launchers.backends.slurm.task"     # the node entry point (launchers.slurmnode: the old name)

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")
_MEM = re.compile(r"^\d+(?:[KMGTkmgt][Bb]?)?$")     # Slurm's str_to_mbytes: a number, M unless K, G or T follows
AFTER_TYPES = ("afterok", "afterany", "afternotok")
AFTER_ACCEPTED = "RUN_DIR|JOBID[:afterok|afterany|afternotok] (a Slurm run dir, or a job id like 1234 or 1234_5)"
JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?$")


# ------------------------------------------------------------------------------------------ validation

def parse_time(value: str) -> int:
    """Slurm --time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED) -> minutes (0 = unlimited)."""
    v = str(value).strip()
    if v.upper() in ("UNLIMITED", "INFINITE"):
        return 0
    m = _TIME.match(v)
    accepted = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 04:00:00, 1-12:00:00, 30)"
    if not m:
        raise LaunchError(f"--time {value!r} is malformed; accepted: {accepted}")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:          # D-H[:M[:S]]
        h, mi, s = (parts + [0, 0])[:3]
        minutes = int(days) * 1440 + h * 60 + mi + (1 if s else 0)
    elif len(parts) == 1:         # M
        minutes = parts[0]
    elif len(parts) == 2:         # M:S
        minutes = parts[0] + (1 if parts[1] else 0)
    else:                         # H:M:S
        minutes = parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
    if minutes < 1:
        raise LaunchError(f"--time {value!r} is shorter than one minute; accepted: {accepted}")
    return minutes


def parse_sbatch_lines(lines: Any, what: str = "slurm.sbatch_lines entry") -> dict[str, Any]:
    """Profile `sbatch_lines` or --sbatch-arg (["--reservation=x", "#SBATCH --mail-type=END", ...]) -> {flag:
    value|True}, each checked against sbatch's own options (launchers.sbatchopts, the one validator of both)."""
    return {k.replace("-", "_"): v for k, v in sbatchopts.parse(lines, what).items()}


def parse_setup(lines: Any) -> list[str]:
    """--setup / profile `setup`: shell lines the batch script runs before the nodes start, one line each."""
    out = []
    for line in lines or ():
        if not isinstance(line, str) or not line.strip() or any(c in line for c in "\n\r\0"):
            raise LaunchError(f"--setup {brief(line)} is not accepted; give one non-empty line of shell, e.g. "
                              "'module load cuda' or 'source env/bin/activate'")
        out.append(line.strip())
    return out


def node_cpus(spec: RunSpec) -> int | None:
    """CPUs of each node's one task (all of its ranks): --cpus-per-task, else --gpus-per-node x --cpus-per-gpu
    (default DEFAULT_CPUS_PER_GPU); None with --exclusive and neither given (the whole node's CPUs)."""
    o = spec.opts
    if o.get("cpus_per_task") is not None:
        return int(o["cpus_per_task"])
    if o.get("exclusive") and o.get("cpus_per_gpu") is None:
        return None
    return spec.gpus_per_node * int(o.get("cpus_per_gpu") or DEFAULT_CPUS_PER_GPU)


def cpu_warning(spec: RunSpec) -> str | None:
    """One line when the request leaves a rank less than one CPU (dry-run: `# warning: ...`; submit: stderr)."""
    cpus = node_cpus(spec)
    if cpus is None or cpus >= spec.gpus_per_node or spec.opts.get("exclusive"):    # --exclusive: the whole node's
        return None
    return (f"warning: --cpus-per-task {cpus} leaves each of a node's {spec.gpus_per_node} ranks less than one CPU "
            f"({cpus / spec.gpus_per_node:.2g} each); give --cpus-per-task {spec.gpus_per_node} or more, or "
            "--cpus-per-gpu N")


def split_after(value: str) -> tuple[str, str]:
    """--after VALUE -> (run dir or job id, dependency type); the type is afterok unless given."""
    target, sep, kind = str(value).rpartition(":")
    if sep and kind in AFTER_TYPES:
        return target, kind
    if sep and kind.startswith("after"):
        raise LaunchError(f"--after {value!r}: dependency type {kind!r} is not accepted; accepted: {AFTER_ACCEPTED}")
    return str(value), "afterok"


def dependency(spec: RunSpec) -> str | None:
    """sbatch --dependency from --after (resolved to a job id by the backend's plan), e.g. 'afterok:1234'."""
    after = spec.opts.get("after")
    if after is None:
        return None
    target, kind = split_after(after)
    if not JOB_ID.match(target):
        raise LaunchError(f"--after {after!r} is not a Slurm job id; accepted: {AFTER_ACCEPTED}")
    return f"{kind}:{target}"


def slurm_options(spec: RunSpec) -> dict[str, Any]:
    """The validated Slurm options of a spec, with defaults filled in."""
    o = spec.opts
    res: dict[str, Any] = {
        "signal_seconds": o.get("signal_seconds", DEFAULT_SIGNAL_SECONDS),
        "max_requeues": o.get("max_requeues", DEFAULT_MAX_REQUEUES),
        "extra": {**parse_sbatch_lines(o.get("sbatch_lines")), **parse_sbatch_lines(o.get("sbatch_args"), "--sbatch-arg")},
        "setup": parse_setup(o.get("setup")),
    }
    for key in ("signal_seconds", "max_requeues"):
        v = res[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
            raise LaunchError(f"--{key.replace('_', '-')} {v!r} is not accepted; give an integer 0-65535")
    if o.get("time") is not None:
        res["timeout_min"] = parse_time(o["time"])
    check_resources(o)
    for key in ("partition", "account", "qos", "constraint", "job_name"):
        v = o.get(key)
        if v is not None and (not str(v).strip() or any(c in str(v) for c in "\n\r")):
            raise LaunchError(f"--{key.replace('_', '-')} {v!r} is not accepted; give a non-empty single-line value")
    return res


def check_resources(o: dict[str, Any]) -> None:
    """--mem/--mem-per-gpu in Slurm's grammar (one of them), --cpus-per-task/--cpus-per-gpu >= 1 (one of them)."""
    for key in ("mem", "mem_per_gpu"):
        if o.get(key) is not None and not _MEM.match(str(o[key])):
            raise LaunchError(f"--{key.replace('_', '-')} {str(o[key])!r} is malformed; accepted: an integer with an "
                              "optional K, M, G or T suffix (M when none; e.g. 64G, 0 for all of the node's memory)")
    for key in ("cpus_per_task", "cpus_per_gpu"):
        v = o.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 100000):
            raise LaunchError(f"--{key.replace('_', '-')} {v!r} is not accepted; give an integer from 1 to 100000")
    for a, b in (("mem", "mem_per_gpu"), ("cpus_per_task", "cpus_per_gpu")):
        if o.get(a) is not None and o.get(b) is not None:
            raise LaunchError(f"--{a.replace('_', '-')} {o[a]} and --{b.replace('_', '-')} {o[b]} are given "
                              "together; accepted: one of the two")


# ------------------------------------------------------------------------------------------ rendering

def sbatch_parameters(spec: RunSpec) -> dict[str, Any]:
    """submitit `_make_sbatch_string` keyword arguments for one homogeneous allocation of spec.nodes nodes."""
    so = slurm_options(spec)
    o = spec.opts
    extra = dict(so["extra"])
    params: dict[str, Any] = {
        "job_name": o.get("job_name") or spec.name,
        "nodes": spec.nodes + spec.spares,        # --spares: idle nodes in the allocation (backends.slurm.steps)
        "ntasks_per_node": 1,                    # one task per node: the node task that runs torchrun
        "signal_delay_s": so["signal_seconds"],
        "stderr_to_stdout": True,
        "wckey": None,                           # submitit's default "submitit" would be an arbitrary wckey
    }
    # Slurm >= 19.05 with select/cons_tres takes --gpus-per-node; clusters on cons_res need --gres=gpu:N,
    # which a profile gives through sbatch_lines (then --gpus-per-node is left out).
    if "gres" not in extra:
        params["gpus_per_node"] = spec.gpus_per_node
    for key in ("partition", "account", "qos", "constraint", "mem", "mem_per_gpu"):
        if o.get(key) is not None:
            params[key] = o[key]
    if node_cpus(spec) is not None:               # the node's one task holds every rank: their CPUs (docs/SLURM.md)
        params["cpus_per_task"] = node_cpus(spec)
    if o.get("exclusive"):
        params["exclusive"] = True
    # without --time submitit would write its own default (5 minutes): leave the cluster's default instead
    params["time"] = (str(o["time"]) if so["timeout_min"] else "UNLIMITED") if "timeout_min" in so else None
    avoid = [h for h in spec.avoid_hosts if HOST.match(h)]   # quarantined in the site's node ledger: never allocated
    if avoid:
        extra["exclude"] = ",".join([*([str(extra["exclude"])] if extra.get("exclude") else []), *avoid])
    extra.setdefault("requeue", True)
    if step_loop(spec):
        extra.setdefault("no-kill", True)        # a node's loss does not end the allocation: a spare or a shrink
    if dependency(spec):
        extra["dependency"] = dependency(spec)
    params["additional_parameters"] = extra
    params["srun_args"] = srun_binding(spec) + step_container(spec)
    params["setup"] = so["setup"] or None         # submitit's `setup`: lines before the command
    return params


def srun_binding(spec: RunSpec) -> list[str]:
    """srun's own binding left off when the rank wrapper binds (--cpu-bind other than none): the node task gets
    its allocation's CPUs and the wrapper splits them among the ranks, so no rank is bound twice or bound to the
    one core srun's task/affinity would give a task of one CPU."""
    return ["--cpu-bind=none"] if spec.cpu_bind != "none" else []


def step_container(spec: RunSpec) -> list[str]:
    """srun's container flags (launchers.container: pyxis, Slurm's OCI); the secrets cross by name only."""
    names = secret_keys({**dict(spec.env), **dict(spec.secrets)}, [k for k, _ in spec.secrets])
    return container.srun_args(spec, tuple(sorted(names)))


def node_task_command(python: str, run_dir: str, base_attempt: int, array: bool = False) -> str:
    """What srun runs on every node: the node task submitit pickled (NodeTask(run dir, base attempt)), called
    from its arguments so the node does not import submitit to unpickle it. With array, run_dir is a sweep
    dir and each array task runs the sweep's run number SLURM_ARRAY_TASK_ID."""
    words = (python, "-u", "-m", NODE_ENTRY, "task", run_dir, "--base-attempt", str(base_attempt))
    return " ".join(shlex.quote(w) for w in words + (("--array",) if array else ()))


def step_loop(spec: RunSpec) -> bool:
    """The job runs each attempt as a step of its allocation (launchers.backends.slurm.steps): with --spares (a
    spare takes a lost node's place) or --nodes MIN:MAX (the run shrinks to the survivors, never below MIN)."""
    return bool(spec.spares or spec.min_nodes)


def steps_command(python: str, run_dir: str, base_attempt: int) -> str:
    """With --spares, the batch script's command: the loop over attempts inside the allocation, each an srun
    step on the pool's active nodes (launchers.backends.slurm.steps: it records each attempt's end itself)."""
    words = (python, "-u", "-m", NODE_ENTRY, "steps", run_dir, "--base-attempt", str(base_attempt))
    return " ".join(shlex.quote(w) for w in words)


def step_log(spec: RunSpec) -> str:
    return os.path.join(layout.path(spec.run_dir, "slurm"), "%j_%t_log.out")


def step_srun_argv(spec: RunSpec, hosts: list[str], task_command: str) -> list[str]:
    """One attempt's srun step on these hosts of the allocation (--spares: launchers.backends.slurm.steps)."""
    n = len(hosts)
    return ["srun", "--unbuffered", "--output", step_log(spec), *sbatch_parameters(spec)["srun_args"],
            f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", f"--nodelist={','.join(hosts)}",
            # --overlap: a failed step whose node was lost holds its survivors until Slurm has cleaned it up
            # ("step creation temporarily disabled ... Requested nodes are busy" for minutes); the loop runs one
            # step at a time and each node sweeps what the step before left (launchers.backends.slurm.node)
            "--overlap", *shlex.split(task_command)]


def finalize_command(python: str, run_dir: str, base_attempt: int, array: bool = False) -> str:
    """Batch-side last line: record the attempt's result (per-node exit codes, first failure)."""
    words = (python, "-m", NODE_ENTRY, "finalize", run_dir, "--base-attempt", str(base_attempt))
    words += ("--array",) if array else ()
    return " ".join(shlex.quote(w) for w in words) + ' --srun-status "$?"'   # $?: srun's exit status


def sbatch_flag(key: str, value: Any) -> str:
    """One `#SBATCH` line, formatted as submitit's _as_sbatch_flag does."""
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def render_sbatch(spec: RunSpec, *, base_attempt: int, header: str, array: tuple[int, int] | None = None) -> str:
    """The exact sbatch script `launch slurm` submits (and --dry-run prints).

    The layout is submitit's `_make_sbatch_string` for these parameters (sorted `#SBATCH` flags, USR2
    --signal, output in the submitit folder, `--open-mode=append`, srun line, teardown); the equivalence is
    a test (tests/test_slurm_render.py). Rendering it here keeps submitit's ~60 ms import off the launcher's
    start-up; submitit itself submits the script (submit.py). array=(runs, at once): a job array of a sweep
    (spec.run_dir is then the sweep dir), in submitit's array layout (`--array=0-N%P`, %A_%a outputs)."""
    params = {k: v for k, v in sbatch_parameters(spec).items() if v is not None}
    params.pop("stderr_to_stdout")                       # our scripts always merge stderr into stdout
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
    srun = " ".join(shlex.quote(w) for w in ("srun", "--unbuffered", "--output", stdout, *srun_args))
    head = ["#!/bin/bash", *[f"# {line}" if line else "#" for line in header.splitlines()], "", "# Parameters",
            *[sbatch_flag(k, params[k]) for k in sorted(params)], *(["", "# setup", *setup] if setup else []),
            "", "# command", "export SUBMITIT_EXECUTOR=slurm"]
    if step_loop(spec) and not array:         # each attempt a step on the pool's nodes, recorded by the loop
        return "\n".join([*head, steps_command(spec.python, spec.run_dir, base_attempt)]) + "\n"
    lines = [*head, f"{srun} {node_task_command(container.step_python(spec), spec.run_dir, base_attempt, bool(array))}",
             "", "", "# teardown", finalize_command(spec.python, spec.run_dir, base_attempt, bool(array))]
    return "\n".join(lines) + "\n"


def header_for(argv: list[str] | tuple[str, ...], version: str) -> str:
    """'produced by: launch slurm ...' with secret-looking --env values (by name or value) shown as ***."""
    return f"produced by: {shlex.join(['launch', *redact_argv(argv)])}\nlaunchers {version}; submitted with submitit"


def allocation_env(signal_seconds: int) -> dict[str, str]:
    """Environment the node task adds to torchrun's agent (shown in the dry-run too)."""
    grace = max(5, int(signal_seconds) - 15)
    return {"PET_SHUTDOWN_TIMEOUT": str(grace)}


def srun_argv(spec: RunSpec, *, run_id: str, job_id: str, base_attempt: int) -> list[str]:
    """In-allocation mode: one node task per allocated node, in the current allocation."""
    out = os.path.join(layout.path(spec.run_dir, "slurm"), f"alloc-{job_id}-%s-%t.out")
    return ["srun", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}", "--ntasks-per-node=1", *srun_binding(spec),
            *step_container(spec), "--kill-on-bad-exit=0", f"--job-name=launch-{run_id}", f"--output={out}",
            "--open-mode=append", container.step_python(spec), "-u", "-m", NODE_ENTRY, "run", spec.run_dir,
            "--base-attempt", str(base_attempt), "--in-allocation"]
