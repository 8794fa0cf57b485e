"""The one error type users see: a one-line message, a non-zero exit, nothing started."""


class LaunchError(ValueError):
    """Bad input or a failed precondition; the CLI prints it on one line and exits 2, the Python API
    raises it (a ValueError: `except ValueError` catches a bad value whichever check found it)."""

    exit_code = 2


def brief(value: object, limit: int = 60) -> str:
    """repr(value) cut to `limit` characters: a message names a bad value without printing all of it
    (a long path, a YAML alias bomb)."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = limit
    r.maxlist = r.maxdict = r.maxtuple = r.maxset = 4
    r.maxlevel = 2
    text = r.repr(value)
    return text if len(text) <= limit + 10 else text[:limit] + "..."


class RunDirGone(LaunchError):
    """The run dir was removed while its run ran (the one LaunchError raised after a start): every
    rank was stopped and nothing recorded (a record would recreate half a run dir); exit 1."""

    exit_code = 1


class NodeFault(LaunchError):
    """A node found itself unfit before its ranks started (a failed GPU check): its record's `kind`
    (a kind of launchers.resilience.recovery.KINDS) tells the recovery policy what happened without
    reading the message."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


class LaunchWarning(UserWarning):
    """What the CLI prints as `launch: WARNING: ...`, given to Python API callers through
    `warnings`."""


class TimedOut(LaunchError):
    """`launch wait --timeout` ran out before the run ended (the run is left as it is); exit 124, as
    timeout(1)."""

    exit_code = 124


def need_extra(module: str, extra: str, what: str) -> None:
    """A LaunchError when `module` (an optional dependency) is not installed: which extra brings
    it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        import sys

        raise LaunchError(
            f"{what} needs {module}, which {sys.executable} cannot import; accepted: "
            f"pip install 'launchers[{extra}]' into that environment"
        )
