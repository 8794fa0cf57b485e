"""Issue 22 item 1 for real: `launch local --container-runtime podman` runs a 1 node x 2 process job
in the small local image (clusters/image.sh build: an imported rootfs; this host's /usr, the
interpreter's Python prefix and the venv mounted read-only at the same paths, so the venv's python
runs inside). Every rank proves it is inside (podman's /run/.containerenv, a mount namespace other
than ours); the run completes with its per-rank records; after it, after a Ctrl-C mid-run and after
a SIGKILLed agent of a 2-node job, no container of the run and no process of it is left; `launch
resume` of that job continues inside from its last checkpoint. Needs podman and the image (`make
podman`; `make test` does it): without them these tests fail, never skip."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCH, ROOT, rank_lines, read_json, require_cluster, run_launch
from launchers import procs
from launchers.containers import container

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))
from common import (  # noqa: E402
    assert_latest_complete,
    convnet,
    kill_orphans,
    latest_checkpoint,
    metrics,
    orphans,
    proc_env,
    wait_for,
    wait_step,
)

pytestmark = pytest.mark.podman
IMAGE = os.environ.get("LAUNCH_TEST_IMAGE", "localhost/launch-python:test")


def container_flags() -> list[str]:
    """The image, the venv's python inside it, and what makes that python run there (read-only, same
    paths)."""
    ready = (
        shutil.which("podman") is not None
        and subprocess.run(
            ["podman", "image", "exists", IMAGE], capture_output=True, timeout=60
        ).returncode
        == 0
    )
    require_cluster(f"podman with the image {IMAGE}", ready, "make podman")
    return image_flags(IMAGE)


def image_flags(image: str) -> list[str]:
    """The flags that run the venv's python inside image (a rootfs with an empty /usr:
    clusters/image.sh)."""
    paths = [
        "/usr",
        *(p for p in dict.fromkeys((sys.base_prefix, sys.prefix)) if not p.startswith("/usr/")),
    ]
    mounts = [w for p in paths for w in ("--container-mount", f"{p}:{p}:ro")]
    return [
        "--container-runtime",
        "podman",
        "--container-image",
        image,
        "--container-python",
        sys.executable,
        *mounts,
    ]


def reports(run_dir) -> list[dict]:
    return sorted(
        (json.loads(ln[len("REPORT ") :]) for ln in rank_lines(run_dir, "REPORT ")),
        key=lambda r: r["rank"],
    )


def run_id_of(run_dir) -> str:
    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]


def containers_of(run_id: str) -> list[str]:
    out = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"name={run_id}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return out.split()


def test_podman_1x2_runs_inside_the_container_and_leaves_nothing(workdir):
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/p",
        *container_flags(),
        "--",
        "report.py",
    )
    assert p.returncode == 0, p.stderr
    reps = reports("runs/p")
    assert [(r["rank"], r["world"], r["sum"]) for r in reps] == [(0, 2, 3.0), (1, 2, 3.0)]
    ours = os.readlink("/proc/self/ns/mnt")
    assert all(r["container"] and r["mnt_ns"] != ours for r in reps), reps  # each rank is inside
    # --dist-backend auto: the node's shell runs podman,
    log = Path("runs/p/logs/node0/agent.log").read_text()
    assert "podman --rm --replace" in log and "nvidia.com/gpu=all" not in log.replace(
        container.CDI_PROBE, ""
    )
    # ... with the GPUs only where the host has a CDI spec of them (this host: none)
    st = read_json("runs/p/status.json")
    assert st["state"] == "COMPLETED" and st["nodes"] == {"0": 0} and st["first_failure"] is None
    assert [read_json(f"runs/p/status/rank{r}.json")["exit_code"] for r in (0, 1)] == [0, 0]
    run_id = run_id_of("runs/p")
    assert containers_of(run_id) == [] and procs.tagged_pids(run_id) == []


def test_podman_ctrl_c_leaves_no_container_and_no_process(workdir):
    p = subprocess.Popen(
        [
            LAUNCH,
            "local",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--run-dir",
            "runs/c",
            *container_flags(),
            "--env",
            "TEST_SLEEP=120",
            "--",
            "report.py",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(rank_lines("runs/c", "sleeping")) < 2:
        assert time.monotonic() < deadline and p.poll() is None, (
            p.stderr.read() if p.poll() is not None else "timeout"
        )
        time.sleep(0.2)
    run_id = run_id_of("runs/c")
    assert containers_of(run_id) == [f"{run_id}-node0"]  # the run's one container, running
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=90) == 130, p.stderr.read()
    assert containers_of(run_id) == [] and procs.tagged_pids(run_id) == []
    assert read_json("runs/c/status.json")["state"] == "CANCELLED"
    assert all(r["container"] for r in reports("runs/c")) and len(reports("runs/c")) == 2


# A rank's first words from inside, then the module it is given runs as `python -m` would run it
# (the convnet).
INSIDE = """import json, os, runpy, sys
e = os.environ
rec = {"rank": int(e["RANK"]), "world": int(e["WORLD_SIZE"]), "attempt": int(e["LAUNCH_ATTEMPT"]),
       "container": os.path.exists("/run/.containerenv"), "mnt_ns": os.readlink("/proc/self/ns/mnt")}
print("INSIDE " + json.dumps(rec), flush=True)
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""  # noqa: E501


def inside_agent(run_id: str, node: int) -> int | None:
    """The torchrun agent of `node` in its container (--pid host: a pid of ours; its root is the
    image's), never the `podman run` client in front of it, which carries the same tag and command
    line."""
    return next(
        (
            q
            for q in procs.agent_pids(run_id)
            if proc_env(q).get("NODE_RANK") == str(node)
            and os.path.exists(f"/proc/{q}/root/run/.containerenv")
        ),
        None,
    )


@pytest.mark.slow
def test_podman_2_nodes_killed_agent_leaves_nothing_and_resume_continues_inside(workdir):
    """2 nodes x 1 process (gloo), one container per node; the checkout mounted read-only for
    `workloads`. SIGKILL node 1's torchrun agent once both ranks are past a complete checkpoint: the
    run FAILS, node 1 ended by the SIGKILL (podman's 128 + 9), which is the first failure (node 1,
    SIGKILL: not rank 0's lost peer), no container and no process is left; `launch resume` runs
    attempt 1 in the containers from checkpoints/latest to COMPLETED. Every rank of both attempts
    says it is inside, in a world of 2."""
    steps, every, hit = 30, 5, 10
    Path("inside.py").write_text(INSIDE)
    train = ["inside.py", *convnet(steps, every)[1:]]  # [1:]: inside.py takes the module's name
    flags = [
        *container_flags(),
        "--container-mount",
        f"{ROOT}:{ROOT}:ro",
        "--env",
        f"PYTHONPATH={ROOT}",
    ]
    with open("launch.err", "w") as err:
        p = subprocess.Popen(
            [
                LAUNCH,
                "local",
                "--nodes",
                "2",
                "--gpus-per-node",
                "1",
                "--run-dir",
                "runs/k",
                *flags,
                "--",
                *train,
                "--step-delay",
                "0.2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for(lambda: Path("runs/k/run.yaml").is_file() or p.poll() is not None, 60, "run.yaml")
        rid = run_id_of("runs/k")
        killed_agent_then_resume(p, rid, train, steps, every, hit)
    finally:  # a failed check leaves nothing running either
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=90)
        if Path("runs/k/run.yaml").is_file():
            kill_orphans(run_id_of("runs/k"))
            for name in containers_of(run_id_of("runs/k")):
                subprocess.run(["podman", "rm", "-f", name], capture_output=True, timeout=60)


def killed_agent_then_resume(
    p: subprocess.Popen, rid: str, train: list[str], steps: int, every: int, hit: int
) -> None:
    wait_step("runs/k", hit, world=2, timeout=240, alive=lambda: p.poll() is None)
    wait_for(lambda: latest_checkpoint("runs/k")[1], 60, "a complete checkpoint")
    assert sorted(containers_of(rid)) == [f"{rid}-node0", f"{rid}-node1"]
    pid = inside_agent(rid, 1)
    assert pid, [proc_env(q).get("NODE_RANK") for q in procs.agent_pids(rid)]
    os.kill(pid, signal.SIGKILL)
    assert p.wait(timeout=180) == 1, Path("launch.err").read_text()[-3000:]
    st = read_json("runs/k/status.json")
    ff = st["first_failure"]  # as without a container: the killed node, not the peer that lost it
    assert st["state"] == "FAILED" and st["nodes"]["1"] == 128 + signal.SIGKILL, st
    assert ff["node"] == 1 and ff["signal"] == "SIGKILL" and ff.get("rank") is None, st
    err = Path("launch.err").read_text()
    assert "run FAILED (node 1, signal SIGKILL)" in err, err[-3000:]
    assert containers_of(rid) == [] and orphans(rid) == []
    assert_latest_complete("runs/k")
    r = run_launch("resume", "runs/k", "--", *train, timeout=300)  # the normal speed
    assert r.returncode == 0, r.stderr[-3000:]
    st = read_json("runs/k/status.json")
    assert st["state"] == "COMPLETED" and st["nodes"] == {"0": 0, "1": 0}, st
    resumed = rank_lines("runs/k", "resumed from ")  # rank 0 says where from
    assert len(resumed) == 1 and int(resumed[0].split("(step ")[1].split(",")[0]) >= every, resumed
    later = [m for m in metrics("runs/k") if m.get("attempt") == 1 and "step" in m]
    assert later and later[0]["step"] > every and later[-1]["step"] == steps, later[:1] + later[-1:]
    ins = sorted(
        (json.loads(ln[len("INSIDE ") :]) for ln in rank_lines("runs/k", "INSIDE ")),
        key=lambda d: (d["attempt"], d["rank"]),
    )
    ours = os.readlink("/proc/self/ns/mnt")
    assert [(d["attempt"], d["rank"], d["world"]) for d in ins] == [
        (0, 0, 2),
        (0, 1, 2),
        (1, 0, 2),
        (1, 1, 2),
    ], ins
    assert all(d["container"] and d["mnt_ns"] != ours for d in ins), ins
    assert read_json("runs/k/final.json")["param_sha256"]
    assert containers_of(rid) == [] and orphans(rid) == []


@pytest.mark.ssh
def test_podman_on_two_ssh_hosts_world_2_and_leaves_nothing(workdir):
    """The same image on the SSH test hosts (they share this machine's podman storage: one import
    serves all): a 2-host job, one rank each, every rank inside its host's container, COMPLETED;
    nothing left on any host."""
    state = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
    require_cluster("the SSH test hosts", (state / "known_hosts").exists(), "make ssh-up")
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,sshhost2",
        "--ssh-config",
        str(state / "ssh_config"),
        "--known-hosts",
        str(state / "known_hosts"),
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--run-dir",
        "runs/s",
        *container_flags(),
        "--",
        "report.py",
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    reps = reports("runs/s")
    assert [(r["rank"], r["world"], r["sum"], r["node_rank"]) for r in reps] == [
        (0, 2, 3.0, "0"),
        (1, 2, 3.0, "1"),
    ]
    assert all(r["container"] for r in reps), reps
    run = yaml.safe_load(Path("runs/s/run.yaml").read_text())
    assert run["attempts"][0]["hosts"] == ["sshhost1", "sshhost2"]
    assert read_json("runs/s/status.json")["state"] == "COMPLETED"
    assert containers_of(run["run_id"]) == [] and procs.tagged_pids(run["run_id"]) == []


@pytest.mark.ssh
def test_podman_on_two_ssh_hosts_launch_cancel_leaves_no_container_and_no_process(workdir):
    """`launch cancel` of a 2-host job in the container on the SSH test hosts, while both ranks
    sleep: CANCELLED, no container of the run and no process of it left on any host (the root
    namespace sees every host's)."""
    state = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
    require_cluster("the SSH test hosts", (state / "known_hosts").exists(), "make ssh-up")
    p = subprocess.Popen(
        [
            LAUNCH,
            "ssh",
            "--hosts",
            "sshhost1,sshhost2",
            "--ssh-config",
            str(state / "ssh_config"),
            "--known-hosts",
            str(state / "known_hosts"),
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--run-dir",
            "runs/c",
            *container_flags(),
            "--env",
            "TEST_SLEEP=120",
            "--",
            "report.py",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while len(rank_lines("runs/c", "sleeping")) < 2:
            assert time.monotonic() < deadline and p.poll() is None, (
                p.stderr.read() if p.poll() is not None else "timeout"
            )
            time.sleep(0.3)
        run_id = run_id_of("runs/c")
        assert sorted(containers_of(run_id)) == [f"{run_id}-node0", f"{run_id}-node1"]
        run_launch("cancel", "runs/c", check=True, timeout=120)
        assert p.wait(timeout=120) == 143, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    deadline = time.monotonic() + 30  # the hosts' podman clients end after their teardown
    while (containers_of(run_id) or procs.tagged_pids(run_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert containers_of(run_id) == [] and procs.tagged_pids(run_id) == []
    assert read_json("runs/c/status.json")["state"] == "CANCELLED"
    assert all(r["container"] for r in reports("runs/c")) and len(reports("runs/c")) == 2
