"""--notify URL|COMMAND: tell someone when a run changes state (RUNNING, REQUEUED, HANG, FAILED,
CANCELLED, COMPLETED). An http(s) URL gets the event as a JSON POST (urllib, a short timeout);
anything else is a shell command run with the event in its environment (LAUNCH_EVENT, LAUNCH_RUN_ID,
LAUNCH_RUN_DIR, LAUNCH_STATE, LAUNCH_REASON, LAUNCH_EVENT_JSON). RunDir.update_status (the one
writer of status.json) calls on_change() once per change of state; only a process that armed the run
dir sends (the launcher that made or resumed it, a Slurm job's node 0 or batch side: arm()). A
reader (`launch status`, `wait`, `list`) that corrects a dead launcher's state records it and sends
nothing: run.yaml's targets are data to it, never a command (issue 35). One sender thread per
process sends the events in order, each target tried a few times with backoff (a process that ends
waits for it at most EXIT_WAIT_S); a notification that fails never affects the job: it is logged to
the run's launcher.log. Secret values (the job's --secret and secret-named variables, as far as this
process has them, and anything that looks like a secret by its content:
launchers.credentials.secretenv) never leave: they are *** in the payload, and a target is logged by
its scheme and host (a URL) or first word (a command) only. The option itself (its targets, what a
log shows of one) is launchers.options.notifytarget's. Layer 0: stdlib and layout, secretenv,
secretshape, notifytarget.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Iterable, Mapping

from .. import layout
from ..credentials import secretenv
from ..credentials.secretshape import redact_text
from ..options.notifytarget import is_url, shown

EVENTS = ("RUNNING", "REQUEUED", "HANG", "FAILED", "CANCELLED", "COMPLETED")
TRIES, BACKOFF_S = 3, (1.0, 3.0)  # attempts per target; the waits between them
HTTP_TIMEOUT_S, COMMAND_TIMEOUT_S = 5.0, 10.0
EXIT_WAIT_S = 20.0  # how long a process that ends waits for its events still being sent


# ------------------------------------------------------------------------------------ events (pure)


def event_of(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """The event of a status.json change, or None: a new state among EVENTS (FAILED -> RUNNING again
    on a restart counts), or a hang verdict newly recorded."""
    if new.get("state") != old.get("state") and new.get("state") in EVENTS:
        return new["state"]
    hang = new.get("hang")
    if hang and hang != old.get("hang") and hang.get("stalled_ranks"):
        return "HANG"
    return None


def payload(
    event: str,
    st: Mapping[str, Any],
    record: Mapping[str, Any],
    path: str,
    detail: str | None = None,
) -> dict[str, Any]:
    """The event as the JSON body / LAUNCH_EVENT_JSON: what happened, to which run, and why when
    known."""
    spec = record.get("spec") or {}
    reason = detail or st.get("reason")
    return {
        "event": event,
        "state": st.get("state"),
        "run_id": record.get("run_id"),
        "run_dir": path,
        "name": spec.get("name"),
        "backend": spec.get("backend"),
        "attempt": st.get("attempt", 0),
        "reason": reason,
        "first_failure": st.get("first_failure"),
        "slurm_job_id": st.get("slurm_job_id"),
        "host": socket.gethostname(),
        "time": time.time(),
        "summary": f"run {spec.get('name') or os.path.basename(path)} {event}"
        + (f" ({reason})" if reason else "")
        + (f": {failure_line(st['first_failure'])}" if st.get("first_failure") else ""),
    }


def failure_line(ff: Mapping[str, Any]) -> str:
    where = (
        f"rank {ff['rank']} on node {ff.get('node')}"
        if ff.get("rank") is not None
        else f"node {ff.get('node')}"
    )
    how = f"signal {ff['signal']}" if ff.get("signal") else f"exit code {ff.get('exit_code')}"
    why = ff.get("exception") or ff.get("reason")
    return f"{where}, {how}" + (f": {why}" if why else "")


_armed: set[str] = set()  # the run dirs (real paths) whose events this process sends (arm())


def arm(path: str) -> None:
    """This process owns the run at `path` (it made or resumed it with its --notify, or is its Slurm
    job's own node task / batch side): its state changes are sent to the targets of run.yaml. Any
    other process that records a change (a reader correcting a dead launcher) sends nothing."""
    _armed.add(os.path.realpath(path))


def armed(path: str) -> bool:
    return os.path.realpath(path) in _armed


def known_secrets(held: Iterable[str] = ()) -> list[str]:
    """The secret values this process knows: `held` (a RunDir's: the values of the spec it wrote)
    and a rank's own (NAMES_ENV). Kept by their holder, never in this module."""
    return sorted(set(held) | set(secretenv.rank_known(os.environ)))


def secret_values(
    record: Mapping[str, Any], environ: Mapping[str, str], held: Iterable[str] = ()
) -> list[str]:
    """The values of the run's secrets this process has: `held`, and its --secret names and the
    variables run.yaml keeps as *** (secret-named or secret-looking) as `environ` gives them (a
    Slurm job's)."""
    spec = record.get("spec") or {}
    names = [k for k, v in (spec.get("env") or {}).items() if v == secretenv.REDACTED] + list(
        spec.get("secrets") or ()
    )
    return sorted(set(held) | {environ[k] for k in names if environ.get(k)})


def redact(value: Any, secrets: Iterable[str]) -> Any:
    """Every string in value with each secret value, and each word that looks like a secret, as
    ***."""
    if isinstance(value, dict):
        return {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    if not isinstance(value, str):
        return value
    return redact_text(value, secrets)  # known values, credentials by shape, random tokens


def command_env(body: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """A command target's environment: the caller's, plus the event."""
    return {
        **environ,
        "LAUNCH_EVENT": body["event"],
        "LAUNCH_RUN_ID": str(body.get("run_id") or ""),
        "LAUNCH_RUN_DIR": body["run_dir"],
        "LAUNCH_STATE": str(body.get("state") or ""),
        "LAUNCH_REASON": str(body.get("reason") or ""),
        "LAUNCH_EVENT_JSON": json.dumps(body, sort_keys=True),
    }


# ----------------------------------------------------------------------------------------- delivery


def post(url: str, body: Mapping[str, Any]) -> None:
    """One JSON POST; raises OSError (urllib's errors are OSErrors) unless the answer is 2xx."""
    # only when sending: every rank wrapper imports this module (through rundir)
    import urllib.request

    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "launchers-notify"},
    )
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
        if not 200 <= r.status < 300:
            raise OSError(f"HTTP {r.status}")


def run_command(command: str, body: Mapping[str, Any]) -> None:
    """The command under /bin/sh with the event in its environment; raises OSError unless it exits
    0."""
    import tempfile

    # a file, not a pipe: a child left in the background holds no EOF
    with tempfile.TemporaryFile() as errf:
        p = subprocess.Popen(
            ["/bin/sh", "-c", command],
            env=command_env(body, os.environ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errf,
            start_new_session=True,
        )
        _groups.add(p.pid)
        try:  # its own process group: a command that hangs is ended with all it started
            p.wait(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise OSError(f"did not end within {COMMAND_TIMEOUT_S:g} s (killed)") from None
        finally:
            end_group(p)  # what it left behind in the background goes too
        errf.seek(max(0, errf.seek(0, 2) - 4096))
        err = errf.read()
    if p.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or [""])[-1][:200]
        raise OSError(f"exit status {p.returncode}" + (f": {last}" if last else ""))


_groups: set[int] = set()  # the process groups of the commands being run (ended at exit too)


def end_group(p: subprocess.Popen) -> None:
    """SIGKILL to the command's process group (its session), then reap it."""
    try:
        os.killpg(p.pid, 9)
    except OSError:  # the group is gone already
        pass
    p.wait()
    _groups.discard(p.pid)


def deliver(
    target: str,
    body: Mapping[str, Any],
    send: Callable[[str, Mapping[str, Any]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    tries: int = TRIES,
) -> tuple[int, str | None]:
    """Send one event to one target, retried with backoff: (tries used, None) once sent, else
    (tries, the last error). Never raises."""
    send = send or (post if is_url(target) else run_command)
    why = None
    for i in range(tries):
        if i:
            sleep(BACKOFF_S[min(i - 1, len(BACKOFF_S) - 1)])
        try:
            send(target, body)
            return i + 1, None
        except Exception as e:  # any failure of a notification stays here: the job goes on
            # urllib's URLError (not its HTTPError): the cause inside
            reason = getattr(e, "reason", None)
            plain = reason is not None and not hasattr(e, "code")
            # HTTP Error 500: ...
            why = (str(reason) if plain else str(e) or type(e).__name__)[:200]
    return tries, why


def log_line(path: str, line: str) -> None:
    try:
        with open(layout.path(path, "launcher_log"), "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} launch: {line}\n")
    except OSError:
        pass


def send_all(
    path: str, targets: Iterable[str], body: Mapping[str, Any], secrets: Iterable[str]
) -> None:
    """Deliver to each target (one after another) and log the outcome to launcher.log."""
    for t in targets:
        n, why = deliver(t, body)
        what = f"notify {shown(t)}: {body['event']}"
        log_line(
            path,
            f"{what} sent"
            if why is None
            else f"{what} failed after {n} tries: {redact(why, secrets)}",
        )


# events not yet sent, oldest first
_queue: list[tuple[str, list[str], dict[str, Any], list[str]]] = []
_guard = threading.Lock()
_worker: threading.Thread | None = None
_done = threading.Event()  # set when the queue is empty


def _forget() -> None:
    """In a forked child: the parent's sender thread is not there; its queue is the parent's to
    send."""
    global _guard, _worker
    _guard, _worker = threading.Lock(), None
    _queue.clear()
    _groups.clear()


def _at_exit() -> None:
    """A process that ends waits for its events, at most EXIT_WAIT_S (a slow target never holds up a
    job's end for long; what is not sent by then is lost)."""
    if _worker is not None:
        _done.wait(EXIT_WAIT_S)
    for pgid in list(_groups):  # a command still running: never left behind after the run
        try:
            os.killpg(pgid, 9)
        except OSError:
            pass


os.register_at_fork(after_in_child=_forget)
atexit.register(_at_exit)


def _drain() -> None:
    """The one sender of this process: the events in the order they happened (RUNNING before
    COMPLETED)."""
    global _worker
    while True:
        with _guard:
            if not _queue:
                _worker = None
                _done.set()
                return
            item = _queue.pop(0)
        send_all(*item)


def on_change(
    path: str,
    event: str,
    st: Mapping[str, Any],
    detail: str | None = None,
    held: Iterable[str] = (),
) -> threading.Thread | None:
    """Queue `event` for the run's targets (run.yaml's spec `notify`); sent in order by one thread
    per process (a process that ends waits for it, at most EXIT_WAIT_S). Returns that thread (None:
    no target). Never raises."""
    global _worker
    try:
        record, _ = layout.load_run_yaml(path)
        targets = list(((record or {}).get("spec") or {}).get("notify") or ())
        if not targets:
            return None
        if not armed(path):
            log_line(
                path,
                f"notify: {event} not sent: the launcher that owned it is gone (recorded by pid "
                f"{os.getpid()}, a reader: run.yaml's targets are never run by readers)",
            )
            return None
        secrets = secret_values(record, os.environ, held)
        body = redact(payload(event, st, record, path, detail), secrets)
        with _guard:
            _queue.append((path, targets, body, secrets))
            _done.clear()
            if _worker is None:
                _worker = threading.Thread(target=_drain, name="launch-notify", daemon=True)
                _worker.start()
            return _worker
    except Exception as e:  # a notification never breaks the status write that triggered it
        log_line(path, f"notify: {event} not sent: {type(e).__name__}: {e}"[:300])
        return None
