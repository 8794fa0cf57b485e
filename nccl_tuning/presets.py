"""Preset files (YAML data): load by name or path, list, combine with conflict detection, render.

File format:
    name: moe
    description: one line
    affects: [all_to_all, send_recv]      # collectives the preset is meant to change
    min_nccl: "2.14"                       # optional
    vars:
      NCCL_X: {value: "4", reason: "why"}  # strings only; "{run_dir}" is the only placeholder
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from .errors import NcclTuningError
from .knowledge import parse_version

TOP_KEYS = {"name", "description", "affects", "vars", "min_nccl"}
REQUIRED = {"name", "description", "affects", "vars"}
VAR_KEYS = {"value", "reason"}
AFFECTS = (
    "all",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send_recv",
)
PLACEHOLDERS = ("run_dir",)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    affects: tuple[str, ...]
    vars: dict  # NAME -> (value, reason); insertion-ordered
    min_nccl: tuple | None
    path: str

    def env(self) -> dict[str, str]:
        return {k: v for k, (v, _) in self.vars.items()}


def builtin_dir() -> Path:
    return Path(str(resources.files(__package__).joinpath("presets")))


def _dirs(extra_dirs) -> list[Path]:
    return [Path(d) for d in (extra_dirs or ())] + [builtin_dir()]


def _fail(path, msg):
    raise NcclTuningError(f"preset file {path}: {msg}")


def load_file(path) -> Preset:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise NcclTuningError(f"preset file {path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise NcclTuningError(f"preset file {path}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        _fail(path, "must be a mapping with keys " + ", ".join(sorted(REQUIRED)))
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        _fail(
            path,
            f"unknown key(s) {', '.join(map(str, unknown))} (accepted: "
            f"{', '.join(sorted(TOP_KEYS))})",
        )
    missing = sorted(REQUIRED - set(data))
    if missing:
        _fail(path, f"missing key(s) {', '.join(missing)}")
    for key in ("name", "description"):
        if not isinstance(data[key], str) or not data[key].strip():
            _fail(path, f"'{key}' must be a non-empty string, got {data[key]!r}")
    if "\n" in data["description"].strip():
        _fail(path, "'description' must be one line")
    affects = data["affects"]
    if not isinstance(affects, list) or not all(isinstance(a, str) for a in affects):
        _fail(path, f"'affects' must be a list of strings, got {affects!r}")
    bad = [a for a in affects if a not in AFFECTS]
    if bad:
        _fail(path, f"'affects' has {', '.join(bad)} (accepted: {', '.join(AFFECTS)})")
    min_nccl = data.get("min_nccl")
    if min_nccl is not None:
        if not isinstance(min_nccl, str):
            _fail(path, f"'min_nccl' must be a quoted string like \"2.14\", got {min_nccl!r}")
        min_nccl = parse_version(min_nccl)
    return Preset(
        data["name"],
        data["description"].strip(),
        tuple(affects),
        _load_vars(path, data["vars"]),
        min_nccl,
        str(path),
    )


def _load_vars(path, raw) -> dict:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        _fail(path, f"'vars' must be a mapping NAME: {{value, reason}}, got {type(raw).__name__}")
    out = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            _fail(path, f"variable name {name!r} is not an environment variable name")
        if not isinstance(entry, dict):
            _fail(path, f"{name} must be a mapping with 'value' and 'reason', got {entry!r}")
        unknown = sorted(map(str, set(entry) - VAR_KEYS))
        if unknown:
            _fail(path, f"{name} has unknown key(s) {', '.join(unknown)} (accepted: value, reason)")
        for key in ("value", "reason"):
            if key not in entry:
                _fail(path, f"{name} is missing '{key}'")
            if not isinstance(entry[key], str):
                _fail(
                    path,
                    f"{name}.{key} must be a quoted string, got {entry[key]!r} "
                    f'({type(entry[key]).__name__}); write {key}: "{entry[key]}"',
                )
        if not entry["reason"].strip():
            _fail(path, f"{name}.reason is empty; every variable needs a reason")
        for ph in re.findall(r"\{([^{}]*)\}", entry["value"]):
            if ph not in PLACEHOLDERS:
                _fail(
                    path,
                    f"{name}.value has placeholder {{{ph}}} (accepted: "
                    f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)})",
                )
        out[name] = (entry["value"], entry["reason"].strip())
    return out


def is_path(item: str) -> bool:
    return "/" in item or item.endswith((".yaml", ".yml"))


def known_names(extra_dirs=()) -> list[str]:
    names = []
    for d in _dirs(extra_dirs):
        if d.is_dir():
            names += [p.stem for p in sorted(d.glob("*.yaml")) if p.stem not in names]
    return sorted(names)


def load(item: str, extra_dirs=()) -> Preset:
    """One preset by name (searched in extra_dirs, then the shipped ones) or by path."""
    if is_path(item):
        return load_file(item)
    for d in _dirs(extra_dirs):
        path = d / f"{item}.yaml"
        if path.is_file():
            preset = load_file(path)
            if preset.name != item:
                _fail(path, f"'name' is {preset.name!r} but the file is {item}.yaml")
            return preset
    raise NcclTuningError(
        f"unknown NCCL preset {item!r} (known: "
        f"{', '.join(known_names(extra_dirs))}; or give a path to a .yaml file)"
    )


def list_presets(extra_dirs=()) -> list[Preset]:
    return [load(n, extra_dirs) for n in known_names(extra_dirs)]


def split_spec(spec: str) -> list[str]:
    items = [s.strip() for s in (spec or "").split(",")]
    if any(not s for s in items) and (spec or "").strip():
        raise NcclTuningError(f"preset list {spec!r} has an empty entry; write e.g. moe,roce")
    return [s for s in items if s]


def combine(spec: str, extra_dirs=()) -> tuple[list[Preset], dict, dict]:
    """'moe,roce' -> (presets, env, origin) where origin[NAME] = preset name that set it.
    The same variable with different values in two presets is an error naming both."""
    presets, env, origin, conflicts = [], {}, {}, []
    for item in split_spec(spec):
        p = load(item, extra_dirs)
        if any(q.path == p.path for q in presets):
            continue
        presets.append(p)
        for name, (value, _) in p.vars.items():
            if name in env and env[name] != value:
                conflicts.append(
                    f"{name} is {env[name]!r} in {origin[name]} but {value!r} in {p.name}"
                )
                continue
            env.setdefault(name, value)
            origin.setdefault(name, p.name)
    if conflicts:
        raise NcclTuningError(f"presets {spec} conflict: {'; '.join(conflicts)}")
    return presets, env, origin


def expand(env: dict, run_dir: str | None) -> dict:
    """Replace {run_dir}; without a run dir the placeholder stays visible."""
    if run_dir is None:
        return dict(env)
    return {k: v.replace("{run_dir}", str(run_dir)) for k, v in env.items()}
