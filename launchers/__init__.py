"""launchers: start multi-node torchrun jobs locally, over SSH or on Slurm, with one run directory.

The Python API (docs/API.md): `from launchers import JobSpec, submit, Run, runs`. Those names are
loaded on first use (module __getattr__, by name: the package itself stays layer 0 and `import
launchers` stays fast).
"""

__version__ = "0.1.0"

_API = {
    "JobSpec": "launchers.request",
    "SlurmOptions": "launchers.request",
    "submit": "launchers.client",
    "submit_sweep": "launchers.client",
    "Run": "launchers.client",
    "RunStatus": "launchers.client",
    "DryRun": "launchers.runjson",
    "Sweep": "launchers.client",
    "runs": "launchers.client",
    "ClusterRun": "launchers.client",
    "LaunchError": "launchers.errors",
    "LaunchWarning": "launchers.errors",
}
__all__ = [
    "JobSpec",
    "SlurmOptions",
    "submit",
    "submit_sweep",
    "Run",
    "RunStatus",
    "DryRun",
    "Sweep",
    "runs",
    "ClusterRun",
    "LaunchError",
    "LaunchWarning",
    "__version__",
]


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'launchers' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API])
