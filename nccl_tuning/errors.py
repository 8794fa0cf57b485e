"""The one error type of nccl_tuning: bad user input, a one-line message (a ValueError)."""


class NcclTuningError(ValueError):
    """A preset, variable or version the user gave is invalid; str(err) is one line."""
