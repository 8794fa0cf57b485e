"""RunSpec: the frozen description of one job as resolved and recorded (run.yaml; the API's request
is request.JobSpec), built from a YAML profile with CLI flags layered on top. Everything is
validated here, before any backend starts."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import cpubind, layout
from .containers import containeropts
from .credentials import secretenv
from .errors import LaunchError
from .frozen import snapshot
from .ledgers import siteledger
from .node.memstore import fields as memory_fields
from .options.notifytarget import parse_targets
from .options.profiles import load_profile
from .options.specvalues import (
    DIST_BACKENDS,
    check_choice,
    check_name,
    check_program_words,
    check_python,
    default_name,
    parse_env,
    parse_forward_env,
    parse_port,
    parse_preflight,
    parse_program,
    parse_seconds,
    parse_stop_signal,
    positive_int,
)
from .resilience import recoveryopts
from .runopts import BACKENDS

MAX_NODES = recoveryopts.MAX_NODES  # --nodes, the hosts of a hostfile
MAX_PER_NODE = 1024  # --gpus-per-node, a hostfile's slots=


@dataclass(frozen=True)
class RunSpec:
    backend: str
    nodes: int
    gpus_per_node: int
    program: tuple[str, ...]  # ("-m", "pkg.mod") or ("/abs/path/train.py",)
    program_args: tuple[str, ...]  # passed verbatim
    run_dir: str  # absolute
    name: str
    env: tuple[tuple[str, str], ...] = ()
    nccl_preset: str = ""
    nccl_env: tuple[tuple[str, str], ...] = ()
    master_port: int | None = None
    max_restarts: int = 0
    # --max-restarts-per-hour (0: no hourly limit; launchers.resilience.recovery)
    max_restarts_per_hour: int = 0
    spares: int = 0  # --spares: idle node slots a failed node is replaced by (recovery)
    min_nodes: int = 0  # --nodes MIN:MAX: the run may shrink to MIN nodes (0: no range)
    max_nodes: int = 0  # ... and grows back to MAX (nodes: this attempt's count)
    quarantine_after: int = 2  # --quarantine-after: strikes that quarantine a node slot
    # --node-ledger: the site's ledger (launchers.ledgers.siteledger; "" = none)
    node_ledger: str = ""
    avoid_hosts: tuple[str, ...] = ()  # its quarantined hosts when the run started: not used
    dist_backend: str = "auto"
    python: str = field(default_factory=lambda: sys.executable)
    options: tuple[tuple[str, Any], ...] = ()  # backend-specific, declared in launchers.runopts
    # globs of the caller's variables passed on (launchers.jobenv)
    forward_env: tuple[str, ...] = ()
    # seconds without progress of any rank = a hang (launchers.hang)
    hang_timeout: float | None = None
    stop_grace: float = 30.0  # seconds a stopped program has before SIGKILL (launchers.rankexec)
    # what a program gets on a stop that is not Ctrl-C (launchers.rankexec)
    stop_signal: str = "SIGTERM"
    cpu_bind: str = "auto"  # each local rank's CPUs (launchers.cpubind, applied by rankexec)
    # checks on every node before the start (launchers.doctor.preflight)
    preflight: tuple[str, ...] = ()
    # --notify URL|COMMAND: told of each change of state (launchers.records.notify)
    notify: tuple[str, ...] = ()
    explicit: tuple[str, ...] = ()  # shape fields the user set (a backend may default the others)
    # --secret: name -> reference, never a value (secretenv.resolve)
    secrets: tuple[tuple[str, str], ...] = ()
    # --container-image ("" = no container; launchers.containers.containeropts)
    container_image: str = ""
    # resolved: pyxis | oci | podman | apptainer (launchers.containers.container)
    container_runtime: str = ""
    container_mounts: tuple[str, ...] = ()  # SRC:DST[:ro], SRC absolute
    container_python: str = ""  # the image's interpreter (runs the agent and the program)
    container_workdir: str = ""  # the launch dir: mounted at the same path, the program's cwd
    snapshot: str = ""  # --snapshot: the store of the run's snapshots ("" = none)
    snapshot_dir: str = ""  # the snapshot the ranks run from (launchers.frozen.snapshot.take)
    snapshot_from: str = ""  # the tree it was taken from (a program file's path maps into it)
    # every rank's TORCH_EXTENSIONS_DIR (launchers.frozen.extcache; "": theirs)
    torch_extensions_dir: str = ""
    # --memory-checkpoint: every M steps in host memory (-1: auto, 0: off; memstore)
    memory_checkpoint: int = 0

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def opts(self) -> dict[str, Any]:
        return dict(self.options)

    def replace(self, **changes: Any) -> "RunSpec":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data holding no secret value (secretenv.without_values): what records,
        the dry-run and other processes get; a process that needs the values gets them by
        secretenv.handover."""
        d = dataclasses.asdict(self)
        d["program"] = list(self.program)
        d["program_args"] = list(self.program_args)
        d["env"] = dict(self.env)
        d["nccl_env"] = dict(self.nccl_env)
        d["options"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.options}
        for key in (
            "explicit",
            "forward_env",
            "preflight",
            "notify",
            "container_mounts",
            "avoid_hosts",
        ):
            d[key] = list(getattr(self, key))
        d["secrets"] = dict(self.secrets)
        return secretenv.without_values(d, secretenv.resolve(self.secrets, os.environ))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise LaunchError(f"run.yaml spec has unknown key {unknown[0]!r}")
        d = dict(d)
        d["program"] = tuple(d["program"])
        d["program_args"] = tuple(d.get("program_args") or ())
        d["env"] = tuple((d.get("env") or {}).items())
        d["nccl_env"] = tuple((d.get("nccl_env") or {}).items())
        d["options"] = _freeze_options(d.get("options") or {})
        for key in (
            "explicit",
            "forward_env",
            "preflight",
            "notify",
            "container_mounts",
            "avoid_hosts",
        ):
            d[key] = tuple(d.get(key) or ())
        # name -> reference (run.yaml: the names only: each from the environment)
        sec = d.get("secrets") or {}
        refs = sec.items() if isinstance(sec, Mapping) else ((k, secretenv.ENV_REF) for k in sec)
        d["secrets"] = tuple(
            (k, r if isinstance(r, str) and r.startswith("@") else secretenv.ENV_REF)
            for k, r in refs
        )
        return cls(**d)


JobSpec = RunSpec  # its name before (the API's launchers.spec.JobSpec: Run.spec, JobSpec.resolve())


def _freeze_options(opts: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in opts.items()))


# secret values (the names given, TOKEN/KEY/SECRET/PASS names, secret-looking) -> ***
redact_env = secretenv.redact


def build_spec(
    backend: str,
    flags: Mapping[str, Any],
    program_words: list[str],
    profile: str | None = None,
    existing: bool = False,
) -> RunSpec:
    """Layer CLI `flags` (None = not given) over the profile and the defaults, validate, freeze.
    existing: the --run-dir may be an existing run dir (its run continues:
    launchers.backends.slurm.inalloc)."""
    check_choice("backend", backend, BACKENDS)
    prof = load_profile(profile) if profile else {}
    pick, said = _sources(flags, prof, profile)
    shape = _shape(backend, pick, said)
    job = _job(backend, flags, prof, profile, program_words)
    opts = _backend_options(backend, flags, prof)
    containeropts.check_warm(opts, pick("container_image"))

    name = check_name(default_name(job["program"]) if pick("name") is None else pick("name"))
    run_dir = layout.choose_run_dir(flags.get("run_dir"), name, pick("runs_root"), existing)
    snap = (
        snapshot.store_for(run_dir, layout.runs_root(pick("runs_root")))
        if pick("snapshot", backend == "slurm")
        else ""
    )
    return RunSpec(
        backend=backend,
        run_dir=run_dir,
        name=name,
        nccl_preset=str(pick("nccl_preset", "") or ""),
        **shape,
        **job,
        python=check_python(pick("python", sys.executable), backend),
        options=_freeze_options(opts),
        explicit=tuple(
            k for k in ("nodes", "gpus_per_node") if flags.get(k) is not None or k in prof
        ),
        snapshot=snap,
        **memory_fields(pick, said),
        **siteledger.fields(backend, pick("node_ledger"), said("node_ledger")),
        notify=parse_targets(
            [
                *parse_targets(prof.get("notify") or (), f"profile {profile!r}: notify"),
                *(flags.get("notify") or ()),
            ]
        ),
        **containeropts.fields(
            backend, pick, os.getcwd(), (("the run dir", run_dir), ("the snapshot", snap))
        ),
    )


def _sources(
    flags: Mapping[str, Any], prof: Mapping[str, Any], profile: str | None
) -> tuple[Callable[..., Any], Callable[[str], str]]:
    """pick(key, default): the flag's value, else the profile's, else default; said(key): who gave
    the value, as a message names it -- the flag (or its LAUNCH_* variable), else the profile."""

    def pick(key: str, default: Any = None) -> Any:
        v = flags.get(key)
        if v is not None and v != ():
            return v
        return prof.get(key, default)

    def said(key: str) -> str:
        given = flags.get(key) is not None or key not in prof
        return "--" + key.replace("_", "-") if given else f"profile {profile!r}: {key}"

    return pick, said


def _shape(backend: str, pick: Callable[..., Any], said: Callable[[str], str]) -> dict[str, Any]:
    """The RunSpec fields of the job's shape, restarts and stops, checked in this order."""
    # nodes (a range), max_restarts, spares, quarantine_after
    restarts = recoveryopts.options(backend, pick, said)
    gpn = positive_int(said("gpus_per_node"), pick("gpus_per_node", 1), maximum=MAX_PER_NODE)
    dist = check_choice(said("dist_backend"), str(pick("dist_backend", "auto")), DIST_BACKENDS)
    port = parse_port(p, said("master_port")) if (p := pick("master_port")) is not None else None
    hang = pick("hang_timeout")
    hang = parse_seconds(said("hang_timeout"), hang) if hang is not None else None
    grace = parse_seconds(said("stop_grace"), pick("stop_grace", 30))
    return dict(
        restarts,
        gpus_per_node=gpn,
        dist_backend=dist,
        master_port=port,
        hang_timeout=hang,
        stop_grace=grace,
        stop_signal=parse_stop_signal(pick("stop_signal", "SIGTERM")),
        cpu_bind=cpubind.check_mode(pick("cpu_bind", "auto"), said("cpu_bind")),
        preflight=parse_preflight(pick("preflight")),
    )


def _job(
    backend: str,
    flags: Mapping[str, Any],
    prof: Mapping[str, Any],
    profile: str | None,
    program_words: list[str],
) -> dict[str, Any]:
    """The RunSpec fields of what runs: the env (the profile's, then --env), --secret references,
    --forward-env and the program with its arguments (the words given, else the profile's)."""
    env = parse_env(prof.get("env") or {}, f"profile {profile!r}: env")
    env.update(parse_env(flags.get("env") or ()))
    secrets = secretenv.parse_secrets(
        list(prof.get("secrets") or ()) + list(flags.get("secrets") or ()), os.environ, env
    )
    forward = parse_forward_env(
        list(prof.get("forward_env") or ()) + list(flags.get("forward_env") or ())
    )
    words = list(program_words) or list(prof.get("program") or [])
    check_program_words(backend, words)
    program, args = parse_program(words, check_local=True, pythonpath=env.get("PYTHONPATH"))
    return dict(
        env=tuple(env.items()),
        secrets=tuple(secrets.items()),
        forward_env=forward,
        program=program,
        program_args=args,
    )


def _backend_options(
    backend: str, flags: Mapping[str, Any], prof: Mapping[str, Any]
) -> dict[str, Any]:
    """The backend's options: the profile's mapping, the flags given over it."""
    opts = dict(prof.get(backend) or {})
    for k, v in (flags.get("options") or {}).items():
        if v is not None and v != ():
            opts[k] = v
    return opts
