"""How each option declared in launchers.runopts reads in `launch BACKEND --help` and completes: its
help line (HELP), its section of the help (GROUPS), its metavar or the words it accepts, and what
its value completes to (LOOK); both keyed by the option's key. Data only, no imports: runopts
attaches them to its declarations (every declared option has an entry of each; an option is still
declared there, once).
"""

from __future__ import annotations

# each option's help line in `launch BACKEND --help`: what it does, its default
HELP: dict[str, str] = {
    "nodes": (
        "Number of nodes (default 1), or MIN:MAX: start on MAX; with no spare left a node "
        "that must leave shrinks the run to the survivors (never below MIN, resharded from "
        "checkpoints/latest), and a later restart grows it back to MAX (local, ssh)."
    ),
    "gpus_per_node": "Processes per node (= GPUs; default 1).",
    "run_dir": "Exact run directory (default: <runs root>/<name>-<time>).",
    "name": "Run name (default: from the program).",
    "env": "K=V added to every worker's environment (repeatable).",
    "forward_env": "Pass on the caller's variables matching GLOB, e.g. 'NCCL_*' (repeatable).",
    "secrets": (
        "NAME or NAME=@FILE: a secret every rank gets in its environment, from yours or "
        "from FILE; never written to the run dir nor shown (repeatable; a resume needs it again)."
    ),
    "profile": "YAML profile; flags override its values.",
    "master_port": "Rendezvous port (default: derived from the run id).",
    "max_restarts": (
        "Restart the whole job from checkpoints/latest K times (default 0; with "
        "--spares K and --nodes MIN:MAX: K + MAX - MIN + 1)."
    ),
    "spares": (
        "K idle spare nodes: a node that fails in a way that points at it (its agent or "
        "host died, it went silent or hung, or it failed --quarantine-after times) is replaced by "
        "one, from checkpoints/latest, in the same run (default 0; Slurm: in the same job, the "
        "allocation holds them)."
    ),
    "quarantine_after": (
        "Strikes (failures that stopped an attempt) that quarantine a node: "
        "never used again in the run (default 2)."
    ),
    "max_restarts_per_hour": (
        "At most N restarts in any hour (counted from nodes.json's decisions; default 0: no "
        "hourly limit, only --max-restarts): a restart storm stops with one line naming it and "
        "what failed."
    ),
    "node_ledger": (
        "The site's node ledger, a JSON file on shared storage (docs/RECOVERY.md): read at the "
        "start (its quarantined hosts are not used: SSH leaves them out, Slurm --exclude), the "
        "run's strikes merged in at its end; `launch nodes` shows it (default: none)."
    ),
    "memory_checkpoint": (
        "Also keep every rank's state in host memory (/dev/shm) every M steps, copied to the "
        "next node (node k -> k+1) in the background: a lost node's ranks resume from its peer's "
        "copy, the others from their own, storage only when both are gone (docs/RECOVERY.md)."
    ),
    "memory_checkpoint_every": (
        "M for --memory-checkpoint (default auto: every step the program reports, unless "
        "a copy costs more than 0.25% of a step, then the smallest M within that; implies "
        "--memory-checkpoint)."
    ),
    "stop_grace": (
        "Seconds a program has to end after a stop (Ctrl-C, launch cancel, a peer's "
        "failure, a hang) before it is killed (default 30, like torchrun)."
    ),
    "stop_signal": (
        "What each program gets on `launch cancel` / SIGTERM to the launcher / "
        "scancel: SIGTERM (default, like torchrun) or SIGINT (Python raises KeyboardInterrupt: "
        "`finally` blocks run), SIGHUP, SIGQUIT. Ctrl-C always gives SIGINT."
    ),
    "hang_timeout": (
        "Seconds without progress of any rank that make a hang: stacks are captured, "
        "the stalled rank named, the run stopped (default: off)."
    ),
    "dist_backend": (
        "auto (decided on each node: nccl where the node has GPUs, else gloo), gloo or nccl."
    ),
    "cpu_bind": (
        "CPUs of each local rank, from the node's topology: auto (numa where a node has "
        "more than one NUMA node, else none), none, numa (its GPU's NUMA node), cores (whole cores "
        "of it, one set per rank)."
    ),
    "preflight": (
        "Checks on every node before anything starts: gpu (the tools of `launch doctor "
        "--gpu`; a node with a fault stops the launch, one line per bad node; on Slurm each node "
        "checks itself when the job runs and a bad node ends it FAILED before any agent starts)."
    ),
    "notify": (
        "URL or COMMAND told of each change of state (RUNNING, REQUEUED, HANG, FAILED with "
        "the first failure, CANCELLED, COMPLETED): an http(s) URL gets a JSON POST, a command runs "
        "with LAUNCH_EVENT, LAUNCH_EVENT_JSON, ... in its environment (repeatable)."
    ),
    "nccl_preset": "NCCL preset(s), e.g. moe or moe,roce or ./mine.yaml.",
    "python": "Python interpreter on the nodes (default: this one).",
    "container_image": (
        "Run every node's agent and ranks in this image (pyxis: an enroot URI or "
        "squashfs; podman: an image name; apptainer: a SIF or URI; oci: a bundle dir); the run dir "
        "and the launch dir are mounted at the same paths."
    ),
    "container_mounts": "SRC:DST[:ro]: one more bind mount into the container (repeatable).",
    "container_runtime": (
        "auto (Slurm: pyxis; SSH: podman; local: podman or apptainer, whichever "
        "is installed), pyxis, apptainer, podman or oci (Slurm's own: srun --container)."
    ),
    "container_python": (
        "The interpreter inside the image that runs the agent and the program (default python3)."
    ),
    "snapshot": (
        "Run the ranks from a copy of the program's tree frozen at submit (git-tracked "
        "and untracked-not-ignored files; outside git the directory less .launchignore), "
        "content-addressed under <runs root>/.snapshots; default on for slurm, off for local and "
        "ssh. A resume keeps the run's snapshot unless given again."
    ),
    "dry_run": "Print exactly what would run; start nothing.",
    "json": (
        "One JSON object on stdout once started (or ended): run_dir, run_id, state, job_ids, "
        "started; with --dry-run the text, run dir and each node's command. People's lines go to "
        "stderr."
    ),
    "sweep": (
        "KEY=V1,V2: one run per combination, each with `--KEY V` appended to its program args, "
        "under one sweep dir (repeatable; Slurm: one job array, local/SSH: one after another)."
    ),
    "warm_spares": (
        "Every node slot of the run (the nodes and the --spares) keeps a python with "
        "torch imported: a restart's torchrun agents and programs are forked from it, not started "
        "cold, so taking a spare or restarting costs no start-up (docs/RECOVERY.md)."
    ),
    "hosts": "Comma-separated hosts; the first is node 0 and the master.",
    "hostfile": "One host per line: `host [slots=N]`, `user@host:port` allowed.",
    "ssh_config": "ssh config file used to resolve host names.",
    "known_hosts": (
        "The only known_hosts file (default: the ssh config's UserKnownHostsFile, "
        "else ~/.ssh/known_hosts, and /etc/ssh/ssh_known_hosts); unknown keys are refused."
    ),
    "identity": "Private key file.",
    "connect_timeout": "Seconds to wait for each host (default 10).",
    "shared_storage": "Hosts stage logs/checkpoints locally; the launcher collects them over SFTP.",
    "staging_dir": "Host-local dir for --no-shared-storage (default /tmp/launch-staging).",
    "partition": "Slurm partition to submit to (sbatch --partition; default: the cluster's).",
    "time": "Time limit, e.g. 04:00:00 or 1-00:00:00 (sbatch --time).",
    "account": "Account the job is charged to (sbatch --account).",
    "qos": "Quality of service (sbatch --qos).",
    "constraint": "Node features the nodes must have, e.g. 'a100&ib' (sbatch --constraint).",
    "exclusive": (
        "Whole nodes: every CPU of each node (no other job shares them); no "
        "--cpus-per-task then unless given."
    ),
    "mem": (
        "Memory per node: an integer with an optional K, M, G or T suffix (e.g. 64G; 0: all of it)."
    ),
    "mem_per_gpu": "Memory per GPU instead of --mem, e.g. 80G (same grammar).",
    "cpus_per_task": (
        "CPUs of each node's one task, which holds all of its ranks (default: "
        "--gpus-per-node x --cpus-per-gpu)."
    ),
    "cpus_per_gpu": (
        "CPUs per rank (= per GPU): the node's task asks for --gpus-per-node x this "
        "many (default 1; a site's profile gives its number)."
    ),
    "sbatch_args": (
        "One more sbatch option in its long form, e.g. '--gres=gpu:8' or "
        "'--reservation=maint' (repeatable; checked against sbatch's options; added to a profile's "
        "sbatch_lines)."
    ),
    "setup": (
        "A line the batch script runs before the nodes start, e.g. 'module load cuda' or "
        "'source env/bin/activate' (repeatable; profile key setup: a list)."
    ),
    "signal_seconds": "USR2 this many seconds before the time limit (default 120).",
    "max_requeues": "Requeues after preemption/timeout before FAILED (default 3).",
    "wait": "Follow the job until it ends; exit with its result.",
    "after": (
        "RUN_DIR|JOBID[:afterok|afterany|afternotok]: start only after that run/job ends "
        "(sbatch --dependency; default afterok)."
    ),
    "max_parallel": "With --sweep: at most this many runs of the array at once.",
    "sbatch_lines": (
        "Extra #SBATCH lines, e.g. ['--gres=gpu:8'] (profile only; checked as --sbatch-arg)."
    ),
    "job_name": "Slurm job name (profile only; default: the run name).",
    "cluster": (
        "NAME in the clusters file ($XDG_CONFIG_HOME/launchers/clusters.yaml): submit "
        "from its login node over SSH (host keys verified, jump hosts as listed; this tree "
        "uploaded); run dirs under its runs root. '' = this machine's Slurm."
    ),
}

# How each option reads in `launch BACKEND --help` and completes: (group, metavar or the choices,
# completion). The value is still read by the option's own parser (launchers.spec): help and
# completion only show it.
GROUPS = ("Targets", "Slurm", "SSH", "Job shape", "Run", "Recovery", "Container", "Diagnosis")
_N, _SEC = "INTEGER", "SECONDS"
LOOK: dict[str, tuple[str, str | tuple[str, ...], str]] = {
    "nodes": ("Job shape", "N|MIN:MAX", ""),
    "gpus_per_node": ("Job shape", _N, ""),
    "dist_backend": ("Job shape", ("auto", "gloo", "nccl"), ""),
    "cpu_bind": ("Job shape", ("auto", "none", "numa", "cores"), ""),
    "master_port": ("Job shape", _N, ""),
    "python": ("Job shape", "PATH", "file"),
    "run_dir": ("Run", "DIR", "dir"),
    "name": ("Run", "NAME", ""),
    "profile": ("Run", "FILE", "profile"),
    "env": ("Run", "K=V", ""),
    "forward_env": ("Run", "GLOB", ""),
    "secrets": ("Run", "NAME[=@FILE]", ""),
    "nccl_preset": ("Run", "PRESET[,PRESET]", ""),
    "snapshot": ("Run", "", ""),
    "stop_signal": ("Run", ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"), ""),
    "stop_grace": ("Run", _SEC, ""),
    "dry_run": ("Run", "", ""),
    "json": ("Run", "", ""),
    "sweep": ("Run", "KEY=V1,V2", ""),
    "max_restarts": ("Recovery", _N, ""),
    "spares": ("Recovery", _N, ""),
    "quarantine_after": ("Recovery", _N, ""),
    "max_restarts_per_hour": ("Recovery", _N, ""),
    "node_ledger": ("Recovery", "FILE", "file"),
    "memory_checkpoint": ("Recovery", "", ""),
    "warm_spares": ("Recovery", "", ""),
    "memory_checkpoint_every": ("Recovery", _N, ""),
    "container_image": ("Container", "IMAGE", ""),
    "container_mounts": ("Container", "SRC:DST[:ro]", ""),
    "container_runtime": ("Container", ("auto", "pyxis", "apptainer", "podman", "oci"), ""),
    "container_python": ("Container", "PATH", ""),
    "preflight": ("Diagnosis", ("gpu",), ""),
    "hang_timeout": ("Diagnosis", _SEC, ""),
    "notify": ("Diagnosis", "URL|COMMAND", ""),
    "hosts": ("SSH", "HOST[,HOST...]", ""),
    "hostfile": ("SSH", "FILE", "file"),
    "ssh_config": ("SSH", "FILE", "file"),
    "known_hosts": ("SSH", "FILE", "file"),
    "identity": ("SSH", "FILE", "file"),
    "connect_timeout": ("SSH", _SEC, ""),
    "shared_storage": ("SSH", "", ""),
    "staging_dir": ("SSH", "DIR", ""),
    "partition": ("Slurm", "NAME", ""),
    "time": ("Slurm", "[D-]H:M:S", ""),
    "account": ("Slurm", "NAME", ""),
    "qos": ("Slurm", "NAME", ""),
    "constraint": ("Slurm", "FEATURES", ""),
    "exclusive": ("Slurm", "", ""),
    "mem": ("Slurm", "SIZE", ""),
    "mem_per_gpu": ("Slurm", "SIZE", ""),
    "cpus_per_task": ("Slurm", _N, ""),
    "cpus_per_gpu": ("Slurm", _N, ""),
    "sbatch_args": ("Slurm", "OPTION", ""),
    "setup": ("Slurm", "LINE", ""),
    "signal_seconds": ("Slurm", _N, ""),
    "max_requeues": ("Slurm", _N, ""),
    "wait": ("Slurm", "", ""),
    "after": ("Slurm", "RUN|JOBID[:TYPE]", "run"),
    "max_parallel": ("Slurm", _N, ""),
    "cluster": ("Slurm", "NAME", ""),
    "sbatch_lines": ("Slurm", "", ""),
    "job_name": ("Slurm", "", ""),
}
