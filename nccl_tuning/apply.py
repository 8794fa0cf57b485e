"""Resolve a preset spec into the env a job runs with, validated; render it for show.

Torch-free: the launcher imports this. The NCCL version defaults to the one pip installed with
torch (nvidia-nccl-cu* metadata), else the newest known rules.
"""

from __future__ import annotations

import os
import shlex

from . import presets as P
from .errors import NcclTuningError
from .knowledge import NEWEST, installed_nccl_version, parse_version, vstr
from .validate import Finding, has_errors, validate

FORMATS = ("env", "yaml", "conf", "sbatch")


def select_version(nccl_version) -> tuple[int, int, int]:
    """Explicit version (str or tuple) > installed nvidia-nccl-cu* > newest known."""
    if isinstance(nccl_version, tuple):
        return nccl_version
    if nccl_version:
        return parse_version(nccl_version)
    return installed_nccl_version() or NEWEST


def check_min_nccl(presets, version) -> list[Finding]:
    return [
        Finding(
            "error",
            f"preset:{p.name}",
            vstr(p.min_nccl),
            f"needs NCCL >= {vstr(p.min_nccl)}; the selected NCCL is {vstr(version)}",
        )
        for p in presets
        if p.min_nccl and p.min_nccl > version
    ]


def resolve(
    preset_spec: str,
    run_dir: str | None = None,
    nccl_version=None,
    extra_dirs=(),
    production: bool = True,
) -> tuple[dict, list[Finding]]:
    """'moe,roce' -> (env, findings). Raises NcclTuningError (a ValueError, one line) for an
    unknown preset, a bad file, a conflict, or any error finding."""
    version = select_version(nccl_version)
    presets, env, _ = P.combine(preset_spec, extra_dirs)
    findings = check_min_nccl(presets, version) + validate(env, version, production)
    env = P.expand(env, run_dir)
    if has_errors(findings):
        errors = [f for f in findings if f.severity == "error"]
        more = (
            f" (+{len(errors) - 1} more error(s); run: launch nccl check {preset_spec})"
            if len(errors) > 1
            else ""
        )
        raise NcclTuningError(f"NCCL preset {preset_spec}: {errors[0]}{more}")
    return env, findings


def required_dirs(env: dict) -> list[str]:
    """Directories NCCL/PyTorch will write into (NCCL does not create them); create before start."""
    out = []
    for name in ("NCCL_DEBUG_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "NCCL_TOPO_DUMP_FILE"):
        value = env.get(name)
        if value and "{run_dir}" not in value and os.path.dirname(value):
            d = os.path.dirname(value)
            if d not in out:
                out.append(d)
    return out


def parse_env_lines(text: str, source: str) -> dict:
    """K=V lines (also 'export K=V', nccl.conf style); '#' comments; quotes stripped."""
    env = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not P._NAME_RE.fullmatch(key):
            raise NcclTuningError(f"{source} line {n}: {raw.strip()!r} is not NAME=value")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def parse_env_args(items) -> dict:
    env = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not P._NAME_RE.fullmatch(key):
            raise NcclTuningError(f"--env {item!r} is not NAME=value (e.g. --env NCCL_PROTO=LL)")
        env[key] = value
    return env


def render(preset_spec: str, fmt: str = "env", run_dir: str | None = None, extra_dirs=()) -> str:
    """The resolved variables of one or more presets, each with its reason, in a chosen format."""
    if fmt not in FORMATS:
        raise NcclTuningError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    presets, env, origin = P.combine(preset_spec, extra_dirs)
    env = P.expand(env, run_dir)
    reasons = {}
    for p in presets:
        for name, (_, reason) in p.vars.items():
            reasons.setdefault(name, f"[{p.name}] {reason}")
    title = "; ".join(f"{p.name}: {p.description}" for p in presets) or "(no preset)"
    if fmt == "yaml":
        return _render_yaml(presets, env, reasons, preset_spec)
    lines = []
    if fmt == "sbatch":
        lines += [
            "#!/bin/bash",
            f"# NCCL preset {title}",
            "# exported here, inherited by every srun step of the batch script",
        ]
    else:
        lines.append(f"# NCCL preset {title}")
    if not env:
        lines.append("# (sets no variables)")
    for name, value in env.items():
        lines.append(f"# {reasons[name]}")
        if fmt == "conf":
            if not name.startswith("NCCL_"):
                lines.append(f"# {name} is not NCCL's; nccl.conf cannot set it: export it instead")
                continue
            lines.append(f"{name}={value}")
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def _render_yaml(presets, env, reasons, spec) -> str:
    import yaml

    if len(presets) == 1:
        p = presets[0]
        data = {"name": p.name, "description": p.description, "affects": list(p.affects)}
        if p.min_nccl:
            data["min_nccl"] = vstr(p.min_nccl)
    else:
        affects = sorted({a for p in presets for a in p.affects})
        data = {
            "name": spec.replace(",", "+"),
            "description": "; ".join(p.description for p in presets),
            "affects": affects,
        }
    data["vars"] = {n: {"value": v, "reason": reasons[n].split("] ", 1)[1]} for n, v in env.items()}
    return yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)
