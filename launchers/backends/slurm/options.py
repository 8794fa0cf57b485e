"""The Slurm options of a spec, validated (one-line LaunchErrors) and with their defaults: --time,
--signal-seconds, --max-requeues, --sbatch-arg / profile sbatch_lines, --setup, --mem/--mem-per-gpu,
--cpus-per-task/--cpus-per-gpu (a node's CPUs, the too-few-CPUs warning) and --after's dependency.
Pure: no clock, no environment, no Slurm."""

from __future__ import annotations

import re
from typing import Any

from ...errors import LaunchError, brief
from ...options import sbatchopts
from ...spec import RunSpec

DEFAULT_SIGNAL_SECONDS = 120
DEFAULT_MAX_REQUEUES = 3
# CPUs per rank when neither --cpus-per-task nor --cpus-per-gpu is given (docs/SLURM.md)
DEFAULT_CPUS_PER_GPU = 1

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")
# Slurm's str_to_mbytes: a number, M unless K, G or T follows
_MEM = re.compile(r"^\d+(?:[KMGTkmgt][Bb]?)?$")
AFTER_TYPES = ("afterok", "afterany", "afternotok")
AFTER_ACCEPTED = (
    "RUN_DIR|JOBID[:afterok|afterany|afternotok] (a Slurm run dir, or a job id like 1234 or 1234_5)"
)
JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?$")


def parse_time(value: str) -> int:
    """Slurm --time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED) -> minutes (0 =
    unlimited)."""
    v = str(value).strip()
    if v.upper() in ("UNLIMITED", "INFINITE"):
        return 0
    m = _TIME.match(v)
    accepted = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 04:00:00, 1-12:00:00, 30)"
    if not m:
        raise LaunchError(f"--time {value!r} is malformed; accepted: {accepted}")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-H[:M[:S]]
        h, mi, s = (parts + [0, 0])[:3]
        minutes = int(days) * 1440 + h * 60 + mi + (1 if s else 0)
    elif len(parts) == 1:  # M
        minutes = parts[0]
    elif len(parts) == 2:  # M:S
        minutes = parts[0] + (1 if parts[1] else 0)
    else:  # H:M:S
        minutes = parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
    if minutes < 1:
        raise LaunchError(f"--time {value!r} is shorter than one minute; accepted: {accepted}")
    return minutes


def parse_sbatch_lines(lines: Any, what: str = "slurm.sbatch_lines entry") -> dict[str, Any]:
    """Profile `sbatch_lines` or --sbatch-arg (["--reservation=x", "#SBATCH --mail-type=END", ...])
    -> {flag: value|True}, each checked against sbatch's own options (launchers.options.sbatchopts,
    the one validator of both)."""
    return {k.replace("-", "_"): v for k, v in sbatchopts.parse(lines, what).items()}


def parse_setup(lines: Any) -> list[str]:
    """--setup / profile `setup`: shell lines the batch script runs before the nodes start, one line
    each."""
    out = []
    for line in lines or ():
        if not isinstance(line, str) or not line.strip() or any(c in line for c in "\n\r\0"):
            raise LaunchError(
                f"--setup {brief(line)} is not accepted; give one non-empty line of shell, e.g. "
                "'module load cuda' or 'source env/bin/activate'"
            )
        out.append(line.strip())
    return out


def node_cpus(spec: RunSpec) -> int | None:
    """CPUs of each node's one task (all of its ranks): --cpus-per-task, else --gpus-per-node x
    --cpus-per-gpu (default DEFAULT_CPUS_PER_GPU); None with --exclusive and neither given (the
    whole node's CPUs)."""
    o = spec.opts
    if o.get("cpus_per_task") is not None:
        return int(o["cpus_per_task"])
    if o.get("exclusive") and o.get("cpus_per_gpu") is None:
        return None
    return spec.gpus_per_node * int(o.get("cpus_per_gpu") or DEFAULT_CPUS_PER_GPU)


def cpu_warning(spec: RunSpec) -> str | None:
    """One line when the request leaves a rank less than one CPU (dry-run: `# warning: ...`; submit:
    stderr)."""
    cpus = node_cpus(spec)
    # --exclusive: the whole node's
    if cpus is None or cpus >= spec.gpus_per_node or spec.opts.get("exclusive"):
        return None
    return (
        f"warning: --cpus-per-task {cpus} leaves each of a node's {spec.gpus_per_node} ranks "
        f"less than one CPU ({cpus / spec.gpus_per_node:.2g} each); give --cpus-per-task "
        f"{spec.gpus_per_node} or more, or --cpus-per-gpu N"
    )


def split_after(value: str) -> tuple[str, str]:
    """--after VALUE -> (run dir or job id, dependency type); the type is afterok unless given."""
    target, sep, kind = str(value).rpartition(":")
    if sep and kind in AFTER_TYPES:
        return target, kind
    if sep and kind.startswith("after"):
        raise LaunchError(
            f"--after {value!r}: dependency type {kind!r} is not accepted; accepted: "
            f"{AFTER_ACCEPTED}"
        )
    return str(value), "afterok"


def dependency(spec: RunSpec) -> str | None:
    """sbatch --dependency from --after (resolved to a job id by the backend's plan), e.g.
    'afterok:1234'."""
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
        "extra": {
            **parse_sbatch_lines(o.get("sbatch_lines")),
            **parse_sbatch_lines(o.get("sbatch_args"), "--sbatch-arg"),
        },
        "setup": parse_setup(o.get("setup")),
    }
    for key in ("signal_seconds", "max_requeues"):
        v = res[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
            raise LaunchError(
                f"--{key.replace('_', '-')} {v!r} is not accepted; give an integer 0-65535"
            )
    if o.get("time") is not None:
        res["timeout_min"] = parse_time(o["time"])
    check_resources(o)
    for key in ("partition", "account", "qos", "constraint", "job_name"):
        v = o.get(key)
        if v is not None and (not str(v).strip() or any(c in str(v) for c in "\n\r")):
            raise LaunchError(
                f"--{key.replace('_', '-')} {v!r} is not accepted; give a non-empty single-line "
                "value"
            )
    return res


def check_resources(o: dict[str, Any]) -> None:
    """--mem/--mem-per-gpu in Slurm's grammar (one of them), --cpus-per-task/--cpus-per-gpu >= 1
    (one of them)."""
    for key in ("mem", "mem_per_gpu"):
        if o.get(key) is not None and not _MEM.match(str(o[key])):
            raise LaunchError(
                f"--{key.replace('_', '-')} {str(o[key])!r} is malformed; accepted: an integer "
                "with an optional K, M, G or T suffix (M when none; e.g. 64G, 0 for all of the "
                "node's memory)"
            )
    for key in ("cpus_per_task", "cpus_per_gpu"):
        v = o.get(key)
        if v is not None and (
            isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 100000
        ):
            raise LaunchError(
                f"--{key.replace('_', '-')} {v!r} is not accepted; give an integer from 1 to 100000"
            )
    for a, b in (("mem", "mem_per_gpu"), ("cpus_per_task", "cpus_per_gpu")):
        if o.get(a) is not None and o.get(b) is not None:
            raise LaunchError(
                f"--{a.replace('_', '-')} {o[a]} and --{b.replace('_', '-')} {o[b]} are given "
                "together; accepted: one of the two"
            )
