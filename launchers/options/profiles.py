"""A YAML profile, read and checked: only the keys launchers.runopts declares (the common ones, one
mapping per backend), each value of its option's declared type or read by its flag's own parser; the
file through launchers.options.values' safe loader. launchers.spec.build_spec layers the flags over
it.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import LaunchError, brief
from ..runopts import BACKEND_OPTIONS, BACKENDS, COMMON, PROFILE_KEYS
from . import values


def load_profile(path: str) -> dict[str, Any]:
    """Read a YAML profile (launchers.options.values.profile_loader: the safe subset, a number kept
    as its text, a key given twice refused); unknown keys and python tags are errors; each value
    read by its option's parser."""
    expected = "a UTF-8 YAML mapping of profile keys"
    # yaml imported there: not on a node's start-up
    data = values.read_yaml_file(path, "profile", expected)
    if data is None:
        raise LaunchError(f"profile {path!r} is empty; expected {expected}, e.g. `nodes: 2`")
    if not isinstance(data, dict):
        raise LaunchError(f"profile {path!r} must be a mapping of keys, got {type(data).__name__}")
    for key in data:
        if key not in PROFILE_KEYS:
            raise LaunchError(
                f"profile {path!r}: unknown key {brief(key)}; accepted: {', '.join(PROFILE_KEYS)}"
            )
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
                raise LaunchError(
                    f"profile {path!r}: unknown key {backend}.{brief(key)}; accepted: {accepted}"
                )
            sub[key] = opt.from_profile(val, f"profile {path!r}: {backend}")
    return values.plain(data)


def check_profile_types(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The common keys have the types declared in launchers.runopts; a number's text (any str) is
    kept for build_spec to read with the flag's own parser and range; `program` is a list of
    words."""
    data = dict(data)
    for o in COMMON:
        v = data.get(o.key)
        if (
            o.in_profile
            and v is not None
            and not (isinstance(v, str) and {int, float} & set(o.types))
        ):
            data[o.key] = o.from_profile(v, where)
    prog, root = values.plain(data.get("program")), data.get("runs_root")
    if prog is not None and (
        not isinstance(prog, list) or not all(isinstance(w, str) for w in prog)
    ):
        raise LaunchError(
            f"{where}: program has a value of the wrong type: {brief(prog)}; expected a list of "
            "words, e.g. [train.py, --lr, '3e-4'] or [-m, workloads.convnet]"
        )
    if root is not None and not isinstance(root, str):
        raise LaunchError(
            f"{where}: runs_root has a value of the wrong type: {brief(root)}; expected str"
        )
    return data
