"""--warm-spares' fork (launchers.warmfork, launchers.nodeside.zygote), run for real: a program
forked from a zygote sees what a cold `python -u` start of it sees (argv, sys.path[0], cwd,
environment -- in /proc too --, stdout, exit status, a traceback, a signal), with torch already
imported; a zygote in a directory others may enter is never used (the program starts cold)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from launchers import procs, warmfork

ROOT = Path(__file__).resolve().parent.parent
PROG = """import json, os, sys
what = dict(argv=sys.argv, path0=sys.path[0], cwd=os.getcwd(), x=os.environ.get("X"), pp=sys.path[1],
            proc="X=" + os.environ["X"] in open(f"/proc/{os.getpid()}/environ").read().split("\\0"),
            torch="torch" in sys.modules)
print(json.dumps(what))
if os.environ.get("HOW") == "raise":
    raise RuntimeError("boom in the program")
if os.environ.get("HOW") == "signal":
    os.kill(os.getpid(), 15)
sys.exit(int(os.environ.get("CODE", "0")))
"""  # noqa: E501


@pytest.fixture
def zygote():
    d = tempfile.mkdtemp(prefix="lw", dir="/tmp")  # short: sun_path holds 108 bytes
    os.chmod(d, 0o700)
    path = os.path.join(d, "t-s0.sock")
    z = subprocess.Popen(
        [sys.executable, "-m", "launchers.nodeside.zygote", path, "0"],
        stdin=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        assert z.poll() is None and time.monotonic() < deadline, "the zygote did not come up"
        time.sleep(0.05)
    yield path
    z.stdin.close()  # its launcher gone: it ends, its socket with it
    assert z.wait(timeout=10) == 0
    assert not os.path.exists(path), "the zygote left its socket"
    shutil.rmtree(d)


def run(argv: list[str], cwd: Path, sock: str | None, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{cwd / 'lib'}", X="a b=c", **env)
    if sock:
        e[warmfork.SOCKET_ENV] = sock
        argv = [sys.executable, "-m", "launchers.warmfork", "--", *argv]
    return subprocess.run(argv, cwd=cwd, env=e, capture_output=True, text=True, timeout=60)


def test_a_forked_program_sees_what_a_cold_start_sees(zygote, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "prog.py").write_text(PROG)
    (tmp_path / "lib" / "wprog.py").write_text(PROG)
    for argv in (["sub/prog.py", "one", "two words"], ["-m", "wprog", "--flag"]):
        cold, warm = (run([sys.executable, "-u", *argv], tmp_path, s) for s in (None, zygote))
        assert cold.returncode == warm.returncode == 0, (cold.stderr, warm.stderr)
        c, w = json.loads(cold.stdout), json.loads(warm.stdout)
        assert (c.pop("torch"), w.pop("torch")) == (False, True)  # forked: torch was in already
        assert w == c and w["proc"] and w["x"] == "a b=c", (c, w)
    for how, code in (("raise", 1), ("signal", -signal.SIGTERM), ("exit", 3)):
        cold, warm = (
            run([sys.executable, "-u", "sub/prog.py"], tmp_path, s, HOW=how, CODE="3")
            for s in (None, zygote)
        )
        assert cold.returncode == warm.returncode == code, (how, cold.stderr, warm.stderr)
        assert ("RuntimeError: boom in the program" in warm.stderr) == (how == "raise"), warm.stderr


def test_the_forked_process_is_found_as_a_cold_one_and_dies_with_its_client(zygote, tmp_path):
    """The sweeps find a forked process by its environment (/proc), tagged `program`; SIGKILL of the
    client (no PR_SET_PDEATHSIG across the fork) takes the program with it."""
    tag = f"warmtest-{os.getpid()}"
    (tmp_path / "lib").mkdir()
    p = subprocess.Popen(
        [sys.executable, "-m", "launchers.warmfork", "--", sys.executable, "-u", "-c", "x"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **{warmfork.SOCKET_ENV: zygote}),
    )
    assert p.wait(timeout=60) == 1  # `-c` is not a program a zygote forks: started cold, and it ran
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(120)\n")
    p = subprocess.Popen(
        [sys.executable, "-m", "launchers.warmfork", "--", sys.executable, "-u", str(sleeper)],
        env=dict(
            os.environ, PYTHONPATH=str(ROOT), LAUNCH_RUN_ID=tag, **{warmfork.SOCKET_ENV: zygote}
        ),
    )
    deadline = time.monotonic() + 30
    while (
        not (found := [q for q in procs.tagged_pids(tag) if q != p.pid])
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert len(found) == 1 and procs.is_agent(found[0]), found
    p.kill()
    p.wait()
    deadline = time.monotonic() + 10
    while procs.alive(found[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.alive(found[0]), "the forked program outlived its client"


def test_a_zygote_others_may_reach_is_not_used(zygote, tmp_path):
    os.chmod(os.path.dirname(zygote), 0o755)
    try:
        (tmp_path / "lib").mkdir()
        (tmp_path / "prog.py").write_text(PROG)
        r = run([sys.executable, "-u", "prog.py"], tmp_path, zygote)
    finally:
        os.chmod(os.path.dirname(zygote), 0o700)
    assert r.returncode == 0 and json.loads(r.stdout)["torch"] is False, r.stderr
