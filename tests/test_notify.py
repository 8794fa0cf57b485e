"""--notify URL|COMMAND (issue 25 item 5): each change of a run's state is told to a local HTTP
server (a JSON POST) or a command (the event in its environment), retried, never affecting the job,
secrets redacted. Two real runs (1x1, a trivial program): RUNNING then COMPLETED, and RUNNING then
FAILED with the first failure; the rest is pure."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

import launchers
from conftest import ROOT, read_json, require_cluster, run_launch
from launchers.errors import LaunchError
from launchers.options import notifytarget
from launchers.records import notify
from launchers.spec import build_spec

TOKEN = "ghp_9fK2mQ7xZ4vB8nR1tY6wL3pS5dH0jC2a"  # looks like a secret by its content


class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.got.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(self.server.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server(request):
    """The hook server; on the dev clusters it listens on their bridge's address too (a Slurm job
    tells it from its node's network namespace): `bind` given by the test's marker."""
    mark = request.node.get_closest_marker("bind")
    srv = http.server.ThreadingHTTPServer((mark.args[0] if mark else "127.0.0.1", 0), Hook)
    srv.got, srv.status = [], 204
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv, path="/hook/abc") -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


# ---------------------------------------------------------------------------------------- real runs


def test_local_runs_tell_the_server(workdir, server):
    (workdir / "ok.py").write_text("print('fine')\n")
    (workdir / "bad.py").write_text(
        "import os\nraise RuntimeError('no access with ' + os.environ['MY_TOKEN'])\n"
    )
    p = run_launch(
        "local", "--notify", url(server), "--run-dir", "runs/ok", "--", "ok.py", timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert [b["event"] for _, _, b in server.got] == ["RUNNING", "COMPLETED"], server.got
    path, ctype, body = server.got[1]
    assert (path, ctype, body["state"], body["run_dir"]) == (
        "/hook/abc",
        "application/json",
        "COMPLETED",
        str(workdir / "runs/ok"),
    ), body
    assert body["run_id"] == yaml.safe_load((workdir / "runs/ok/run.yaml").read_text())["run_id"]
    assert read_json(workdir / "runs/ok/status.json")["state"] == "COMPLETED"

    server.got.clear()
    p = run_launch(
        "local",
        "--notify",
        url(server),
        "--env",
        "MY_TOKEN=hunter2-secret",
        "--run-dir",
        "runs/bad",
        "--max-restarts",
        "1",
        "--",
        "bad.py",
        timeout=120,
    )
    # a failed attempt the policy restarts is never FAILED meanwhile
    assert p.returncode == 1, p.stderr[-2000:]
    assert [b["event"] for _, _, b in server.got] == ["RUNNING", "REQUEUED", "RUNNING", "FAILED"], (
        server.got
    )
    assert server.got[1][2]["reason"].startswith(
        "attempt 0 failed (rank 0 on node 0, exit code 1"
    ), server.got[1]
    failed = server.got[3][2]
    ff = failed["first_failure"]
    assert (ff["rank"], ff["node"], ff["exit_code"]) == (0, 0, 1), failed
    # the --env token's value redacted
    assert ff["exception"] == "RuntimeError: no access with ***", ff
    assert "hunter2-secret" not in json.dumps(server.got)
    assert "rank 0 on node 0, exit code 1: RuntimeError: no access with ***" in failed["summary"]
    log = (workdir / "runs/bad/launcher.log").read_text()
    assert "notify http://127.0.0.1" in log and "FAILED sent" in log and "/hook/abc" not in log, log


SSH_STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
BAD = "import os\nraise RuntimeError('no access with ' + os.environ['MY_TOKEN'])\n"


def bridge_address(dev: str) -> str:
    """This machine's address on a dev cluster's bridge (what its nodes reach it at)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", dev], capture_output=True, text=True
    ).stdout
    assert " inet " in out, f"no IPv4 address on {dev}: {out!r}"
    return out.split(" inet ")[1].split("/")[0]


def wait_events(srv, want: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(srv.got) < want and time.monotonic() < deadline:
        time.sleep(0.5)
    return [b["event"] for _, _, b in srv.got]


def check_failed(srv, run_dir: str, rank: int, node: int) -> None:
    failed = srv.got[-1][2]
    ff = failed["first_failure"]
    assert (ff["rank"], ff["node"], ff["exit_code"]) == (rank, node, 1), failed
    assert ff["exception"] == "RuntimeError: no access with ***", ff
    assert "hunter2-secret" not in json.dumps(srv.got)
    assert failed["run_id"] == yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]
    assert read_json(Path(run_dir, "status.json"))["state"] == "FAILED"


def cluster_run(
    workdir, srv, script: str, bridge: str, backend_args: list[str], code: int, wait_s: float
) -> None:
    """A 2-node run on a dev cluster whose rank 1 raises: the server hears RUNNING then FAILED, at
    its path."""
    st = subprocess.run([str(ROOT / script), "status"], capture_output=True, text=True)
    require_cluster(script, st.returncode == 0, "make clusters-up")
    (workdir / "bad.py").write_text(BAD.replace("raise", "if os.environ['RANK'] == '1': raise"))
    hook = f"http://{bridge_address(bridge)}:{srv.server_address[1]}/hook/{bridge}"
    p = run_launch(
        *backend_args,
        "--notify",
        hook,
        "--env",
        "MY_TOKEN=hunter2-secret",
        "--run-dir",
        "runs/c",
        "--",
        "bad.py",
        timeout=180,
    )
    assert p.returncode == code, p.stderr[-2000:]
    assert wait_events(srv, 2, wait_s) == ["RUNNING", "FAILED"], srv.got
    assert all(path == f"/hook/{bridge}" for path, _, _ in srv.got)
    check_failed(srv, "runs/c", 1, 1)


@pytest.mark.ssh
@pytest.mark.bind("0.0.0.0")
def test_ssh_run_tells_the_server(workdir, server):
    cluster_run(
        workdir,
        server,
        "clusters/ssh-hosts.sh",
        "lsshbr0",
        [
            "ssh",
            "--hosts",
            "sshhost1,sshhost2",
            "--ssh-config",
            str(SSH_STATE / "ssh_config"),
            "--known-hosts",
            str(SSH_STATE / "known_hosts"),
        ],
        1,
        10,
    )


@pytest.mark.slurm
@pytest.mark.bind("0.0.0.0")
def test_slurm_job_tells_the_server_with_no_launcher_waiting(workdir, server):
    """No --wait: the job itself (its batch side, in a node's network namespace) tells the
    server."""
    cluster_run(
        workdir,
        server,
        "slurm/dev-cluster.sh",
        "lsimbr0",
        ["slurm", "--nodes", "2", "--gpus-per-node", "1", "--time", "5"],
        0,
        180,
    )


# ------------------------------------------------------------------------------------------ pure


@pytest.mark.parametrize(
    "value, needle",
    [
        ("", "empty or more than one line"),
        ("  ", "empty or more than one line"),
        ("a\nb", "more than one line"),
        ("ftp://example.org/x", "scheme 'ftp'"),
        ("http://", "no host"),
        ("http://h:99999/x", "bad port"),
        (7, "type int"),
        ([3], "'int'"),
    ],
)
def test_bad_targets_are_refused(value, needle):
    with pytest.raises(LaunchError) as e:
        notifytarget.parse_targets(
            value if isinstance(value, list) else [value] if not isinstance(value, int) else value
        )
    assert needle in str(e.value) and "http:// or https:// URL" in str(e.value)


def test_targets_from_profile_and_flags(workdir):
    (workdir / "ok.py").write_text("")
    (workdir / "p.yaml").write_text("notify: https://hooks.example.org/T1/B2\n")
    spec = build_spec(
        "local", {"notify": ("echo done", "https://hooks.example.org/T1/B2")}, ["ok.py"], "p.yaml"
    )
    # each once, profile first
    assert spec.notify == ("https://hooks.example.org/T1/B2", "echo done")
    assert spec.replace().to_dict()["notify"] == list(spec.notify)
    assert launchers.JobSpec(
        backend="local", program=("ok.py",), notify=("echo x",)
    ).resolve().notify == ("echo x",)
    with pytest.raises(LaunchError, match=r"profile 'p2.yaml': notify 'gopher://h/\.\.\.'"):
        (workdir / "p2.yaml").write_text("notify: [gopher://h/x]\n")
        build_spec("local", {}, ["ok.py"], "p2.yaml")
    assert (
        notifytarget.shown("https://u:pw@hooks.example.org:8443/T1/B2?k=v")
        == "https://hooks.example.org:8443/..."
    )
    assert notifytarget.shown("notify-send 'run ended'") == "notify-send ..."


@pytest.mark.parametrize(
    "old, new, event",
    [
        ({"state": "PENDING"}, {"state": "RUNNING"}, "RUNNING"),
        ({"state": "RUNNING"}, {"state": "RUNNING", "reason": "x"}, None),
        ({"state": "FAILED"}, {"state": "RUNNING"}, "RUNNING"),  # a restart
        ({"state": "PENDING"}, {"state": "REQUEUED"}, "REQUEUED"),
        ({"state": "RUNNING"}, {"state": "PREEMPTED"}, None),
        ({}, {"state": "PENDING"}, None),
        ({"state": "RUNNING"}, {"state": "RUNNING", "hang": {"stalled_ranks": [1]}}, "HANG"),
        (
            {"state": "RUNNING", "hang": {"stalled_ranks": [1]}},
            {"state": "RUNNING", "hang": {"stalled_ranks": [1]}},
            None,
        ),
        ({"state": "RUNNING"}, {"state": "FAILED"}, "FAILED"),
        ({"state": "RUNNING"}, {"state": "CANCELLED"}, "CANCELLED"),
        ({"state": "RUNNING"}, {"state": "COMPLETED"}, "COMPLETED"),
    ],
)
def test_event_of_a_change(old, new, event):
    assert notify.event_of(old, new) == event


def test_payload_is_redacted():
    record = {
        "run_id": "r-1",
        "spec": {
            "name": "r",
            "backend": "slurm",
            "env": {"DB_PASS": "***", "A": "1"},
            "secrets": ["HF_TOKEN"],
        },
    }
    st = {
        "state": "FAILED",
        "attempt": 1,
        "slurm_job_id": "42",
        "reason": "see https://u:pw1@h/x",
        "first_failure": {
            "rank": 3,
            "node": 1,
            "exit_code": 1,
            "exception": f"KeyError: {TOKEN} hf-abc db-xyz",
        },
    }
    secrets = notify.secret_values(record, {"DB_PASS": "db-xyz", "HF_TOKEN": "hf-abc", "A": "1"})
    assert secrets == ["db-xyz", "hf-abc"]
    body = notify.redact(notify.payload("FAILED", st, record, "/runs/r"), secrets)
    assert (
        body["first_failure"]["exception"] == "KeyError: *** *** ***"
        and body["reason"] == "see https://u:***@h/x"
    )
    assert (body["event"], body["run_id"], body["attempt"], body["slurm_job_id"]) == (
        "FAILED",
        "r-1",
        1,
        "42",
    )
    assert (
        body["summary"]
        == "run r FAILED (see https://u:***@h/x): rank 3 on node 1, exit code 1: KeyError: *** "
        "*** ***"
    )
    env = notify.command_env(body, {"PATH": "/bin"})
    assert (env["LAUNCH_EVENT"], env["LAUNCH_RUN_ID"], env["LAUNCH_RUN_DIR"]) == (
        "FAILED",
        "r-1",
        "/runs/r",
    )
    assert json.loads(env["LAUNCH_EVENT_JSON"]) == json.loads(json.dumps(body))


def test_retries_with_backoff_then_gives_up():
    calls, waits = [], []

    def flaky(target, body):
        calls.append(target)
        if len(calls) < 3:
            raise OSError("connection refused")

    assert notify.deliver("http://h/x", {}, send=flaky, sleep=waits.append) == (3, None)
    assert waits == list(notify.BACKOFF_S)

    def broken(target, body):
        raise ValueError("bad answer")

    waits.clear()
    assert notify.deliver("cmd", {}, send=broken, sleep=waits.append, tries=2) == (2, "bad answer")
    assert waits == [notify.BACKOFF_S[0]]


def test_http_error_and_command_mode(server, tmp_path, monkeypatch):
    server.status = 500
    n, why = notify.deliver(url(server), {"event": "RUNNING"}, sleep=lambda s: None)
    assert (n, len(server.got)) == (notify.TRIES, notify.TRIES) and "500" in why
    body = {"event": "COMPLETED", "run_id": "r-2", "run_dir": str(tmp_path), "state": "COMPLETED"}
    out = tmp_path / "got"
    cmd = f'printf "%s %s %s" "$LAUNCH_EVENT" "$LAUNCH_RUN_ID" "$LAUNCH_EVENT_JSON" > {out}'
    assert notify.deliver(cmd, body, sleep=lambda s: None) == (1, None)
    assert out.read_text() == "COMPLETED r-2 " + json.dumps(body, sort_keys=True)
    assert notify.deliver("echo nope >&2; exit 3", body, sleep=lambda s: None, tries=1) == (
        1,
        "exit status 3: nope",
    )


def test_a_failing_target_is_logged_not_raised(tmp_path, monkeypatch):
    """on_change with a target that refuses: the status write goes on; launcher.log says it
    failed."""
    monkeypatch.setattr(notify, "BACKOFF_S", (0.0,))
    spec = {
        "backend": "local",
        "program": ["x.py"],
        "run_dir": str(tmp_path),
        "name": "r",
        "nodes": 1,
        "gpus_per_node": 1,
        "notify": ["exit 4"],
    }
    (tmp_path / "run.yaml").write_text(
        json.dumps({"run_id": "r-3", "spec": spec, "attempts": [{}]})
    )
    notify.arm(str(tmp_path))  # the launcher of that run (a reader sends nothing)
    th = notify.on_change(str(tmp_path), "RUNNING", {"state": "RUNNING"})
    th.join()
    log = (tmp_path / "launcher.log").read_text()
    assert f"notify exit ...: RUNNING failed after {notify.TRIES} tries: exit status 4" in log, log
