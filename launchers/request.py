"""The Python API's JobSpec: what a caller asks for, field for field the flags of `launch BACKEND`.

`JobSpec(backend="slurm", nodes=4, gpus_per_node=8, program=("train.py", "--lr", "3e-4"),
slurm={"partition": "gpu"})` checks the types of its fields at once (TypeError naming the field);
`resolve()` turns it into the recorded spec (launchers.spec.RunSpec) through the CLI's own code
(spec.build_spec), so a bad value raises the CLI's LaunchError (a ValueError) in the CLI's words.
Stdlib + launchers.spec/runopts/apiflags only.
"""

from __future__ import annotations

import difflib
import inspect
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Sequence

from . import spec as specmod
from .errors import LaunchError, brief
from .options.apiflags import api_words, cli_words
from .runopts import BACKEND_OPTIONS, BACKENDS, COMMON

_INT, _NUM, _STR = (int,), (int, float), (str, os.PathLike)
# optional fields: accepted types, how the message says it
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "nodes": (_INT, "an int"),
    "gpus_per_node": (_INT, "an int"),
    "master_port": (_INT, "an int"),
    "max_restarts": (_INT, "an int"),
    "max_restarts_per_hour": (_INT, "an int"),
    "spares": (_INT, "an int"),
    "quarantine_after": (_INT, "an int"),
    "stop_grace": (_NUM, "a number of seconds"),
    "stop_signal": ((str,), "a str"),
    "hang_timeout": (_NUM, "a number of seconds"),
    "name": ((str,), "a str"),
    "run_dir": (_STR, "a path"),
    "runs_root": (_STR, "a path"),
    "profile": (_STR, "a path"),
    "python": (_STR, "a path or command"),
    "dist_backend": ((str,), "a str"),
    "nccl_preset": ((str,), "a str"),
    "cpu_bind": ((str,), "a str"),
    "container_image": ((str,), "a str"),
    "container_runtime": ((str,), "a str"),
    "container_python": ((str,), "a str"),
    "node_ledger": (_STR, "a path"),
    "memory_checkpoint_every": (_INT, "an int"),
}
NOT_IN_API = {"wait": "submit never blocks; use run.wait()"}  # backend options the API refuses


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One job as the Python API takes it; None (the default) = not given, as when a flag is left
    out."""

    backend: str
    # the words after `--`: ("train.py", "--lr", "3e-4") or ("-m", "pkg.mod")
    program: Sequence[str] = ()
    nodes: int | None = None
    gpus_per_node: int | None = None
    name: str | None = None
    run_dir: str | os.PathLike | None = None
    runs_root: str | os.PathLike | None = None
    env: Mapping[str, str] | None = None
    forward_env: Sequence[str] = ()
    # ("HF_TOKEN", "DB_PASS=@/run/keys/db"): --secret (never written nor shown)
    secrets: Sequence[str] = ()
    preflight: Sequence[str] = ()  # ("gpu",): --preflight gpu
    # ("https://hooks.example/x", "notify-send launch"): --notify URL|COMMAND
    notify: Sequence[str] = ()
    master_port: int | None = None
    max_restarts: int | None = None
    # --max-restarts-per-hour N: at most N restarts in any hour (0: no limit)
    max_restarts_per_hour: int | None = None
    # --spares K (local only for now): idle nodes a failed node is replaced by
    spares: int | None = None
    # --quarantine-after N: strikes that quarantine a node (default 2)
    quarantine_after: int | None = None
    # --node-ledger PATH: the site's node ledger (launchers.ledgers.siteledger)
    node_ledger: str | os.PathLike | None = None
    stop_grace: float | None = None
    stop_signal: str | None = None  # "SIGTERM" (None: the default) or "SIGINT", "SIGHUP", "SIGQUIT"
    hang_timeout: float | None = None
    dist_backend: str | None = None
    cpu_bind: str | None = None  # "auto" (None: the default), "none", "numa" or "cores"
    nccl_preset: str | None = None
    python: str | os.PathLike | None = None
    container_image: str | None = None  # --container-image (launchers.containers.containeropts)
    container_mounts: Sequence[str] = ()  # ("/data:/data:ro",): --container-mount
    # "auto" (None: the default), "pyxis", "apptainer", "podman", "oci"
    container_runtime: str | None = None
    container_python: str | None = None  # the image's interpreter (None: python3)
    # --memory-checkpoint: state in host memory too, copied to a peer node
    memory_checkpoint: bool | None = None
    # --memory-checkpoint-every M (default: auto, launchers.memplan; implies it)
    memory_checkpoint_every: int | None = None
    # --snapshot / --no-snapshot (None: on for slurm, off for local and ssh)
    snapshot: bool | None = None
    profile: str | os.PathLike | None = None
    local: Mapping[str, Any] | None = None
    ssh: Mapping[str, Any] | None = None
    # SlurmOptions(partition=...) or a dict of the same
    slurm: "SlurmOptions | Mapping[str, Any] | None" = None
    # the one resolve() chose
    _run_dir: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str):
            raise TypeError(f"JobSpec.backend must be a str, got {_what(self.backend)}")
        specmod.check_choice("JobSpec.backend", self.backend, BACKENDS)
        for name, (types, said) in _TYPES.items():
            _check_type(name, getattr(self, name), types, said)
        for name in ("snapshot", "memory_checkpoint"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"JobSpec.{name} must be a bool (or None), got {_what(getattr(self, name))}"
                )
        object.__setattr__(self, "program", _words("program", self.program))
        object.__setattr__(self, "forward_env", _words("forward_env", self.forward_env))
        object.__setattr__(self, "secrets", _words("secrets", self.secrets))
        object.__setattr__(self, "preflight", _words("preflight", self.preflight))
        object.__setattr__(self, "notify", _words("notify", self.notify))
        object.__setattr__(
            self, "container_mounts", _words("container_mounts", self.container_mounts)
        )
        if not self.program and self.profile is None:
            raise LaunchError(
                "JobSpec.program is empty; give the program and its arguments, e.g. "
                "('train.py', '--lr', '3e-4') or ('-m', 'workloads.convnet')"
            )
        if self.env is not None:
            if not isinstance(self.env, Mapping):
                raise TypeError(
                    f"JobSpec.env must be a mapping of str to str, got {_what(self.env)}"
                )
            for k, v in self.env.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise TypeError(f"JobSpec.env[{k!r}] must map a str to a str, got {_what(v)}")
            object.__setattr__(self, "env", dict(self.env))
        for b in BACKENDS:
            object.__setattr__(self, b, _backend_options(self, b))

    @property
    def options(self) -> dict[str, Any]:
        """The options of this spec's backend (its `local=`/`ssh=`/`slurm=` mapping)."""
        return dict(getattr(self, self.backend) or {})

    def flags(self) -> dict[str, Any]:
        """The flags mapping spec.build_spec takes (what the CLI hands it), None = not given."""
        out: dict[str, Any] = {
            k: (os.fspath(v) if isinstance(v, os.PathLike) else v)
            for k, v in ((n, getattr(self, n)) for n in _TYPES)
            if k != "profile"
        }
        out.update(
            env=self.env or {},
            forward_env=self.forward_env,
            secrets=self.secrets,
            options=self.options,
            preflight=list(self.preflight) or None,
            notify=self.notify,
            container_mounts=self.container_mounts,
            snapshot=self.snapshot,
            memory_checkpoint=self.memory_checkpoint,
        )
        return out

    def cli_args(self) -> list[str]:
        """The flags of `launch BACKEND` that ask for this spec, the program not included: what
        submit(cluster=) hands the login node's launch. LaunchError naming the field for what no
        flag says (a profile-only option, runs_root: the cluster's own)."""
        if self.runs_root is not None:
            raise LaunchError(
                "JobSpec.runs_root is this machine's; a cluster's runs root is its clusters file's "
                "runs_root: leave JobSpec.runs_root unset with cluster="
            )
        flags, words = (
            self.flags(),
            (["--profile", os.fspath(self.profile)] if self.profile is not None else []),
        )
        for opt in COMMON:
            words += cli_words(opt, flags.get(opt.key), f"JobSpec.{opt.key}")
        for opt in BACKEND_OPTIONS[self.backend]:
            if opt.key != "cluster":
                words += cli_words(
                    opt, self.options.get(opt.key), f"JobSpec.{self.backend}[{opt.key!r}]"
                )
        return words

    def resolve(self) -> specmod.RunSpec:
        """The recorded spec, by the CLI's code: defaults and the profile layered, values checked,
        the program found (relative to the cwd), the run dir chosen (not created; the same one on
        every call, and the one submit uses). Raises LaunchError (a ValueError) naming this spec's
        fields (JobSpec.nodes, not --nodes)."""
        profile = os.fspath(self.profile) if self.profile is not None else None
        flags = self.flags()
        if flags.get("run_dir") is None and self._run_dir:
            flags["run_dir"] = self._run_dir
        try:
            spec = specmod.build_spec(self.backend, flags, list(self.program), profile)
        except LaunchError as e:
            raise type(e)(api_words(str(e), self.backend)) from None
        object.__setattr__(self, "_run_dir", spec.run_dir)
        return spec


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """`launch slurm`'s own options, typed: `JobSpec(backend="slurm",
    slurm=SlurmOptions(partition="gpu", time="04:00:00"), ...)`; None / empty = not given. A
    misspelt field is a TypeError naming the nearest one; a dict with the same keys is accepted as
    well. Values are checked as the flags' (at resolve)."""

    partition: str | None = None
    time: str | None = None  # [D-]H:M:S
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    mem: str | None = None  # Slurm's grammar: 64G
    mem_per_gpu: str | None = None
    cpus_per_task: int | None = None
    cpus_per_gpu: int | None = None
    signal_seconds: int | None = None
    max_requeues: int | None = None
    after: str | None = None  # RUN|JOBID[:TYPE]
    max_parallel: int | None = None
    job_name: str | None = None
    # only "" (this machine's Slurm); a named cluster: submit(cluster=...)
    cluster: str | None = None
    sbatch_args: Sequence[str] = ()
    sbatch_lines: Sequence[str] = ()
    setup: Sequence[str] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
            if value not in (None, ()):
                _check_option("slurm", f.name, value, f"SlurmOptions.{f.name}")

    def to_dict(self) -> dict[str, Any]:
        """The options given, as JobSpec's `slurm={...}` takes them."""
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in asdict(self).items()
            if v not in (None, ())
        }


def _named_init(cls: type) -> type:
    """cls(**kw) with a misspelt keyword: a TypeError naming the nearest field and every one
    accepted."""
    names, dataclass_init = [f.name for f in fields(cls)], cls.__init__

    def __init__(self, **kw: Any) -> None:
        for key in kw:
            if key not in names:
                raise TypeError(
                    f"{cls.__name__} has no field {key!r}{suggest(key, names)}; accepted: "
                    + ", ".join(names)
                )
        dataclass_init(self, **kw)

    __init__.__doc__, __init__.__signature__ = cls.__doc__, inspect.signature(dataclass_init)
    cls.__init__ = __init__
    return cls


_named_init(SlurmOptions)


def suggest(word: str, accepted: Sequence[str]) -> str:
    """` (did you mean 'partition'?)` for the nearest accepted word, '' when none is near."""
    near = difflib.get_close_matches(str(word), list(accepted), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _what(value: Any) -> str:
    return f"{type(value).__name__} {brief(value)}"


def _check_type(name: str, value: Any, types: tuple[type, ...], said: str) -> None:
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        raise TypeError(f"JobSpec.{name} must be {said} (or None), got {_what(value)}")


def _words(name: str, value: Any) -> tuple[str, ...]:
    """A sequence of str (a tuple or a list; a lone str is refused: it would be split into
    letters)."""
    if (
        isinstance(value, (str, bytes))
        or not isinstance(value, Sequence)
        or not all(isinstance(w, str) for w in value)
    ):
        raise TypeError(
            f"JobSpec.{name} must be a tuple or list of str, e.g. ('train.py', '--lr', '3e-4'), "
            f"got {_what(value)}"
        )
    return tuple(value)


def _backend_options(js: JobSpec, backend: str) -> dict[str, Any] | None:
    """`slurm={...}` (or SlurmOptions) etc.: only the spec's own backend's, each key one of its
    options, of the declared type; a misspelt key names the nearest option."""
    given = getattr(js, backend)
    if given is None:
        return None
    if isinstance(given, SlurmOptions) and backend == "slurm":
        given = given.to_dict()
    if not isinstance(given, Mapping):
        raise TypeError(
            f"JobSpec.{backend} must be a mapping of option to value, got {_what(given)}"
        )
    if backend != js.backend and given:
        raise LaunchError(
            f"JobSpec.{backend} is given but the backend is {js.backend!r}; give "
            f"{js.backend}={{...}} for its options"
        )
    return {
        key: _check_option(backend, key, value, f"JobSpec.{backend}[{key!r}]")
        for key, value in given.items()
    }


def _check_option(backend: str, key: Any, value: Any, name: str) -> Any:
    """One backend option's value, of its declared type (a tuple for a list: a list); an unknown key
    is refused naming the nearest and every one accepted."""
    opt = next((o for o in BACKEND_OPTIONS[backend] if o.key == key), None)
    if opt is None or key in NOT_IN_API:
        keys = [o.key for o in BACKEND_OPTIONS[backend] if o.key not in NOT_IN_API]
        why = f" ({NOT_IN_API[key]})" if key in NOT_IN_API else suggest(key, keys)
        raise LaunchError(
            f"JobSpec.{backend} option {brief(key)} is not accepted{why}; accepted: "
            f"{', '.join(keys) or '(none)'}"
        )
    if isinstance(value, tuple) and list in opt.types:
        value = list(value)
    numeric = any(t in (int, float) for t in opt.types)
    if not isinstance(value, opt.types) or (
        isinstance(value, bool) and numeric and bool not in opt.types
    ):
        raise TypeError(
            f"{name} must be {' or '.join(t.__name__ for t in opt.types)}, got {_what(value)}"
        )
    return value
