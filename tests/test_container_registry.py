"""Issue 22, images from a registry, for real on local: the test image served by Debian's
docker-registry with htpasswd auth on 127.0.0.1 (clusters/registry.sh up; `make podman` and `make
test` do it), credentials from the auth file REGISTRY_AUTH_FILE names. A 1x1 job from the registry
completes, pulling the image once (one manifest GET in the registry's log) and recording the
registry's digest in the manifest; a second launch downloads nothing (no GET of the repository's
manifests or blobs). A wrong password and a missing image each fail before anything starts, in one
line naming the host and the cause: no run dir, no container, no process of the run. Without the
registry these tests fail, never skip."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conftest import read_json, require_cluster, run_launch
from test_container_podman import image_flags, reports

pytestmark = pytest.mark.podman
ROOT = Path(__file__).resolve().parents[1]
PORT = os.environ.get("LAUNCH_REGISTRY_PORT", "5055")
DIR = Path(os.environ.get("LAUNCH_REGISTRY_DIR", "/var/tmp/launch-registry"))
REPO = f"127.0.0.1:{PORT}/launch-python"
AUTH = str(DIR / "auth.json")  # clusters/registry.sh's: user launch and its password
# the registry's access log
REQUEST = re.compile(r'^\S+ - \S+ \[[^]]+\] "(\w+) (\S+) HTTP/[\d.]+" (\d+)')


def registry_up() -> None:
    ok = (
        subprocess.run(
            [str(ROOT / "clusters/registry.sh"), "status"], capture_output=True, timeout=60
        ).returncode
        == 0
    )
    require_cluster(f"the test registry on 127.0.0.1:{PORT}", ok, "make podman")


def log_size() -> int:
    return (DIR / "registry.log").stat().st_size


def requests_since(offset: int) -> list[str]:
    """`METHOD URI STATUS` of every request to the test image's repository logged after offset."""
    with open(DIR / "registry.log", "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return [
        " ".join(m.groups())
        for ln in text.splitlines()
        if (m := REQUEST.match(ln)) and m.group(2).startswith("/v2/launch-python/")
    ]


def launch(run_dir: str, image: str, auth: str) -> subprocess.CompletedProcess:
    return run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--run-dir",
        run_dir,
        *image_flags(image),
        "--",
        "report.py",
        env={"REGISTRY_AUTH_FILE": auth},
    )


def registry_config_digest(tag: str) -> str:
    """The content digest of the image the registry serves for tag: its manifest's config.digest."""
    user_pw = f"launch:{(DIR / 'password').read_text().strip()}"
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v2/launch-python/manifests/{tag}",
        headers={
            "Authorization": "Basic " + base64.b64encode(user_pw.encode()).decode(),
            "Accept": (
                "application/vnd.oci.image.manifest.v1+json, "
                "application/vnd.docker.distribution.manifest.v2+json"
            ),
        },
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["config"]["digest"]


@pytest.mark.slow
def test_pulled_once_then_a_second_launch_downloads_nothing(workdir):
    registry_up()
    ref = f"{REPO}:test"
    # this host has not pulled it yet
    subprocess.run(["podman", "rmi", ref], capture_output=True, timeout=60)
    at = log_size()
    p = launch("runs/first", ref, AUTH)
    assert p.returncode == 0, p.stderr
    first, first_stderr = requests_since(at), p.stderr
    assert [r for r in first if "/manifests/" in r] == [
        "GET /v2/launch-python/manifests/test 200"
    ], first
    assert any(
        r.startswith("GET /v2/launch-python/blobs/sha256:") and r.endswith(" 200") for r in first
    ), first
    assert [(r["rank"], r["world"]) for r in reports("runs/first")] == [(0, 1)] and reports(
        "runs/first"
    )[0]["container"]
    assert read_json("runs/first/status.json")["state"] == "COMPLETED"
    at = log_size()
    p = launch("runs/second", ref, AUTH)
    assert p.returncode == 0, p.stderr
    assert requests_since(at) == []  # no manifest, no blob: nothing asked of the registry
    assert f"pulled {ref} (sha256:" in first_stderr and f"pulled {ref}" not in p.stderr
    # after the counts: this is a GET
    digests = {socket.gethostname(): registry_config_digest("test")}
    for run in ("runs/first", "runs/second"):
        m = read_json(f"{run}/manifest.json")
        assert m["container_image"] == ref and m["image_digests"] == digests, m


@pytest.mark.parametrize("tag, cause", [("denied", "unauthorized"), ("absent", "manifest unknown")])
def test_a_wrong_password_or_a_missing_image_fails_in_one_line_before_anything_starts(
    workdir, tag, cause
):
    registry_up()
    auth = AUTH
    if tag == "denied":
        auth = str(Path("wrong-auth.json").resolve())
        Path(auth).write_text(
            json.dumps(
                {
                    "auths": {
                        f"127.0.0.1:{PORT}": {
                            "auth": base64.b64encode(b"launch:not-the-password").decode()
                        }
                    }
                }
            )
        )
    name = f"reg-{tag}-{os.getpid()}"
    p = launch(f"runs/{name}", f"{REPO}:{tag}", auth)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert (
        f"node 0 on host {socket.gethostname()}" in lines[0]
        and cause in lines[0]
        and f"{REPO}:{tag}" in lines[0]
    )
    assert not Path("runs", name).exists()  # nothing written
    names = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert names.split() == [] and run_processes(name) == []


def run_processes(name: str) -> list[int]:
    """Live processes tagged with a run id of run dir `name` (launchers.procs.TAG=name-...)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(f"LAUNCH_RUN_ID={name}-".encode()) for e in env):
            out.append(int(pid))
    return out
