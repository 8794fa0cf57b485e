"""Every option a job takes, declared once (torchx's runopts style): the common ones and each
backend's own.

From these declarations come the click options of `launch local|ssh|slurm` (launchers.cli), the
profile's keys and their types (launchers.spec) and the flags `launch nccl bench|sweep` may pass on
to `launch BACKEND` (nccl_tuning.cli). How each reads in help and completes (its help line, section,
metavar or choices) is launchers.options.opthelp's, by key. Pure data + small converters; stdlib
only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .errors import LaunchError, brief
from .options.opthelp import HELP, LOOK
from .options.values import Number, parse_int, parse_number


@dataclass(frozen=True)
class Opt:
    key: str  # the spec's option key and the profile key
    types: tuple[type, ...]  # what a profile value may be
    help: str = ""
    kind: str = "str"  # how the CLI value is read: str | int | float | flag | switch | list
    flag: str | None = ""  # CLI flag ("" = --key-with-dashes; None = profile only)
    cli_value: Any = True  # kind "flag": the value the flag sets
    in_profile: bool = True  # also a profile key
    group: str = ""  # its section of `launch BACKEND --help` (GROUPS; "" = LOOK's)
    metavar: str = ""  # how help shows its value: INTEGER, SECONDS, FILE, ... ("" = LOOK's)
    choices: tuple[str, ...] = ()  # the words it accepts (help shows [a|b], completion offers them)
    complete: str = ""  # what its value completes to: file | dir | run | profile ("" = choices)

    @property
    def cli_flag(self) -> str | None:
        return None if self.flag is None else (self.flag or "--" + self.key.replace("_", "-"))

    @property
    def cli_words(self) -> tuple[str, ...]:
        """The flags that set it: a switch's --KEY and --no-KEY, else its one flag (none: profile
        only)."""
        if self.cli_flag is None:
            return ()
        return (
            (self.cli_flag, "--no-" + self.cli_flag[2:])
            if self.kind == "switch"
            else (self.cli_flag,)
        )

    def from_cli(self, raw: Any) -> Any:
        """The CLI's value (a string, or True for a flag; None when not given) -> the option's
        value."""
        if self.kind == "switch":  # --KEY / --no-KEY: True / False (None: neither given)
            return raw
        if raw is None or raw is False:
            return None
        if self.kind == "flag":
            return self.cli_value
        if self.kind == "multi":
            return list(raw) or None
        if self.kind == "list":
            return str(raw).split(",")  # an empty item stays: the option's parser refuses it
        if self.kind == "int":
            return parse_int(self.cli_flag or self.key, raw)
        if self.kind == "float":
            return parse_number(self.cli_flag or self.key, raw)
        return raw

    def from_profile(self, value: Any, where: str) -> Any:
        """A profile value of this option, of one of the declared types (a bool is not a number);
        the text of a number option is read by the flag's own parser (launchers.options.values),
        whether YAML saw a number or not."""
        if isinstance(value, str) and int in self.types and float not in self.types:
            return parse_int(f"{where}: {self.key}", str(value))
        if isinstance(value, str) and float in self.types:
            return parse_number(f"{where}: {self.key}", str(value))
        if isinstance(value, Number) and str in self.types:
            return str(value)
        numeric = any(t in (int, float) for t in self.types)
        if (
            not isinstance(value, self.types)
            or isinstance(value, Number)
            or (isinstance(value, bool) and numeric and bool not in self.types)
        ):
            names = " or ".join(t.__name__ for t in self.types)
            raise LaunchError(
                f"{where}: {self.key} has a value of the wrong type: {brief(value)}; expected "
                f"{names}"
            )
        return value


S, I, B, L = (str,), (int,), (bool,), (list,)

COMMON: tuple[Opt, ...] = (
    Opt("nodes", I),
    Opt("gpus_per_node", I),
    Opt("run_dir", S, in_profile=False),
    Opt("name", S),
    Opt("env", (dict,), kind="multi"),
    Opt("forward_env", (list,), kind="multi"),
    Opt("secrets", (list,), kind="multi", flag="--secret"),
    Opt("profile", S, in_profile=False),
    Opt("master_port", I),
    Opt("max_restarts", I),
    Opt("spares", I),
    Opt("quarantine_after", I),
    Opt("max_restarts_per_hour", I),
    Opt("node_ledger", S),
    Opt("memory_checkpoint", B, kind="flag"),
    Opt("memory_checkpoint_every", I, kind="int"),
    Opt("stop_grace", (int, float)),
    Opt("stop_signal", S),
    Opt("hang_timeout", (int, float)),
    Opt("dist_backend", S),
    Opt("cpu_bind", S),
    Opt("preflight", L, kind="list"),
    Opt("notify", (list, str), kind="multi"),
    Opt("nccl_preset", S),
    Opt("python", S),
    Opt("container_image", S),
    Opt("container_mounts", (list,), kind="multi", flag="--container-mount"),
    Opt("container_runtime", S),
    Opt("container_python", S),
    Opt("snapshot", B, kind="switch"),
    Opt("dry_run", B, kind="flag", in_profile=False),
    Opt("json", B, kind="flag", in_profile=False),
    Opt("sweep", (list,), kind="multi", in_profile=False),
)

WARM_SPARES = Opt("warm_spares", B, kind="flag")
BACKEND_OPTIONS: dict[str, tuple[Opt, ...]] = {
    "local": (WARM_SPARES,),
    "ssh": (
        Opt("hosts", (list, str), kind="list"),
        Opt("hostfile", S),
        Opt("ssh_config", S),
        Opt("known_hosts", S),
        Opt("identity", S),
        Opt("connect_timeout", (int, float), kind="float"),
        Opt("shared_storage", B, kind="flag", flag="--no-shared-storage", cli_value=False),
        Opt("staging_dir", S),
        WARM_SPARES,
    ),
    "slurm": (
        Opt("partition", S),
        Opt("time", S),
        Opt("account", S),
        Opt("qos", S),
        Opt("constraint", S),
        Opt("exclusive", B, kind="flag"),
        Opt("mem", S),
        Opt("mem_per_gpu", S),
        Opt("cpus_per_task", I, kind="int"),
        Opt("cpus_per_gpu", I, kind="int"),
        Opt("sbatch_args", L, kind="multi", flag="--sbatch-arg"),
        Opt("setup", L, kind="multi", flag="--setup"),
        Opt("signal_seconds", I, kind="int"),
        Opt("max_requeues", I, kind="int"),
        Opt("wait", B, kind="flag"),
        Opt("after", S, in_profile=False),
        Opt("max_parallel", I, kind="int"),
        Opt("sbatch_lines", L, flag=None),
        Opt("job_name", S, flag=None),
        Opt("cluster", S),
    ),
}
BACKENDS = tuple(BACKEND_OPTIONS)


def _looked(o: Opt) -> Opt:
    """The declaration with how it reads in help and completes (launchers.options.opthelp: HELP,
    LOOK)."""
    group, shown, complete = LOOK[o.key]
    choices = shown if isinstance(shown, tuple) else ()
    return replace(
        o,
        help=o.help or HELP[o.key],
        group=o.group or group,
        metavar=o.metavar or ("" if choices else shown),
        choices=o.choices or choices,
        complete=o.complete or complete,
    )


COMMON = tuple(_looked(o) for o in COMMON)
BACKEND_OPTIONS = {b: tuple(_looked(o) for o in opts) for b, opts in BACKEND_OPTIONS.items()}
# the top-level keys of a profile: the common options, two keys without a flag, one mapping per
# backend
PROFILE_KEYS = (*(o.key for o in COMMON if o.in_profile), "program", "runs_root", *BACKENDS)


# LAUNCH_* environment defaults for the common flags: the variable acts as its flag when the flag is
# not given (a flag wins; the variable wins over a profile's value). LAUNCH_<KEY> for a common
# option, LAUNCH_<BACKEND>_<KEY> for a backend's. Not LAUNCH_STOP_GRACE / LAUNCH_HANG_TIMEOUT /
# LAUNCH_DIST_BACKEND: those are the workers' env.
ENV_DEFAULTS: dict[str, tuple[str, ...]] = {
    "": (
        "nodes",
        "gpus_per_node",
        "profile",
        "nccl_preset",
        "python",
        "max_restarts",
        "node_ledger",
    ),
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
    """The backend's options from the CLI's raw values (keyed by option key; absent/None = not
    given)."""
    out = {}
    for o in BACKEND_OPTIONS[backend]:
        v = o.from_cli(raw.get(o.key))
        if v is not None:
            out[o.key] = v
    return out
