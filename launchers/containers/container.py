"""The one place a node's command meets a container runtime (the options:
launchers.containers.containeropts). Pure: no I/O.

Every backend calls wrap() on the torchrun builder's NodeCommand (backends.base.node_commands, the
Slurm node task's slurm_node_command) and the Slurm renderer calls srun_args(); no backend knows
which runtime is in use. Inside any container:
- the run dir and the launch dir are mounted at the same paths (LAUNCH_RUN_DIR, checkpoints and
  relative program paths mean the same inside), the launch dir is the working directory;
- the launchers package is mounted read-only at /opt/launchers/launchers and /opt/launchers leads
  PYTHONPATH, so the torchrun agent's rank wrapper (launchers.rankexec) and a Slurm step's node task
  run inside from the same code;
- the agent runs with the image's interpreter (--container-python, default python3);
- every variable of the node command (ranks, ports, LAUNCH_*, MASTER_*, NCCL_*, --env, --secret)
  reaches the program by name, never by value on a command line: podman `--env NAME` (the value from
  podman's own environment), apptainer `APPTAINERENV_NAME` in the environment, pyxis
  `--container-env NAME`;
- the node's GPUs, with --dist-backend nccl and with auto (decided on each node by its rank wrapper,
  inside the container: launchers.nodebackend, so the GPUs must be there to be found), each local
  rank then taking the LOCAL_RANK-th visible one: podman CDI `--device nvidia.com/gpu=all` (auto:
  only where the node has a CDI spec of NVIDIA GPUs, decided by the node's shell as the agent
  starts), apptainer `--nv`, pyxis and Slurm OCI NVIDIA_VISIBLE_DEVICES=all (enroot's hook,
  nvidia-container-runtime); CUDA_VISIBLE_DEVICES (Slurm's GPU binding sets it per step) passes by
  name where the node has it: podman `--env CUDA_VISIBLE_DEVICES`, pyxis `--container-env`,
  apptainer and Slurm OCI the step's environment as it is.
"""

from __future__ import annotations

import os
import shlex
import signal

from ..spec import RunSpec
from ..torchrun import NodeCommand
from .containeropts import BINARIES, SIGNAL_EXIT_BASE, WRAPS, Limits, check_mount_path

# this launchers package, mounted into every container
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_AT = "/opt/launchers"  # ... at PACKAGE_AT/launchers (PACKAGE_AT on PYTHONPATH)
GPU_BACKENDS = ("nccl", "auto")  # LAUNCH_DIST_BACKEND values whose container gets the node's GPUs
# every NVIDIA GPU of the node's CDI spec (`nvidia-ctk cdi generate`)
CDI_GPUS = "nvidia.com/gpu=all"
# podman refuses a CDI device no spec resolves ("unresolvable CDI devices"), so with auto the node's
# own shell adds it only where a spec of NVIDIA GPUs is in podman's CDI dirs (containers.conf
# cdi_spec_dirs: /etc/cdi, /var/run/cdi): a node without GPUs runs the same command without it (its
# ranks then decide gloo). The command is built on the submitting side for an SSH node, so the
# node's shell is where this is known.
CDI_PROBE = (
    "if grep -qs nvidia.com/gpu /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml "
    "/var/run/cdi/*.json; "
    f'then set -- --device {CDI_GPUS} "$@"; fi; exec podman run "$@"'
)


def in_container(spec: RunSpec) -> bool:
    return bool(spec.container_image)


def mounts(spec: RunSpec, package: str = PACKAGE_DIR) -> list[tuple[str, str, bool]]:
    """(source, destination, read-only): the run dir, the launch dir, launchers, then
    --container-mount's; a destination given twice keeps its first source; a parent before what is
    mounted below it (pyxis/enroot mount in the order given). LaunchError (one line) for a path the
    runtime's mount option cannot take (containeropts.check_mount_path): a run dir with ':' is
    refused here, before anything starts, never by the runtime on a node."""
    out = [
        (spec.run_dir, spec.run_dir, False),
        (spec.container_workdir, spec.container_workdir, False),
        (package, f"{PACKAGE_AT}/launchers", True),
    ]
    what = [
        "the run dir",
        "the launch dir (the container's working directory)",
        "the launchers package",
    ]
    if spec.torch_extensions_dir:  # the extensions built once per image (launchers.frozen.extcache)
        out.append((spec.torch_extensions_dir, spec.torch_extensions_dir, False))
        what.append("the torch extensions dir")
    for m in spec.container_mounts:
        src, dst, *flags = m.split(":")
        out.append((src, dst, flags == ["ro"]))
        what.append(f"--container-mount {m!r}: the path")
    for (src, dst, _), label in zip(out, what):
        for path in dict.fromkeys((src, dst)):
            check_mount_path(path, label, spec.container_runtime)
    seen: set[str] = set()
    out = [m for m in out if not (m[1] in seen or seen.add(m[1]))]
    return sorted(out, key=lambda m: m[1].rstrip("/").count("/"))


def inner_env(nc: NodeCommand) -> dict[str, str]:
    """The node command's environment as the container needs it: launchers first on PYTHONPATH."""
    env = nc.env_dict
    env["PYTHONPATH"] = PACKAGE_AT + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
    return env


def podman_name(run_id: str, node: int) -> str:
    """One container per run and node: `podman rm -f` finds it after a cancel or a SIGKILLed
    agent."""
    return f"{run_id}-node{node}"


def _podman(
    spec: RunSpec, nc: NodeCommand, env: dict[str, str], run_id: str, package: str, limits: Limits
) -> list[str]:
    # podman run(1): --rm removes it when the agent ends; --replace removes a same-named leftover of
    # an earlier attempt (a SIGKILLed agent); --runtime runc (crun refuses a hybrid cgroup layout);
    # --network/--ipc host: the rendezvous port and NCCL's shared memory as on the host; --pid host:
    # the pids the rank wrappers record and the hang monitor's py-spy reads are the host's, the
    # tagged sweep finds every process, the agent is no PID 1 (podman passes the signals it gets on:
    # --sig-proxy, the default); --ulimit NAME=N:N: the host's limits as read where the command is
    # built (containeropts.host_limits; podman's own defaults, 1048576, and `--ulimit host` are
    # refused by runc where podman cannot raise a limit); --env NAME: the value from podman's own
    # environment. GPUs: CDI (the host ran `nvidia-ctk cdi generate`); nccl asks for them (a node
    # without fails, as it should), auto through CDI_PROBE (sh -c SCRIPT podman ARGS: the node's
    # shell adds them where a spec exists, then execs podman in its place: the same pid, signals and
    # exit status); CUDA_VISIBLE_DEVICES by name (podman sets it only where the node's environment
    # has it: Slurm's GPU binding, a user's choice).
    backend = env.get("LAUNCH_DIST_BACKEND")
    words = ["sh", "-c", CDI_PROBE, "podman"] if backend == "auto" else ["podman", "run"]
    words += [
        "--rm",
        "--replace",
        "--runtime",
        "runc",
        "--network",
        "host",
        "--ipc",
        "host",
        "--pid",
        "host",
        "--name",
        podman_name(run_id, nc.node_rank),
    ]
    for name, n in limits:
        words += ["--ulimit", f"{name}={n}:{n}"]
    if backend == "nccl":
        words += ["--device", CDI_GPUS]
    for src, dst, ro in mounts(spec, package):
        words += ["-v", f"{src}:{dst}" + (":ro" if ro else "")]
    gpu_names = (
        ["CUDA_VISIBLE_DEVICES"]
        if backend in GPU_BACKENDS and "CUDA_VISIBLE_DEVICES" not in env
        else []
    )
    for name in [*env, *gpu_names]:
        words += ["--env", name]
    return words + ["-w", spec.container_workdir, spec.container_image]


def _apptainer(
    spec: RunSpec, nc: NodeCommand, env: dict[str, str], run_id: str, package: str, limits: Limits
) -> list[str]:
    # apptainer exec: the host's environment passes in, but a variable the image sets wins over the
    # host's (apptainer-userdocs environment_and_metadata.rst, "Environment from the host");
    # APPTAINERENV_NAME wins over the image ("Environment Variable Precedence"), so wrap() adds one
    # for each variable. --nv: the host's NVIDIA driver and GPUs, with nccl and auto: on a node
    # without them apptainer says "Could not find any nv files on this host!" and goes on
    # (apptainer-userdocs gpu.rst), so auto needs no node-side choice; the host's
    # CUDA_VISIBLE_DEVICES passes in with the rest of its environment (no --cleanenv); the host's
    # network, IPC and PID namespaces are shared by default.
    binds = ",".join(
        f"{src}:{dst}" + (":ro" if ro else "") for src, dst, ro in mounts(spec, package)
    )
    nv = ["--nv"] if env.get("LAUNCH_DIST_BACKEND") in GPU_BACKENDS else []
    return [
        "apptainer",
        "exec",
        *nv,
        "--bind",
        binds,
        "--pwd",
        spec.container_workdir,
        spec.container_image,
    ]


NODE_WRAPPERS = {"podman": _podman, "apptainer": _apptainer}
ENV_PREFIX = {"apptainer": "APPTAINERENV_"}  # variables the runtime reads from its own environment


def wrap(
    spec: RunSpec, nc: NodeCommand, run_id: str, package: str = PACKAGE_DIR, limits: Limits = ()
) -> NodeCommand:
    """The node command as it runs with spec's container: unchanged without one; the image's
    interpreter and launchers on PYTHONPATH inside; for a node runtime (podman, apptainer), its
    command line in front; limits: the node's resource limits for podman's --ulimit
    (containeropts.host_limits, read by the caller)."""
    if not in_container(spec):
        return nc
    env = inner_env(nc)
    argv = (spec.container_python, *nc.argv[1:])  # argv[0]: the builder's interpreter
    runtime, secret = spec.container_runtime, nc.secret
    if WRAPS[runtime] == "node":
        argv = (*NODE_WRAPPERS[runtime](spec, nc, env, run_id, package, limits), *argv)
    prefix = ENV_PREFIX.get(runtime)
    if prefix:
        env.update({prefix + k: v for k, v in list(env.items())})
        secret = (*secret, *(prefix + k for k in nc.secret_env()))
    return NodeCommand(node_rank=nc.node_rank, argv=argv, env=tuple(env.items()), secret=secret)


SIGNALS = frozenset(int(s) for s in signal.Signals)


def agent_code(spec: RunSpec, code: int | None) -> int | None:
    """A node agent's exit as Popen reports it (-N: signal N ended it) through the job's runtime: a
    podman client's 128 + N (its container's agent ended by signal N: SIGNAL_EXIT_BASE) is -N; any
    other code as given."""
    base = SIGNAL_EXIT_BASE.get(spec.container_runtime) if in_container(spec) else None
    if base is None or code is None or code - base not in SIGNALS:
        return code
    return base - code


# -------------------------------------------------------------------------------------- Slurm steps


def pyxis_name(spec: RunSpec) -> str:
    """One pyxis container per run (its run dir's name): pyxis imports the image on a node once and
    reuses the named container for every later step there -- a requeued attempt, a resume
    (NVIDIA/pyxis README: --container-name; container_scope=job in pyxis's plugstack config ends it
    with the job)."""
    return "launch-" + os.path.basename(spec.run_dir.rstrip("/"))


def srun_args(
    spec: RunSpec, secret_names: tuple[str, ...] = (), package: str = PACKAGE_DIR
) -> list[str]:
    """srun's own flags for a step runtime (pyxis, oci): the node task and all it starts run inside;
    [] for the others (the node task wraps its agent: wrap()) and without a container."""
    if not in_container(spec) or WRAPS[spec.container_runtime] != "step":
        return []
    # nccl, or auto: decided on each node, inside (launchers.nodebackend)
    gpus = spec.dist_backend != "gloo"
    # Slurm's OCI support: the bundle's config.json has the mounts, oci.conf the runtime
    if spec.container_runtime == "oci":
        # slurmstepd gives the bundle's process the step's environment (its CUDA_VISIBLE_DEVICES
        # included), not the image's: NVIDIA_VISIBLE_DEVICES=all is what an oci.conf runtime such as
        # nvidia-container-runtime acts on to bring the GPUs in (runc ignores it).
        return [
            f"--container={spec.container_image}",
            f"--export=ALL,PYTHONPATH={PACKAGE_AT}"
            + (",NVIDIA_VISIBLE_DEVICES=all" if gpus else ""),
        ]
    # pyxis (NVIDIA/pyxis README, args.c): --container-mounts SRC:DST[:FLAGS] joined by ',' (flags
    # by '+'); --container-env NAME,...: these host values win over the image's (by default an
    # image's value wins); GPUs and /dev/infiniband come through enroot's hooks (98-nvidia.sh,
    # 99-mellanox.sh), which act on NVIDIA_VISIBLE_DEVICES / MELLANOX_VISIBLE_DEVICES: set to all
    # unless the job runs gloo (with auto too: a node then needs enroot's nvidia-container-cli,
    # which a GPU partition has). CUDA_VISIBLE_DEVICES, Slurm's per-step GPU binding, crosses by
    # name (pyxis: a name the host lacks leaves the image's value, if any).
    gpu = {"NVIDIA_VISIBLE_DEVICES": "all", "MELLANOX_VISIBLE_DEVICES": "all"} if gpus else {}
    exported = {"PYTHONPATH": PACKAGE_AT, **gpu}
    crossing = [*exported, *(["CUDA_VISIBLE_DEVICES"] if gpus else []), *sorted(set(secret_names))]
    return [
        f"--container-image={spec.container_image}",
        "--container-mounts="
        + ",".join(f"{s}:{d}" + (":ro" if ro else "") for s, d, ro in mounts(spec, package)),
        f"--container-workdir={spec.container_workdir}",
        f"--container-name={pyxis_name(spec)}",
        "--container-env=" + ",".join(crossing),
        "--export=" + ",".join(["ALL", *(f"{k}={v}" for k, v in exported.items())]),
    ]


def step_cwd(spec: RunSpec) -> str | None:
    """Where a Slurm step's node task starts its agent: the launch dir in Slurm's OCI container,
    whose process runs in its bundle's process.cwd ("/"), never srun's (slurmstepd rewrites the
    bundle's args, env and root, not its cwd: slurm-22-05-8-1
    src/slurmd/slurmstepd/container.c:255-466); None elsewhere (srun's cwd, pyxis's
    --container-workdir)."""
    return (
        spec.container_workdir if in_container(spec) and spec.container_runtime == "oci" else None
    )


def step_python(spec: RunSpec) -> str:
    """The interpreter of a Slurm step's node task: the image's when the step runs in the
    container."""
    return (
        spec.container_python
        if in_container(spec) and WRAPS[spec.container_runtime] == "step"
        else spec.python
    )


# ------------------------------------------------------------------------------------------ cleanup


def cleanup_argv(spec: RunSpec, run_id: str, node: int) -> list[str] | None:
    """What removes node's container after a cancel or a SIGKILLed agent (run on that node; a
    container already gone is not an error), or None when nothing outlives the agent (apptainer's
    processes are the host's, Slurm ends a step's pyxis/OCI container with the step)."""
    if not in_container(spec) or spec.container_runtime != "podman":
        return None
    return ["podman", "rm", "--force", "--ignore", "--time", "0", podman_name(run_id, node)]


def cleanup_line(spec: RunSpec, run_id: str, node: int) -> str:
    """cleanup_argv as `; ARGV` to append to a shell line on that node, its output dropped ("" when
    there is nothing to remove)."""
    argv = cleanup_argv(spec, run_id, node)
    return "" if argv is None else f"; {shlex.join(argv)} >/dev/null 2>&1"


def host_check(spec: RunSpec) -> dict[str, list[str]]:
    """What a node's preflight (launchers.node.nodecheck CHECK) looks for when the job runs in a
    container: the runtime on PATH and launchers (its host agent); not torch nor the program (the
    image has them: looking a module up on the host would import its packages there)."""
    if not in_container(spec):
        return {}
    return {
        "modules": ["launchers"],
        "binaries": list(BINARIES[spec.container_runtime]),
        "program": [],
    }
