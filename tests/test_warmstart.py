"""The warm launcher (launchers/warmstart.py): a `launch slurm` handed to a resident server runs
exactly as it would in-process (exit status, messages, working directory, umask, environment), only
from a process that imported everything already; a socket that is not in the user's private
directory is never used; no server outlives a test. The suite runs with LAUNCH_WARM=0 (conftest);
these turn it on in a scratch state dir of their own."""

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LAUNCH, ROOT, require_cluster

pytestmark = pytest.mark.slurm
# the console script's own interpreter
PYTHON = Path(LAUNCH).read_text().splitlines()[0][2:].strip()
BAD = ["slurm", "--nodes", "abc", "--", "x.py"]
BAD_LINE = (
    "launch: error: --nodes 'abc' is not accepted; give an integer 1-65536 in plain decimal digits"
)


def launch(args, env, cwd, umask=None):
    """`launch ARGS` with -X importtime: (exit status, stderr's own lines, whether click was
    imported here)."""
    p = subprocess.run(
        [PYTHON, "-X", "importtime", LAUNCH, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )
    said = [ln for ln in p.stderr.splitlines() if not ln.startswith("import time:")]
    names = [
        ln.split("|")[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")
    ]
    imported.clear()  # after site's line: what the interpreter's start-up imports is not ours
    imported.update(names[names.index("site") + 1 :] if "site" in names else names)
    return p.returncode, said, p.stdout, "click" in imported


imported: set[str] = set()  # what the last launch() imported in its own process, after site


def servers(state: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"launchers.warmstart" in cmd and any(str(state).encode() in c for c in cmd):
                out.append(int(d.name))
    return out


@pytest.fixture
def warm(tmp_path):
    # a socket path past sun_path's 108 bytes, as a deep home makes
    state = tmp_path / ("deep" * 20) / "state"
    env = {**os.environ, "LAUNCH_WARM": "1", "LAUNCH_STATE_DIR": str(state)}
    yield env, state
    for pid in servers(state):
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + 30
    while servers(state) and time.monotonic() < end:
        time.sleep(0.1)
    assert not servers(state), "a warm server outlived its test"
    assert not list((state / "warm").glob("*.sock")), "a server that ended left its socket behind"


def served_soon(env, cwd) -> None:
    """The first submit-shaped command runs here and leaves a server behind; wait until one
    serves."""
    code, said, _, here = launch(BAD, env, cwd)
    assert (code, said, here) == (2, [BAD_LINE], True)
    end = time.monotonic() + 90
    while time.monotonic() < end:
        code, said, _, here = launch(BAD, env, cwd)
        assert (code, said) == (2, [BAD_LINE])
        if not here:
            return
        time.sleep(0.3)
    pytest.fail("no warm server answered within 90 s")


def test_bad_input_served_warm_says_the_same_line_and_a_socket_outside_a_private_dir_is_not_used(
    warm, tmp_path
):
    env, state = warm
    served_soon(env, tmp_path)
    assert not any(tmp_path.glob("runs*")), "nothing is created for bad input"
    (state / "warm").chmod(0o755)  # no longer private: the client does not use the socket
    code, said, _, here = launch(BAD, env, tmp_path)
    assert (code, said, here) == (2, [BAD_LINE], True)
    (state / "warm").chmod(0o700)
    code, said, _, here = launch(BAD, {**env, "LAUNCH_WARM": "0"}, tmp_path)
    assert (code, said, here) == (2, [BAD_LINE], True)


def test_a_submit_served_warm_runs_in_the_clients_directory_umask_and_environment(warm, tmp_path):
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")
    env, _ = warm
    served_soon(env, tmp_path)
    (tmp_path / "probe.py").write_text(
        "import os, sys\nopen(sys.argv[1] + '.tmp', 'w').write(os.environ['WARM_PROBE'] + "
        "ascii(os.environ['WARM_EXOTIC']))\n"
        # seen whole or not at all
        "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    )
    out = tmp_path / "probe.out"
    code, said, stdout, here = launch(
        [
            "slurm",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--time",
            "5",
            "--run-dir",
            "runs/w",
            "--",
            "probe.py",
            str(out),
        ],
        {**env, "WARM_PROBE": "from the client", "WARM_EXOTIC": 'é\t"q"\\ \u2028'},
        tmp_path,
        umask=0o027,
    )
    assert code == 0 and not here, (code, said, stdout)
    # the client (launchers.warmclient) imports none of the Python wrappers it does without
    assert not imported & {"re", "json", "socket", "enum", "contextlib"}, sorted(imported)
    assert "slurm job" in stdout and str(tmp_path / "runs" / "w") in stdout
    mode = stat.S_IMODE((tmp_path / "runs" / "w").stat().st_mode)
    assert mode == 0o750, oct(mode)  # the client's umask 027, not the server's
    end = time.monotonic() + 120
    while not out.exists() and time.monotonic() < end:
        time.sleep(0.2)
    assert out.read_text() == "from the client" + ascii('é\t"q"\\ \u2028')


def test_a_socket_another_user_listens_on_is_sent_nothing(tmp_path, monkeypatch):
    """A directory swapped between the client's checks and its connect can put another user's
    listener at the socket's path: the client checks the listener's uid (SO_PEERCRED) before it
    sends anything (its environment holds secrets) and runs the command itself. The listener here
    drops to uid 65534 before listen()."""
    from launchers import warmstart

    monkeypatch.setenv("LAUNCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("LAUNCH_WARM", "1")
    path = warmstart.socket_path()
    os.makedirs(os.path.dirname(path), mode=0o700)
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user's listener
        import socket

        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(path)
            os.setuid(65534)
            s.listen(1)
            s.settimeout(20)
            conn, _ = s.accept()
            conn.settimeout(5)
            data = conn.recv(65536)
            os.write(got_w, b"sent %d bytes" % len(data))
        finally:
            os._exit(0)
    os.close(got_w)
    end = time.monotonic() + 10
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.2)  # listen() after the setuid
    assert warmstart.run(["launch", "slurm", "--nodes", "abc", "--", "x.py"]) is None
    os.waitpid(pid, 0)
    assert os.read(got_r, 100) in (b"", b"sent 0 bytes")
