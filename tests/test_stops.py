"""One stop, whatever the reason (launchers.stops), pure: every reason but a second Ctrl-C gives the
programs the run's stop signal path and the whole grace; one name per ending in status, the end
line, `launch cancel` of an ended run, the exit code and the Python API's RunStatus (no INTERRUPTED
beside CANCELLED)."""

import signal

import pytest

from launchers import api, stops
from launchers.backends.base import Interrupts
from launchers.client import RunStatus
from launchers.records.rundir import TERMINAL


@pytest.mark.parametrize(
    "why, got, sig, wait",
    [
        ("ctrl-c", None, signal.SIGINT, 17.0),
        ("cancel", None, signal.SIGTERM, 17.0),
        ("signal", signal.SIGINT, signal.SIGINT, 17.0),
        ("signal", signal.SIGHUP, signal.SIGTERM, 17.0),
        ("peer failure", None, signal.SIGTERM, 17.0),
        ("hang", None, signal.SIGTERM, 17.0),
        ("lost node", None, signal.SIGTERM, 17.0),
        ("urgent", None, signal.SIGKILL, 0.0),
    ],
)
def test_every_stop_but_an_urgent_one_waits_the_grace(why, got, sig, wait):
    assert stops.stop_decision(why, 2, got) == stops.Stop(sig, wait)


def test_an_unknown_reason_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown stop reason 'bored'; known: ctrl-c, cancel"):
        stops.stop_decision("bored", 2)


def test_the_launcher_stops_for_a_hang_or_a_peer_as_for_its_own_signal():
    intr = Interrupts()
    assert intr.stop("hang", 5) == stops.Stop(signal.SIGTERM, 20.0)  # nothing got: the reason's
    intr.got.append(signal.SIGINT)
    # Ctrl-C during it: the signal got
    assert intr.stop("hang", 5) == stops.Stop(signal.SIGINT, 20.0)
    intr.got.append(signal.SIGINT)
    assert intr.stop("hang", 5).wait_s == 0.0  # the second: now


@pytest.mark.parametrize(
    "st, code, line",
    [
        ({"state": "COMPLETED"}, 0, "launch: run COMPLETED"),
        (
            {"state": "CANCELLED", "stopped_by": "SIGINT", "reason": "Ctrl-C"},
            130,
            "launch: run CANCELLED (Ctrl-C)",
        ),
        (
            {"state": "CANCELLED", "stopped_by": "SIGTERM", "reason": "by launch cancel"},
            143,
            "launch: run CANCELLED (by launch cancel)",
        ),
        (
            {"state": "FAILED", "reason": "hang: no rank advanced"},
            1,
            "launch: run FAILED (hang: no rank advanced)",
        ),
    ],
)
def test_one_name_per_ending_everywhere(st, code, line):
    assert tuple(stops.ENDINGS) == TERMINAL
    assert stops.exit_code(st) == code and api.end_line(st) == line
    # the end line names the state
    assert line.split()[2] == st["state"] == RunStatus.from_dict(st).state
    if st.get("stopped_by"):  # the reason every backend records for a stop
        assert stops.stopped_reason(st["stopped_by"], "cancel" in st["reason"]) == st["reason"]


def test_a_hang_stop_is_failed_even_when_every_program_ended_well_on_it(tmp_path):
    """The survivors of a hang clean up and may exit 0 on the stop: the attempt still FAILED, on the
    hung rank."""
    from launchers.records.rundir import RunDir
    from launchers.spec import RunSpec

    rd = RunDir.create(
        RunSpec("local", 1, 2, ("t.py",), (), str(tmp_path / "r"), "r"), "r-1234", {}
    )
    hang = {
        "attempt": 0,
        "stalled_ranks": [1],
        "waiting_ranks": [0],
        "since": 1.0,
        "timeout": 3,
        "dir": "d",
        "ranks": {
            "1": {"why": "process stopped", "node": 0},
            "0": {"why": "in all_reduce", "node": 0},
        },
    }
    rd.update_status(hang=hang)
    assert rd.record_outcome(0, {"0": 0}) == 1
    st = rd.read_status()
    assert st["state"] == "FAILED" and st["first_failure"]["rank"] == 1, st
    assert api.end_line(st) == "launch: run FAILED (rank 1 on node 0, hang: process stopped)"
