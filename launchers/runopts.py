"""Every option a job takes, declared once (torchx's runopts style): the common ones and each backend's own.

From these declarations come the click options of `launch local|ssh|slurm` (launchers.cli), the profile's
keys and their types (launchers.spec) and the
flags `launch nccl bench|sweep` may pass on to `launch BACKEND` (nccl_tuning.cli). Pure data + small
converters; stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .errors import LaunchError, brief
from .values import Number, parse_int, parse_number


@dataclass(frozen=True)
class Opt:
    key: str                          # the spec's option key and the profile key
    types: tuple[type, ...]           # what a profile value may be
    help: str = ""
    kind: str = "str"                 # how the CLI value is read: str | int | float | flag | switch | list
    flag: str | None = ""             # CLI flag ("" = --key-with-dashes; None = profile only)
    cli_value: Any = True             # kind "flag": the value the flag sets
    in_profile: bool = True           # also a profile key
    group: str = ""                   # its section of `launch BACKEND --help` (GROUPS; "" = LOOK's)
    metavar: str = ""                 # how help shows its value: INTEGER, SECONDS, FILE, ... ("" = LOOK's)
    choices: tuple[str, ...] = ()     # the words it accepts (help shows [a|b], completion offers them)
    complete: str = ""                # what its value completes to: file | dir | run | profile ("" = choices)

    @property
    def cli_flag(self) -> str | None:
        return None if self.flag is None else (self.flag or "--" + self.key.replace("_", "-"))

    @property
    def cli_words(self) -> tuple[str, ...]:
        """The flags that set it: a switch's --KEY and --no-KEY, else its one flag (none: profile only)."""
        if self.cli_flag is None:
            return ()
        return (self.cli_flag, "--no-" + self.cli_flag[2:]) if self.kind == "switch" else (self.cli_flag,)

    def from_cli(self, raw: Any) -> Any:
        """The CLI's value (a string, or True for a flag; None when not given) -> the option's value."""
        if self.kind == "switch":            # --KEY / --no-KEY: True / False (None: neither given)
            return raw
        if raw is None or raw is False:
            return None
        if self.kind == "flag":
            return self.cli_value
        if self.kind == "multi":
            return list(raw) or None
        if self.kind == "list":
            return str(raw).split(",")          # an empty item stays: the option's parser refuses it
        if self.kind == "int":
            return parse_int(self.cli_flag or self.key, raw)
        if self.kind == "float":
            return parse_number(self.cli_flag or self.key, raw)
        return raw

    def from_profile(self, value: Any, where: str) -> Any:
        """A profile value of this option, of one of the declared types (a bool is not a number); the text of a
        number option is read by the flag's own parser (launchers.values), whether YAML saw a number or not."""
        if isinstance(value, str) and int in self.types and float not in self.types:
            return parse_int(f"{where}: {self.key}", str(value))
        if isinstance(value, str) and float in self.types:
            return parse_number(f"{where}: {self.key}", str(value))
        if isinstance(value, Number) and str in self.types:
            return str(value)
        numeric = any(t in (int, float) for t in self.types)
        if not isinstance(value, self.types) or isinstance(value, Number) \
                or (isinstance(value, bool) and numeric and bool not in self.types):
            names = " or ".join(t.__name__ for t in self.types)
            raise LaunchError(f"{where}: {self.key} has a value of the wrong type: {brief(value)}; expected {names}")
        return value


S, I, B, L = (str,), (int,), (bool,), (list,)

COMMON: tuple[Opt, ...] = (
    Opt("nodes", I, "Number of nodes (default 1), or MIN:MAX: start on MAX; with no spare left a node that must "
        "leave shrinks the run to the survivors (never below MIN, resharded from checkpoints/latest), and a "
        "later restart grows it back to MAX (local, ssh)."),
    Opt("gpus_per_node", I, "Processes per node (= GPUs; default 1)."),
    Opt("run_dir", S, "Exact run directory (default: <runs root>/<name>-<time>).", in_profile=False),
    Opt("name", S, "Run name (default: from the program)."),
    Opt("env", (dict,), "K=V added to every worker's environment (repeatable).", kind="multi"),
    Opt("forward_env", (list,), "Pass on the caller's variables matching GLOB, e.g. 'NCCL_*' (repeatable).",
        kind="multi"),
    Opt("secrets", (list,), "NAME or NAME=@FILE: a secret every rank gets in its environment, from yours or "
        "from FILE; never written to the run dir nor shown (repeatable; a resume needs it again).", kind="multi",
        flag="--secret"),
    Opt("profile", S, "YAML profile; flags override its values.", in_profile=False),
    Opt("master_port", I, "Rendezvous port (default: derived from the run id)."),
    Opt("max_restarts", I, "Restart the whole job from checkpoints/latest K times (default 0; with --spares K "
        "and --nodes MIN:MAX: K + MAX - MIN + 1)."),
    Opt("spares", I, "K idle spare nodes: a node that fails in a way that points at it (its agent or host died, "
        "it went silent or hung, or it failed --quarantine-after times) is replaced by one, from "
        "checkpoints/latest, in the same run (default 0; Slurm: in the same job, the allocation holds them)."),
    Opt("quarantine_after", I, "Strikes (failures that stopped an attempt) that quarantine a node: never used "
        "again in the run (default 2)."),
    Opt("max_restarts_per_hour", I, "At most N restarts in any hour (counted from nodes.json's decisions; default "
        "0: no hourly limit, only --max-restarts): a restart storm stops with one line naming it and what failed."),
    Opt("node_ledger", S, "The site's node ledger, a JSON file on shared storage (docs/RECOVERY.md): read at the "
        "start (its quarantined hosts are not used: SSH leaves them out, Slurm --exclude), the run's strikes merged in "
        "at its end; `launch nodes` shows it (default: none)."),
    Opt("memory_checkpoint", B, "Also keep every rank's state in host memory (/dev/shm) every M steps, copied "
        "to the next node (node k -> k+1) in the background: a lost node's ranks resume from its peer's copy, the "
        "others from their own, storage only when both are gone (docs/RECOVERY.md).", kind="flag"),
    Opt("memory_checkpoint_every", I, "M for --memory-checkpoint (default 1: every step the program reports; "
        "implies --memory-checkpoint).", kind="int"),
    Opt("stop_grace", (int, float), "Seconds a program has to end after a stop (Ctrl-C, launch cancel, a peer's "
        "failure, a hang) before it is killed (default 30, like torchrun)."),
    Opt("stop_signal", S, "What each program gets on `launch cancel` / SIGTERM to the launcher / scancel: SIGTERM "
        "(default, like torchrun) or SIGINT (Python raises KeyboardInterrupt: `finally` blocks run), SIGHUP, SIGQUIT. "
        "Ctrl-C always gives SIGINT."),
    Opt("hang_timeout", (int, float), "Seconds without progress of any rank that make a hang: stacks are "
        "captured, the stalled rank named, the run stopped (default: off)."),
    Opt("dist_backend", S, "auto (decided on each node: nccl where the node has GPUs, else gloo), gloo or nccl."),
    Opt("cpu_bind", S, "CPUs of each local rank, from the node's topology: auto (numa where a node has more than "
        "one NUMA node, else none), none, numa (its GPU's NUMA node), cores (whole cores of it, one set per rank)."),
    Opt("preflight", L, "Checks on every node before anything starts: gpu (the tools of `launch doctor --gpu`; "
        "a node with a fault stops the launch, one line per bad node; on Slurm each node checks itself when the job "
        "runs and a bad node ends it FAILED before any agent starts).", kind="list"),
    Opt("notify", (list, str), "URL or COMMAND told of each change of state (RUNNING, REQUEUED, HANG, FAILED with the "
        "first failure, CANCELLED, COMPLETED): an http(s) URL gets a JSON POST, a command runs with LAUNCH_EVENT, "
        "LAUNCH_EVENT_JSON, ... in its environment (repeatable).", kind="multi"),
    Opt("nccl_preset", S, "NCCL preset(s), e.g. moe or moe,roce or ./mine.yaml."),
    Opt("python", S, "Python interpreter on the nodes (default: this one)."),
    Opt("container_image", S, "Run every node's agent and ranks in this image (pyxis: an enroot URI or squashfs; "
        "podman: an image name; apptainer: a SIF or URI; oci: a bundle dir); the run dir and the launch dir are "
        "mounted at the same paths."),
    Opt("container_mounts", (list,), "SRC:DST[:ro]: one more bind mount into the container (repeatable).",
        kind="multi", flag="--container-mount"),
    Opt("container_runtime", S, "auto (Slurm: pyxis; SSH: podman; local: podman or apptainer, whichever is "
        "installed), pyxis, apptainer, podman or oci (Slurm's own: srun --container)."),
    Opt("container_python", S, "The interpreter inside the image that runs the agent and the program (default "
        "python3)."),
    Opt("snapshot", B, "Run the ranks from a copy of the program's tree frozen at submit (git-tracked and "
        "untracked-not-ignored files; outside git the directory less .launchignore), content-addressed under "
        "<runs root>/.snapshots; default on for slurm, off for local and ssh. A resume keeps the run's snapshot "
        "unless given again.", kind="switch"),
    Opt("dry_run", B, "Print exactly what would run; start nothing.", kind="flag", in_profile=False),
    Opt("json", B, "One JSON object on stdout once started (or ended): run_dir, run_id, state, job_ids, "
        "started; with --dry-run the text, run dir and each node's command. People's lines go to stderr.",
        kind="flag", in_profile=False),
    Opt("sweep", (list,), "KEY=V1,V2: one run per combination, each with `--KEY V` appended to its program "
        "args, under one sweep dir (repeatable; Slurm: one job array, local/SSH: one after another).",
        kind="multi", in_profile=False),
)

WARM_SPARES = Opt("warm_spares", B, "Every node slot of the run (the nodes and the --spares) keeps a python with "
                  "torch imported: a restart's torchrun agents and programs are forked from it, not started cold, so "
                  "taking a spare or restarting costs no start-up (docs/RECOVERY.md).", kind="flag")
BACKEND_OPTIONS: dict[str, tuple[Opt, ...]] = {
    "local": (WARM_SPARES,),
    "ssh": (
        Opt("hosts", (list, str), "Comma-separated hosts; the first is node 0 and the master.", kind="list"),
        Opt("hostfile", S, "One host per line: `host [slots=N]`, `user@host:port` allowed."),
        Opt("ssh_config", S, "ssh config file used to resolve host names."),
        Opt("known_hosts", S, "The only known_hosts file (default: the ssh config's UserKnownHostsFile, else ~/.ssh/known_hosts, and /etc/ssh/ssh_known_hosts); unknown keys are refused."),
        Opt("identity", S, "Private key file."),
        Opt("connect_timeout", (int, float), "Seconds to wait for each host (default 10).", kind="float"),
        Opt("shared_storage", B, "Hosts stage logs/checkpoints locally; the launcher collects them over SFTP.",
            kind="flag", flag="--no-shared-storage", cli_value=False),
        Opt("staging_dir", S, "Host-local dir for --no-shared-storage (default /tmp/launch-staging)."),
        WARM_SPARES,
    ),
    "slurm": (
        Opt("partition", S, "Slurm partition to submit to (sbatch --partition; default: the cluster's)."),
        Opt("time", S, "Time limit, e.g. 04:00:00 or 1-00:00:00 (sbatch --time)."),
        Opt("account", S, "Account the job is charged to (sbatch --account)."),
        Opt("qos", S, "Quality of service (sbatch --qos)."),
        Opt("constraint", S, "Node features the nodes must have, e.g. 'a100&ib' (sbatch --constraint)."),
        Opt("exclusive", B, "Whole nodes: every CPU of each node (no other job shares them); no --cpus-per-task "
            "then unless given.", kind="flag"),
        Opt("mem", S, "Memory per node: an integer with an optional K, M, G or T suffix (e.g. 64G; 0: all of it)."),
        Opt("mem_per_gpu", S, "Memory per GPU instead of --mem, e.g. 80G (same grammar)."),
        Opt("cpus_per_task", I, "CPUs of each node's one task, which holds all of its ranks (default: --gpus-per-node "
            "x --cpus-per-gpu).", kind="int"),
        Opt("cpus_per_gpu", I, "CPUs per rank (= per GPU): the node's task asks for --gpus-per-node x this many "
            "(default 1; a site's profile gives its number).", kind="int"),
        Opt("sbatch_args", L, "One more sbatch option in its long form, e.g. '--gres=gpu:8' or '--reservation=maint' "
            "(repeatable; checked against sbatch's options; added to a profile's sbatch_lines).", kind="multi",
            flag="--sbatch-arg"),
        Opt("setup", L, "A line the batch script runs before the nodes start, e.g. 'module load cuda' or 'source "
            "env/bin/activate' (repeatable; profile key setup: a list).", kind="multi", flag="--setup"),
        Opt("signal_seconds", I, "USR2 this many seconds before the time limit (default 120).", kind="int"),
        Opt("max_requeues", I, "Requeues after preemption/timeout before FAILED (default 3).", kind="int"),
        Opt("wait", B, "Follow the job until it ends; exit with its result.", kind="flag"),
        Opt("after", S, "RUN_DIR|JOBID[:afterok|afterany|afternotok]: start only after that run/job ends "
            "(sbatch --dependency; default afterok).", in_profile=False),
        Opt("max_parallel", I, "With --sweep: at most this many runs of the array at once.", kind="int"),
        Opt("sbatch_lines", L, "Extra #SBATCH lines, e.g. ['--gres=gpu:8'] (profile only; checked as --sbatch-arg).",
            flag=None),
        Opt("job_name", S, "Slurm job name (profile only; default: the run name).", flag=None),
        Opt("cluster", S, "NAME in the clusters file ($XDG_CONFIG_HOME/launchers/clusters.yaml): submit from its "
            "login node over SSH (host keys verified, jump hosts as listed; this tree uploaded); run dirs under its "
            "runs root. '' = this machine's Slurm."),
    ),
}
BACKENDS = tuple(BACKEND_OPTIONS)

# How each option reads in `launch BACKEND --help` and completes: (group, metavar or the choices, completion).
# The value is still read by the option's own parser (launchers.spec): help and completion only show it.
GROUPS = ("Targets", "Slurm", "SSH", "Job shape", "Run", "Recovery", "Container", "Diagnosis")
_N, _SEC = "INTEGER", "SECONDS"
LOOK: dict[str, tuple[str, str | tuple[str, ...], str]] = {
    "nodes": ("Job shape", "N|MIN:MAX", ""), "gpus_per_node": ("Job shape", _N, ""),
    "dist_backend": ("Job shape", ("auto", "gloo", "nccl"), ""),
    "cpu_bind": ("Job shape", ("auto", "none", "numa", "cores"), ""), "master_port": ("Job shape", _N, ""),
    "python": ("Job shape", "PATH", "file"),
    "run_dir": ("Run", "DIR", "dir"), "name": ("Run", "NAME", ""), "profile": ("Run", "FILE", "profile"),
    "env": ("Run", "K=V", ""), "forward_env": ("Run", "GLOB", ""), "secrets": ("Run", "NAME[=@FILE]", ""),
    "nccl_preset": ("Run", "PRESET[,PRESET]", ""), "snapshot": ("Run", "", ""),
    "stop_signal": ("Run", ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"), ""), "stop_grace": ("Run", _SEC, ""),
    "dry_run": ("Run", "", ""), "json": ("Run", "", ""), "sweep": ("Run", "KEY=V1,V2", ""),
    "max_restarts": ("Recovery", _N, ""), "spares": ("Recovery", _N, ""), "quarantine_after": ("Recovery", _N, ""),
    "max_restarts_per_hour": ("Recovery", _N, ""),
    "node_ledger": ("Recovery", "FILE", "file"),
    "memory_checkpoint": ("Recovery", "", ""), "warm_spares": ("Recovery", "", ""), "memory_checkpoint_every": ("Recovery", _N, ""),
    "container_image": ("Container", "IMAGE", ""), "container_mounts": ("Container", "SRC:DST[:ro]", ""),
    "container_runtime": ("Container", ("auto", "pyxis", "apptainer", "podman", "oci"), ""),
    "container_python": ("Container", "PATH", ""),
    "preflight": ("Diagnosis", ("gpu",), ""), "hang_timeout": ("Diagnosis", _SEC, ""),
    "notify": ("Diagnosis", "URL|COMMAND", ""),
    "hosts": ("SSH", "HOST[,HOST...]", ""), "hostfile": ("SSH", "FILE", "file"),
    "ssh_config": ("SSH", "FILE", "file"), "known_hosts": ("SSH", "FILE", "file"),
    "identity": ("SSH", "FILE", "file"), "connect_timeout": ("SSH", _SEC, ""), "shared_storage": ("SSH", "", ""),
    "staging_dir": ("SSH", "DIR", ""),
    "partition": ("Slurm", "NAME", ""), "time": ("Slurm", "[D-]H:M:S", ""), "account": ("Slurm", "NAME", ""),
    "qos": ("Slurm", "NAME", ""), "constraint": ("Slurm", "FEATURES", ""), "exclusive": ("Slurm", "", ""),
    "mem": ("Slurm", "SIZE", ""), "mem_per_gpu": ("Slurm", "SIZE", ""), "cpus_per_task": ("Slurm", _N, ""),
    "cpus_per_gpu": ("Slurm", _N, ""), "sbatch_args": ("Slurm", "OPTION", ""), "setup": ("Slurm", "LINE", ""),
    "signal_seconds": ("Slurm", _N, ""), "max_requeues": ("Slurm", _N, ""), "wait": ("Slurm", "", ""),
    "after": ("Slurm", "RUN|JOBID[:TYPE]", "run"), "max_parallel": ("Slurm", _N, ""),
    "cluster": ("Slurm", "NAME", ""), "sbatch_lines": ("Slurm", "", ""), "job_name": ("Slurm", "", ""),
}


def _looked(o: Opt) -> Opt:
    group, shown, complete = LOOK[o.key]
    choices = shown if isinstance(shown, tuple) else ()
    return replace(o, group=o.group or group, metavar=o.metavar or ("" if choices else shown),
                   choices=o.choices or choices, complete=o.complete or complete)


COMMON = tuple(_looked(o) for o in COMMON)
BACKEND_OPTIONS = {b: tuple(_looked(o) for o in opts) for b, opts in BACKEND_OPTIONS.items()}
# the top-level keys of a profile: the common options, two keys without a flag, one mapping per backend
PROFILE_KEYS = (*(o.key for o in COMMON if o.in_profile), "program", "runs_root", *BACKENDS)


# LAUNCH_* environment defaults for the common flags: the variable acts as its flag when the flag is not given
# (a flag wins; the variable wins over a profile's value). LAUNCH_<KEY> for a common option, LAUNCH_<BACKEND>_<KEY>
# for a backend's. Not LAUNCH_STOP_GRACE / LAUNCH_HANG_TIMEOUT / LAUNCH_DIST_BACKEND: those are the workers' env.
ENV_DEFAULTS: dict[str, tuple[str, ...]] = {
    "": ("nodes", "gpus_per_node", "profile", "nccl_preset", "python", "max_restarts", "node_ledger"),
    "ssh": ("hostfile", "ssh_config", "known_hosts", "identity", "connect_timeout"),
    "slurm": ("partition", "account", "qos", "time", "constraint"),
}


def envvar(backend: str, o: Opt) -> str | None:
    """The LAUNCH_* variable that gives option o's default for `launch BACKEND`, or None."""
    if o in COMMON and o.key in ENV_DEFAULTS[""]:
        return "LAUNCH_" + o.key.upper()
    if o in BACKEND_OPTIONS.get(backend, ()) and o.key in ENV_DEFAULTS.get(backend, ()):
        return f"LAUNCH_{backend.upper()}_{o.key.upper()}"
    return None


def backend_option(backend: str, key: str) -> Opt | None:
    return next((o for o in BACKEND_OPTIONS[backend] if o.key == key), None)


def cli_flags(backend: str) -> set[str]:
    """Every flag `launch BACKEND` accepts (common and the backend's own)."""
    return {w for o in (*COMMON, *BACKEND_OPTIONS[backend]) for w in o.cli_words} | {"-h", "--help"}


def options_from_cli(backend: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The backend's options from the CLI's raw values (keyed by option key; absent/None = not given)."""
    out = {}
    for o in BACKEND_OPTIONS[backend]:
        v = o.from_cli(raw.get(o.key))
        if v is not None:
            out[o.key] = v
    return out
