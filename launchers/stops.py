"""One stop, whatever the reason (issue 21 item 5): what a run's stop is, decided once here; every
backend (the local launcher, an SSH host's agent side, a Slurm node's task) only carries the
decision out.

A stop is one signal to each node's torchrun agent, which passes it on once to each rank wrapper
(launchers.rankexec), which passes it on once to its program (a SIGTERM as the run's --stop-signal)
and gives it --stop-grace seconds before SIGKILL. Ctrl-C, `launch cancel`, a peer's failure, a hang
and a lost node all stop the surviving programs this way; only a second Ctrl-C (urgent) skips the
wait. A hung program will not finish its cleanup, but the ranks waiting on it can.

ENDINGS is the one table of how a run ends: the same name in status.json, the end line, `launch
status`, `launch cancel` of an ended run and the Python API (launchers.client). Ctrl-C is a
CANCELLED run whose reason is `Ctrl-C` (exit 130); there is no second name for it. Stdlib only.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

# state -> the launcher's exit code (`launch wait`, `launch slurm --wait`, the CLI); CANCELLED by
# SIGINT: 130
ENDINGS = {"COMPLETED": 0, "FAILED": 1, "CANCELLED": 143}
INTERRUPT_CODE = 130  # a run CANCELLED by Ctrl-C (stopped_by SIGINT)
TIMEOUT_CODE = 124  # `launch wait --timeout` ran out, the run not ended (as timeout(1))
MARGIN_S = 15.0  # over the grace: the agent's own 10 s more, the records, the sweep

# why a run is stopped -> the signal its agents get (None: the signal the launcher itself got)
WHY = {
    "ctrl-c": signal.SIGINT,
    "cancel": signal.SIGTERM,
    "signal": None,
    "peer failure": signal.SIGTERM,
    "hang": signal.SIGTERM,
    "lost node": signal.SIGTERM,
    "urgent": signal.SIGKILL,
    # its records cannot be kept: anything a grace let a program write would
    "run dir gone": signal.SIGKILL,
}
# recreate half a run dir (launchers.layout.Presence)


@dataclass(frozen=True)
class Stop:
    signal: int  # to each node's agent (the rank wrappers pass it on once)
    wait_s: float  # how long the stopper waits for the node's processes before the SIGKILL sweep


def stop_decision(why: str, grace: float, got: int | None = None) -> Stop:
    """The stop for `why` (a key of WHY); got: the signal the launcher got (for "signal"). Every
    stop but an urgent one (a second Ctrl-C) waits the run's grace and the margin."""
    if why not in WHY:
        raise ValueError(f"unknown stop reason {why!r}; known: {', '.join(WHY)}")
    sig = WHY[why] if WHY[why] is not None else (got or signal.SIGTERM)
    if sig == signal.SIGHUP:  # a dropped terminal or session: a stop like any other
        sig = signal.SIGTERM
    return Stop(sig, 0.0 if sig == signal.SIGKILL else wait_s(grace))


def wait_s(grace: float) -> float:
    """How long a stopped node may take: the programs' stop grace, the agent's margin and some
    slack."""
    return float(grace) + MARGIN_S


def exit_code(st: dict[str, Any]) -> int:
    """The launcher's exit code for a run's status (ENDINGS): 0 COMPLETED, 130 CANCELLED by Ctrl-C,
    143 CANCELLED otherwise (launch cancel, scancel, SIGTERM), 1 anything else."""
    state = st.get("state")
    if state == "CANCELLED" and st.get("stopped_by") == "SIGINT":
        return INTERRUPT_CODE
    return ENDINGS.get(state, 1)


def stopped_reason(stopped_by: str, cancel_requested: bool = False) -> str:
    """A CANCELLED run's reason, the same on every backend: `by launch cancel`, `Ctrl-C` or `by
    SIGTERM`."""
    return (
        "by launch cancel"
        if cancel_requested
        else "Ctrl-C"
        if stopped_by == "SIGINT"
        else f"by {stopped_by}"
    )
