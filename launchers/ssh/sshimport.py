"""paramiko, imported for less: an SSH fan-out's process spent ~150 ms importing it
(bench/ssh_fanout.py).

paramiko.config imports invoke at once (unittest.mock, yaml, asyncio) only for an ssh config's
`Match exec`: here invoke is imported when a Match exec runs. paramiko/__init__ asks
importlib.metadata for its own version (the client banner's): importing that and scanning every
sys.path entry's distributions was ~50 ms; here paramiko's version is read from its own dist-info's
METADATA (the same answer; importlib.metadata when it is not found there). Stdlib only.
"""

from __future__ import annotations

import os
import sys
import threading
import types

_lock = threading.Lock()


class _InvokeOnUse:
    """paramiko.config's `invoke`: imported when a Match exec runs."""

    @staticmethod
    def run(*args, **kwargs):
        import invoke

        return invoke.run(*args, **kwargs)


def dist_version(name: str) -> str | None:
    """The Version: of the one `<name>-*.dist-info` beside the package `name` (not imported), else
    None."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    where = list(spec.submodule_search_locations or []) if spec else []
    if len(where) != 1:
        return None
    site = os.path.dirname(where[0])
    infos = [d for d in os.listdir(site) if d.startswith(f"{name}-") and d.endswith(".dist-info")]
    if len(infos) != 1:
        return None
    try:
        with open(os.path.join(site, infos[0], "METADATA"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip() or None
                if not line.strip():
                    return None
    except OSError:
        return None
    return None


def _metadata_shim() -> types.ModuleType | None:
    """A stand-in for importlib.metadata that knows paramiko's version only (None: not found, use
    the real one)."""
    v = dist_version("paramiko")
    if v is None:
        return None
    shim = types.ModuleType("importlib.metadata")
    shim.version = lambda name: v if name == "paramiko" else _real_version(name)
    return shim


def _real_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def paramiko_module():
    """paramiko (imported the first time as above)."""
    with _lock:
        if "paramiko" not in sys.modules:
            _first_import()
    import paramiko

    return paramiko


def _first_import() -> None:
    import importlib

    saved = {k: sys.modules.get(k) for k in ("invoke", "importlib.metadata")}
    had_attr, attr = hasattr(importlib, "metadata"), getattr(importlib, "metadata", None)
    shim = _metadata_shim()
    try:
        if saved["invoke"] is None:
            # paramiko.config: `import invoke` -> ImportError, its invoke = None
            sys.modules["invoke"] = None
        if shim is not None:
            sys.modules["importlib.metadata"] = shim
            importlib.metadata = shim
        import paramiko.config
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        if had_attr:
            importlib.metadata = attr
        elif getattr(importlib, "metadata", None) is shim:
            del importlib.metadata
    if paramiko.config.invoke is None and saved["invoke"] is None:
        paramiko.config.invoke = _InvokeOnUse()
