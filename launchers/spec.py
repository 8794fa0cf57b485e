"""RunSpec: the frozen description of one job as resolved and recorded (run.yaml; the API's request is request.JobSpec),
built from a YAML profile with CLI flags layered on top. Everything is validated here, before any backend starts."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import containeropts, cpubind, layout, recoveryopts, sbatchopts, secretenv, siteledger, snapshot, values
from .errors import LaunchError, brief
from .memstore import fields as memory_fields
from .notifytarget import parse_targets
from .runopts import BACKEND_OPTIONS, BACKENDS, COMMON, PROFILE_KEYS, cli_flags

DIST_BACKENDS = ("auto", "gloo", "nccl")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_NODES = recoveryopts.MAX_NODES      # --nodes, the hosts of a hostfile
MAX_PER_NODE = 1024                 # --gpus-per-node, a hostfile's slots=
MAX_NAME = 200                      # --name: a run dir's name adds -<time>-<random> (NAME_MAX is 255)

@dataclass(frozen=True)
class RunSpec:
    backend: str
    nodes: int
    gpus_per_node: int
    program: tuple[str, ...]          # ("-m", "pkg.mod") or ("/abs/path/train.py",)
    program_args: tuple[str, ...]     # passed verbatim
    run_dir: str                      # absolute
    name: str
    env: tuple[tuple[str, str], ...] = ()
    nccl_preset: str = ""
    nccl_env: tuple[tuple[str, str], ...] = ()
    master_port: int | None = None
    max_restarts: int = 0
    max_restarts_per_hour: int = 0              # --max-restarts-per-hour (0: no hourly limit; launchers.recovery)
    spares: int = 0                             # --spares: idle node slots a failed node is replaced by (recovery)
    min_nodes: int = 0                          # --nodes MIN:MAX: the run may shrink to MIN nodes (0: no range)
    max_nodes: int = 0                          # ... and grows back to MAX (nodes: this attempt's count)
    quarantine_after: int = 2                   # --quarantine-after: strikes that quarantine a node slot
    node_ledger: str = ""                       # --node-ledger: the site's ledger (launchers.siteledger; "" = none)
    avoid_hosts: tuple[str, ...] = ()           # its quarantined hosts when the run started: not used
    dist_backend: str = "auto"
    python: str = field(default_factory=lambda: sys.executable)
    options: tuple[tuple[str, Any], ...] = ()   # backend-specific, declared in launchers.runopts
    forward_env: tuple[str, ...] = ()           # globs of the caller's variables passed on (launchers.jobenv)
    hang_timeout: float | None = None           # seconds without progress of any rank = a hang (launchers.hang)
    stop_grace: float = 30.0                    # seconds a stopped program has before SIGKILL (launchers.rankexec)
    stop_signal: str = "SIGTERM"                # what a program gets on a stop that is not Ctrl-C (launchers.rankexec)
    cpu_bind: str = "auto"                      # each local rank's CPUs (launchers.cpubind, applied by rankexec)
    preflight: tuple[str, ...] = ()             # checks on every node before the start (launchers.doctor.preflight)
    notify: tuple[str, ...] = ()                # --notify URL|COMMAND: told of each change of state (launchers.notify)
    explicit: tuple[str, ...] = ()              # shape fields the user set (a backend may default the others)
    secrets: tuple[tuple[str, str], ...] = ()   # --secret: name -> reference, never a value (secretenv.resolve)
    container_image: str = ""                   # --container-image ("" = no container; launchers.containeropts)
    container_runtime: str = ""                 # resolved: pyxis | oci | podman | apptainer (launchers.container)
    container_mounts: tuple[str, ...] = ()      # SRC:DST[:ro], SRC absolute
    container_python: str = ""                  # the image's interpreter (runs the agent and the program)
    container_workdir: str = ""                 # the launch dir: mounted at the same path, the program's cwd
    snapshot: str = ""                          # --snapshot: the store of the run's snapshots ("" = none)
    snapshot_dir: str = ""                      # the snapshot the ranks run from (launchers.snapshot.take)
    snapshot_from: str = ""                     # the tree it was taken from (a program file's path maps into it)
    torch_extensions_dir: str = ""              # every rank's TORCH_EXTENSIONS_DIR (launchers.extcache; "": theirs)
    memory_checkpoint: int = 0                  # --memory-checkpoint: every M steps in host memory (0: off; memstore)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def opts(self) -> dict[str, Any]:
        return dict(self.options)

    def replace(self, **changes: Any) -> "RunSpec":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data holding no secret value (secretenv.without_values): what records, the dry-run
        and other processes get; a process that needs the values gets them by secretenv.handover."""
        d = dataclasses.asdict(self)
        d["program"] = list(self.program)
        d["program_args"] = list(self.program_args)
        d["env"] = dict(self.env)
        d["nccl_env"] = dict(self.nccl_env)
        d["options"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.options}
        for key in ("explicit", "forward_env", "preflight", "notify", "container_mounts", "avoid_hosts"):
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
        for key in ("explicit", "forward_env", "preflight", "notify", "container_mounts", "avoid_hosts"):
            d[key] = tuple(d.get(key) or ())
        sec = d.get("secrets") or {}         # name -> reference (run.yaml: the names only: each from the environment)
        refs = sec.items() if isinstance(sec, Mapping) else ((k, secretenv.ENV_REF) for k in sec)
        d["secrets"] = tuple((k, r if isinstance(r, str) and r.startswith("@") else secretenv.ENV_REF) for k, r in refs)
        return cls(**d)


JobSpec = RunSpec      # its name before (the API's launchers.spec.JobSpec: Run.spec, JobSpec.resolve())

def _freeze_options(opts: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in opts.items()))


redact_env = secretenv.redact      # secret values (the names given, TOKEN/KEY/SECRET/PASS names, secret-looking) -> ***


# ---------------------------------------------------------------- parsing helpers (each raises LaunchError)

def load_profile(path: str) -> dict[str, Any]:
    """Read a YAML profile (launchers.values.profile_loader: the safe subset, a number kept as its text, a key
    given twice refused); unknown keys and python tags are errors; each value read by its option's parser."""
    expected = "a UTF-8 YAML mapping of profile keys"
    data = values.read_yaml_file(path, "profile", expected)      # yaml imported there: not on a node's start-up
    if data is None:
        raise LaunchError(f"profile {path!r} is empty; expected {expected}, e.g. `nodes: 2`")
    if not isinstance(data, dict):
        raise LaunchError(f"profile {path!r} must be a mapping of keys, got {type(data).__name__}")
    for key in data:
        if key not in PROFILE_KEYS:
            raise LaunchError(f"profile {path!r}: unknown key {brief(key)}; accepted: {', '.join(PROFILE_KEYS)}")
    data = check_profile_types(data, f"profile {path!r}")
    for backend in BACKENDS:
        sub = data.get(backend)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise LaunchError(f"profile {path!r}: {backend!r} must be a mapping")
        for key, val in list(sub.items()):
            opt = next((o for o in BACKEND_OPTIONS[backend] if o.key == key), None)
            if opt is None:
                accepted = ", ".join(o.key for o in BACKEND_OPTIONS[backend]) or "(none)"
                raise LaunchError(f"profile {path!r}: unknown key {backend}.{brief(key)}; accepted: {accepted}")
            sub[key] = opt.from_profile(val, f"profile {path!r}: {backend}")
    return values.plain(data)


def check_profile_types(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The common keys have the types declared in launchers.runopts; a number's text (any str) is kept for
    build_spec to read with the flag's own parser and range; `program` is a list of words."""
    data = dict(data)
    for o in COMMON:
        v = data.get(o.key)
        if o.in_profile and v is not None and not (isinstance(v, str) and {int, float} & set(o.types)):
            data[o.key] = o.from_profile(v, where)
    prog, root = values.plain(data.get("program")), data.get("runs_root")
    if prog is not None and (not isinstance(prog, list) or not all(isinstance(w, str) for w in prog)):
        raise LaunchError(f"{where}: program has a value of the wrong type: {brief(prog)}; expected a list of "
                          "words, e.g. [train.py, --lr, '3e-4'] or [-m, workloads.convnet]")
    if root is not None and not isinstance(root, str):
        raise LaunchError(f"{where}: runs_root has a value of the wrong type: {brief(root)}; expected str")
    return data


def positive_int(what: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer in [minimum, maximum], by the one integer parser (launchers.values.parse_int)."""
    return values.parse_int(what, value, minimum, maximum)


def parse_env(items: Any, what: str = "--env") -> dict[str, str]:
    """`K=V` strings (CLI) or a mapping (profile, API) -> dict; the name must be a valid variable name, the value
    hold no NUL byte, the name not be one launch sets itself (launchers.values.RESERVED_ENV)."""
    if isinstance(items, Mapping):
        pairs = [(str(k), v) for k, v in items.items()]
        for k, v in pairs:
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise LaunchError(f"{what} value of {k} must be a string, got {brief(v)}")
        pairs = [(k, str(v)) for k, v in pairs]
    else:
        pairs = []
        for item in items:
            if "=" not in item:
                raise LaunchError(f"{what} {brief(item)} is malformed; expected NAME=VALUE")
            k, v = item.split("=", 1)
            pairs.append((k, v))
    for k, v in pairs:
        if not _ENV_NAME.match(k):
            raise LaunchError(f"{what} name {brief(k)} is not a valid variable name; expected [A-Za-z_][A-Za-z0-9_]*")
        values.check_env_value(what, k, v)
    return dict(pairs)


_GLOB = re.compile(r"^[A-Za-z0-9_*?\[\]!]+$")


def parse_forward_env(globs: list[Any]) -> tuple[str, ...]:
    """--forward-env GLOB (repeatable): names of the caller's variables to pass on, e.g. 'NCCL_*'."""
    out = []
    for g in globs:
        if not isinstance(g, str) or not _GLOB.match(g):
            raise LaunchError(f"--forward-env {g!r} is not accepted; give a variable name or a glob of one, "
                              "e.g. 'NCCL_*' or 'WANDB_API_KEY'")
        if g in values.RESERVED_ENV:
            values.check_env_value("--forward-env", g, "")
        if g not in out:
            out.append(g)
    return tuple(out)


def parse_seconds(what: str, value: Any) -> float:
    """A positive, finite number of seconds (launchers.values.parse_number)."""
    accepted = "a number of seconds > 0 (e.g. 300) in plain decimal digits"
    v = values.parse_number(what, value, accepted)
    if not v > 0:
        raise LaunchError(f"{what} {brief(value)} is out of range; give {accepted}")
    return v


STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")      # the stops the rank wrapper times a grace for


def parse_stop_signal(value: Any) -> str:
    """SIGTERM / SIGINT / SIGHUP / SIGQUIT, also written TERM, int, ... (not a number)."""
    name = str(value).strip().upper() if isinstance(value, str) else ""
    name = name if name.startswith("SIG") else "SIG" + name
    if name not in STOP_SIGNALS:
        raise LaunchError(f"--stop-signal {brief(value)} is not accepted; choose one of: {', '.join(STOP_SIGNALS)}")
    return name


def parse_port(value: Any, what: str = "--master-port") -> int:
    return values.parse_int(what, value, 1024, 65535)


def parse_program(words: list[str] | tuple[str, ...], check_local: bool = True,
                  pythonpath: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`-m mod args...` or `path.py args...` -> (program, args). The program must exist here: a module is looked
    up as the workers will (the launch directory first, then the job's PYTHONPATH, else this one's path)."""
    words = list(words)
    if not words:
        raise LaunchError("missing program: give it after `--`, e.g. `-- train.py --lr 3e-4` or `-- -m workloads.convnet`")
    if words[0] == "-m" or words[0].startswith("-m") and len(words[0]) > 2:
        module = words[1] if words[0] == "-m" and len(words) > 1 else words[0][2:]
        rest = words[2:] if words[0] == "-m" else words[1:]
        if not module:
            raise LaunchError("missing module after -m")
        if check_local:
            _check_module(module, pythonpath)
        return ("-m", module), tuple(rest)
    path = words[0]
    if path.startswith("-"):
        raise LaunchError(f"program {path!r} is not a file or `-m module`")
    if check_local:
        if not os.path.isfile(path):
            raise LaunchError(f"program file {path!r} does not exist")
        path = os.path.abspath(path)
    return (path,), tuple(words[1:])


def _check_module(module: str, pythonpath: str | None = None) -> None:
    # torchrun workers run `python -m` in the launch cwd (first on sys.path), with the job's PYTHONPATH (--env /
    # profile) when it gives one: search those before this process's own path.
    extra = [os.getcwd(), *(os.path.abspath(p) for p in (pythonpath or "").split(os.pathsep) if p)]
    saved = list(sys.path)
    sys.path[:0] = [p for p in extra if p not in sys.path]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path[:] = saved
    if found is None:
        where = f"; PYTHONPATH={pythonpath}" if pythonpath else ""
        raise LaunchError(f"module {module!r} cannot be found (from {os.getcwd()}{where})")


def check_choice(what: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise LaunchError(f"{what} {value!r} is not accepted; choose one of: {', '.join(choices)}")
    return value


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > MAX_NAME:
        raise LaunchError(f"--name {brief(name)} is not accepted; give 1-{MAX_NAME} letters, digits, '.', '_' "
                          "and '-', starting with a letter or digit")
    return name


def check_python(python: str, backend: str) -> str:
    """--python: on this machine (local) an executable file or a command on PATH; elsewhere not checkable here."""
    import shutil
    if not python or "\n" in python:
        raise LaunchError(f"--python {brief(python)} is not accepted; give an interpreter path, e.g. /usr/bin/python3")
    if backend == "local" and not (shutil.which(python) if os.sep not in python
                                   else os.path.isfile(python) and os.access(python, os.X_OK)):
        raise LaunchError(f"--python {brief(python)} is not an executable file here; give an existing Python "
                          f"interpreter (default: {sys.executable})")
    return python


def check_program_words(backend: str, words: list[str]) -> None:
    """A first word like `--nodez` is a mistyped option of launch (click passes unknown options on); an sbatch
    option given to `launch slurm` (`--gres gpu:8`, `-N 2`) is pointed at --sbatch-arg (launchers.sbatchopts)."""
    hint = sbatchopts.misplaced(backend, words) if words and words[0] != "-m" else None
    if hint:
        raise LaunchError(hint)
    if words and words[0].startswith("--"):
        import difflib
        known = sorted(f for f in cli_flags(backend) if f.startswith("--"))
        close = difflib.get_close_matches(words[0].split("=", 1)[0], known, n=1)
        mean = f" (did you mean {close[0]}?)" if close else ""
        raise LaunchError(f"unknown option {brief(words[0])} of `launch {backend}`{mean}; accepted: "
                          f"{', '.join(known)} (the program goes after `--`)")


def build_spec(backend: str, flags: Mapping[str, Any], program_words: list[str], profile: str | None = None,
               existing: bool = False) -> RunSpec:
    """Layer CLI `flags` (None = not given) over the profile and the defaults, validate, freeze. existing: the
    --run-dir may be an existing run dir (its run continues: launchers.backends.slurm.inalloc)."""
    check_choice("backend", backend, BACKENDS)
    prof = load_profile(profile) if profile else {}

    def pick(key: str, default: Any = None) -> Any:
        v = flags.get(key)
        if v is not None and v != ():
            return v
        return prof.get(key, default)

    def said(key: str) -> str:      # who gave the value: the flag (or its LAUNCH_* variable), else the profile
        given = flags.get(key) is not None or key not in prof
        return "--" + key.replace("_", "-") if given else f"profile {profile!r}: {key}"

    restarts = recoveryopts.options(backend, pick, said)      # nodes (a range), max_restarts, spares, quarantine_after
    gpn = positive_int(said("gpus_per_node"), pick("gpus_per_node", 1), maximum=MAX_PER_NODE)
    dist = check_choice(said("dist_backend"), str(pick("dist_backend", "auto")), DIST_BACKENDS)
    port = parse_port(p, said("master_port")) if (p := pick("master_port")) is not None else None
    hang = pick("hang_timeout")
    hang = parse_seconds(said("hang_timeout"), hang) if hang is not None else None
    grace = parse_seconds(said("stop_grace"), pick("stop_grace", 30))
    stop_signal = parse_stop_signal(pick("stop_signal", "SIGTERM"))
    cpu_bind = cpubind.check_mode(pick("cpu_bind", "auto"), said("cpu_bind"))
    preflight = parse_preflight(pick("preflight"))

    env = parse_env(prof.get("env") or {}, f"profile {profile!r}: env")
    env.update(parse_env(flags.get("env") or ()))
    secrets = secretenv.parse_secrets(list(prof.get("secrets") or ()) + list(flags.get("secrets") or ()), os.environ,
                                      env)

    forward = parse_forward_env(list(prof.get("forward_env") or ()) + list(flags.get("forward_env") or ()))
    words = list(program_words) or list(prof.get("program") or [])
    check_program_words(backend, words)
    program, args = parse_program(words, check_local=True, pythonpath=env.get("PYTHONPATH"))

    opts = dict(prof.get(backend) or {})
    for k, v in (flags.get("options") or {}).items():
        if v is not None and v != ():
            opts[k] = v
    containeropts.check_warm(opts, pick("container_image"))

    name = check_name(default_name(program) if pick("name") is None else pick("name"))
    run_dir = layout.choose_run_dir(flags.get("run_dir"), name, pick("runs_root"), existing)
    snap = snapshot.store_for(run_dir, layout.runs_root(pick("runs_root"))) if pick("snapshot", backend == "slurm") else ""
    return RunSpec(
        backend=backend, gpus_per_node=gpn, program=program, program_args=args,
        run_dir=run_dir, name=name, env=tuple(env.items()), nccl_preset=str(pick("nccl_preset", "") or ""),
        master_port=port, dist_backend=dist, **restarts,
        python=check_python(pick("python", sys.executable), backend), options=_freeze_options(opts),
        explicit=tuple(k for k in ("nodes", "gpus_per_node") if flags.get(k) is not None or k in prof),
        forward_env=forward, hang_timeout=hang, stop_grace=grace, stop_signal=stop_signal, cpu_bind=cpu_bind,
        preflight=preflight, secrets=tuple(secrets.items()), snapshot=snap, **memory_fields(pick, said),
        **siteledger.fields(backend, pick("node_ledger"), said("node_ledger")),
        notify=parse_targets([*parse_targets(prof.get("notify") or (), f"profile {profile!r}: notify"),
                              *(flags.get("notify") or ())]),
        **containeropts.fields(backend, pick, os.getcwd(), (("the run dir", run_dir), ("the snapshot", snap))))


PREFLIGHTS = ("gpu",)


def parse_preflight(value: Any) -> tuple[str, ...]:
    """--preflight gpu[,...] (a profile: a list) -> the checks, each once, in the order given."""
    out: list[str] = []
    for item in (value if isinstance(value, (list, tuple)) else [] if value is None else [value]):
        check_choice("--preflight", str(item).strip(), PREFLIGHTS)
        if str(item).strip() not in out:
            out.append(str(item).strip())
    return tuple(out)


def default_name(program: tuple[str, ...]) -> str:
    base = program[1].rsplit(".", 1)[-1] if program[0] == "-m" else os.path.splitext(os.path.basename(program[0]))[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", base).lstrip("._-")[:MAX_NAME] or "job"
