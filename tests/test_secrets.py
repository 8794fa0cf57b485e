"""Issue 21 item 4: secrets.

- a resume never hands the program `***`: a value run.yaml keeps redacted must be in the caller's
  environment, else the resume is refused in one line naming it, before anything is written or
  started;
- --secret NAME / NAME=@FILE (profile `secrets:`, JobSpec.secrets): every rank gets it, run.yaml
  keeps only the name, the dry-run shows NAME=***, no command line holds it (SSH: an 0600 env file
  the host agent reads and deletes; Slurm: the sbatch process's environment);
- --env/--forward-env values that look secret by content (a URL with a password, a long random
  token) are treated as secrets and named once on stderr; --forward-env '*' is warned about loudly.
Pure logic here, and one real `launch local` 1x1 run (tests/data-free: a tiny program that only says
whether it got the value).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import LAUNCH, run_launch
from launchers.backends.slurm.render import header_for
from launchers.backends.slurm.submit import secret_env
from launchers.backends.ssh import SSHBackend
from launchers.credentials import secretenv, secretshape
from launchers.errors import LaunchError
from launchers.nodeagent import read_env_file
from launchers.records.rundir import redacted_spec, spec_from_record
from launchers.spec import RunSpec
from launchers.torchrun import node_command

URL = "postgres://app:hunter2-Zq@db.internal:5432/prod"
TOKEN = "hf_Q3v9XkP2mL7sR4tW8yB1nC6dF0gH5jK2aE"  # 37 characters, random
WANDB = "9f3b2c71d4e85a60b1f7c2d93e4a5b6c7d8e9f01"  # 40 hex digits


@pytest.mark.parametrize(
    "value,why",
    [
        (URL, "a URL with a password"),
        ("redis://:s3cr3t@cache:6379/0", "a URL with a password"),
        ("x --url https://u:p@h/x", "a URL with a password"),
        (TOKEN, "a service token"),
        (WANDB, "a long random token"),
        ("https://example.com/path", None),
        ("git@github.com:org/repo.git", None),
        ("/home/user/data:/opt/lib", None),
        ("my_very_long_experiment_name_for_testing_2", None),
        ("resnet50_imagenet_baseline_run_2024_v2", None),
        ("a" * 40, None),
        ("deadbeef" * 5, None),
        ("eth0", None),
        ("3e-4", None),
        ("short1234TOKEN", None),
    ],
    ids=lambda v: v if v is None or len(v) < 25 else v[:20],
)
def test_looks_secret_by_content(value, why):
    assert secretshape.looks_secret(value) == why


def test_redact_by_name_value_and_given_names():
    env = {
        "WANDB_API_KEY": "k",
        "MY_DB_PASS": "p",
        "DATABASE_URL": URL,
        "T": TOKEN,
        "PLAIN": "x",
        "GIVEN": "g",
    }
    assert secretenv.redact(env, ["GIVEN"]) == {**{k: "***" for k in env}, "PLAIN": "x"}
    assert secretenv.content_secrets(env) == {
        "DATABASE_URL": "a URL with a password",
        "T": "a service token",
    }


def test_parse_secrets_from_env_and_file_and_bad_words(tmp_path):
    f = tmp_path / "tok"
    f.write_text(TOKEN + "\n")
    refs = secretenv.parse_secrets(["A", f"B=@{f}"], {"A": "va"})
    assert refs == {"A": "env", "B": f"@{f}"}  # references: the values are read where used
    assert secretenv.resolve(refs.items(), {"A": "va"}) == {"A": "va", "B": TOKEN}
    # gone: the rank's wrapper refuses it
    assert secretenv.resolve(refs.items(), {}) == {"A": "***", "B": TOKEN}
    bad = [
        (["MISSING"], "is not set in your environment"),
        (["B=value"], "give NAME"),
        (["B=@"], "give NAME"),
        (["1X"], "give NAME"),
        ([f"B=@{tmp_path}/none"], "cannot be read"),
        ("A", "give a list"),
        ([f"B=@{tmp_path}"], "is not a regular file"),
    ]
    for items, says in bad:
        with pytest.raises(LaunchError) as e:
            secretenv.parse_secrets(items, {"A": "va"})
        assert says in str(e.value) and "\n" not in str(e.value), (items, str(e.value))


def spec(**kw) -> RunSpec:
    base = dict(
        backend="local",
        nodes=1,
        gpus_per_node=1,
        program=("/p.py",),
        program_args=(),
        run_dir="/r",
        name="n",
        env=(("DATABASE_URL", URL), ("WANDB_API_KEY", WANDB), ("LR", "3e-4")),
        secrets=(("MY_DB_PASS", "env"),),
    )
    return RunSpec(**{**base, **kw})


@pytest.fixture(autouse=True)
def _db_pass(monkeypatch):
    monkeypatch.setenv("MY_DB_PASS", "pw-71x")  # spec()'s --secret MY_DB_PASS, from the environment


def test_a_specs_dict_holds_no_secret_value(tmp_path):
    """RunSpec.to_dict() (what records, the dry-run and other processes get) holds references and
    ***, never a value: not a --secret's (from the environment or a file), a secret --env's nor a
    credential in the program's arguments; secretenv.handover gives them to another process, whose
    spec_from_record takes them back."""
    key = tmp_path / "key"
    key.write_text("file-secret-93q\n")
    s = spec(
        secrets=(("MY_DB_PASS", "env"), ("KEYFILE", f"@{key}")),
        program_args=("--token", "tok-55z", TOKEN),
    )
    d = s.to_dict()
    text = json.dumps(d)
    for value in ("pw-71x", "file-secret-93q", URL, WANDB, "tok-55z", TOKEN):
        assert value not in text, value
    assert d["secrets"] == {"MY_DB_PASS": "env", "KEYFILE": f"@{key}"} and d["env"]["LR"] == "3e-4"
    given = secretenv.handover(s, os.environ)
    assert {k: given[k] for k in ("MY_DB_PASS", "KEYFILE", "DATABASE_URL", "WANDB_API_KEY")} == {
        "MY_DB_PASS": "pw-71x",
        "KEYFILE": "file-secret-93q",
        "DATABASE_URL": URL,
        "WANDB_API_KEY": WANDB,
    }
    for k, v in given.items():
        os.environ[k] = v
    try:
        back = spec_from_record(d)
        nc = node_command(back, node_rank=0, master_addr="a", master_port=1, run_id="r", attempt=0)
    finally:
        for k in set(given) - {"MY_DB_PASS"}:
            del os.environ[k]
    assert dict(back.env) == dict(s.env) and back.program_args == s.program_args
    assert nc.env_dict["KEYFILE"] == "file-secret-93q" and nc.env_dict["MY_DB_PASS"] == "pw-71x"


def test_record_keeps_names_only_and_resume_needs_them(monkeypatch):
    rec = redacted_spec(spec())
    text = json.dumps(rec)
    assert rec["secrets"] == ["MY_DB_PASS"] and rec["env"]["LR"] == "3e-4"
    assert (
        URL not in text
        and WANDB not in text
        and "pw-71x" not in text
        and "pw-71x" not in repr(spec())
    )
    assert secretenv.missing(rec, {"WANDB_API_KEY": "w"}) == ["DATABASE_URL", "MY_DB_PASS"]
    with pytest.raises(LaunchError) as e:
        secretenv.refuse_missing(rec, {"DATABASE_URL": "u", "WANDB_API_KEY": "w"}, "/r")
    assert str(e.value) == (
        "run '/r' needs MY_DB_PASS from your environment (a secret: not kept in the run dir); "
        "export it and resume again"
    )
    secretenv.refuse_missing(
        rec, {"DATABASE_URL": "u", "WANDB_API_KEY": "w", "MY_DB_PASS": "p"}, "/r"
    )
    for k, v in (("DATABASE_URL", "u2"), ("WANDB_API_KEY", "w2"), ("MY_DB_PASS", "p2")):
        monkeypatch.setenv(k, v)
    back = spec_from_record(rec)
    assert dict(back.env) == {"DATABASE_URL": "u2", "WANDB_API_KEY": "w2", "LR": "3e-4"}
    assert dict(back.secrets) == {"MY_DB_PASS": "env"}
    assert (
        node_command(
            back, node_rank=0, master_addr="a", master_port=1, run_id="r", attempt=0
        ).env_dict["MY_DB_PASS"]
        == "p2"
    )


def test_node_command_secrets_never_on_a_command_line(tmp_path):
    nc = node_command(spec(), node_rank=0, master_addr="a", master_port=1, run_id="rid", attempt=0)
    assert nc.env_dict["MY_DB_PASS"] == "pw-71x" and nc.secret == ("MY_DB_PASS",)
    # + their names
    assert set(nc.secret_env()) == {
        "MY_DB_PASS",
        "DATABASE_URL",
        "WANDB_API_KEY",
        "LAUNCH_PRIVATE_ENV",
    }
    shown = nc.shell()
    assert (
        "MY_DB_PASS=***" in shown
        and "pw-71x" not in shown
        and URL not in shown
        and WANDB not in shown
    )
    (tmp_path / "cfg").write_text("")
    ssh = SSHBackend().plan(
        spec(
            backend="ssh", options=(("hosts", ["h1", "h2"]), ("ssh_config", str(tmp_path / "cfg")))
        ),
        "rid",
        attempt=3,
    )
    for k in (0, 1):
        line, dry = ssh.remote_line(k, redact=False), ssh.remote_line(k)
        assert f"--env-file /tmp/.launch-rid-a3-node{k}.env" in line and "LR=3e-4" in line
        assert not any(
            v in t for v in ("pw-71x", URL, WANDB, "MY_DB_PASS", "DATABASE_URL") for t in (line,)
        ), line
        assert "MY_DB_PASS=***" in dry and "pw-71x" not in dry and URL not in dry
    sl = secret_env(spec(backend="slurm"))
    assert sl == {"MY_DB_PASS": "pw-71x", "DATABASE_URL": URL, "WANDB_API_KEY": WANDB}
    head = header_for(
        ["--env", f"DATABASE_URL={URL}", "--secret", "MY_DB_PASS", "--env", "LR=3e-4"], "v"
    )
    assert URL not in head and "DATABASE_URL=***" in head and "LR=3e-4" in head


def test_host_agent_env_file_read_once_private_only(tmp_path):
    f = tmp_path / "e.env"
    f.write_text(json.dumps({"MY_DB_PASS": "pw"}))
    f.chmod(0o600)
    assert read_env_file(str(f)) == {"MY_DB_PASS": "pw"} and not f.exists()
    f.write_text("{}")
    f.chmod(0o644)
    with pytest.raises(SystemExit, match="not a private"):
        read_env_file(str(f))
    assert not f.exists()  # deleted also when refused
    os.symlink(tmp_path / "x", f)
    with pytest.raises(OSError):  # never through a symlink
        read_env_file(str(f))
    assert stat.S_ISLNK(os.lstat(f).st_mode)


PROG = """import os
print("SECRET", "same" if os.environ.get("MY_DB_PASS") == os.environ["EXPECT"] else "differs",
      "same" if os.environ.get("DATABASE_URL") == os.environ["EXPECT_URL"] else "differs", flush=True)
"""  # noqa: E501


def test_local_run_secret_hidden_given_and_resume_refused(tmp_path):
    """One real 1x1 run: the program gets --secret's and a URL's values, no file of the run dir and
    no output holds them (dry-run neither), and a resume without them in the environment is refused
    in one line."""
    (tmp_path / "prog.py").write_text(PROG)
    (tmp_path / "pw").write_text("pw-file-3c9\n")
    env = {"MY_DB_PASS": "pw-env-8d1", "EXPECT": "pw-file-3c9", "EXPECT_URL": URL}
    args = [
        "--run-dir",
        "runs/s",
        "--secret",
        "MY_DB_PASS=@pw",
        "--env",
        f"DATABASE_URL={URL}",
        "--",
        "prog.py",
    ]
    dry = run_launch("local", *args[:-2], "--dry-run", *args[-2:], cwd=tmp_path, env=env)
    assert (
        dry.returncode == 0 and "MY_DB_PASS=***" in dry.stdout and "DATABASE_URL=***" in dry.stdout
    ), dry.stderr
    assert "treated as secrets by their value: DATABASE_URL (a URL with a password)" in dry.stderr
    p = run_launch("local", *args, cwd=tmp_path, env=env, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = tmp_path / "runs/s"
    assert "SECRET same same" in (run_dir / "logs/node0/rank0.log").read_text()
    for v in ("pw-file-3c9", URL, "hunter2"):
        assert all(v not in t for t in (dry.stdout, dry.stderr, p.stdout, p.stderr))
        assert [f for f in run_dir.rglob("*") if f.is_file() and v.encode() in f.read_bytes()] == []
    before = (run_dir / "run.yaml").read_text()
    gone = {k: v for k, v in os.environ.items() if k not in ("MY_DB_PASS", "DATABASE_URL")}
    r = subprocess.run(
        [LAUNCH, "resume", "runs/s"],
        cwd=tmp_path,
        env=gone,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "needs DATABASE_URL, MY_DB_PASS from your environment" in r.stderr
    assert (run_dir / "run.yaml").read_text() == before and not (
        run_dir / "logs/node0/agent.log"
    ).read_text().count("attempt 1")


def test_api_submit_hands_secrets_to_its_launcher_not_in_the_spec(tmp_path, monkeypatch):
    """The API's submit starts a detached launcher with the spec's dict, which holds no secret
    value: a --secret read from a file and a secret --env value reach the program through that
    launcher's environment (secretenv.handover), and no file of the run dir holds them."""
    import launchers

    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text(PROG)
    (tmp_path / "pw").write_text("pw-file-7k2\n")
    monkeypatch.setenv("EXPECT", "pw-file-7k2")  # what the program compares with, as the caller's
    monkeypatch.setenv("EXPECT_URL", URL)
    monkeypatch.delenv("MY_DB_PASS")
    run = launchers.submit(
        launchers.JobSpec(
            backend="local",
            program=("prog.py",),
            run_dir="runs/api",
            secrets=("MY_DB_PASS=@pw",),
            env={"DATABASE_URL": URL},
        )
    )
    assert run.wait(timeout=180).state == "COMPLETED"
    run_dir = tmp_path / "runs/api"
    assert "SECRET same same" in (run_dir / "logs/node0/rank0.log").read_text()
    for v in ("pw-file-7k2", URL):
        assert [f for f in run_dir.rglob("*") if f.is_file() and v.encode() in f.read_bytes()] == []


def test_profile_key_and_api_field_give_secrets(tmp_path, monkeypatch):
    from launchers.request import JobSpec as ApiSpec
    from launchers.spec import build_spec

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf-value")
    (tmp_path / "p.py").write_text("")
    (tmp_path / "k").write_text("from-file")
    (tmp_path / "prof.yaml").write_text("secrets: [HF_TOKEN, 'DB=@k']\n")
    s = build_spec("local", {"secrets": ("X=@k",)}, ["p.py"], str(tmp_path / "prof.yaml"))
    assert dict(s.secrets) == {
        "HF_TOKEN": "env",
        "DB": f"@{tmp_path / 'k'}",
        "X": f"@{tmp_path / 'k'}",
    }
    assert secretenv.resolve(s.secrets, os.environ) == {
        "HF_TOKEN": "hf-value",
        "DB": "from-file",
        "X": "from-file",
    }
    api = ApiSpec(backend="local", program=("p.py",), secrets=("HF_TOKEN",)).resolve()
    assert dict(api.secrets) == {"HF_TOKEN": "env"}
    with pytest.raises(TypeError, match="JobSpec.secrets"):
        ApiSpec(backend="local", program=("p.py",), secrets="HF_TOKEN")
    with pytest.raises(LaunchError, match="set by launch"):
        build_spec("local", {"secrets": ("RANK=@k",)}, ["p.py"])
    with pytest.raises(LaunchError, match="also given with --env"):
        build_spec("local", {"secrets": ("HF_TOKEN",), "env": ("HF_TOKEN=x",)}, ["p.py"])


# ---------------------------------------------------------------------------------- issue 35 item 4
# Credentials found where people put them: by their shape in any --env value and in program
# arguments, kept out of every record and dry-run (the program gets its arguments byte for byte), a
# known secret value out of exception lines, status, the final line and notify payloads; --secret
# @FILE bounded; --cluster carries secrets over stdin.

BEARER = "Bearer eyJhbGciOiJIUzI1NiJ9.c3ViIjoiMTIzIn0.Zq3-9xT"
AWS_ID, AWS_SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SHAPES = {
    BEARER: "an Authorization header",
    "Basic dXNlcjpwYXNzd29yZA==": "an Authorization header",
    AWS_ID: "an AWS access key",
    AWS_SECRET: "an AWS secret key",
    "hf_abcdefghijklmnopqrstuvwxyzAB": "a service token",
    "sk-proj-abc123def456ghi789": "a service token",
    "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789": "a service token",
    "github_pat_11ABCDEFG0aBcDeFgHiJkL_mnopqrstuv": "a service token",
    "xoxb-1234567890-abcdefghijk": "a service token",
    "xoxp-1234567890-abcdefghijk": "a service token",
    "s3://key:s3c%2Fret@bucket": "a URL with a password",
    # not credentials
    "sk-learn": None,
    "Bearer": None,
    "basic mode": None,
    "AKIA-not-a-key": None,
    "task-abcdefghijklmnopqrstuv": None,
    "--max-tokens": None,
    "/data/imagenet/train": None,
}


@pytest.mark.parametrize("value", list(SHAPES), ids=lambda v: v[:18])
def test_credentials_by_shape(value):
    assert secretshape.looks_secret(value) == SHAPES[value]
    inside = f"--opt={value} and more"  # found inside a longer text too, the rest kept
    assert (secretshape.REDACTED in secretshape.redact_text(inside)) == (
        SHAPES[value] is not None
    ), inside
    assert secretshape.redact_text(inside).endswith(" and more")


def test_program_args_redacted_in_every_record_given_as_is(tmp_path):
    args = (
        "--hf-token=hf_abcdefghijklmnopqrstuvwxyzAB",
        "--token",
        "sk-proj-abc123def456ghi789",
        "--lr",
        "3e-4",
        "--api-key",
        "plainvalue",
        "--password=hunter2",
        "--max-tokens",
        "512",
        "--url",
        "https://u:pw-9@h/x",
    )
    shown = secretshape.redact_args(args)
    assert shown == [
        "--hf-token=***",
        "--token",
        "***",
        "--lr",
        "3e-4",
        "--api-key",
        "***",
        "--password=***",
        "--max-tokens",
        "512",
        "--url",
        "https://u:***@h/x",
    ]
    assert secretshape.arg_secrets(args) == [0, 2, 6, 7, 11]
    s = spec(
        program_args=args, env=(("API_AUTH", BEARER), ("S3_CREDS", AWS_SECRET), ("LR", "3e-4"))
    )
    rec = redacted_spec(s)
    assert rec["program_args"] == shown and rec["env"] == {
        "API_AUTH": "***",
        "S3_CREDS": "***",
        "LR": "3e-4",
    }
    nc = node_command(s, node_rank=0, master_addr="a", master_port=1, run_id="rid", attempt=0)
    assert nc.argv[-len(args) :] == args  # the program gets them as given
    dry = nc.shell()
    for v in ("hf_abc", "sk-proj", "plainvalue", "hunter2", "pw-9", BEARER, AWS_SECRET):
        assert v not in dry and v not in json.dumps(rec), v
    assert "--max-tokens 512" in dry and "LR=3e-4" in dry
    (tmp_path / "cfg").write_text("")
    ssh = SSHBackend().plan(
        spec(
            backend="ssh",
            program_args=args,
            options=(("hosts", ["h1"]), ("ssh_config", str(tmp_path / "cfg"))),
        ),
        "rid",
        attempt=0,
    )
    assert (
        "sk-proj" not in ssh.render()
        and "hunter2" not in ssh.render()
        and "'--hf-token=***'" in ssh.render()
    )
    # what sshd runs
    assert ssh.remote_line(0, redact=False).endswith(" ".join(shlex.quote(a) for a in args))
    # the sbatch header
    head = header_for(["slurm", "--env", f"API_AUTH={BEARER}", "--", "p.py", *args], "v")
    assert (
        "hf_abc" not in head
        and "sk-proj" not in head
        and "Bearer ***" not in head
        and "API_AUTH=***" in head
    )
    from launchers.records.manifest import command_line

    line = command_line(["launch", "local", "--env", f"S3_CREDS={AWS_SECRET}", "--", "p.py", *args])
    assert AWS_SECRET not in line and "hf_abc" not in line and "S3_CREDS=***" in line


def test_redacted_args_come_back_on_a_slurm_node_a_resume_without_them_refused(monkeypatch):
    args = ("--token", "sk-proj-abc123def456ghi789", "--epochs", "2")
    s = spec(backend="slurm", program_args=args)
    env = secret_env(s)  # the sbatch process's environment, never the script
    assert json.loads(env[secretenv.ARGS_ENV]) == list(args)
    rec = redacted_spec(s)
    monkeypatch.delenv(secretenv.ARGS_ENV, raising=False)
    assert spec_from_record(rec).program_args == ("--token", "***", "--epochs", "2")
    with pytest.raises(LaunchError) as e:
        secretenv.refuse_missing(
            rec, {"DATABASE_URL": "u", "WANDB_API_KEY": "w", "MY_DB_PASS": "p"}, "/r"
        )
    assert "program arguments held a credential" in str(e.value) and "--secret NAME" in str(e.value)
    monkeypatch.setenv(secretenv.ARGS_ENV, env[secretenv.ARGS_ENV])
    assert spec_from_record(rec).program_args == args
    # not this run's
    monkeypatch.setenv(secretenv.ARGS_ENV, json.dumps(["--token", "other", "--epochs", "3"]))
    assert spec_from_record(rec).program_args == ("--token", "***", "--epochs", "2")


def test_known_values_redacted_from_exception_status_and_payload(tmp_path, monkeypatch):
    from launchers.node import rankcause
    from launchers.records import notify
    from launchers.records.rundir import RunDir

    log = tmp_path / "rank0.log"
    log.write_text(
        "Traceback (most recent call last):\n  File x\nRuntimeError: login as pw-file-3c9 to "
        f"https://u:p4ss@h/x with {AWS_ID} failed\n"
    )
    monkeypatch.setenv("MY_DB_PASS", "pw-file-3c9")
    monkeypatch.setenv(secretenv.NAMES_ENV, "MY_DB_PASS")
    line = rankcause.exception_line(str(log))
    assert line == "RuntimeError: login as *** to https://u:***@h/x with *** failed", line
    rd = RunDir.create(spec(run_dir=str(tmp_path / "r")), "r-1", {})
    st = rd.update_status(
        state="FAILED",
        reason="auth pw-file-3c9 refused",
        first_failure={"rank": 0, "exception": f"KeyError: {BEARER}"},
    )
    text = (tmp_path / "r" / "status.json").read_text()
    assert (
        "pw-file-3c9" not in text and "eyJhbGci" not in text and st["reason"] == "auth *** refused"
    )
    body = notify.redact(
        notify.payload("FAILED", st, {"spec": {}}, str(tmp_path)), notify.known_secrets(rd.held)
    )
    assert "pw-file-3c9" not in json.dumps(body) and "eyJhbGci" not in json.dumps(body)


def test_secret_file_bounded_regular_only(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 200_000)
    os.mkfifo(tmp_path / "fifo")
    for src, says in (
        ("/dev/zero", "is not a regular file"),
        (str(big), "over the limit of at most 64 KiB"),
        (str(tmp_path / "fifo"), "is not a regular file"),
    ):
        with pytest.raises(LaunchError) as e:  # never blocks, never reads without a limit
            secretenv.parse_secrets([f"S={'@' + src}"], {})
        assert says in str(e.value) and "\n" not in str(e.value) and "64 KiB" in str(e.value), str(
            e.value
        )
    ok = tmp_path / "ok"
    ok.write_bytes(b"y" * secretenv.SECRET_FILE_MAX)
    assert secretenv.resolve(secretenv.parse_secrets([f"S=@{ok}"], {}).items(), {}) == {
        "S": "y" * secretenv.SECRET_FILE_MAX
    }
    p = run_launch(
        "local", "--secret", f"S=@{big}", "--run-dir", "runs/x", "--", "p.py", cwd=tmp_path
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "64 KiB" in p.stderr, p.stderr


ARGS_PROG = """import os, sys
want = open(os.environ["WANT_FILE"]).read().split("\\0")
print("ARGS", "same" if sys.argv[1:] == want else "differs", flush=True)
raise RuntimeError("cannot log in with " + os.environ["MY_DB_PASS"] + " and " + os.environ["API_AUTH"])
"""  # noqa: E501


def test_local_run_credentials_in_env_and_args_nowhere_recorded(tmp_path):
    """One real 1x1 run: credentials in --env values of any name and in the program's arguments
    reach the program as given and are in no file of the run dir, no output, no notify payload; the
    user is told once; a secret's value in the program's exception is *** in status.json, the final
    line and the payload."""
    args = [
        "--hf-token=hf_abcdefghijklmnopqrstuvwxyzAB",
        "--token",
        "sk-proj-abc123def456ghi789",
        "--n",
        "2",
    ]
    (tmp_path / "prog.py").write_text(ARGS_PROG)
    (tmp_path / "want").write_text("\0".join(args))
    (tmp_path / "pw").write_text("pw-file-3c9\n")
    hook = f"printenv LAUNCH_EVENT_JSON > {tmp_path}/payload-$LAUNCH_EVENT.json"
    opts = [
        "--run-dir",
        "runs/c",
        "--secret",
        "MY_DB_PASS=@pw",
        "--env",
        f"API_AUTH={BEARER}",
        "--env",
        f"S3_CREDS={AWS_SECRET}",
        "--env",
        f"WANT_FILE={tmp_path}/want",
        "--notify",
        hook,
    ]
    dry = run_launch("local", *opts, "--dry-run", "--", "prog.py", *args, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    told = [ln for ln in dry.stderr.splitlines() if "--secret NAME" in ln]
    assert (
        len(told) == 1
        and "API_AUTH (an Authorization header)" in told[0]
        and "program argument 1" in told[0]
    )
    p = run_launch("local", *opts, "--", "prog.py", *args, cwd=tmp_path, timeout=180)
    assert (
        p.returncode != 0 and "ARGS same" in (tmp_path / "runs/c/logs/node0/rank0.log").read_text()
    )
    assert "RuntimeError: cannot log in with ***" in p.stderr, p.stderr[-2000:]  # the final line
    files = [
        f
        for f in (tmp_path / "runs/c").rglob("*")
        if f.is_file() and not re.fullmatch(r"rank\d+\.log", f.name)
    ]
    files += list(tmp_path.glob("payload-*.json"))
    assert (tmp_path / "payload-FAILED.json").exists() and (
        tmp_path / "runs/c/manifest.json"
    ) in files
    # not the rank's own
    said = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith(("launch", "#"))]
    for v in ("pw-file-3c9", "eyJhbGci", AWS_SECRET, "hf_abcdef", "sk-proj"):
        assert v not in dry.stdout + dry.stderr + "\n".join(said), v
        assert [f for f in files if v.encode() in f.read_bytes()] == [], v


DUMP = """#!/bin/sh
printf '%s\\n' "$API_AUTH" "$MY_DB_PASS" > "$0.env"
printf '%s\\n' "$@" > "$0.args"
for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f"; echo; done > "$0.ps" 2>/dev/null
"""


def test_cluster_submit_carries_secrets_over_stdin_only(tmp_path, monkeypatch):
    """--cluster: an --env value that is secret and a --secret's value reach the login node's launch
    through its environment (read from the connection's stdin), never on a command line there (its
    ps) nor in the dry-run."""
    import base64

    from launchers.ssh import clusters, viacluster
    from launchers.ssh.clusterssh import remote_line

    monkeypatch.setenv("MY_DB_PASS", "pw-env-8d1")
    args = [
        "--nodes",
        "1",
        "--env",
        f"API_AUTH={BEARER}",
        "--env=LR=3e-4",
        "--secret",
        "MY_DB_PASS",
        "--",
        "t.py",
        "--env",
        "X=1",
    ]
    out, secret = viacluster.carried(args)
    assert out == [
        "--nodes",
        "1",
        "--env=LR=3e-4",
        "--secret",
        "API_AUTH",
        "--secret",
        "MY_DB_PASS",
        "--",
        "t.py",
        "--env",
        "X=1",
    ]
    assert secret == {"API_AUTH": BEARER, "MY_DB_PASS": "pw-env-8d1"}
    dump = tmp_path / "dump"
    dump.write_text(DUMP)
    dump.chmod(0o755)
    for f in ("id", "kh", "cfg"):
        (tmp_path / f).touch()
    (tmp_path / "c.yaml").write_text(
        f"c:\n  login: 127.0.0.1\n  port: 9\n  known_hosts: kh\n  runs_root: {tmp_path}\n"
        f"  launch: {dump}\n"
    )
    c = clusters.get("c", str(tmp_path / "c.yaml"))
    line = remote_line(c, ["slurm", *out], cwd=str(tmp_path), receive=tuple(secret))
    assert BEARER not in line and "pw-env-8d1" not in line
    # what sshd runs there, stdin the connection's
    p = subprocess.Popen(["sh", "-c", line], stdin=subprocess.PIPE)
    p.stdin.write(viacluster.secret_feed(secret))
    p.stdin.flush()
    assert p.wait(30) == 0
    p.stdin.close()
    assert (tmp_path / "dump.env").read_text() == f"{BEARER}\npw-env-8d1\n"
    assert (tmp_path / "dump.args").read_text().split("\n")[:6] == [
        "slurm",
        "--nodes",
        "1",
        "--env=LR=3e-4",
        "--secret",
        "API_AUTH",
    ]
    ps = (tmp_path / "dump.ps").read_text()
    assert "dump" in ps and "eyJhbGci" not in ps and "pw-env-8d1" not in ps
    assert base64.b64encode(BEARER.encode()).decode() not in ps
    env = {
        "PATH": os.environ["PATH"],
        "LAUNCH_CLUSTERS_FILE": str(tmp_path / "c.yaml"),
        "MY_DB_PASS": "pw-env-8d1",
    }
    (tmp_path / "t.py").write_text("")
    dry = run_launch(
        "slurm",
        "--cluster",
        "c",
        "--env",
        f"API_AUTH={BEARER}",
        "--secret",
        "MY_DB_PASS",
        "--dry-run",
        "--",
        "t.py",
        cwd=tmp_path,
        env=env,
    )
    assert dry.returncode == 0 and "--secret API_AUTH" in dry.stdout, dry.stderr
    assert "eyJhbGci" not in dry.stdout + dry.stderr and "pw-env-8d1" not in dry.stdout + dry.stderr
    # a profile's secrets too
    (tmp_path / "p.yaml").write_text("slurm: {cluster: c}\nsecrets: [MY_DB_PASS]\n")
    dry = run_launch(
        "slurm", "--profile", "p.yaml", "--dry-run", "--", "t.py", cwd=tmp_path, env=env
    )
    assert (
        dry.returncode == 0
        and "MY_DB_PASS=$(printf" in dry.stdout
        and "pw-env-8d1" not in dry.stdout
    ), dry.stderr


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_notify_command_that_hangs_is_ended_with_all_it_started(tmp_path, monkeypatch):
    import time

    from launchers.records import notify

    monkeypatch.setattr(notify, "COMMAND_TIMEOUT_S", 1.0)
    pids, body = tmp_path / "pids", {"event": "FAILED", "run_dir": str(tmp_path)}
    t0 = time.monotonic()
    with pytest.raises(OSError, match="did not end within 1 s"):
        notify.run_command(f"sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; sleep 300", body)
    assert time.monotonic() - t0 < 10
    # one left in the background: ended too
    notify.run_command(f"sleep 300 & echo $! >> {pids}; exit 0", body)
    found = [int(p) for p in pids.read_text().split()]
    end = time.monotonic() + 5  # SIGKILL is sent; its delivery takes a moment
    while not all(gone(p) for p in found) and time.monotonic() < end:
        time.sleep(0.05)
    assert len(found) == 3 and all(gone(p) for p in found), [(p, gone(p)) for p in found]


def test_local_run_notify_that_hangs_leaves_no_process(tmp_path):
    """A real 1x1 run whose --notify command never ends: the run ends (within the notify's exit
    wait) and no process of the command is left after it."""
    import uuid

    mark = f"notify-hang-{uuid.uuid4().hex[:8]}"
    (tmp_path / "ok.py").write_text("print('ok')\n")
    p = run_launch(
        "local",
        "--run-dir",
        "runs/n",
        "--notify",
        f"sleep 301; : {mark}",
        "--",
        "ok.py",
        cwd=tmp_path,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    left = []
    for f in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if mark.encode() in f.read_bytes() and not gone(int(f.parent.name)):
                left.append(f.parent.name)
        except OSError:
            pass
    assert left == []


def test_profile_dates_stay_text_and_a_huge_one_is_not_read(tmp_path):
    import time

    from launchers.options.profiles import load_profile

    (tmp_path / "p.yaml").write_text(
        "name: 2001-12-14\nenv: {WHEN: '2001-12-14t21:59:43.10-05:00', AT: 2002-12-14 "
        "21:59:43.10 -5}\n"
    )
    d = load_profile(str(tmp_path / "p.yaml"))
    assert d["name"] == "2001-12-14" and dict(d["env"])["AT"] == "2002-12-14 21:59:43.10 -5"
    with open(tmp_path / "big.yaml", "wb") as f:
        f.truncate(60 * 1024 * 1024)  # 60 MB (sparse): refused without reading it
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="over the size limit .at most 1 MiB."):
        load_profile(str(tmp_path / "big.yaml"))
    assert time.monotonic() - t0 < 2


WANT_PROG = """import os, sys
want = open(os.environ["WANT_FILE"]).read().split("\\0")
print("ARGS", "same" if sys.argv[1:] == want else "differs", flush=True)
"""


@pytest.mark.slurm
def test_slurm_run_program_args_given_as_is_records_redacted(tmp_path):
    """A real 1x1 Slurm run: the nodes read the spec the launcher recorded (its arguments ***) and
    get the real arguments back from the job's environment; no file of the run dir but the rank's
    log holds them."""
    from conftest import ROOT, require_cluster

    up = subprocess.run(
        [str(ROOT / "slurm" / "dev-cluster.sh"), "status"], capture_output=True, text=True
    )
    require_cluster("the dev Slurm cluster", up.returncode == 0, "make slurm-up")
    args = ["--token", "sk-proj-abc123def456ghi789", "--url=https://u:pw-9zq1@h/x", "--n", "2"]
    (tmp_path / "src").mkdir()  # the tree the snapshot freezes; the expected words outside it
    (tmp_path / "src" / "prog.py").write_text(WANT_PROG)
    (tmp_path / "want").write_text("\0".join(args))
    p = run_launch(
        "slurm",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--time",
        "5",
        "--wait",
        "--run-dir",
        str(tmp_path / "runs/s"),
        "--env",
        f"WANT_FILE={tmp_path}/want",
        "--",
        "prog.py",
        *args,
        cwd=tmp_path / "src",
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    run_dir = tmp_path / "runs/s"
    assert ["ARGS same"] == [
        ln
        for ln in (run_dir / "logs/node0/rank0.log").read_text().splitlines()
        if ln.startswith("ARGS")
    ]
    assert "- '***'" in (run_dir / "run.yaml").read_text()
    files = [
        f for f in run_dir.rglob("*") if f.is_file() and not re.fullmatch(r"rank\d+\.log", f.name)
    ]
    for v in ("sk-proj", "pw-9zq1"):
        assert (
            v not in p.stdout + p.stderr
            and [f for f in files if v.encode() in f.read_bytes()] == []
        ), v
