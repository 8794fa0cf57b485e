"""The one error type users see: a one-line message, a non-zero exit, nothing started."""


class LaunchError(Exception):
    """Bad input or a failed precondition; the CLI prints it on one line and exits 2."""

    exit_code = 2
