"""`launch doctor`'s options: the job options it shares with `launch ssh|slurm` (their one declaration in
launchers.runopts, reused as they are) and its own. The CLI generates its click options from OPTIONS."""
from __future__ import annotations

from ..runopts import BACKEND_OPTIONS, COMMON, Opt

B, S = (bool,), (str,)

SHARED_COMMON = ("nodes", "gpus_per_node", "master_port", "python", "env")
SHARED_SLURM = ("partition", "account", "qos", "constraint")

OWN: tuple[Opt, ...] = (
    Opt("local", B, "Check this machine (the local backend's node).", kind="flag"),
    Opt("slurm", B, "Check Slurm nodes: a short job (srun) on --nodes N (default 2) of --partition.",
        kind="flag"),
    Opt("run_root", S, "Runs root whose sharing is checked (default $LAUNCH_RUNS_ROOT or ./runs)."),
    Opt("require_gpus", B, "Fail on a node that sees fewer GPUs than --gpus-per-node (default 1), 0 included.",
        kind="flag"),
    Opt("collective", B, "Also time all_reduce, all_to_all and node-0 links across all nodes (gloo on CPU).",
        kind="flag"),
    Opt("timeout", (int, float), "Seconds the nodes have to meet at the master (default 30).", kind="float"),
    Opt("json", B, "Machine-readable output.", kind="flag"),
)

OPTIONS: tuple[Opt, ...] = (
    *(o for o in COMMON if o.key in SHARED_COMMON),
    *BACKEND_OPTIONS["ssh"],
    *(o for o in BACKEND_OPTIONS["slurm"] if o.key in SHARED_SLURM),
    *OWN,
)


def from_cli(raw: dict) -> dict:
    """Raw click values (None = not given) -> the options given, converted (kind int/float/list/flag)."""
    out = {}
    for o in OPTIONS:
        v = raw.get(o.key)
        if o.kind == "multi":
            v = tuple(v or ()) or None
        else:
            v = o.from_cli(v)
        if v is not None:
            out[o.key] = v
    return out
