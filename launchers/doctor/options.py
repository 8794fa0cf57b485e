"""`launch doctor`'s options: the job options it shares with `launch ssh|slurm` (their one
declaration in launchers.runopts, reused as they are) and its own. The CLI generates its click
options from OPTIONS."""

from __future__ import annotations

from dataclasses import replace

from ..runopts import BACKEND_OPTIONS, COMMON, Opt, envvar

B, S = (bool,), (str,)

SHARED_COMMON = (
    "nodes",
    "gpus_per_node",
    "master_port",
    "python",
    "env",
    "container_image",
    "container_runtime",
)
SHARED_SLURM = ("partition", "account", "qos", "constraint")

OWN: tuple[Opt, ...] = (
    Opt("local", B, "Check this machine (the local backend's node).", kind="flag", group="Targets"),
    Opt(
        "slurm",
        B,
        "Check Slurm nodes: a short job (srun) on --nodes N (default 2) of --partition.",
        kind="flag",
        group="Targets",
    ),
    Opt(
        "run_root",
        S,
        "Runs root whose sharing is checked (default $LAUNCH_RUNS_ROOT or ./runs).",
        flag="--runs-root",
        group="Run",
        metavar="DIR",
        complete="dir",
    ),
    Opt(
        "require_gpus",
        B,
        "Fail on a node that sees fewer GPUs than --gpus-per-node (default 1), 0 included.",
        kind="flag",
        group="Diagnosis",
    ),
    Opt(
        "collective",
        B,
        "Also time all_reduce, all_to_all and node-0 links across all nodes (gloo on CPU).",
        kind="flag",
        group="Diagnosis",
    ),
    Opt(
        "gpu",
        B,
        "Also run each node's GPU/NIC tools (nvidia-smi -q -x, topo -m, nvlink -s; ibstat or "
        "/sys/class/infiniband; dmesg Xid lines) and name every fault: node, device, fact.",
        kind="flag",
        group="Diagnosis",
    ),
    Opt(
        "timeout",
        (int, float),
        "Seconds the nodes have to meet at the master (default 30).",
        kind="float",
        group="Diagnosis",
        metavar="SECONDS",
    ),
    Opt("json", B, "Machine-readable output.", kind="flag", group="Diagnosis"),
)

# what a shared option means for doctor, where launch's words do not fit
HELP = {
    "nodes": "Nodes to check (SSH: the first N hosts, default all; Slurm: default 2; local: 1).",
    "master_port": "Master port to check on node 0 (default: one derived like launch's).",
    "env": "K=V your job adds (repeatable); checked with the nodes' NCCL_* env.",
    "gpus_per_node": "GPUs each node must see when it has any (default 1).",
    "container_runtime": (
        "Check that every node has this container runtime: auto (Slurm: pyxis's "
        "enroot; else podman or apptainer), pyxis, apptainer, podman or oci (crun or runc)."
    ),
    "container_image": (
        "Check that every node has this image for the runtime checked (podman: podman image "
        "exists; apptainer: the SIF file; oci: the bundle; pyxis and URIs: imported at run time)."
    ),
}


def _doctor_help(o: Opt) -> Opt:
    o = replace(o, metavar="INTEGER") if o.key == "nodes" else o  # a count here, never MIN:MAX
    return replace(o, help=HELP[o.key]) if o.key in HELP else o


OPTIONS: tuple[Opt, ...] = (
    *(_doctor_help(o) for o in COMMON if o.key in SHARED_COMMON),
    *(o for o in BACKEND_OPTIONS["ssh"] if o.key != "staging_dir"),
    *(o for o in BACKEND_OPTIONS["slurm"] if o.key in SHARED_SLURM),
    *OWN,
)


def env_default(o: Opt) -> tuple[str, str] | None:
    """(the LAUNCH_* variable that gives o's default, as for the verb doctor checks for; that verb:
    "" = any), or None: LAUNCH_SSH_* for SSH hosts, LAUNCH_SLURM_* for --slurm, LAUNCH_<KEY> for
    every target."""
    for backend in ("ssh", "slurm"):
        if o in BACKEND_OPTIONS[backend]:
            var = envvar(backend, o)
            return (var, backend) if var else None
    common = next((c for c in COMMON if c.key == o.key), None)
    var = envvar("local", common) if common else None
    return (var, "") if var else None


def env_applies(key: str, target: str) -> bool:
    """A LAUNCH_* default of option `key` counts for this target (local, ssh, slurm): the local
    target is this one machine (LAUNCH_NODES is for `launch local`'s simulated nodes)."""
    o = next(o for o in OPTIONS if o.key == key)
    found = env_default(o)
    return (
        found is not None
        and found[1] in ("", target)
        and not (target == "local" and key == "nodes")
    )


def from_cli(raw: dict) -> dict:
    """Raw click values (None = not given) -> the options given, converted (kind
    int/float/list/flag)."""
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
