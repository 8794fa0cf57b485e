"""The warm submitter (launchers/backends/slurm/submit.py) as a process: no Slurm needed for
these."""

import os
import sys

import pytest

from launchers.backends.slurm import submit as ss


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_closed_without_a_request_it_exits_having_submitted_nothing():
    w = ss.WarmSubmitter()
    w.close()  # waits for it
    assert gone(w.pid)


def test_a_submitter_that_died_is_reported_as_gone_so_the_launcher_submits_itself():
    w = ss.WarmSubmitter()
    os.kill(w.pid, 9)
    os.waitpid(w.pid, 0)
    with pytest.raises(ss.SubmitterGone):
        w.submit(
            ss.SubmitRequest("/tmp/none", "#!/bin/bash\n", 1, 1, sys.executable, "/tmp/none", 0)
        )


def test_a_failure_inside_it_comes_back_as_one_submit_error(tmp_path):
    w = ss.WarmSubmitter()
    req = ss.SubmitRequest(
        folder="/proc/no-such-dir/slurm",
        script="#!/bin/bash\n",
        nodes=1,
        max_requeues=1,
        python=sys.executable,
        run_dir=str(tmp_path),
        attempt=0,
    )
    with pytest.raises(ss.SubmitError, match="/proc/no-such-dir"):
        w.submit(req)
    assert gone(w.pid)


def test_a_request_crosses_the_pipe_unchanged():
    req = ss.SubmitRequest(
        "/f", "#!/bin/bash\necho 'a b'\n", 4, 3, "/py", "/run", 2, {"HF_TOKEN": "x y"}
    )
    assert ss.SubmitRequest.from_json(req.to_json()) == req
