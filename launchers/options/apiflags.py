"""The Python API's JobSpec and the CLI's flags, one in the other's words: a field's value as the
words of its `launch` flag (cli_words: what submit(cluster=) hands the login node's launch; the
inverse of runopts.Opt.from_cli) and a CLI message naming each flag as the JobSpec field it is
(api_words). Stdlib + launchers.runopts only.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

from ..errors import LaunchError
from ..runopts import BACKEND_OPTIONS, COMMON


def api_words(message: str, backend: str) -> str:
    """A CLI message in the API's words: each flag named as the JobSpec field it is (`--nodes` ->
    `JobSpec.nodes`, `--partition` -> `JobSpec.slurm['partition']`); a command it suggests (in
    backticks) stays as it is."""
    names = {o.cli_flag: f"JobSpec.{o.key}" for o in COMMON if o.cli_flag}
    names.update(
        {
            o.cli_flag: f"JobSpec.{backend}[{o.key!r}]"
            for o in BACKEND_OPTIONS[backend]
            if o.cli_flag
        }
    )
    parts = message.split("`")
    return "`".join(
        re.sub(r"(?<![\w-])--[a-z][\w-]*(?![\w-])", lambda m: names.get(m.group(0), m.group(0)), p)
        if k % 2 == 0
        else p
        for k, p in enumerate(parts)
    )


def cli_words(opt: Any, value: Any, name: str) -> list[str]:
    """One option's value as the CLI's words (the inverse of runopts.Opt.from_cli); [] when not
    given."""
    if value is None or (isinstance(value, (list, tuple, Mapping)) and not value):
        return []
    if opt.cli_flag is None:
        raise LaunchError(
            f"{name} has no flag of `launch`; with cluster= give it in a profile (JobSpec.profile)"
        )
    if opt.kind == "switch":
        return [opt.cli_flag if value else "--no-" + opt.cli_flag[2:]]
    if opt.kind == "flag":
        return [opt.cli_flag] if value == opt.cli_value else []
    items = (
        [f"{k}={v}" for k, v in value.items()]
        if isinstance(value, Mapping)
        else [str(v) for v in value]
        if isinstance(value, (list, tuple))
        else [os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    )
    words = (
        [(opt.cli_flag, item) for item in items]
        if opt.kind == "multi"
        else [(opt.cli_flag, ",".join(items))]
    )
    return [w for flag, v in words for w in ([f"{flag}={v}"] if v.startswith("-") else [flag, v])]
