"""The frameworks people run under a launcher (docs/FRAMEWORKS.md): examples/lightning_ddp.py
(PyTorch Lightning), examples/accelerate_ddp.py (HF Accelerate) and examples/ddp_tutorial.py (the
PyTorch DDP tutorial's plain script with a `finally` cleanup), started exactly as the recipes say: 2
nodes x 2 processes on `launch local`, 2 hosts x 1 on the real SSH test hosts;
examples/hf_trainer.py (Transformers' Trainer) and examples/deepspeed_plain.py (a plain DeepSpeed
ZeRO-2 script), 2 nodes x 1 on `launch local`, the Trainer also 1 x 2 inside the podman image. Each
rank prints one REPORT line with the world it sees from inside the framework; every file a program
writes must be in the run dir, none in the caller's cwd."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import (
    LAUNCH,
    ROOT,
    assert_ranks_refused,
    rank_lines,
    read_json,
    require_cluster,
    run_launch,
)
from launchers import heartbeat, procs

# real training runs of tens of seconds each: `make test` runs them, `make test-fast` (the inner
# loop) does not
pytestmark = pytest.mark.slow

EX = ROOT / "examples"
STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH_OPTS = ["--ssh-config", str(STATE / "ssh_config"), "--known-hosts", str(STATE / "known_hosts")]

# name -> (launch options of the recipe, program and args: few steps)
PROGRAMS = {
    "lightning": (
        ["--stop-signal", "SIGINT"],
        ["lightning_ddp.py", "--max-steps", "4", "--checkpoint-every", "2"],
    ),
    "accelerate": (
        ["--env", "ACCELERATE_USE_CPU=1"],
        ["accelerate_ddp.py", "--max-steps", "4", "--checkpoint-every", "2"],
    ),
    "ddp": ([], ["ddp_tutorial.py", "--steps", "4", "--cleanup-seconds", "1"]),
}


def files(name: str, world: int) -> list[str]:
    """What each program must leave in the run dir."""
    if name == "lightning":
        return [
            "lightning_logs/version_0/hparams.yaml",
            "checkpoints/step-00000002.ckpt",
            "checkpoints/step-00000004.ckpt",
        ]
    if name == "accelerate":
        return [
            "checkpoints/step-00000002/model.safetensors",
            "checkpoints/step-00000004/optimizer.bin",
        ] + [f"checkpoints/step-00000004/random_states_{r}.pkl" for r in range(world)]
    if name == "transformers":
        return [
            "checkpoints/checkpoint-2/model.safetensors",
            "checkpoints/checkpoint-4/optimizer.pt",
            "checkpoints/checkpoint-4/trainer_state.json",
        ] + [f"checkpoints/checkpoint-4/rng_state_{r}.pth" for r in range(world)]
    if name == "deepspeed":
        return ["checkpoints/global_step2/mp_rank_00_model_states.pt"] + [
            f"checkpoints/global_step4/zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            for r in range(world)
        ]
    return ["checkpoints/step-00000004/model.pt"] + [f"cleanup/rank{r}.done" for r in range(world)]


LATEST = {
    "lightning": "step-00000004.ckpt",
    "accelerate": "step-00000004",
    "ddp": "step-00000004",
    "transformers": "checkpoint-4",
    "deepspeed": "global_step4",
}
# progress and `latest` through launchers.integrations alone: every rank's step and total, `latest`
# without a manifest (unverified); no metrics.jsonl (`launch status` takes rank 0's step)
INTEGRATED = ("lightning", "transformers", "deepspeed")
# the recipes of issue 22 item 6: name -> (launch options, program and args: few steps), 2 nodes x 1
RECIPES = {
    "transformers": ([], ["hf_trainer.py", "--max-steps", "4", "--checkpoint-every", "2"]),
    "deepspeed": ([], ["deepspeed_plain.py", "--max-steps", "4", "--checkpoint-every", "2"]),
}


def require_framework(module: str) -> None:
    """A recipe's framework missing is a failure (never a skip): `make venv` installs it."""
    if importlib.util.find_spec(module) is None:
        pytest.fail(
            f"{module} is not installed: run `make venv` (requirements-frameworks.txt, "
            "requirements-deepspeed.txt)",
            pytrace=False,
        )


def reports(run_dir):
    return sorted(
        (json.loads(ln[len("REPORT ") :]) for ln in rank_lines(run_dir, "REPORT ")),
        key=lambda r: r["rank"],
    )


def run_id_of(run_dir):
    return yaml.safe_load(Path(run_dir, "run.yaml").read_text())["run_id"]


def check_run(workdir: Path, before: set, name: str, run: str, nodes: int, per_node: int) -> None:
    world = nodes * per_node
    reps = reports(run)
    assert [r["rank"] for r in reps] == list(range(world)), reps  # every rank reported, once
    assert all(r["framework"] == name and r["world"] == world for r in reps), reps
    # one process group, all of them in it
    assert {r["sum"] for r in reps} == {world * (world + 1) / 2}
    assert [r["node_rank"] for r in reps] == [k for k in range(nodes) for _ in range(per_node)]
    assert [r["local_rank"] for r in reps] == list(range(per_node)) * nodes
    st = read_json(Path(run, "status.json"))
    assert st["state"] == "COMPLETED" and st["first_failure"] is None, st
    assert len(rank_lines(run, "DONE rank ")) == world
    for f in files(name, world):
        assert (workdir / run / f).is_file(), f
    assert (workdir / run / "checkpoints/latest").read_text().strip() == LATEST[name]
    if name not in ("transformers", "deepspeed"):
        assert (
            json.loads((workdir / run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4
        )
    # launchers.integrations' hooks: every rank's step and the total (issue 25)
    if name in INTEGRATED:
        assert [
            (hb["step"], hb["total"]) for hb in (heartbeat.read(run, r) for r in range(world))
        ] == [(4, 4)] * world
    out = run_launch("status", run, check=True).stdout
    assert f"checkpoint: {LATEST[name]}" in out and "last step:  4" in out, out
    # committed with a manifest (launchers.ckptptr.commit); integrations' `latest` alone (no
    # manifest): unverified
    assert (
        f"checkpoint: {LATEST[name]} ({'unverified' if name in INTEGRATED else 'complete'}: " in out
    ), out
    assert set(os.listdir(workdir)) == before | {"runs"}  # nothing in the caller's cwd
    assert procs.tagged_pids(run_id_of(run)) == []


def run_local(
    workdir: Path, name: str, nodes: int, per_node: int, *flags: str, timeout: float = 300
) -> None:
    """The program's recipe on `launch local` (flags: a container's) into runs/<name>, then
    check_run."""
    opts, prog = {**PROGRAMS, **RECIPES}[name]
    before = set(os.listdir(workdir))
    p = run_launch(
        "local",
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        str(per_node),
        "--run-dir",
        f"runs/{name}",
        *flags,
        *opts,
        "--",
        str(EX / prog[0]),
        *prog[1:],
        timeout=timeout,
    )
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    check_run(workdir, before, name, f"runs/{name}", nodes, per_node)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_local_2x2(workdir, name):
    run_local(workdir, name, 2, 2)


@pytest.mark.parametrize("name", list(RECIPES))
def test_local_2x1_recipes(workdir, name):
    """Transformers' Trainer and a plain DeepSpeed script as docs/FRAMEWORKS.md says: COMPLETED,
    world 2 from inside the framework, their own checkpoints in the run's checkpoints dir, `launch
    status` shows the last step and the checkpoint integrations named."""
    require_framework(name)
    run_local(workdir, name, 2, 1)


@pytest.mark.podman
def test_podman_1x2_hf_trainer_every_rank_inside(workdir):
    """The Trainer's recipe inside the local podman image (tests/test_container_podman.py: the venv
    and the checkout mounted read-only at the same paths): COMPLETED, world 2, every rank in the
    container, checkpoints and `latest` in the run dir outside; no container and no process of the
    run left."""
    from test_container_podman import container_flags, containers_of

    require_framework("transformers")
    flags = [
        *container_flags(),
        "--container-mount",
        f"{ROOT}:{ROOT}:ro",
        "--env",
        f"PYTHONPATH={ROOT}",
    ]
    run_local(workdir, "transformers", 1, 2, *flags, timeout=420)
    reps = reports("runs/transformers")
    assert [r["container"] for r in reps] == [True, True], reps
    assert containers_of(run_id_of("runs/transformers")) == []


def test_accelerate_without_cpu_flag_is_refused_not_a_false_pass(workdir):
    """Without ACCELERATE_USE_CPU=1 every rank of a CPU run is its own single-process job (rank 0 of
    1): the example checks the world it sees against torchrun's WORLD_SIZE and exits 2, so the run
    FAILS."""
    p = run_launch(
        "local",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--run-dir",
        "runs/nf",
        "--",
        str(EX / "accelerate_ddp.py"),
        "--max-steps",
        "2",
        timeout=240,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    reps = reports("runs/nf")
    assert reps and all(
        r["world"] == 1 and r["rank"] == 0 and r["distributed_type"] == "DistributedType.NO"
        for r in reps
    ), reps
    assert_ranks_refused("runs/nf", "accelerate_ddp: error:", "ACCELERATE_USE_CPU=1", 2)
    assert read_json("runs/nf/status.json")["state"] == "FAILED"
    assert not Path("runs/nf/checkpoints/latest").exists()


@pytest.mark.ssh
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_ssh_2_hosts(workdir, name):
    st = subprocess.run(
        [str(ROOT / "clusters/ssh-hosts.sh"), "status"], capture_output=True, text=True, timeout=60
    )
    require_cluster(
        "the SSH test hosts sshhost1..4",
        st.returncode == 0 and (STATE / "known_hosts").exists(),
        "make ssh-up",
    )
    opts, prog = PROGRAMS[name]
    before = set(os.listdir(workdir))
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,sshhost2",
        *SSH_OPTS,
        "--run-dir",
        f"runs/{name}",
        *opts,
        "--",
        str(EX / prog[0]),
        *prog[1:],
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    check_run(workdir, before, name, f"runs/{name}", 2, 1)


# name -> (program and args that train until stopped, with a 3 s `finally` cleanup; the line each
# rank prints once it trains; the launch options of the recipe in docs/FRAMEWORKS.md)
STOPPABLE = {
    "ddp": (
        ["ddp_tutorial.py", "--steps", "100000", "--step-sleep", "0.05", "--cleanup-seconds", "3"],
        "TRAINING rank",
        [],
    ),
    # Lightning's own SIGTERM handler runs a collective (docs/FRAMEWORKS.md): its recipe stops with
    # SIGINT
    "lightning": (
        [
            "lightning_ddp.py",
            "--max-steps",
            "100000",
            "--step-sleep",
            "0.05",
            "--checkpoint-every",
            "50",
            "--cleanup-seconds",
            "3",
        ],
        "REPORT ",
        ["--stop-signal", "SIGINT"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", pytest.param("ssh", marks=pytest.mark.ssh)])
@pytest.mark.parametrize("name", list(STOPPABLE))
@pytest.mark.parametrize("how", ["ctrl-c", "cancel"])
def test_finally_cleanup_completes_on_stop(workdir, how, name, backend):
    """Issue 13's real programs (the DDP tutorial's script, a Lightning DDP job), each with a
    3-second `finally` cleanup, stopped by Ctrl-C and by `launch cancel` on local (2 nodes x 1) and
    SSH (2 hosts x 1), started as their recipes say: every rank gets exactly one signal of the right
    kind (SIGINT for Ctrl-C; SIGTERM for a cancel, SIGINT with Lightning's --stop-signal SIGINT),
    the cleanup completes on every rank (within the default 30 s stop grace), the run ends CANCELLED
    with no invented first failure, one end line, exit 130 / 143, and nothing of it is left
    running."""
    if backend == "ssh":
        st = subprocess.run(
            [str(ROOT / "clusters/ssh-hosts.sh"), "status"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        require_cluster("the SSH test hosts sshhost1..4", st.returncode == 0, "make ssh-up")
        where, world = ["ssh", "--hosts", "sshhost1,sshhost2", *SSH_OPTS], 2
    else:
        # the 2x2 recipe: test_local_2x2
        where, world = ["local", "--nodes", "2", "--gpus-per-node", "1"], 2
    prog, training, opts = STOPPABLE[name]
    proc = subprocess.Popen(
        [LAUNCH, *where, *opts, "--run-dir", "runs/s", "--", str(EX / prog[0]), *prog[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while len(rank_lines("runs/s", training)) < world:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][
                -3000:
            ]
            time.sleep(0.3)
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
        else:
            run_launch("cancel", "runs/s", check=True, timeout=120)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    sig, code, end = (
        ("SIGINT", 130, "launch: run CANCELLED (Ctrl-C)")
        if how == "ctrl-c"
        else (
            "SIGINT" if "--stop-signal" in opts else "SIGTERM",
            143,
            "launch: run CANCELLED (by launch cancel)",
        )
    )
    assert proc.returncode == code, err[-3000:]
    assert [ln for ln in err.splitlines() if ln.startswith(("launch: run C", "launch: run F"))] == [
        end
    ], err[-3000:]
    per_node = world // 2
    for r in range(world):
        log = Path(f"runs/s/logs/node{r // per_node}/rank{r}.log").read_text()
        assert [ln.split(" at ")[0] for ln in log.splitlines() if ln.startswith("SIGNAL ")] == [
            f"SIGNAL {sig} rank {r}"
        ], log
        assert f"CLEANUP done rank {r} after 3 s" in log, log
        assert Path(f"runs/s/cleanup/rank{r}.done").read_text().split()[1] == sig
    st = read_json("runs/s/status.json")
    assert st["state"] == "CANCELLED" and st["first_failure"] is None, st
    assert procs.tagged_pids(run_id_of("runs/s")) == []
