"""Issue 13 item 5: security.

- arbitrary text in program args, --env values (any but a newline or NUL: refused,
  tests/test_bad_input_matrix.py), run names and run-dir paths arrives byte-for-byte and never
  reaches a shell unquoted: property-based (hypothesis) on the pure renderings, run through a real
  bash (the SSH line sshd runs, the sbatch script), with many examples; and on real runs (local, SSH
  hosts, Slurm) with few;
- secret-looking values (*TOKEN*, *KEY*, *SECRET*, *PASSWORD*) are *** in the dry-run, run.yaml,
  status.json, `launch status`, agent logs, the sbatch script and the launcher's output -- no file
  of the run dir holds them -- while the program gets the real value;
- run dirs follow the user's umask and are never world-writable;
- YAML is only ever safe-loaded (every yaml call in the tree; a python tag in a preset file is
  refused).
Unknown and changed host keys:
tests/test_ssh_backend.py::test_host_key_unknown_and_changed_are_refused, plus the empty and missing
known_hosts cases here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from conftest import LAUNCH, ROOT, rank_lines, read_json, require_cluster, run_launch
from launchers import layout
from launchers.backends.slurm.render import header_for, render_sbatch
from launchers.backends.ssh import SSHBackend
from launchers.errors import LaunchError
from launchers.options.specvalues import check_name
from launchers.spec import RunSpec

SSH_STATE = Path(os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts"))
SSH_OPTS = [
    "--ssh-config",
    str(SSH_STATE / "ssh_config"),
    "--known-hosts",
    str(SSH_STATE / "known_hosts"),
]
INJECTIONS = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "; touch PWNED",
    "' ; touch PWNED; '",
    '"; touch PWNED; "',
    "\ntouch PWNED\n",
    "&& touch PWNED",
    "| touch PWNED",
    "> PWNED",
    "$HOME",
    "*",
    "~",
    "\\",
    "--",
    "-m",
    "a b",
    "",
    "ünïcødé ✓",
    "\r\n",
    "%j %t %%",
    "'\"'\"'",
]
TEXT = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=30
)
WORD = st.one_of(
    TEXT,
    st.sampled_from(INJECTIONS),
    st.builds(lambda a, b, c: a + b + c, TEXT, st.sampled_from(INJECTIONS), TEXT),
)
# an env value: a newline is refused (issue 21 item 7)
VALUE = WORD.map(lambda w: w.replace("\n", " "))
NAME_PART = WORD.map(lambda w: w.replace("/", "_")).filter(
    lambda w: w not in ("", ".", "..") and len(w.encode()) < 120
)
SECRETS = {
    "SEC_API_TOKEN": "tok-3f9a71 'x' $(touch PWNED)",
    "SEC_DB_PASSWORD": "pw-9c1e44",
    "SEC_AWS_SECRET_ACCESS": "aws-5b2d08",
    "SEC_SSH_KEY": "key-77e0c2 with spaces",
}
ECHO = """import hashlib, json, os, sys
sec = {k: hashlib.sha256(v.encode("utf-8", "surrogateescape")).hexdigest() for k, v in os.environ.items()
       if k.startswith("SEC_")}
print("ECHO " + json.dumps({"argv": sys.argv[1:], "v": os.environ.get("TEST_V"), "run_dir": os.environ.get("LAUNCH_RUN_DIR"),
                            "rank": os.environ.get("RANK"), "sec": sec}), flush=True)
"""  # noqa: E501
DUMP = f"""#!{sys.executable}
import json, os, sys
print(json.dumps({{"argv": sys.argv[1:], "v": os.environ.get("TEST_V"), "run_dir": os.environ.get("LAUNCH_RUN_DIR")}}))
"""  # noqa: E501
FEW = settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
MANY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def sha(v: str) -> str:
    import hashlib

    return hashlib.sha256(v.encode()).hexdigest()


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="launch-sec-") as d:
        base = Path(d)
        (base / "dump").write_text(DUMP)
        (base / "dump").chmod(0o755)
        (base / "ssh_config").write_text("")
        yield base


def new_dir(base: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=base))


def pwned(*dirs: Path) -> list[str]:
    return [str(p) for d in dirs for p in Path(d).rglob("PWNED")]


def refused_or_path(path: str) -> str | None:
    """A run dir the launcher accepts (returned), or None when it refuses it on one line."""
    try:
        return layout.choose_run_dir(path, "x")
    except LaunchError as e:
        assert "\n" not in str(e) and len(str(e)) < 1000
        event("run dir refused")
        return None


# ---------------------------------------------------------------------------- pure renderings, bash


@MANY
@given(args=st.lists(WORD, max_size=5), value=VALUE, dirname=NAME_PART)
@example(args=INJECTIONS, value="$(touch PWNED)\r`touch PWNED`", dirname="$(touch PWNED)")
def test_ssh_line_through_bash_arrives_verbatim(scratch, args, value, dirname):
    """The line sshd hands the login shell: bash gives the node's python exactly the words and env
    values."""
    work = new_dir(scratch)
    run_dir = refused_or_path(str(work / dirname / "run"))
    if run_dir is None:
        return
    spec = RunSpec(
        backend="ssh",
        nodes=1,
        gpus_per_node=1,
        program=(str(work / "prog.py"),),
        program_args=tuple(args),
        run_dir=run_dir,
        name="n",
        env=(("TEST_V", value),),
        python=str(scratch / "dump"),
        options=(("hosts", ["localhost"]), ("ssh_config", str(scratch / "ssh_config"))),
    )
    plan = SSHBackend().plan(spec, "rid", attempt=0)
    p = subprocess.run(
        ["bash", "-c", plan.remote_line(0, redact=False)], cwd=work, capture_output=True, timeout=30
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["argv"][-len(args) - 1 :] == [str(work / "prog.py"), *args]
    assert got["v"] == value and got["run_dir"] == run_dir
    assert pwned(work) == []


@MANY
@given(args=st.lists(WORD, max_size=4), dirname=NAME_PART)
@example(args=["x\n$(touch PWNED)"], dirname="a\nb")
@example(args=["$(touch PWNED)"], dirname="$(touch PWNED)'")
def test_sbatch_script_through_bash(scratch, args, dirname):
    """The sbatch script: its only commands are export, srun and the finalize line, the run dir
    arrives exactly, and the program args in its header stay comments."""
    work = new_dir(scratch)
    run_dir = refused_or_path(str(work / dirname))
    if run_dir is None:
        return
    spec = RunSpec(
        backend="slurm",
        nodes=2,
        gpus_per_node=1,
        program=("train.py",),
        program_args=tuple(args),
        run_dir=run_dir,
        name="n",
        python=str(scratch / "dump"),
        options=(("time", "5"),),
    )
    script = render_sbatch(
        spec, base_attempt=0, header=header_for(["slurm", "--", "train.py", *args], "0")
    )
    lines = script.split("\n")  # bash's lines (str.splitlines would also split at \x85)
    commands = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    assert len(commands) == 3 and commands[0] == "export SUBMITIT_EXECUTOR=slurm", script
    for ln in lines:
        if ln.startswith("#SBATCH"):
            assert len(shlex.split(ln[1:])) == 2, ln  # one quoted value per flag line
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(DUMP)
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-c", script], cwd=work, capture_output=True, timeout=30, env=env)
    assert p.returncode == 0, p.stderr
    srun, final = [json.loads(ln) for ln in p.stdout.split(b"\n") if ln]
    assert srun["argv"][-3:] == [run_dir, "--base-attempt", "0"] and final["argv"][-5] == run_dir
    assert pwned(work) == []


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(name=WORD)
@example(name="ok-name.1")
def test_run_name_refused_or_used_verbatim(name):
    try:
        assert check_name(name) == name
    except LaunchError as e:
        assert "\n" not in str(e) and "--name" in str(e)
        return
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name)
    path = layout.choose_run_dir(None, name, "/nonexistent-root")
    assert os.path.basename(path).startswith(name + "-")


# ---------------------------------------------------------------------------------------- real runs


def echo_reports(run_dir: Path) -> list[dict]:
    return [json.loads(ln[len("ECHO ") :]) for ln in rank_lines(run_dir, "ECHO ")]


def secret_flags() -> list[str]:
    return [f for k, v in SECRETS.items() for f in ("--env", f"{k}={v}")]


def assert_no_secret(texts: list[str], run_dir: Path | None) -> None:
    for k, v in SECRETS.items():
        for t in texts:
            assert v not in t, (k, t[-2000:])
        if run_dir is not None:
            for f in run_dir.rglob("*"):
                if f.is_file():
                    assert v.encode() not in f.read_bytes(), (k, str(f))


def check_echoes(run_dir: Path, program: str, args: list[str], value: str, world: int) -> None:
    reps = echo_reports(run_dir)
    assert sorted(int(r["rank"]) for r in reps) == list(range(world)), reps
    for r in reps:
        assert r["argv"] == args and r["v"] == value and r["run_dir"] == str(run_dir)
        # the program got the real values
        assert r["sec"] == {k: sha(v) for k, v in SECRETS.items()}


def real_case(base: Path, dirname: str) -> tuple[Path, Path, str] | None:
    work = new_dir(base)
    prog_dir = work / dirname
    prog_dir.mkdir()
    (prog_dir / "echo.py").write_text(ECHO)
    run_dir = refused_or_path(str(work / dirname / "run"))
    return None if run_dir is None else (work, Path(run_dir), str(prog_dir / "echo.py"))


@pytest.mark.slow
@FEW
@given(args=st.lists(WORD, max_size=4), value=VALUE, dirname=NAME_PART)
@example(
    args=INJECTIONS[:8],
    value="$(touch PWNED) 'q' \"dq\" \t tab \r cr",
    dirname="d i r $(touch PWNED) ü",
)
def test_local_real_run_verbatim_and_secrets_hidden(scratch, args, value, dirname):
    case = real_case(scratch, dirname)
    if case is None:
        return
    work, run_dir, prog = case
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--run-dir",
        str(run_dir),
        "--env",
        f"TEST_V={value}",
        *secret_flags(),
        "--",
        prog,
        *args,
        cwd=work,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    check_echoes(run_dir, prog, args, value, 2)
    st_ = run_launch("status", str(run_dir), cwd=work, check=True).stdout
    js = run_launch("status", "--json", str(run_dir), cwd=work, check=True).stdout
    assert_no_secret([p.stdout, p.stderr, st_, js], run_dir)
    assert "SEC_API_TOKEN: '***'" in (run_dir / "run.yaml").read_text()
    assert pwned(work) == []


def test_dry_runs_show_secrets_as_stars(workdir):
    (workdir / "hf").write_text("gpu1 slots=2\n")
    (workdir / "cfg").write_text("")
    for backend, extra in (
        ("local", []),
        ("ssh", ["--hostfile", "hf", "--ssh-config", "cfg"]),
        ("slurm", ["--time", "5"]),
    ):
        p = run_launch(
            backend, *extra, "--run-dir", "runs/d", *secret_flags(), "--dry-run", "--", "report.py"
        )
        assert p.returncode == 0, (backend, p.stderr)
        assert_no_secret([p.stdout, p.stderr], None)
        assert p.stdout.count("SEC_API_TOKEN=***") >= 1 and "SEC_DB_PASSWORD=***" in p.stdout, (
            backend,
            p.stdout,
        )
    assert not (workdir / "runs").exists()


def test_forwarded_and_profile_secrets_hidden(workdir):
    (workdir / "echo.py").write_text(ECHO)
    (workdir / "p.yaml").write_text(
        "env: {SEC_DB_PASSWORD: " + json.dumps(SECRETS["SEC_DB_PASSWORD"]) + "}\n"
    )
    env = {
        "SEC_API_TOKEN": SECRETS["SEC_API_TOKEN"],
        "SEC_SSH_KEY": SECRETS["SEC_SSH_KEY"],
        "SEC_AWS_SECRET_ACCESS": SECRETS["SEC_AWS_SECRET_ACCESS"],
    }
    p = run_launch(
        "local",
        "--profile",
        "p.yaml",
        "--forward-env",
        "SEC_*",
        "--run-dir",
        "runs/f",
        "--",
        "echo.py",
        env=env,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    check_echoes(workdir / "runs/f", "echo.py", [], None, 1)
    assert_no_secret([p.stdout, p.stderr], workdir / "runs/f")


# ------------------------------------------------------------------------------------------ umask


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000], ids=["022", "077", "000"])
def test_run_dir_follows_umask_never_world_writable(workdir, umask):
    (workdir / "echo.py").write_text(ECHO)
    p = subprocess.run(
        [
            "sh",
            "-c",
            f'umask {umask:03o} && exec "$@"',
            "sh",
            LAUNCH,
            "local",
            "--run-dir",
            "runs/u",
            "--",
            "echo.py",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    allowed = 0o777 & ~(umask | 0o002)
    paths = [workdir / "runs" / "u", *(workdir / "runs" / "u").rglob("*")]
    assert len(paths) > 8
    for f in paths:
        mode = stat.S_IMODE(f.lstat().st_mode)
        assert mode & ~allowed == 0, (str(f), oct(mode), oct(umask))
        assert not mode & stat.S_IWOTH, str(f)


# ------------------------------------------------------------------------------------------ YAML


def yaml_calls() -> list[tuple[str, int, str]]:
    """(file, line, call) for every yaml.<loader> call in launchers/, nccl_tuning/, workloads/,
    bench/, slurm/."""
    out = []
    for top in ("launchers", "nccl_tuning", "workloads", "bench", "slurm", "clusters"):
        for f in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "yaml"
                ):
                    out.append((str(f.relative_to(ROOT)), node.lineno, node.func.attr))
    return out


def test_yaml_only_safe_loaded():
    calls = yaml_calls()
    loads = [c for c in calls if "load" in c[2]]
    assert loads, "no yaml load call found: the scan is broken"
    assert [c for c in loads if c[2] not in ("safe_load", "safe_load_all")] == []
    assert [
        c
        for c in calls
        if c[2] in ("Loader", "FullLoader", "UnsafeLoader", "unsafe_load", "full_load")
    ] == []
    import yaml

    # the profile's loader (numbers kept as text, duplicate keys refused)
    from launchers.options import values

    assert issubclass(values.profile_loader(), yaml.SafeLoader)


def test_python_tags_refused_everywhere(workdir):
    bad = "!!python/object/apply:os.system ['touch PWNED']"
    (workdir / "preset.yaml").write_text(f"env: {{NCCL_DEBUG: {bad}}}\n")
    p = run_launch(
        "local", "--nccl-preset", "./preset.yaml", "--run-dir", "runs/y", "--", "report.py"
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    (workdir / "prof.yaml").write_text(f"name: {bad}\n")
    p = run_launch("local", "--profile", "prof.yaml", "--run-dir", "runs/y", "--", "report.py")
    assert p.returncode == 2 and "safe subset" in p.stderr, p.stderr
    assert pwned(workdir) == [] and not (workdir / "runs").exists()


# --------------------------------------------------------------------------------- SSH hosts (real)


def ssh_hosts_up() -> None:
    st_ = subprocess.run(
        [str(ROOT / "clusters" / "ssh-hosts.sh"), "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    require_cluster("the SSH test hosts sshhost1..4", st_.returncode == 0, "make ssh-up")


@pytest.mark.ssh
@FEW
@given(args=st.lists(WORD, max_size=4), value=VALUE, dirname=NAME_PART)
@example(args=INJECTIONS[:8], value="$(touch PWNED) 'q' \t tab", dirname="s s h $(touch PWNED)")
def test_ssh_real_run_verbatim_and_secrets_hidden(scratch, args, value, dirname):
    ssh_hosts_up()
    case = real_case(scratch, dirname)
    if case is None:
        return
    work, run_dir, prog = case
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,sshhost2",
        *SSH_OPTS,
        "--run-dir",
        str(run_dir),
        "--env",
        f"TEST_V={value}",
        *secret_flags(),
        "--",
        prog,
        *args,
        cwd=work,
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    check_echoes(run_dir, prog, args, value, 2)
    assert_no_secret([p.stdout, p.stderr], run_dir)
    assert pwned(work) == []


@pytest.mark.ssh
@pytest.mark.parametrize("kind", ["empty", "missing"])
def test_ssh_without_known_keys_refused(workdir, kind):
    ssh_hosts_up()
    kh = workdir / "kh"
    if kind == "empty":
        kh.write_text("")
    p = run_launch(
        "ssh",
        "--hosts",
        "sshhost1,sshhost2",
        "--ssh-config",
        SSH_OPTS[1],
        "--known-hosts",
        str(kh),
        "--run-dir",
        "runs/k",
        "--",
        "report.py",
        timeout=120,
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("launch: error: "), (
        p.stderr
    )
    want = (
        ("sshhost1", "host key unknown", "refusing")
        if kind == "empty"
        else (str(kh), "does not exist")
    )
    assert all(w in lines[0] for w in want), lines[0]
    assert not (workdir / "runs").exists() and (kind == "missing") == (not kh.exists())
    if kind == "empty":
        assert kh.read_text() == ""  # never learned a key


# ------------------------------------------------------------------------------------- Slurm (real)


@pytest.mark.slurm
@settings(
    max_examples=1,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(args=st.lists(WORD, max_size=3), value=VALUE)
@example(args=INJECTIONS[:8], value="$(touch PWNED) 'q' \t tab")
def test_slurm_real_run_verbatim_and_secrets_hidden(scratch, args, value):
    p = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", p.returncode == 0, "make slurm-up")
    case = real_case(scratch, "slurm $(touch PWNED) ü")
    assert case is not None
    work, run_dir, prog = case
    p = run_launch(
        "slurm",
        "--nodes",
        "2",
        "--time",
        "5",
        "--wait",
        "--run-dir",
        str(run_dir),
        "--env",
        f"TEST_V={value}",
        *secret_flags(),
        "--",
        prog,
        *args,
        cwd=work,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    check_echoes(run_dir, prog, args, value, 2)
    script = [
        f
        for f in (run_dir / "slurm").rglob("*")
        if f.is_file() and f.read_bytes().startswith(b"#!/bin/bash")
    ]
    assert script and "SEC_API_TOKEN=***" in script[0].read_text()  # the header names it, as ***
    assert_no_secret(
        [p.stdout, p.stderr, run_launch("status", str(run_dir), check=True).stdout], run_dir
    )
    assert read_json(run_dir / "status.json")["state"] == "COMPLETED"
    assert pwned(work) == []
