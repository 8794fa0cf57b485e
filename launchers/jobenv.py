"""The NCCL environment a job gets, whatever set it, resolved and validated once before anything
starts.

Sources, lowest first: the preset(s) (--nccl-preset), the caller's variables forwarded by
--forward-env GLOB, the job's own env (profile `env`, then --env); --secret values are the spec's
own (launchers.credentials.secretenv). The NCCL_* variables of the result are checked with
nccl_tuning's validator (NCCL's own parsers, per version): an error aborts the launch on every
backend (nothing is created or started), warnings are printed once. The caller's exported NCCL_*
that are not forwarded are named once: the job does not get them on any backend (the local and Slurm
nodes drop them from the environment they inherit; see torchrun.node_environ).
"""

from __future__ import annotations

import fnmatch
import os
from typing import Mapping, TextIO

from .credentials.secretenv import content_secrets
from .credentials.secretshape import arg_secrets, looks_secret
from .errors import LaunchError
from .options.values import ENV_REFUSED, RESERVED_ENV
from .spec import RunSpec


def forwarded(spec: RunSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's variables that match a --forward-env glob (the job's own env wins over them; the
    ones launch sets itself, e.g. MASTER_PORT for 'MASTER_*', are never forwarded:
    launchers.options.values.RESERVED_ENV); one whose value holds a newline is refused, as an --env
    value is."""
    own = dict(spec.env)
    out = {
        k: v
        for k, v in sorted(environ.items())
        if k not in own
        and k not in RESERVED_ENV
        and any(fnmatch.fnmatchcase(k, g) for g in spec.forward_env)
    }
    for k, v in out.items():  # the value is not shown: it may be a secret
        bad = next((word for char, word in ENV_REFUSED if char in v), None)
        if bad:
            raise LaunchError(
                f"--forward-env: {k} (from your environment) holds {bad}; NUL and newline are not "
                "accepted in an environment value"
            )
    return out


def resolve_preset(spec: RunSpec) -> tuple[dict[str, str], list]:
    if not spec.nccl_preset:
        return {}, []
    from nccl_tuning.apply import resolve  # torch-free

    try:
        return resolve(spec.nccl_preset, run_dir=spec.run_dir)
    except ValueError as e:
        raise LaunchError(str(e).splitlines()[0]) from None


def sources(spec: RunSpec, preset: dict[str, str], fwd: dict[str, str]) -> dict[str, str]:
    out = {k: f"preset {spec.nccl_preset}" for k in preset}
    out.update({k: "forwarded from your environment" for k in fwd})
    out.update({k: "--env / profile env" for k, _ in spec.env})
    return out


def resolve_job_env(
    spec: RunSpec, out: TextIO, environ: Mapping[str, str] | None = None
) -> RunSpec:
    """The spec with its preset variables and forwarded variables in place, every NCCL_* one
    validated."""
    environ = os.environ if environ is None else environ
    preset, findings = resolve_preset(spec)
    fwd = forwarded(spec, environ)
    env = {**fwd, **dict(spec.env)}
    nccl = {k: v for k, v in {**preset, **env}.items() if k.startswith("NCCL_")}
    if nccl:
        from nccl_tuning.validate import validate_env  # torch-free

        try:
            findings = findings + validate_env(nccl)
        except ValueError as e:
            raise LaunchError(str(e).splitlines()[0]) from None
    where = sources(spec, preset, fwd)
    for f in findings:  # an error first and alone: bad input is one line, before any warning
        if f.severity == "error":
            raise LaunchError(
                f"{f.variable}={f.value!r} ({where.get(f.variable, 'preset')}): {f.message}"
            )
    seen = set()
    for f in findings:
        if str(f) not in seen:
            seen.add(str(f))
            print(f"launch: nccl {f}", file=out)
    tell_secrets(spec, env, fwd, out)
    left = sorted(
        k
        for k in environ
        if k.startswith("NCCL_") and k not in fwd and k not in env and k not in preset
    )
    if left:
        print(
            f"launch: note: {', '.join(left)} set here {'is' if len(left) == 1 else 'are'} not "
            "forwarded to the job (add --forward-env 'NCCL_*' to forward and validate them)",
            file=out,
        )
    return spec.replace(nccl_env=tuple(preset.items()), env=tuple(env.items()))


def tell_secrets(
    spec: RunSpec, env: Mapping[str, str], fwd: Mapping[str, str], out: TextIO
) -> None:
    """--forward-env '*' named loudly; the values treated as secrets only because of their content
    named once."""
    if "*" in spec.forward_env:
        print(
            f"launch: WARNING: --forward-env '*' forwards all {len(fwd)} variables of your "
            "environment to every rank; name the ones the job needs instead (e.g. --forward-env "
            "'NCCL_*', --secret NAME)",
            file=out,
        )
    found = [f"{k} ({why})" for k, why in sorted(content_secrets(env).items())]
    found += [
        f"program argument {i + 1} ({looks_secret(a) or 'a secret option'})"
        for i, a in ((i, spec.program_args[i]) for i in arg_secrets(spec.program_args))
    ]
    if found:  # one line for all: the user is told once how to pass them
        print(
            f"launch: note: treated as secrets by their value: {'; '.join(found)}: shown as ***, "
            "not kept in the run dir, needed in your environment again at resume; pass a secret "
            "as --secret NAME (its value from your environment or NAME=@FILE; the program reads "
            "$NAME)",
            file=out,
        )
