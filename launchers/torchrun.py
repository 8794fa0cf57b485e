"""The one per-node torchrun command builder, shared by every backend. Pure: no I/O, no torch.

Each worker is started through `launchers.rankexec`, which appends the rank's output to
logs/node<K>/rank<R>.log (R = global rank) and records how the rank ended in status/rank<R>.json.
torchrun runs with --max-restarts 0: restarts belong to the launcher (they start a new attempt).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Mapping

from . import layout
from .cpubind import ENV as CPU_BIND_ENV
from .credentials.secretenv import (
    NAMES_ENV,
    known_values,
    needed,
    redact_args,
    resolve,
    secret_keys,
)
from .frozen.snapshot import ENV as SNAPSHOT_ENV
from .node import memstore
from .spec import RunSpec, redact_env
from .warmfork import SOCKET_ENV as WARM_SOCKET_ENV

# Signals the agent passes on to its workers (USR2: Slurm's warning before the time limit /
# preemption).
AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"
NODE_SLOT_ENV = "LAUNCH_NODE_SLOT"  # the node slot (launchers.resilience.recovery) a node runs on


@dataclass(frozen=True)
class NodeCommand:
    node_rank: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # additions to the node's environment, in a fixed order
    # the --secret names among them (never shown, never on a command line)
    secret: tuple[str, ...] = ()

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def secret_env(self) -> dict[str, str]:
        """The secret variables (--secret, or secret by name or value:
        launchers.credentials.secretenv): never on a command line; public_env() is the rest."""
        hidden = secret_keys(self.env_dict, self.secret)
        return {k: v for k, v in self.env if k in hidden}

    def public_env(self) -> dict[str, str]:
        hidden = self.secret_env()
        return {k: v for k, v in self.env if k not in hidden}

    def shell(self, redact: bool = True) -> str:
        """The command as one POSIX shell line: `env K=V ... argv` with every word quoted.

        Secret-looking values are shown as *** unless redact=False (only for executing it).
        """
        env = redact_env(self.env_dict, self.secret) if redact else self.env_dict
        words = (
            ["env"]
            + [f"{k}={v}" for k, v in env.items()]
            + (self.shown_argv() if redact else list(self.argv))
        )
        return " ".join(shlex.quote(w) for w in words)

    def shown_argv(self) -> list[str]:
        """argv as records and dry-runs show it: the program's arguments with their credentials as
        ***."""
        argv = list(self.argv)
        if "--" in argv:
            cut = argv.index("--") + 2  # after `--` and the program
            argv[cut:] = redact_args(argv[cut:], known_values(self.env_dict, self.secret))
        return argv


def flight_recorder(run_dir: str) -> dict[str, str]:
    """PyTorch's NCCL flight recorder, on by default with --dist-backend nccl: the last 2000
    collectives per rank are kept in memory (cheap) and dumped into <run dir>/nccl/ when a
    collective times out, naming what each rank was waiting in. Off: --env
    TORCH_FR_BUFFER_SIZE=0."""
    return {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": layout.path(run_dir, "nccl_flight"),
    }


def node_command(
    spec: RunSpec,
    *,
    node_rank: int,
    master_addr: str,
    master_port: int,
    run_id: str,
    attempt: int,
    dist_backend: str = "gloo",
    one_machine: bool = False,
    slot: int | None = None,
    warm: str | None = None,
) -> NodeCommand:
    """one_machine: every node runs on this machine (the local backend): the CPU plan is made for
    all the machine's ranks and each node's ranks take their slots of it (LAUNCH_CPU_BIND_SLOT:
    first/all). slot: the node slot of the run's pool it runs on (LAUNCH_NODE_SLOT; stable across
    attempts, unlike NODE_RANK). warm: the node slot's zygote socket (--warm-spares): the agent and
    the programs are forked from it (launchers.warmfork)."""
    argv = agent_argv(spec, node_rank, master_addr, master_port)
    env = job_env(spec, dist_backend)
    env.update(
        {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "NODE_RANK": str(node_rank),
            "NNODES": str(spec.nodes),
            **({NODE_SLOT_ENV: str(slot)} if slot is not None else {}),
            "LAUNCH_RUN_DIR": spec.run_dir,
            "LAUNCH_RUN_ID": run_id,
            "LAUNCH_CHECKPOINT_DIR": layout.path(spec.run_dir, "checkpoints"),
            "LAUNCH_ATTEMPT": str(attempt),
            "LAUNCH_DIST_BACKEND": dist_backend,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(wrapper_env(spec, node_rank, one_machine))
    # --memory-checkpoint
    env.update(memstore.worker_env(spec.memory_checkpoint, run_id, slot, one_machine))
    if spec.snapshot_dir:  # the rank wrapper runs the program there (--snapshot)
        env[SNAPSHOT_ENV] = spec.snapshot_dir
    if warm:
        argv = (spec.python, "-m", "launchers.warmfork", "--", *argv)
        env[WARM_SOCKET_ENV] = warm
    return NodeCommand(
        node_rank=node_rank,
        argv=argv,
        env=tuple(env.items()),
        secret=tuple(k for k, _ in spec.secrets),
    )


def agent_argv(
    spec: RunSpec, node_rank: int, master_addr: str, master_port: int
) -> tuple[str, ...]:
    """The node's torchrun agent, each rank run by the rank wrapper (launchers.rankexec)."""
    return (
        spec.python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(spec.nodes),
        "--nproc-per-node",
        str(spec.gpus_per_node),
        "--node-rank",
        str(node_rank),
        "--master-addr",
        master_addr,
        "--master-port",
        str(master_port),
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        "--signals-to-handle",
        AGENT_SIGNALS,
        "-m",
        "launchers.rankexec",
        "--",
        *snapshot_program(spec),
        *spec.program_args,
    )


def job_env(spec: RunSpec, dist_backend: str) -> dict[str, str]:
    """The job's own environment: defaults, NCCL's (its flight recorder on nccl, the preset's), the
    extension cache, then the user's --env (it wins over presets and defaults), then --secret's
    values (in the agent's environment, never on its command line)."""
    env: dict[str, str] = {"OMP_NUM_THREADS": "1"}
    if dist_backend == "nccl":
        env.update(flight_recorder(spec.run_dir))
    env.update(dict(spec.nccl_env))
    if spec.torch_extensions_dir:  # built once per environment, shared (launchers.frozen.extcache)
        env["TORCH_EXTENSIONS_DIR"] = env["LAUNCH_TORCH_EXTENSIONS_DIR"] = spec.torch_extensions_dir
    env.update(dict(spec.env))
    env.update(resolve(spec.secrets, os.environ))
    return env


def wrapper_env(spec: RunSpec, node_rank: int, one_machine: bool) -> dict[str, str]:
    """What the rank wrapper and the agent are told: the stop's grace and signal, the CPU binding
    (one_machine: this node's slots of the machine's plan), the secrets each wrapper checks, the
    hang monitor's timeout."""
    env = {
        "LAUNCH_STOP_GRACE": f"{spec.stop_grace:g}",  # the rank wrapper's grace after a stop
        # the agent's: longer, so the wrapper records it
        "PET_SHUTDOWN_TIMEOUT": str(int(spec.stop_grace) + 10),
        "LAUNCH_STOP_SIGNAL": spec.stop_signal,  # the rank wrapper passes a SIGTERM on as this one
        CPU_BIND_ENV: spec.cpu_bind,  # the rank wrapper binds each rank from its node's topology
    }
    if one_machine and spec.nodes > 1:
        env[CPU_BIND_ENV + "_SLOT"] = f"{node_rank * spec.gpus_per_node}/{spec.world_size}"
    # each rank's wrapper checks them
    if names := needed(dict(spec.env), (k for k, _ in spec.secrets)):
        env[NAMES_ENV] = ",".join(names)
    if spec.hang_timeout is not None:  # the node's hang monitor (launchers.remote) reads it
        env["LAUNCH_HANG_TIMEOUT"] = f"{spec.hang_timeout:g}"
    return env


def snapshot_program(spec: RunSpec) -> tuple[str, ...]:
    """The program as the ranks run it: a file of the tree is its copy in the snapshot
    (--snapshot)."""
    if not spec.snapshot_dir or spec.program[0] == "-m":
        return spec.program
    return (os.path.join(spec.snapshot_dir, os.path.relpath(spec.program[0], spec.snapshot_from)),)


def node_environ(inherited: Mapping[str, str], nc: NodeCommand) -> dict[str, str]:
    """The environment a node's agent starts with: what it inherits, less the NCCL_* variables the
    job was not given (the caller's are passed on only through --forward-env, validated:
    launchers.jobenv), plus the node command's own."""
    own = nc.env_dict
    return {**{k: v for k, v in inherited.items() if not k.startswith("NCCL_") or k in own}, **own}
