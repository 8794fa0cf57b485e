"""Issue 13 item 4: every refused input in one table -- CLI flags, profiles, hostfiles, NCCL values,
workload flags, run names and run dirs, and the verbs on things that are not (usable) run dirs.

Each case runs the real `launch` (or a workload's own CLI) in a scratch cwd and asserts: exit code 2
(0 for a request with nothing to do: `launch cancel` of a run that already ended, issue 21), exactly
one stderr line `launch: error: ...` (the workloads: `<prog>: error: ...`) naming the offending
value and what is accepted, no traceback, nothing on stdout (no dry-run rendered), nothing started
(the program would create ./STARTED) and the scratch directory untouched: no run dir created, a run
dir given to a verb unchanged. Nothing here needs a cluster: a local case fails before anything
starts, SSH and Slurm cases use --dry-run (a refused one renders nothing and connects nowhere).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCH, ROOT, run_launch
from launchers import procs

MARKER = "import pathlib\npathlib.Path('STARTED').write_text('started')\n"
# ../shared/seeds
SEED = ["--env", "NCCL_ALGO=ring", "--env", "NCCL_PROTO=shm", "--env", "NCCL_SHM_DISABLE=0"]
LONG = "a" * 5000
BOMB = "env:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # 9**9 leaves if expanded
    f"  {c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi")
)
HOSTS_5000_DUP = "".join(f"h{k}\n" for k in range(1, 5000)) + "h1\n"
HOSTS_5000_BAD_LAST = "".join(f"h{k} slots=1\n" for k in range(1, 5000)) + "h5000 slots=0\n"
HERE = "@here"  # a run_copy key: the copy records its own location (made there)
LIVE = procs.self_record()  # this process (alive while a case runs): the launcher a run dir names


def status_json(state, **extra):
    return json.dumps(
        {"state": state, "attempt": 0, "nodes": {"0": 0}, "first_failure": None, **extra}
    )


# a read-only file system in a mount namespace
RO_MOUNT = 'mount -t tmpfs -o ro tmpfs ro && exec "$0" "$@"'


@dataclass
class Case:
    id: str
    argv: list[str]  # launch's arguments (or the whole command when cmd is set)
    needles: tuple[str, ...]  # what the one error line must name: the value and what is accepted
    # scratch files: path -> str | bytes | None (a directory)
    files: dict = field(default_factory=dict)
    cmd: str = "launch"  # launch | workload | ro (launch under a read-only mount)
    prefix: str = "launch: error: "
    # copies of a real run dir: name -> {file: new text | None (removed)}
    run_copy: dict = field(default_factory=dict)
    code: int = 2  # 0: a request with nothing to do (cancel of an ended run), said in one line
    env: dict = field(default_factory=dict)  # added to launch's environment
    owner: dict = field(default_factory=dict)  # scratch files' mode and uid: path -> (mode, uid)


def local(*flags, program=("marker.py",)):
    return ["local", "--run-dir", "runs/x", *flags, "--", *program]


def prof(text, *flags, backend="local"):
    extra = ["--dry-run"] if backend != "local" else []
    return {
        "argv": [
            backend,
            "--profile",
            "p.yaml",
            "--run-dir",
            "runs/x",
            *extra,
            *flags,
            "--",
            "marker.py",
        ],
        "files": {"p.yaml": text},
    }


def ssh_hf(text, *flags):
    return {
        "argv": [
            "ssh",
            "--hostfile",
            "hf",
            "--ssh-config",
            "/dev/null",
            "--run-dir",
            "runs/x",
            "--dry-run",
            *flags,
            "--",
            "marker.py",
        ],
        "files": {"hf": text},
    }


def slurm(*flags):
    return ["slurm", "--run-dir", "runs/x", "--dry-run", *flags, "--", "marker.py"]


CASES = [
    # ---------------------------------------------------------------- CLI flags
    Case("nodes-0", local("--nodes", "0"), ("--nodes '0'", "1-65536")),
    Case("nodes-space", local("--nodes", " 2"), ("--nodes ' 2'", "an integer")),
    Case("nodes-word", local("--nodes", "two"), ("'two'", "an integer")),
    Case("nodes-float", local("--nodes", "1.5"), ("'1.5'", "an integer")),
    Case(
        "nodes-huge", local("--nodes", "99999999999999999999"), ("99999999999999999999", "1-65536")
    ),
    Case(
        "nodes-range-min-over-max",
        local("--nodes", "2:1"),
        ("--nodes '2:1'", "MIN 2 is more than MAX 1", "MIN:MAX"),
    ),
    Case(
        "nodes-range-min-0",
        local("--nodes", "0:2"),
        ("--nodes '0:2'", "integers 1-65536", "MIN:MAX"),
    ),
    Case("nodes-range-word", local("--nodes", "1:two"), ("--nodes '1:two'", "MIN:MAX")),
    Case("nodes-range-three", local("--nodes", "1:2:3"), ("--nodes '1:2:3'", "MIN:MAX")),
    Case("gpn-0", local("--gpus-per-node", "0"), ("--gpus-per-node '0'", "1-1024")),
    Case("gpn-huge", local("--gpus-per-node", "5000"), ("'5000'", "1-1024")),
    Case("max-restarts-neg", local("--max-restarts", "-1"), ("'-1'", ">= 0")),
    Case(
        "quarantine-after-0",
        local("--spares", "1", "--quarantine-after", "0"),
        ("--quarantine-after '0'", "1-65536"),
    ),
    Case(
        "spares-ssh-few-hosts",
        [
            "ssh",
            "--hosts",
            "a,b,c",
            "--nodes",
            "2",
            "--spares",
            "2",
            "--dry-run",
            "--",
            "marker.py",
        ],
        ("--nodes 2 with --spares 2 needs 4 hosts", "3 given"),
    ),
    Case(
        "spares-ssh-no-node",
        ["ssh", "--hosts", "a,b", "--spares", "2", "--dry-run", "--", "marker.py"],
        ("--spares 2 leaves no host for a node", "--spares 0-1"),
    ),
    Case(
        "spares-slurm-negative",
        slurm("--spares", "-1"),
        ("--spares '-1'", "out of range", "0-65536"),
    ),
    Case("port-low", local("--master-port", "80"), ("'80'", "1024-65535")),
    Case("port-word", local("--master-port", "abc"), ("'abc'", "1024-65535")),
    Case("dist-mpi", local("--dist-backend", "mpi"), ("'mpi'", "auto, gloo, nccl")),
    Case(
        "cpu-bind-sockets",
        local("--cpu-bind", "sockets"),
        ("--cpu-bind 'sockets'", "auto, none, numa, cores"),
    ),
    Case(
        "cpu-bind-slurm-empty",
        slurm("--cpu-bind", ""),
        ("--cpu-bind ''", "auto, none, numa, cores"),
    ),
    Case(
        "container-mount-relative-dst",
        slurm("--container-image", "img", "--container-mount", "/data:data"),
        ("'/data:data'", "relative", "absolute path"),
    ),
    Case(
        "container-runtime-pyxis-local",
        local("--container-image", "img", "--container-runtime", "pyxis"),
        ("pyxis", "local backend", "auto, podman, apptainer"),
    ),
    # issue 35 item 5: an image is never an option; mount paths the runtime would split; ~ with no
    # home
    Case(
        "container-image-option",
        slurm("--container-image=--privileged"),
        (
            "--container-image '--privileged'",
            "an option is never an image",
            "[USER@][REGISTRY#]IMAGE[:TAG]",
        ),
    ),
    Case(
        "container-image-volume-podman",
        [
            "ssh",
            "--hosts",
            "a",
            "--run-dir",
            "runs/x",
            "--dry-run",
            "--container-image=-v/:/host",
            "--container-runtime",
            "podman",
            "--",
            "marker.py",
        ],
        (
            "--container-image '-v/:/host'",
            "an option is never an image",
            "[REGISTRY[:PORT]/]NAME[:TAG][@DIGEST]",
        ),
    ),
    Case(
        "container-image-uppercase",
        slurm("--container-image", "nvcr.io#Nvidia/pytorch"),
        ("'nvcr.io#Nvidia/pytorch'", "not an image pyxis accepts", "[USER@][REGISTRY#]IMAGE[:TAG]"),
    ),
    Case(
        "container-run-dir-colon",
        [
            "slurm",
            "--run-dir",
            "runs/a:b",
            "--dry-run",
            "--container-image",
            "img",
            "--",
            "marker.py",
        ],
        ("the run dir", "a:b' holds ':'", "srun --container-mounts"),
    ),
    Case(
        "container-run-dir-space-apptainer",
        [
            "slurm",
            "--run-dir",
            "runs/a b",
            "--dry-run",
            "--container-image",
            "./t.sif",
            "--container-runtime",
            "apptainer",
            "--",
            "marker.py",
        ],
        ("the run dir", "a b' holds ' '", "apptainer --bind"),
    ),
    Case(
        "container-mount-unknown-home",
        slurm("--container-image", "img", "--container-mount", "~nobody-35/d:/d"),
        ("'~nobody-35/d'", "names no home directory", "~/PATH"),
    ),
    Case("env-no-eq", local("--env", "NOEQUALS"), ("'NOEQUALS'", "NAME=VALUE")),
    Case("env-bad-name", local("--env", "1A=x"), ("'1A'", "[A-Za-z_]")),
    Case("forward-env-space", local("--forward-env", "a b"), ("'a b'", "NCCL_*")),
    Case("hang-timeout-nan", local("--hang-timeout", "nan"), ("'nan'", "seconds > 0")),
    Case(
        "stop-signal-kill",
        local("--stop-signal", "SIGKILL"),
        ("--stop-signal 'SIGKILL'", "SIGTERM, SIGINT"),
    ),
    Case(
        "stop-signal-number",
        local("--stop-signal", "2"),
        ("'2'", "SIGTERM, SIGINT, SIGHUP, SIGQUIT"),
    ),
    Case(
        "notify-ftp",
        local("--notify", "ftp://u:pw@h/x"),
        ("--notify 'ftp://h/...'", "http:// or https:// URL"),
    ),
    Case("name-empty", local("--name", ""), ("--name ''", "letters, digits")),
    Case("name-slash", local("--name", "a/b"), ("'a/b'", "letters, digits")),
    Case("name-5000", ["local", "--name", LONG, "--", "marker.py"], ("--name 'aaa", "1-200")),
    Case(
        "run-dir-5000",
        ["local", "--run-dir", LONG, "--", "marker.py"],
        ("run dir", "too long", "at most 255 bytes"),
    ),
    Case(
        "run-dir-newline",
        ["local", "--run-dir", "a\n$(touch STARTED)", "--", "marker.py"],
        ("control character '\\n'", "without control characters"),
    ),
    Case(
        "run-dir-under-file",
        ["local", "--run-dir", "afile/run", "--", "marker.py"],
        ("afile", "not a directory"),
        files={"afile": "x"},
    ),
    Case(
        "run-dir-read-only-fs",
        ["local", "--run-dir", "ro/run", "--", "marker.py"],
        ("ro/run", "read-only file system", "directory you can write"),
        files={"ro": None},
        cmd="ro",
    ),
    Case(
        "python-missing",
        local("--python", "/nonexistent/python3"),
        ("'/nonexistent/python3'", "interpreter"),
    ),
    Case(
        "unknown-flag",
        ["local", "--nodez", "2", "--", "marker.py"],
        ("'--nodez'", "accepted: ", "--nodes"),
    ),
    Case("program-missing", local(program=()), ("missing program", "-- train.py")),
    Case("program-no-file", local(program=("nope.py",)), ("'nope.py'", "does not exist")),
    Case(
        "program-no-module",
        local(program=("-m", "no_such_module_xyz")),
        ("'no_such_module_xyz'", "cannot be found"),
    ),
    Case("nccl-preset-unknown", local("--nccl-preset", "nosuch"), ("'nosuch'", "known: ")),
    Case(
        "connect-timeout-word",
        ["ssh", "--hosts", "a", "--connect-timeout", "abc", "--dry-run", "--", "marker.py"],
        ("--connect-timeout 'abc'", "a number"),
    ),
    Case("slurm-time", slurm("--time", "abc"), ("'abc'", "04:00:00")),
    Case("slurm-cpus", slurm("--cpus-per-task", "x"), ("'x'", "an integer")),
    Case("slurm-partition-empty", slurm("--partition", ""), ("--partition ''", "non-empty")),
    # issue 33: the node's CPUs and memory, site options (launchers.options.sbatchopts: sbatch's own
    # grammar)
    Case("slurm-mem-gib", slurm("--mem", "64GiB"), ("--mem '64GiB'", "K, M, G or T")),
    Case(
        "slurm-mem-per-gpu-word",
        slurm("--mem-per-gpu", "8X"),
        ("--mem-per-gpu '8X'", "K, M, G or T"),
    ),
    Case(
        "slurm-cpus-per-gpu-zero", slurm("--cpus-per-gpu", "0"), ("--cpus-per-gpu 0", "1 to 100000")
    ),
    Case(
        "slurm-cpus-both",
        slurm("--cpus-per-task", "4", "--cpus-per-gpu", "2"),
        ("--cpus-per-gpu 2", "one of the two"),
    ),
    Case(
        "slurm-sbatch-arg-unknown",
        slurm("--sbatch-arg", "--gress=gpu:8"),
        ("'--gress=gpu:8'", "sbatch --help"),
    ),
    Case(
        "slurm-sbatch-arg-owned",
        slurm("--sbatch-arg", "--nodes=3"),
        ("'--nodes=3'", "give --nodes instead"),
    ),
    Case(
        "slurm-sbatch-arg-no-value",
        slurm("--sbatch-arg", "--reservation"),
        ("'--reservation'", "takes a value"),
    ),
    Case("slurm-sbatch-arg-short", slurm("--sbatch-arg", "-x n1"), ("'-x n1'", "'--exclude=...'")),
    Case("slurm-setup-empty", slurm("--setup", ""), ("--setup ''", "one non-empty line")),
    Case(
        "slurm-gres-given-to-launch",
        slurm("--gres", "gpu:8"),
        ("--gres", "--sbatch-arg '--gres=gpu:8'"),
    ),
    Case("slurm-short-nodes-given-to-launch", slurm("-N", "2"), ("-N", "give --nodes instead")),
    Case("status-click-int", ["logs", "--rank", "x", "."], ("--rank 'x'", "integer >= 0")),
    Case("logs-rank-plus", ["logs", "--rank", "+1", "ok"], ("--rank '+1'", "plain decimal")),
    Case(
        "wait-timeout-underscore",
        ["wait", "--timeout", "1_0", "ok"],
        ("--timeout '1_0'", "seconds > 0"),
    ),
    Case("hostfile-slots-leading-zero", **ssh_hf("a slots=02\n"), needles=("'slots=02'", "1-1024")),
    Case(
        "status-unknown-option", ["status", "--bogus", "."], ("'--bogus'", "accepted: ", "--json")
    ),
    Case("unknown-command", ["frob"], ("'frob'", "accepted: ", "local")),
    # issue 36: typed help keeps our parsers' messages; a typo is named with what was meant; the new
    # names
    Case(
        "slurm-option-typo",
        slurm("--nodse", "2"),
        ("'--nodse'", "did you mean --nodes?", "accepted: "),
    ),
    Case("local-dist-choice-kept", local("--dist-backend", "NCCL"), ("'NCCL'", "auto, gloo, nccl")),
    Case(
        "nccl-bench-preset-unknown",
        ["nccl", "bench", "--nccl-preset", "nosuch"],
        ("'nosuch'", "known: "),
    ),
    Case(
        "nccl-sweep-candidate-unknown",
        ["nccl", "sweep", "--nccl-preset", "moe,nosuch", "--out", "s"],
        ("'nosuch'", "known: "),
    ),
    Case(
        "nccl-bench-typo",
        ["nccl", "bench", "--repeat", "2"],
        ("'--repeat'", "did you mean --repeats?"),
    ),
    Case(
        "doctor-ssh-env-default",
        ["doctor", "--hosts", "sshhost1"],
        ("--connect-timeout (from $LAUNCH_SSH_CONNECT_TIMEOUT)", "(0, 600]"),
        env={"LAUNCH_SSH_CONNECT_TIMEOUT": "0"},
    ),
    # ------------------------------------------------------ NCCL values (NCCL's own parsers decide)
    Case("nccl-typo", local("--env", "NCCL_PROTOO=x"), ("NCCL_PROTOO", "did you mean NCCL_PROTO")),
    Case(
        "nccl-timeout",
        local("--env", "NCCL_TIMEOUT=5"),
        ("NCCL_TIMEOUT", "not read by NCCL", "init_process_group"),
    ),
    Case("nccl-seed-preset", local(*SEED), ("NCCL_PROTO='shm'", "LL, LL128, Simple")),
    Case("nccl-proto-seed", local("--env", "NCCL_PROTO=shm"), ("'shm'", "LL, LL128, Simple")),
    Case("nccl-algo-bogus", local("--env", "NCCL_ALGO=bogus"), ("'bogus'", "accepted")),
    Case(
        "nccl-profile-env",
        prof("env: {NCCL_PROTOO: x}\n")["argv"],
        ("NCCL_PROTOO", "NCCL_PROTO"),
        files=prof("env: {NCCL_PROTOO: x}\n")["files"],
    ),
    Case(
        "nccl-check-on-unseen",
        ["nccl", "check", "--env", "NCCL_IB_HCA=mlx5_1", "--on", "gpu9"],
        ("--on 'gpu9'", "launch doctor has not seen", "run `launch doctor`"),
    ),
    # ---------------------------------------------------------------- profiles
    Case("profile-unknown-key", **prof("nodez: 2\n"), needles=("'nodez'", "accepted: ")),
    Case(
        "profile-unknown-backend-key",
        **prof("slurm: {partishun: gpu}\n"),
        needles=("partishun", "accepted: "),
    ),
    Case(
        "profile-nodes-str",
        **prof("nodes: two\n"),
        needles=("p.yaml", "nodes 'two'", "an integer 1-65536"),
    ),
    Case("profile-nodes-bool", **prof("nodes: true\n"), needles=("True", "expected int")),
    Case(
        "profile-nodes-range-float",
        **prof('nodes: "1:2.5"\n'),
        needles=("p.yaml", "nodes '1:2.5'", "MIN:MAX"),
    ),
    Case(
        "profile-cpu-bind-list",
        **prof("cpu_bind: [cores]\n"),
        needles=("cpu_bind", "['cores']", "expected str"),
    ),
    Case(
        "profile-stop-signal-usr1",
        **prof("stop_signal: SIGUSR1\n"),
        needles=("'SIGUSR1'", "SIGTERM, SIGINT"),
    ),
    Case(
        "profile-python-list",
        **prof("python: [python3, -u]\n"),
        needles=("python", "['python3', '-u']", "expected str"),
    ),
    Case(
        "profile-program-str",
        **prof("program: train.py\n"),
        needles=("'train.py'", "list of words"),
    ),
    Case("profile-env-list", **prof("env: [A=1]\n"), needles=("['A=1']", "expected dict")),
    Case(
        "profile-python-object",
        **prof("nodes: !!python/object/apply:os.system ['touch STARTED']\n"),
        needles=("not valid YAML", "safe subset"),
    ),
    Case(
        "profile-python-name",
        **prof("python: !!python/name:os.system\n"),
        needles=("not valid YAML",),
    ),
    Case(
        "profile-alias-bomb",
        **prof(BOMB + "nodes: *i\n"),
        needles=("p.yaml", "alias bomb", "100000 values"),
    ),
    Case("profile-empty", **prof(""), needles=("p.yaml", "is empty", "nodes: 2")),
    Case(
        "profile-directory",
        ["local", "--profile", "pdir", "--", "marker.py"],
        ("'pdir'", "expected a file"),
        files={"pdir": None},
    ),
    Case(
        "profile-not-utf8", **prof(b"name: \xff\xfe\n"), needles=("not UTF-8", "UTF-8 YAML mapping")
    ),
    Case("profile-list", **prof("- a\n- b\n"), needles=("mapping", "list")),
    Case(
        "profile-missing",
        ["local", "--profile", "nope.yaml", "--", "marker.py"],
        ("'nope.yaml'", "does not exist"),
    ),
    Case(
        "profile-ssh-type",
        **prof("ssh: {connect_timeout: soon}\n", "--hosts", "a", backend="ssh"),
        needles=("connect_timeout 'soon'", "a number"),
    ),
    # ----------------------------------------------- one parser per kind of value (issue 21 item 7)
    *[
        Case(
            f"profile-nodes-{k}",
            **prof(f"nodes: {v}\n"),
            needles=("p.yaml", "nodes", repr(v), "plain decimal"),
        )
        for k, v in (
            ("octal", "010"),
            ("hex", "0x10"),
            ("underscore", "1_0"),
            ("plus", "+2"),
            ("binary", "0b10"),
            ("sexagesimal", "1:20:30"),
        )
    ],  # 1:20 is a range (--nodes MIN:MAX)
    Case(
        "profile-nodes-fullwidth",
        **prof("nodes: \uff12\n"),
        needles=("p.yaml", "nodes '\uff12'", "plain decimal"),
    ),
    Case(
        "profile-port-plus",
        **prof("master_port: +29500\n"),
        needles=("p.yaml", "master_port", "'+29500'", "1024-65535"),
    ),
    Case(
        "profile-port-range",
        **prof("master_port: 80\n"),
        needles=("p.yaml", "master_port", "80", "1024-65535"),
    ),
    Case("profile-nodes-range", **prof("nodes: 0\n"), needles=("p.yaml", "nodes", "0", "1-65536")),
    Case(
        "profile-grace-underscore",
        **prof("stop_grace: 1_0.5\n"),
        needles=("p.yaml", "stop_grace", "'1_0.5'"),
    ),
    Case(
        "profile-slurm-cpus-hex",
        **prof("slurm: {cpus_per_task: 0x4}\n", backend="slurm"),
        needles=("p.yaml", "cpus_per_task", "'0x4'", "plain decimal"),
    ),
    Case(
        "profile-duplicate-key",
        **prof("nodes: 2\nname: a\nnodes: 3\n"),
        needles=("p.yaml", "'nodes'", "twice", "lines 1 and 3"),
    ),
    Case(
        "profile-duplicate-env-key",
        **prof("env:\n  A: 1\n  A: 2\n"),
        needles=("p.yaml", "'A'", "twice"),
    ),
    Case(
        "profile-slurm-sbatch-lines-unknown",
        **prof("slurm: {sbatch_lines: ['--frobnicate=1']}\n", backend="slurm"),
        needles=("'--frobnicate=1'", "sbatch --help"),
    ),
    Case(
        "profile-slurm-setup-not-a-list",
        **prof("slurm: {setup: module load cuda}\n", backend="slurm"),
        needles=("setup", "expected list"),
    ),
    Case(
        "profile-slurm-mem-per-gpu",
        **prof("slurm: {mem_per_gpu: lots}\n", backend="slurm"),
        needles=("'lots'", "K, M, G or T"),
    ),
    Case(
        "profile-duplicate-slurm-key",
        **prof("slurm:\n  partition: a\n  partition: b\n", backend="slurm"),
        needles=("p.yaml", "'partition'", "lines 2 and 3"),
    ),
    Case(
        "profile-env-nul", **prof('env: {A: "x\\0y"}\n'), needles=("p.yaml", "env A=", "NUL byte")
    ),
    Case(
        "env-newline",
        local("--env", "TEST_NL=a\nb"),
        ("--env TEST_NL='a\\nb'", "holds a newline", "NUL and newline are not accepted"),
    ),
    Case(
        "profile-env-newline",
        **prof('env: {TEST_NL: "a\\nb"}\n'),
        needles=("p.yaml", "env TEST_NL=", "a newline", "NUL and newline are not accepted"),
    ),
    Case(
        "profile-env-reserved",
        **prof("env: {LAUNCH_RUN_ID: x}\n"),
        needles=("p.yaml", "LAUNCH_RUN_ID", "--run-dir"),
    ),
    Case(
        "env-reserved-master-port",
        local("--env", "MASTER_PORT=29500"),
        ("--env MASTER_PORT", "--master-port"),
    ),
    Case(
        "env-reserved-run-id",
        local("--env", "LAUNCH_RUN_ID=x"),
        ("--env LAUNCH_RUN_ID", "--run-dir"),
    ),
    Case(
        "env-reserved-world-size", local("--env", "WORLD_SIZE=8"), ("--env WORLD_SIZE", "--nodes")
    ),
    Case(
        "snapshot-program-ignored",
        local("--snapshot"),
        ("marker.py", "left out of the snapshot", "--no-snapshot"),
        files={".launchignore": "marker.py\n"},
    ),  # refused before the snapshot store is written
    Case(
        "profile-snapshot-word",
        **prof("snapshot: 'yes'\n", backend="slurm"),
        needles=("p.yaml", "snapshot", "'yes'", "expected bool"),
    ),
    Case(
        "env-reserved-private-env",
        local("--env", "LAUNCH_PRIVATE_ENV=HF_TOKEN"),
        ("--env LAUNCH_PRIVATE_ENV", "--secret"),
    ),
    Case(
        "secret-reserved-private-env",
        local("--secret", "LAUNCH_PRIVATE_ENV=@s.txt"),
        ("--secret LAUNCH_PRIVATE_ENV", "is set by launch"),
        files={"s.txt": "x\n"},
    ),
    # ------------------------------------------------ issue 35: secrets' files, URL typos, run dirs
    # inside run dirs, hostile profiles and clusters files
    Case(
        "secret-file-dev-zero",
        local("--secret", "S=@/dev/zero"),
        ("--secret S=@/dev/zero", "not a regular file", "at most 64 KiB"),
    ),
    Case(
        "secret-file-fifo",
        local("--secret", "S=@fifo"),
        ("--secret S=@fifo", "not a regular file"),
        files={"fifo": "FIFO"},
    ),
    Case(
        "secret-file-200k",
        local("--secret", "S=@s.txt"),
        ("--secret S=@s.txt", "over the limit", "64 KiB"),
        files={"s.txt": "x" * 200_000},
    ),
    Case(
        "notify-url-typo",
        local("--notify", "https//hooks.slack.com/services/T0/B1/XYZ"),
        ("'https//hooks.slack.com/...'", "without '://'", "http:// or https:// URL"),
    ),
    Case(
        "notify-url-typo-one-slash",
        local("--notify", "http:/hooks.example.org/x"),
        ("'http:/hooks.example.org/...'", "without '://'"),
    ),
    Case(
        "notify-url-typo-profile",
        **prof("notify: 'https:hooks.example.org/T0'\n"),
        needles=("'https:hooks.example.org/...'", "without '://'"),
    ),
    Case(
        "run-dir-empty",
        ["local", "--run-dir", "", "--", "marker.py"],
        ("--run-dir ''", "is empty", "leave --run-dir out"),
    ),
    Case(
        "run-dir-blank",
        ["local", "--run-dir", " ", "--", "marker.py"],
        ("--run-dir ' '", "is empty"),
    ),
    Case(
        "run-dir-in-checkpoints",
        ["local", "--run-dir", "other/checkpoints/x", "--", "marker.py"],
        ("other/checkpoints/x", "is inside the run dir", "other'", "outside any run dir"),
        run_copy={"other": {}},
    ),
    Case(
        "run-dir-in-run-logs",
        ["local", "--run-dir", "other/logs/node0/new", "--", "marker.py"],
        ("is inside the run dir", "outside any run dir"),
        run_copy={"other": {}},
    ),
    Case(
        "profile-over-1mib",
        **prof("# padding\n" * 120_000 + "nodes: 1\n"),
        needles=("p.yaml", "over the size limit", "at most 1 MiB"),
    ),
    Case("profile-alias-bomb-env", **prof(BOMB), needles=("p.yaml", "alias bomb", "100000 values")),
    Case(
        "profile-deep",
        **prof("a: " + "[" * 5000 + "]" * 5000 + "\n"),
        needles=("p.yaml", "nested too deep"),
    ),
    Case(
        "clusters-world-writable",
        ["status", "--cluster", "dev", "r"],
        ("clusters file", "writable by others (mode 0666)", "only you can write"),
        files={"c.yaml": "dev: {login: h, runs_root: /r}\n"},
        env={"LAUNCH_CLUSTERS_FILE": "c.yaml"},
        owner={"c.yaml": (0o666, None)},
    ),
    Case(
        "clusters-group-writable",
        ["status", "--cluster", "dev", "r"],
        ("writable by others (mode 0620)",),
        files={"c.yaml": "dev: {login: h, runs_root: /r}\n"},
        env={"LAUNCH_CLUSTERS_FILE": "c.yaml"},
        owner={"c.yaml": (0o620, None)},
    ),
    Case(
        "clusters-other-owner",
        ["status", "--cluster", "dev", "r"],
        ("clusters file", "owned by uid 4242, not you"),
        files={"c.yaml": "dev: {login: h, runs_root: /r}\n"},
        env={"LAUNCH_CLUSTERS_FILE": "c.yaml"},
        owner={"c.yaml": (0o644, 4242)},
    ),
    Case(
        "clusters-alias-bomb",
        ["status", "--cluster", "dev", "r"],
        ("clusters file", "alias bomb"),
        files={"c.yaml": BOMB.replace("env:", "x:")},
        env={"LAUNCH_CLUSTERS_FILE": "c.yaml"},
    ),
    Case("port-plus", local("--master-port", "+29500"), ("'+29500'", "1024-65535")),
    Case(
        "port-fullwidth",
        local("--master-port", "\uff12\uff19\uff15\uff10\uff10"),
        ("'\uff12", "1024-65535"),
    ),
    Case("port-underscore", local("--master-port", "29_500"), ("'29_500'", "plain decimal")),
    Case("nodes-leading-zero", local("--nodes", "010"), ("'010'", "plain decimal")),
    Case("grace-space", local("--stop-grace", " 30"), ("' 30'", "seconds > 0")),
    Case(
        "connect-timeout-plus",
        ["ssh", "--hosts", "a", "--connect-timeout", "+5", "--dry-run", "--", "marker.py"],
        ("--connect-timeout '+5'", "a number"),
    ),
    Case("slurm-cpus-fullwidth", slurm("--cpus-per-task", "\uff14"), ("'\uff14'", "an integer")),
    # ---------------------------------------------------------------- hostfiles and --hosts
    Case("hostfile-duplicate", **ssh_hf("a\nb\na\n"), needles=("'a'", "listed twice", "one node")),
    Case("hostfile-slots-0", **ssh_hf("a slots=0\n"), needles=("'slots=0'", "1-1024")),
    Case("hostfile-slots-abc", **ssh_hf("a slots=abc\n"), needles=("'slots=abc'", "1-1024")),
    Case(
        "hostfile-slots-huge",
        **ssh_hf("a slots=99999999999999999999\n"),
        needles=("99999999999999999999", "1-1024"),
    ),
    Case(
        "hostfile-slots-fullwidth", **ssh_hf("a slots=\uff12\n"), needles=("slots=\uff12", "1-1024")
    ),
    Case("hostfile-5000-dup", **ssh_hf(HOSTS_5000_DUP), needles=("'h1'", "lines 1 and 5000")),
    Case(
        "hostfile-5000-bad-last", **ssh_hf(HOSTS_5000_BAD_LAST), needles=("line 5000", "'slots=0'")
    ),
    Case(
        "hostfile-unicode",
        **ssh_hf("h\u00f4st slots=2\n"),
        needles=("'h\u00f4st'", "[user@]host[:port]"),
    ),
    Case(
        "hostfile-unknown-field", **ssh_hf("a slot=2\n"), needles=("'slot=2'", "accepted: slots=N")
    ),
    Case("hostfile-empty", **ssh_hf("# nothing\n"), needles=("lists no hosts", "host [slots=N]")),
    Case("hostfile-not-utf8", **ssh_hf(b"h\xff\n"), needles=("not UTF-8", "host [slots=N]")),
    Case(
        "hostfile-port-5000-digits",
        **ssh_hf("a:" + "9" * 5000 + "\n"),
        needles=("bad port", "1-65535"),
    ),
    Case(
        "hosts-empty-name",
        ["ssh", "--hosts", "a,,b", "--dry-run", "--", "marker.py"],
        ("'a,,b'", "host1,host2"),
    ),
    Case(
        "hosts-and-hostfile",
        ["ssh", "--hosts", "a", "--hostfile", "hf", "--dry-run", "--", "marker.py"],
        ("--hosts or --hostfile",),
        files={"hf": "a\n"},
    ),
    Case(
        "ssh-more-nodes-than-hosts",
        ["ssh", "--hosts", "a,b", "--nodes", "3", "--dry-run", "--", "marker.py"],
        ("--nodes 3", "2 hosts"),
    ),
    # ------------------------------------------------------ workload flags (the workload's own CLI)
    Case(
        "workload-epochs",
        ["convnet", "--epochs", "abc", "--run-dir", "runs/w"],
        ("'abc'", "positive integer"),
        cmd="workload",
        prefix="convnet: error: ",
    ),
    Case(
        "workload-lr",
        ["convnet", "--lr", "-1", "--run-dir", "runs/w"],
        ("'-1'", "positive number"),
        cmd="workload",
        prefix="convnet: error: ",
    ),
    Case(
        "workload-dataset",
        ["convnet", "--dataset", "imagenet", "--run-dir", "runs/w"],
        ("'imagenet'", "digits"),
        cmd="workload",
        prefix="convnet: error: ",
    ),
    Case(
        "workload-crash-rank",
        ["convnet", "--crash-at-step", "3", "--crash-rank", "5", "--run-dir", "runs/w"],
        ("--crash-rank 5", "0..0"),
        cmd="workload",
        prefix="convnet: error: ",
    ),
    # --------------------------------------------------------- verbs on paths that are not run dirs
    *[
        Case(
            f"{verb}-plain-dir",
            [verb, "plain"],
            ("plain", "not a run dir", "made by `launch`"),
            files={"plain": None},
        )
        for verb in ("status", "logs", "resume", "cancel")
    ],
    Case("status-missing-path", ["status", "nowhere"], ("nowhere", "not a run dir")),
    *[
        Case(
            f"{verb}-unknown-name-or-job-id",
            [verb, word],
            (f"'{word}' is not a run dir", "nor a Slurm job id", "a name `launch list` shows"),
        )
        for verb, word in (
            ("logs", "nowhere"),
            ("wait", "424242"),
            ("resume", "nowhere"),
            ("cancel", "424242"),
        )
    ],
    Case("top-missing-path", ["top", "--once", "nowhere"], ("nowhere", "not a run dir")),
    Case(
        "top-interval-zero",
        ["top", "--interval", "0", "nowhere"],
        ("--interval 0", "seconds from 0.1 up"),
    ),
    Case("wait-on-file", ["wait", "afile"], ("afile", "not a run dir"), files={"afile": "x"}),
    *[
        Case(
            f"{verb}-garbage-run-yaml",
            [verb, "bad"],
            ("bad", "run.yaml cannot be read", "written by `launch`"),
            run_copy={"bad": {"run.yaml": "spec: [unclosed\n"}},
        )
        for verb in ("status", "logs", "resume", "cancel")
    ],
    Case(
        "status-run-yaml-list",
        ["status", "bad"],
        ("run.yaml is not a mapping", "written by `launch`"),
        run_copy={"bad": {"run.yaml": "- 1\n- 2\n"}},
    ),
    Case(
        "status-run-yaml-python-tag",
        ["status", "bad"],
        ("run.yaml cannot be read", "could not determine"),
        run_copy={
            "bad": {"run.yaml": "run_id: !!python/object/apply:os.system ['touch STARTED']\n"}
        },
    ),
    Case(
        "status-run-yaml-no-spec",
        ["status", "bad"],
        ("has no spec", "written by `launch`"),
        run_copy={"bad": {"run.yaml": "run_id: x\nattempts: [{}]\nspec: {backend: local}\n"}},
    ),
    Case(
        "status-run-yaml-attempts-of-ints",
        ["status", "bad"],
        ("attempts that are not mappings", "written by `launch`"),
        run_copy={
            "bad": {
                "run.yaml": (
                    "run_id: x\nattempts: [1, 2]\nspec: {backend: local, program: [x.py], "
                    "run_dir: x, name: x, nodes: 1, gpus_per_node: 1}\n"
                )
            }
        },
    ),
    Case(
        "status-run-yaml-not-utf8",
        ["status", "bad"],
        ("run.yaml cannot be read", "utf-8"),
        run_copy={"bad": {"run.yaml": b"\xff\xfe\n"}},
    ),
    *[
        Case(
            f"{verb}-no-status-json",
            [verb, "bad"],
            ("bad", "status.json is missing", "made by `launch`"),
            run_copy={"bad": {"status.json": None}},
        )
        for verb in ("status", "resume", "cancel")
    ],
    Case(
        "status-garbage-status-json",
        ["status", "bad"],
        ("status.json", "not valid JSON", "a JSON object"),
        run_copy={"bad": {"status.json": "[1, 2"}},
    ),
    # ------------------------------------------------------------ hostile records (issue 35 item 3)
    *[
        Case(
            f"{verb}-status-json-{name}",
            [verb, "bad"],
            ("bad", "status.json", why, "made by `launch`"),
            run_copy={"bad": {"status.json": text}},
        )
        for verb in ("status", "cancel", "logs")
        for name, text, why in (
            ("deep", "[" * 100000 + "]" * 100000, "nested too deep"),
            ("nan", '{"state": "FAILED", "attempt": NaN}', "NaN is not a JSON value"),
            ("types", status_json("FAILED", nodes="abc"), "has nodes of type str"),
            ("node-names", status_json("FAILED", nodes={"x": 1}), "not node numbers"),
        )
    ],
    # ---------------------------------------------- cancel proves what it signals (issue 35 item 1)
    Case(
        "cancel-a-strangers-pid",
        ["cancel", "bad"],
        (f"names pid {LIVE['pid']}", "not this run's launcher", "can prove"),
        run_copy={"bad": {"status.json": status_json("RUNNING", launcher=LIVE), HERE: ""}},
    ),
    # ------------------------------------------------------------- one attempt at a time (issue 21)
    *[
        Case(
            f"resume-{word}",
            ["resume", "bad"],
            (
                "bad'",
                f"is {word} (launcher pid {LIVE['pid']} on ",
                "one attempt at a time",
                "launch cancel",
            ),
            run_copy={"bad": {"status.json": status_json(state, **{key: LIVE}), HERE: ""}},
        )
        for word, state, key in (
            ("starting", "FAILED", "starting"),
            ("running", "RUNNING", "launcher"),
        )
    ],
    *[
        Case(
            f"cancel-ended-{name}",
            ["cancel", "bad"],
            (f"run bad already ended ({shown})", "nothing to cancel"),
            run_copy={"bad": {"status.json": status_json(state, **extra)}},
            code=0,
            prefix="launch: run ",
        )
        for name, state, shown, extra in (
            ("failed", "FAILED", "FAILED", {}),
            ("cancelled", "CANCELLED", "CANCELLED", {}),
            ("interrupted", "CANCELLED", "CANCELLED", {"stopped_by": "SIGINT"}),
        )
    ],
    Case(
        "cancel-ended-completed",
        ["cancel", "ok"],
        ("run ok already ended (COMPLETED)", "nothing to cancel"),
        code=0,
        prefix="launch: run ",
    ),
    Case("logs-rank-absent", ["logs", "--rank", "99", "ok"], ("--rank 99", "accepted: 0")),
    Case("resume-a-copy", ["resume", "ok"], ("is a copy of", "runs/ok", "launch resume --adopt")),
    Case(
        "cancel-a-copy",
        ["cancel", "bad"],
        ("is a copy of", "runs/ok", "runs nothing"),
        run_copy={"bad": {"status.json": status_json("RUNNING", launcher=LIVE)}},
    ),
]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One real (tiny) local run, copied by the cases that need a run dir."""
    d = tmp_path_factory.mktemp("realrun")
    (d / "marker.py").write_text(MARKER)
    p = run_launch("local", "--run-dir", "runs/ok", "--", "marker.py", cwd=d, timeout=180)
    assert p.returncode == 0, p.stderr
    return d / "runs" / "ok"


def write_files(base: Path, files: dict) -> None:
    for rel, content in files.items():
        target = base / rel
        if content is None:
            target.mkdir(parents=True, exist_ok=True)
        elif content == "FIFO":
            os.mkfifo(target)
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")


def snapshot(base: Path) -> dict[str, str]:
    """Every path under base with its kind, mode and content hash (directories: their listing)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            data = (
                p.read_bytes()
                if p.is_file()
                else "\n".join(sorted(os.listdir(p))).encode()
                if p.is_dir()
                else b""
            )  # a FIFO: never opened
            out[str(p.relative_to(base))] = f"{st.st_mode:o} {hashlib.sha256(data).hexdigest()}"
    return out


def command(case: Case) -> list[str]:
    if case.cmd == "workload":
        return [sys.executable, "-m", f"workloads.{case.argv[0]}", *case.argv[1:]]
    if case.cmd == "ro":
        return ["unshare", "-rm", "sh", "-c", RO_MOUNT, LAUNCH, *case.argv]
    return [LAUNCH, *case.argv]


def test_at_least_40_cases():
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused(case: Case, tmp_path, real_run):
    (tmp_path / "marker.py").write_text(MARKER)
    write_files(tmp_path, case.files)
    for name, changes in case.run_copy.items():
        shutil.copytree(real_run, tmp_path / name)
        for rel, text in changes.items():
            if rel == HERE:  # made where it is (not a copy of real_run): run.yaml records it
                data = yaml.safe_load((tmp_path / name / "run.yaml").read_text())
                data["spec"]["run_dir"] = str(tmp_path / name)
                (tmp_path / name / "run.yaml").write_text(yaml.safe_dump(data))
            elif text is None:
                (tmp_path / name / rel).unlink()
            else:
                write_files(tmp_path / name, {rel: text})
    if "ok" in case.argv:
        shutil.copytree(real_run, tmp_path / "ok")
    for rel, (mode, uid) in case.owner.items():
        os.chmod(tmp_path / rel, mode)
        if uid is not None:
            os.chown(tmp_path / rel, uid, -1)
    before = snapshot(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LAUNCH_RUNS_ROOT": str(tmp_path / "runs"),
        **case.env,
    }
    env = {k: v for k, v in env.items() if not k.startswith("NCCL_")}
    p = subprocess.run(
        command(case), cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == case.code, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    assert "Traceback" not in p.stderr and len(lines) == 1 and lines[0].startswith(case.prefix), (
        p.stderr[-3000:]
    )
    for needle in case.needles:
        assert needle in lines[0], (needle, lines[0])
    assert len(lines[0]) < 1200, lines[0]  # a long value is named, not printed whole
    assert p.stdout == "", p.stdout[-2000:]  # no dry-run rendered, nothing reported
    assert not (tmp_path / "STARTED").exists()  # the program never ran
    assert snapshot(tmp_path) == before  # no run dir created, a given one untouched
