"""The Python API's launcher: `api.submit` / `api.resume` run, unchanged, in a detached process.

Why a process and not a thread: on local and SSH the launcher owns the attempt (it starts the
agents, watches them, handles SIGTERM/SIGINT -- signal handlers need a main thread -- and loops
restarts); as its own process (own session) it is exactly the CLI's launcher: the same run-dir and
status semantics, `cancel` signals it like any launcher, and the job outlives the caller like a
Slurm job does. One code path for every backend: on Slurm the same process submits and exits.

`start(request, run_dir)` returns once the run is started: the launcher recorded itself in
status.json (local, SSH, inside an allocation) or exited having made the run (Slurm: submitted). A
refusal before that (bad NCCL values, an unreachable host, a run still active) is raised here as the
CLI's LaunchError. The launcher's own output (stderr) goes to a temporary file until the run is
started, then to <run dir>/launcher.log; the ranks' streamed output (stdout) is dropped: it is in
the rank logs.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from . import layout
from .errors import LaunchError

ERROR = "launch: error: "


def start(request: dict[str, Any], run_dir: str, secrets: dict[str, str] | None = None) -> int:
    """Start the launcher for `request` ({"verb": "submit", "spec": {...}} or {"verb": "resume",
    "path": ..., "changes": {...}, "program_args": [...] | None}); returns its pid once the run at
    run_dir is started. A spec holds no secret value (RunSpec.to_dict): `secrets`
    (secretenv.handover) goes into the launcher's environment, where it takes them back
    (rundir.spec_from_record)."""
    fd, console = tempfile.mkstemp(prefix="launch-api-", suffix=".log")
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(
        os.environ,
        **(secrets or {}),
        PYTHONPATH=os.pathsep.join(filter(None, (pkg_parent, os.environ.get("PYTHONPATH")))),
    )
    with os.fdopen(fd, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launchers.detach"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,
            text=True,
        )
    try:
        try:
            proc.stdin.write(json.dumps(dict(request, console=console, run_dir=run_dir)))
            proc.stdin.close()
        except BrokenPipeError:  # it died at once (its console says why)
            pass
        code = _until_started(proc, run_dir)
    except BaseException:  # Ctrl-C while starting: the launcher stops its run as on `launch cancel`
        proc.terminate()
        proc.wait()
        raise
    if code is None:
        threading.Thread(target=proc.wait, daemon=True).start()  # reap it when it ends
        return proc.pid
    if code == 2 or not layout.is_run_dir(run_dir):
        why = (
            _last_error(console, run_dir)
            or f"the launcher exited {code} before the run started{_last_line(console)}"
        )
        _remove(console)
        raise LaunchError(why)
    return proc.pid


def _until_started(proc: subprocess.Popen, run_dir: str) -> int | None:
    """None once the launcher has recorded itself in the run's status.json; its exit code if it
    ended first."""
    while True:
        code = proc.poll()
        if code is not None:
            return code
        if _started_by(run_dir, proc.pid):
            return None
        time.sleep(0.05)


def _started_by(run_dir: str, pid: int) -> bool:
    st = layout.read_json(layout.path(run_dir, "status"))
    return bool(st) and (st.get("launcher") or {}).get("pid") == pid


def _last_error(console: str, run_dir: str) -> str | None:
    for path in (console, layout.path(run_dir, "launcher_log")):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = [ln[len(ERROR) :].strip() for ln in f if ln.startswith(ERROR)]
        except OSError:
            continue
        if lines:
            return lines[-1]
    return None


def _last_line(console: str) -> str:
    try:
        with open(console, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        lines = []
    return f": {lines[-1]}" if lines else ""


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Console(io.TextIOBase):
    """The launcher's stderr: the temporary file, then (once the run is started) <run
    dir>/launcher.log, fd 2 included, with what was written before copied over."""

    def __init__(self, temp: str, run_dir: str):
        self.temp, self.run_dir, self.moved = temp, run_dir, False
        self.f = open(temp, "a", encoding="utf-8")

    def writable(self) -> bool:
        return True

    # os.write(sys.stderr.fileno(), ...) in a signal handler: fd 2, the same file
    def fileno(self) -> int:
        return 2

    def write(self, s: str) -> int:
        if not self.moved and _started_by(self.run_dir, os.getpid()):
            self.move()
        n = self.f.write(s)
        self.f.flush()
        return n

    def move(self) -> None:
        with open(self.temp, encoding="utf-8", errors="replace") as t:
            before = t.read()
        log = open(layout.path(self.run_dir, "launcher_log"), "a", encoding="utf-8")
        log.write(before)
        log.flush()
        os.dup2(log.fileno(), 2)
        self.f.close()
        self.f, self.moved = log, True
        _remove(self.temp)


def main() -> int:
    from . import api
    from .records.rundir import spec_from_record

    # as the `launch` script: nothing a run writes is world-writable
    os.umask(os.umask(0o022) | 0o002)
    req = json.load(sys.stdin)
    console = Console(req["console"], req["run_dir"])
    sys.stderr = console
    code = 2
    try:
        if req["verb"] == "submit":
            code = api.submit(spec_from_record(req["spec"]))
        elif req["verb"] == "sweep":  # the API's sweep(): runs one after another or one array
            from .sweeprun import submit_sweep

            code = submit_sweep(spec_from_record(req["spec"]), req["items"])
        else:
            code = api.resume(
                req["path"], req["changes"], req.get("program_args"), adopt=req.get("adopt", False)
            )
    except LaunchError as e:
        print(ERROR + str(e), file=sys.stderr, flush=True)
    finally:
        if code != 2 and not console.moved and layout.is_run_dir(req["run_dir"]):
            console.move()
    return code


if __name__ == "__main__":
    sys.exit(main())
