"""Issue 22 item 1 (rendering): --container-image/-mount/-runtime/-python. Pure: golden command
lines per runtime (podman, apptainer: a node's wrapped command; pyxis, Slurm OCI: the sbatch
script), secrets by name only, every backend's dry-run plan wrapped, the options refused in one
line, the cleanup hook, doctor's runtime check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launchers.backends.local import LocalBackend
from launchers.backends.slurm.backend import SlurmBackend
from launchers.backends.slurm.render import (
    header_for,
    node_task_command,
    render_sbatch,
    sbatch_parameters,
    srun_argv,
)
from launchers.backends.ssh import SSHBackend
from launchers.backends.sshplan import kill_line
from launchers.containers import container, containeropts
from launchers.doctor.checks import Context, container_runtime
from launchers.errors import LaunchError
from launchers.request import JobSpec as ApiJobSpec
from launchers.spec import RunSpec, build_spec
from launchers.torchrun import node_command

GOLDEN = Path(__file__).resolve().parent / "golden"
PKG = "/opt/src/launchers"  # where launchers is installed, for the golden lines
RUN_ID = "r1-abcd"


@pytest.fixture(autouse=True)
def _db_pass(monkeypatch):
    monkeypatch.setenv("DB_PASS", "s3cret")  # spec()'s --secret DB_PASS, from the environment


def spec(runtime="podman", backend="ssh", **kw):
    base = dict(
        backend=backend,
        nodes=2,
        gpus_per_node=2,
        program=("-m", "workloads.convnet"),
        program_args=("--max-steps", "4"),
        run_dir="/shared/runs/r1",
        name="r1",
        env=(("FOO", "bar"), ("HF_TOKEN", "hunter2"), ("PYTHONPATH", "/shared/code/src")),
        secrets=(("DB_PASS", "env"),),
        python="/venv/bin/python",
        container_image={"apptainer": "/images/train.sif", "oci": "/images/train-bundle"}.get(
            runtime, "localhost/train:1"
        ),
        container_runtime=runtime,
        container_mounts=("/data:/data:ro", "/scratch:/scratch"),
        container_python="python3",
        container_workdir="/shared/code",
    )
    base.update(kw)
    return RunSpec(**base)


def wrapped(sp, dist="nccl", node=1):
    nc = node_command(
        sp,
        node_rank=node,
        master_addr="10.0.0.1",
        master_port=29123,
        run_id=RUN_ID,
        attempt=0,
        dist_backend=dist,
    )
    return container.wrap(sp, nc, RUN_ID, package=PKG, limits=LIMITS)


# a host's, as containeropts.host_limits reads them
LIMITS = (("nofile", 1048576), ("nproc", 4194304))


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("runtime", ["podman", "apptainer"])
def test_golden_node_command(runtime):
    """The node's whole command: the runtime's line, the mounts (run dir, launch dir, launchers,
    --container-mount), the image's interpreter running torchrun and the rank wrapper inside; shown
    with secrets as ***."""
    w = wrapped(spec(runtime))
    check_golden(f"{runtime}_node1.sh", w.shell() + "\n")
    assert w.argv[0] == runtime and "python3" in w.argv and "/venv/bin/python" not in w.argv
    assert w.argv[w.argv.index("python3") + 1 :][:2] == ("-m", "torch.distributed.run")
    assert w.env_dict["PYTHONPATH"] == "/opt/launchers:/shared/code/src"


@pytest.mark.parametrize("runtime", ["podman", "apptainer"])
def test_secrets_reach_the_container_by_name_only(runtime):
    w = wrapped(spec(runtime))
    line = " ".join(w.argv)
    assert "s3cret" not in line and "hunter2" not in line and "s3cret" not in w.shell()
    assert w.env_dict["DB_PASS"] == "s3cret"  # in the agent's environment, as outside
    if runtime == "podman":  # podman takes the value from its own env
        assert {"DB_PASS", "HF_TOKEN", "LAUNCH_RUN_DIR", "MASTER_PORT"} <= set(
            w.argv[i + 1] for i, a in enumerate(w.argv) if a == "--env"
        )
    else:  # APPTAINERENV_X wins over the image's X
        assert (
            w.env_dict["APPTAINERENV_DB_PASS"] == "s3cret"
            and "APPTAINERENV_DB_PASS" in w.secret_env()
        )
        assert w.env_dict["APPTAINERENV_LAUNCH_RUN_DIR"] == "/shared/runs/r1"


def test_podman_limits_are_the_hosts_hard_limits_nproc_at_most_pid_max():
    """podman's defaults (1048576) and `--ulimit host` are refused by runc where podman may not
    raise a limit; the container gets the host's hard limits instead, nproc capped at kernel.pid_max
    (podman's own cap)."""
    import resource

    hard = {resource.RLIMIT_NOFILE: (1024, 20000), resource.RLIMIT_NPROC: (96369, 96369)}
    assert containeropts.host_limits(hard.get, lambda: 32768) == (
        ("nofile", 20000),
        ("nproc", 32768),
    )
    inf = {
        resource.RLIMIT_NOFILE: (1024, 524288),
        resource.RLIMIT_NPROC: (resource.RLIM_INFINITY,) * 2,
    }
    assert containeropts.host_limits(inf.get, lambda: 4194304) == (
        ("nofile", 524288),
        ("nproc", 4194304),
    )
    assert containeropts.host_limits(inf.get, lambda: None) == (("nofile", 524288), ("nproc", -1))
    argv = wrapped(spec("podman")).argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--ulimit"] == [
        "nofile=1048576:1048576",
        "nproc=4194304:4194304",
    ]
    assert "host" not in [argv[i + 1] for i, a in enumerate(argv) if a == "--ulimit"]
    assert "--ulimit" not in wrapped(spec("apptainer")).argv


@pytest.mark.parametrize("runtime", ["podman", "apptainer"])
def test_golden_node_command_auto(runtime):
    """--dist-backend auto (decided on each node, inside the container): the node's GPUs go in
    wherever it has them -- podman through its own shell's look at the node's CDI specs, apptainer's
    --nv."""
    check_golden(f"{runtime}_node1_auto.sh", wrapped(spec(runtime), dist="auto").shell() + "\n")


def env_names(argv):
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]


def test_gpus_go_into_each_runtime_with_nccl_and_auto_never_gloo():
    """Each rank's own GPU (LOCAL_RANK-th visible) needs the node's GPUs and its
    CUDA_VISIBLE_DEVICES inside."""
    nccl, auto, gloo = (wrapped(spec("podman"), dist=d).argv for d in ("nccl", "auto", "gloo"))
    assert (
        nccl[:2] == ("podman", "run") and nccl[nccl.index("--device") + 1] == "nvidia.com/gpu=all"
    )
    assert auto[:4] == ("sh", "-c", container.CDI_PROBE, "podman") and "--device" not in auto
    assert gloo[:2] == ("podman", "run") and "--device" not in gloo
    assert "CUDA_VISIBLE_DEVICES" in env_names(nccl) and "CUDA_VISIBLE_DEVICES" in env_names(auto)
    assert "CUDA_VISIBLE_DEVICES" not in env_names(gloo)
    assert [
        ("--nv" in wrapped(spec("apptainer"), dist=d).argv) for d in ("nccl", "auto", "gloo")
    ] == [True, True, False]
    for dist, gpus in (("nccl", True), ("auto", True), ("gloo", False)):
        pyxis = sbatch_parameters(spec("pyxis", backend="slurm", dist_backend=dist))["srun_args"]
        crossing = (
            next(a for a in pyxis if a.startswith("--container-env=")).split("=", 1)[1].split(",")
        )
        exported = next(a for a in pyxis if a.startswith("--export=")).split("=", 1)[1].split(",")
        assert ("CUDA_VISIBLE_DEVICES" in crossing, "NVIDIA_VISIBLE_DEVICES=all" in exported) == (
            gpus,
            gpus,
        )
        # its value is the step's, never ours
        assert "CUDA_VISIBLE_DEVICES" not in " ".join(exported)
        oci = container.srun_args(
            spec("oci", backend="slurm", container_mounts=(), dist_backend=dist)
        )
        assert oci[-1] == "--export=ALL,PYTHONPATH=/opt/launchers" + (
            ",NVIDIA_VISIBLE_DEVICES=all" if gpus else ""
        )
    plain = node_command(
        spec(container_image=""), node_rank=0, master_addr="h", master_port=1, run_id="i", attempt=0
    )
    assert container.wrap(spec(container_image=""), plain, "i") is plain


def test_podman_auto_asks_for_the_gpus_only_where_the_node_has_a_cdi_spec(tmp_path):
    """The auto node command's own shell (CDI_PROBE), run as a node runs it, with a stand-in
    `podman` that prints its arguments: without a CDI spec of NVIDIA GPUs no --device (podman would
    refuse an unresolvable one); with one in /var/run/cdi (a tmpfs over /run in a mount namespace of
    the test's own), --device nvidia.com/gpu=all first; either way podman runs in the shell's place
    (exec) with every argument as given."""
    (tmp_path / "podman").write_text('#!/bin/sh\necho "$$ $*"\n')
    (tmp_path / "podman").chmod(0o755)
    argv = wrapped(spec("podman"), dist="auto").argv
    script = (
        "mount -t tmpfs none /run && { [ ! -d /etc/cdi ] || mount -t tmpfs none /etc/cdi; } && "
        'echo "$$ shell" && if [ -n "$SPEC" ]; then mkdir -p /run/cdi && echo "$SPEC" > '
        "/run/cdi/nvidia.yaml; "
        'fi && exec "$@"'
    )
    outs = []
    for spec_text in ("", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n"):
        env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SPEC": spec_text}
        p = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert p.returncode == 0, p.stderr
        (shell_pid, _), (podman_pid, args) = (ln.split(" ", 1) for ln in p.stdout.splitlines())
        assert podman_pid == shell_pid  # exec: the agent's pid is podman's, as without the shell
        outs.append(args)
    rest = " ".join(argv[4:])
    assert outs == [f"run {rest}", f"run --device nvidia.com/gpu=all {rest}"]


@pytest.mark.parametrize("runtime", ["pyxis", "oci"])
def test_golden_sbatch(runtime):
    sp = spec(
        runtime,
        backend="slurm",
        container_mounts=() if runtime == "oci" else spec().container_mounts,
    )
    header = header_for(
        ["slurm", "--container-image", sp.container_image, "--", "-m", "workloads.convnet"], "0.1.0"
    )
    text = render_sbatch(sp, base_attempt=0, header=header).replace(container.PACKAGE_DIR, PKG)
    check_golden(f"slurm_{runtime}.sbatch", text)
    assert "hunter2" not in text and "s3cret" not in text


def test_pyxis_flags_and_the_submitit_layout():
    """pyxis: one named container per run (reused by a requeued attempt), the secrets' names in
    --container-env; the script is still submitit's own layout for these srun flags."""
    from submitit.slurm.slurm import _make_sbatch_string

    from launchers.backends.slurm.render import finalize_command
    from launchers.layout import path

    sp = spec("pyxis", backend="slurm")
    args = sbatch_parameters(sp)["srun_args"]
    assert "--container-name=launch-r1" in args and "--container-workdir=/shared/code" in args
    env = next(a for a in args if a.startswith("--container-env=")).split("=", 1)[1].split(",")
    assert {
        "PYTHONPATH",
        "DB_PASS",
        "HF_TOKEN",
        "NVIDIA_VISIBLE_DEVICES",
        "MELLANOX_VISIBLE_DEVICES",
    } <= set(env)
    # launch slurm inside an allocation
    inside = srun_argv(sp, run_id=RUN_ID, job_id="7", base_attempt=0)
    assert set(args) <= set(inside) and inside[inside.index("--open-mode=append") + 1] == "python3"
    gloo = sbatch_parameters(spec("pyxis", backend="slurm", dist_backend="gloo"))["srun_args"]
    assert not any("NVIDIA_VISIBLE_DEVICES" in a for a in gloo)
    theirs = _make_sbatch_string(
        command=node_task_command("python3", sp.run_dir, 1),
        folder=path(sp.run_dir, "slurm"),
        teardown=[finalize_command(sp.python, sp.run_dir, 1)],
        **sbatch_parameters(sp),
    )
    shebang, rest = theirs.split("\n", 1)
    assert render_sbatch(sp, base_attempt=1, header="h") == f"{shebang}\n# h\n{rest}\n"


def test_every_backends_dry_run_shows_the_wrapped_commands(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = (
        LocalBackend()
        .plan(spec("podman", backend="local", nodes=1, env=(), secrets=()), "r-1", 0)
        .render()
    )
    assert (
        "podman --rm" in local
        and "--name r-1-node0" in local
        and "localhost/train:1 python3 -m torch" in local
    )
    ssh = SSHBackend().plan(spec("apptainer", options=ssh_opts(tmp_path)), "r-1", 0).render()
    assert (
        ssh.count(" -- apptainer exec ") == 2
        and ssh.count(" /images/train.sif python3 -m torch.distributed.run ") == 2
    )
    slurm = SlurmBackend().plan(spec("pyxis", backend="slurm"), "r-1", 0).render()
    assert (
        "--container-image=localhost/train:1" in slurm
        and " python3 -u -m launchers.backends.slurm.task" in slurm
    )
    assert slurm.count("PYTHONPATH=/opt/launchers:/shared/code/src ") == 2
    # the image's interpreter runs each agent
    assert slurm.count(" python3 -m torch.distributed.run ") == 2
    podman_on_slurm = SlurmBackend().plan(spec("podman", backend="slurm"), "r-1", 0).render()
    assert "--container-image" not in podman_on_slurm and "-- podman run" not in podman_on_slurm
    assert (
        "podman --rm" in podman_on_slurm and "/venv/bin/python -u -m launchers" in podman_on_slurm
    )


def ssh_opts(tmp_path):
    (tmp_path / "ssh_config").write_text("")
    return (("hosts", ["h1", "h2"]), ("ssh_config", str(tmp_path / "ssh_config")))


def test_cleanup_hook(tmp_path):
    assert container.cleanup_argv(spec("podman"), RUN_ID, 1) == [
        "podman",
        "rm",
        "--force",
        "--ignore",
        "--time",
        "0",
        "r1-abcd-node1",
    ]
    assert container.cleanup_argv(spec("apptainer"), RUN_ID, 1) is None
    assert container.cleanup_argv(spec(container_image=""), RUN_ID, 1) is None
    plan = SSHBackend().plan(spec("podman", options=ssh_opts(tmp_path)), RUN_ID, 0)
    assert kill_line(plan, 1, 15, 5).endswith(
        "; podman rm --force --ignore --time 0 r1-abcd-node1 >/dev/null 2>&1"
    )


@pytest.mark.parametrize(
    "runtime, image, code, want",
    [
        # its container's agent ended by a signal
        ("podman", "i", 128 + 9, -9),
        ("podman", "i", 128 + 15, -15),
        ("podman", "i", 1, 1),
        ("podman", "i", 0, 0),
        ("podman", "i", None, None),
        # podman's own failure; no such signal
        ("podman", "i", 125, 125),
        ("podman", "i", 128 + 99, 128 + 99),
        ("podman", "i", -9, -9),  # the podman client itself killed
        # only podman's convention; no container
        ("apptainer", "i", 137, 137),
        ("podman", "", 137, 137),
    ],
)
def test_a_node_agents_exit_through_its_runtime(runtime, image, code, want):
    """A node's code as every backend reads it (Popen's: -N for signal N): podman's 128 + N is
    signal N."""
    assert container.agent_code(spec(runtime, container_image=image), code) == want


def test_the_agent_starts_in_the_launch_dir_only_in_slurms_oci_container():
    """slurmstepd runs the bundle's process.cwd ("/"), not srun's: the node task starts the agent in
    the launch dir (a relative program path); pyxis has --container-workdir, the others srun's
    cwd."""
    assert container.step_cwd(spec("oci", backend="slurm")) == "/shared/code"
    assert [
        container.step_cwd(spec(r, backend="slurm")) for r in ("pyxis", "podman", "apptainer")
    ] == [None] * 3
    assert container.step_cwd(spec("oci", backend="slurm", container_image="")) is None


def test_mounts_normalised_ordered_and_kept_in_run_yaml():
    assert containeropts.parse_mount("data:/d/:ro", "/code") == "/code/data:/d:ro"
    assert containeropts.parse_mount("/a:/b:rw", "/code") == "/a:/b"
    sp = spec(run_dir="/shared/code/runs/r1", container_mounts=("/x:/shared/code/runs/r1",))
    assert [m[1] for m in container.mounts(sp, PKG)] == [
        "/shared/code",
        "/opt/launchers/launchers",
        # parents first, once each
        "/shared/code/runs/r1",
    ]
    back = RunSpec.from_dict(sp.to_dict())  # a spec's dict holds no secret value: HF_TOKEN's is ***
    assert back.replace(env=sp.env) == sp and dict(back.env)["HF_TOKEN"] == "***"


def build(backend, **flags):
    return build_spec(backend, dict(flags, options={}), ["-m", "json"])


def test_resolution_of_auto_and_the_api(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = build("slurm", container_image="img", container_mounts=("d:/d:ro",))
    assert (s.container_runtime, s.container_python, s.container_workdir) == (
        "pyxis",
        "python3",
        str(tmp_path),
    )
    assert s.container_mounts == (f"{tmp_path}/d:/d:ro",)
    assert build("ssh", container_image="img").container_runtime == "podman"
    assert (
        containeropts.resolve_runtime("auto", "local", {"apptainer": "/usr/bin/apptainer"}.get)
        == "apptainer"
    )
    with pytest.raises(
        LaunchError,
        match="needs a container runtime here: podman or apptainer or singularity is not on PATH",
    ):
        containeropts.resolve_runtime("auto", "local", lambda b: None)
    api = ApiJobSpec(
        backend="slurm",
        program=("-m", "json"),
        container_image="img",
        container_runtime="apptainer",
        container_mounts=["/d:/d"],
        container_python="/opt/venv/bin/python",
    ).resolve()
    assert (api.container_runtime, api.container_mounts, api.container_python) == (
        "apptainer",
        ("/d:/d",),
        "/opt/venv/bin/python",
    )


BAD = [
    (
        "slurm",
        dict(container_image="img", container_runtime="docker"),
        "--container-runtime 'docker' is not accepted; "
        "choose one of: auto, pyxis, apptainer, podman, oci",
    ),
    (
        "slurm",
        dict(container_image="img", container_mounts=("/data",)),
        "'/data' is malformed; expected SRC:DST[:ro]",
    ),
    (
        "slurm",
        dict(container_image="img", container_mounts=("/a:/b:rx",)),
        "'/a:/b:rx' is malformed",
    ),
    (
        "slurm",
        dict(container_image="img", container_mounts=("/a:/b:ro:x",)),
        "'/a:/b:ro:x' is malformed",
    ),
    ("slurm", dict(container_image="img", container_mounts=("/a,/c:/b",)), "no ','"),
    ("slurm", dict(container_image="img", container_mounts=("/a:b",)), "DST 'b' is relative"),
    ("slurm", dict(container_runtime="pyxis"), "--container-runtime needs --container-image IMAGE"),
    ("slurm", dict(container_mounts=("/a:/b",)), "--container-mount needs --container-image IMAGE"),
    ("ssh", dict(container_python="python3"), "--container-python needs --container-image IMAGE"),
    (
        "ssh",
        dict(container_image="img", container_runtime="oci"),
        "not accepted with the ssh backend",
    ),
    (
        "slurm",
        dict(container_image="rel/bundle", container_runtime="oci"),
        "an OCI bundle directory",
    ),
    (
        "slurm",
        dict(container_image="/b", container_runtime="oci", container_mounts=("/a:/b",)),
        "--container-mount is not accepted with --container-runtime oci",
    ),
    ("slurm", dict(container_image="my image"), "--container-image 'my image' is not accepted"),
    (
        "slurm",
        dict(container_image="img", container_python="my python"),
        "--container-python 'my python'",
    ),
]


@pytest.mark.parametrize("backend,flags,message", BAD, ids=[m[:30] for _, _, m in BAD])
def test_refused_in_one_line(backend, flags, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LaunchError) as e:
        build(backend, **flags)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_doctor_checks_the_runtime_binary():
    assert containeropts.doctor_binaries("auto", "slurm") == ("pyxis", ("enroot",))
    assert containeropts.doctor_binaries("auto", "ssh") == (
        "podman or apptainer",
        ("podman", "apptainer", "singularity"),
    )
    assert containeropts.doctor_binaries("oci", "slurm") == ("oci", ("crun", "runc"))
    ctx = Context(
        ref={},
        first={},
        master="m",
        port=1,
        gpus_per_node=1,
        require_gpus=False,
        shared_required=True,
        env={},
        collective=False,
        medians={},
        container=containeropts.doctor_binaries("auto", "ssh"),
    )
    found = container_runtime(
        {"container": {"podman": None, "apptainer": "/usr/bin/apptainer"}}, ctx
    )
    assert (found.status, found.value) == ("ok", "apptainer")
    missing = container_runtime(
        {"container": {"podman": None, "apptainer": None, "singularity": None}}, ctx
    )
    assert (
        missing.status == "fail"
        and "none of podman, apptainer, singularity is on PATH" in missing.why
    )


def test_doctor_checks_the_image_on_the_node():
    """--container-image: how each runtime's node tells it has the image (none where it is imported
    at run time); a node whose runtime lacks it fails in one line naming the node, the image and the
    runtime's answer."""
    from launchers.doctor.report import failures

    assert containeropts.doctor_image("localhost/x:1", "local", "podman") == {
        "podman": {"bins": ["podman"], "argv": ["podman", "image", "exists", "localhost/x:1"]}
    }
    assert containeropts.doctor_image("/b", "slurm", "oci") == {
        "oci": {"bins": ["crun", "runc"], "path": "/b/config.json"}
    }
    assert containeropts.doctor_image("docker://x", "ssh", "apptainer") == {}
    # auto on Slurm: pyxis, imported by srun
    assert containeropts.doctor_image("img", "slurm", None) == {}
    assert list(containeropts.doctor_image("t.sif", "ssh", None)) == ["podman", "apptainer"]
    ctx = Context(
        ref={},
        first={},
        master="m",
        port=1,
        gpus_per_node=1,
        require_gpus=False,
        shared_required=True,
        env={},
        collective=False,
        medians={},
        container=("podman", ("podman",)),
        image="localhost/x:1",
    )
    r = {
        "container": {"podman": "/usr/bin/podman"},
        "image": {"podman": "podman image exists localhost/x:1: exit 1"},
    }
    missing = container_runtime(r, ctx)
    assert (missing.status, missing.value) == ("fail", "no image!")
    (line,) = failures([{"node": 1, "host": "h2", "checks": {"container": missing}}])
    assert (
        line.startswith(
            "FAIL node 1 [h2] container: image localhost/x:1 is not there (podman image exists "
            "localhost/x:1: exit 1) -> "
        )
        and "\n" not in line
    )
    here = container_runtime(dict(r, image={"podman": None}), ctx)
    assert (here.status, here.value) == ("ok", "podman, image")
    # no runtime
    assert container_runtime({"container": {"podman": None}, "image": {}}, ctx).status == "fail"


def test_ssh_host_preflight_with_a_container_checks_the_runtime_not_torch(tmp_path):
    """The host side of `launch ssh`'s preflight (launchers.node.nodecheck CHECK, stdlib, run as on
    a host): with a container it wants the runtime and launchers, not torch nor the program (the
    image has them)."""
    import json
    import subprocess
    import sys

    from launchers.node.nodecheck import CHECK

    arg = {
        "cwd": str(tmp_path),
        "program": ["-m", "no_such_module_here"],
        "dirs": [],
        "ports": [],
        **container.host_check(spec("apptainer")),
    }
    arg["binaries"] = ["no-such-runtime-here"]
    out = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(arg)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(container.PACKAGE_DIR).parent)},
    ).stdout
    errors = json.loads(out.split("CHECK ", 1)[1])["errors"]
    assert errors == ["container runtime no-such-runtime-here is not on PATH there"]
    assert container.host_check(spec(container_image="")) == {}


def test_profile_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text(
        "container_image: img\ncontainer_mounts: [/d:/d:ro]\ncontainer_runtime: oci\n"
        "container_python: /opt/venv/bin/python\n"
    )
    with pytest.raises(
        LaunchError, match="--container-mount is not accepted with --container-runtime oci"
    ):
        build_spec("slurm", {"options": {}}, ["-m", "json"], str(tmp_path / "p.yaml"))
    s = build_spec(
        "slurm",
        {"options": {}, "container_runtime": "apptainer"},
        ["-m", "json"],
        str(tmp_path / "p.yaml"),
    )
    # the flag wins over the profile
    assert (s.container_image, s.container_runtime, s.container_mounts, s.container_python) == (
        "img",
        "apptainer",
        ("/d:/d:ro",),
        "/opt/venv/bin/python",
    )
    (tmp_path / "q.yaml").write_text("container_mounts: /d:/d\n")
    with pytest.raises(LaunchError, match="container_mounts has a value of the wrong type"):
        build_spec("slurm", {"options": {}}, ["-m", "json"], str(tmp_path / "q.yaml"))
