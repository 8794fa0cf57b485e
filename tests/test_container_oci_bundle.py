"""Issue 22, Slurm's OCI support: the bundle `clusters/image.sh bundle DIR` makes (what `srun
--container=DIR` runs on the dev cluster, tests/test_container_slurm_oci.py), proved with runc
itself, as slurmstepd's RunTimeRun runs it (slurm/dev-cluster.sh, oci.conf): this interpreter runs
inside and sees podman's marker /run/.containerenv, in a mount namespace of its own but this host's
network, UTS and PID namespaces; its exit status is runc's; nothing is left after it, nor after
`runc kill --all` of a running one. Needs runc (`make podman`): without it these tests fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT, require_cluster
from launchers import procs

pytestmark = pytest.mark.podman
IMAGE_SH = str(ROOT / "clusters" / "image.sh")


def runc() -> str:
    found = shutil.which("runc") or (
        "/usr/sbin/runc" if os.access("/usr/sbin/runc", os.X_OK) else None
    )
    require_cluster("runc", found is not None, "make podman")
    return found


def bundle_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [IMAGE_SH, "bundle", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LAUNCH_BUNDLE_PYTHON": sys.executable},
    )


def bundle_with(src, dst, args: list[str], tag: str) -> str:
    """A copy of the bundle at src whose process is args, tagged LAUNCH_RUN_ID=tag
    (procs.tagged_pids finds it)."""
    shutil.copytree(src, dst, symlinks=True)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["process"]["args"] = args
    cfg["process"]["env"].append(f"LAUNCH_RUN_ID={tag}")
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def listed(rc: str, root) -> list[str]:
    return subprocess.run(
        [rc, "--root", str(root), "list", "-q"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()


def test_bundle_runs_this_python_inside_and_leaves_nothing(tmp_path):
    rc, b = runc(), tmp_path / "bundle"
    p = bundle_sh(str(b))
    assert p.returncode == 0 and "built bundle" in p.stderr, p.stderr
    key = (b / "launchers-bundle.key").read_text()
    p = bundle_sh(str(b))  # idempotent: same recipe, same bundle
    assert (
        p.returncode == 0
        and "up to date" in p.stderr
        and (b / "launchers-bundle.key").read_text() == key
    )
    (tmp_path / "foreign").mkdir()
    for bad, why in (
        (str(tmp_path / "foreign"), "is no bundle made here"),
        ("rel/dir", "bad bundle DIR 'rel/dir'"),
    ):
        p = bundle_sh(bad)
        assert p.returncode == 1 and why in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert not any((tmp_path / "foreign").iterdir())
    code = (
        "import json, os, socket; print(json.dumps({'marker': "
        "os.path.exists('/run/.containerenv'), 'host': socket.gethostname(), 'ns': {n: "
        "os.readlink(f'/proc/self/ns/{n}') for n in ('mnt', 'net', 'uts', 'pid')}})); raise "
        "SystemExit(3)"
    )
    run = bundle_with(
        b, tmp_path / "run", [sys.executable, "-c", code], f"oci-bundle-{os.getpid()}"
    )
    p = subprocess.run(
        [
            rc,
            "--root",
            str(tmp_path / "state"),
            "run",
            "--bundle",
            run,
            f"launch-test-{os.getpid()}",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 3, p.stderr  # the process's exit status is runc's
    seen = json.loads(p.stdout)
    ours = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "net", "uts", "pid")}
    assert (
        seen["marker"] and seen["host"] == os.uname().nodename and seen["ns"]["mnt"] != ours["mnt"]
    ), seen
    assert {n: seen["ns"][n] for n in ("net", "uts", "pid")} == {
        n: ours[n] for n in ("net", "uts", "pid")
    }, seen
    assert listed(rc, tmp_path / "state") == []


def test_runc_kill_all_leaves_no_process(tmp_path):
    """What oci.conf's RunTimeKill does to a container runc run left (slurmstepd at the step's end);
    the container shares this host's PID namespace, so runc kills it through its cgroup: a
    background child included."""
    rc, b, state, tag = runc(), tmp_path / "bundle", tmp_path / "state", f"oci-kill-{os.getpid()}"
    assert bundle_sh(str(b)).returncode == 0
    run = bundle_with(b, tmp_path / "run", ["/bin/sh", "-c", "sleep 600 & sleep 601; wait"], tag)
    cid = f"launch-kill-{os.getpid()}"
    p = subprocess.Popen(
        [rc, "--root", str(state), "run", "--bundle", run, cid],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(procs.tagged_pids(tag)) < 3:  # sh and both sleeps
            assert time.monotonic() < deadline and p.poll() is None, (
                p.stderr.read() if p.poll() is not None else tag
            )
            time.sleep(0.05)
        subprocess.run(
            [rc, "--root", str(state), "kill", "--all", cid, "KILL"], check=True, timeout=30
        )
        assert p.wait(timeout=60) == 137  # 128 + SIGKILL: the container's status
        assert procs.tagged_pids(tag) == [] and listed(rc, state) == []
    finally:
        p.kill()
        subprocess.run(
            [rc, "--root", str(state), "delete", "--force", cid], capture_output=True, timeout=30
        )
