"""The cluster turns of make test (tests/clusterturn.py): shared tests overlap, an exclusive one
runs alone, and one that waits gets its turn before shared tests that come after it."""

from __future__ import annotations

import threading
import time

import pytest

import clusterturn


def hold(
    lock_dir,
    exclusive: bool,
    log: list,
    name: str,
    entered: threading.Event,
    release: threading.Event,
):
    with clusterturn.turn(str(lock_dir), "slurm", exclusive):
        log.append(("in", name))
        entered.set()
        release.wait(10)
        log.append(("out", name))


def start(lock_dir, exclusive, log, name):
    entered, release = threading.Event(), threading.Event()
    t = threading.Thread(
        target=hold, args=(lock_dir, exclusive, log, name, entered, release), daemon=True
    )
    t.start()
    return t, entered, release


def test_shared_overlap_exclusive_waits_and_goes_before_later_shared(tmp_path):
    log: list = []
    a, a_in, a_go = start(tmp_path, False, log, "a")
    b, b_in, b_go = start(tmp_path, False, log, "b")
    assert a_in.wait(5) and b_in.wait(5)  # two shared tests at once
    x, x_in, x_go = start(tmp_path, True, log, "x")
    time.sleep(0.3)
    c, c_in, c_go = start(tmp_path, False, log, "c")  # comes after x: waits behind it
    assert not x_in.wait(0.5) and not c_in.is_set()
    a_go.set()
    b_go.set()
    assert x_in.wait(5)
    time.sleep(0.3)
    assert not c_in.is_set()  # x is alone
    x_go.set()
    assert c_in.wait(5)
    c_go.set()
    for t in (a, b, x, c):
        t.join(5)
    order = [n for ev, n in log if ev == "in"]
    assert order[2:] == ["x", "c"], log
    assert log.index(("in", "x")) > max(log.index(("out", "a")), log.index(("out", "b")))
    assert log.index(("in", "c")) > log.index(("out", "x"))


def test_another_cluster_is_not_held(tmp_path):
    done = threading.Event()
    with clusterturn.turn(str(tmp_path), "slurm", True):

        def other():
            with clusterturn.turn(str(tmp_path), "ssh", True):
                done.set()

        threading.Thread(target=other, daemon=True).start()
        assert done.wait(5)


def test_once_makes_it_once_and_a_failed_make_is_tried_again(tmp_path):
    made: list[str] = []

    def make(d):
        made.append(d)
        time.sleep(0.2)  # the other callers arrive meanwhile and wait
        return {"sha": "x", "dir": d}

    got: list = []
    threads = [
        threading.Thread(target=lambda: got.append(clusterturn.once(str(tmp_path), "ref", make)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(made) == 1 and got == [{"sha": "x", "dir": made[0]}] * 3
    assert made[0].startswith(str(tmp_path / "ref-"))

    def broken(d):
        raise RuntimeError("the reference run failed")

    with pytest.raises(RuntimeError):
        clusterturn.once(str(tmp_path), "other", broken)
    assert clusterturn.once(str(tmp_path), "other", lambda d: 7) == 7
