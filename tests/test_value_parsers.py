"""Issue 21 item 7: one parser for each kind of value, used alike by flags, LAUNCH_* defaults,
profiles and the Python API (launchers.options.values). Property tests: every value a profile
accepts equals the flag's parse of the same text, and every one refused is refused by both; the API
agrees with the flags on the text of its ints. Pure: build_spec chooses a run dir but creates
nothing; one test runs the real `launch` with a LAUNCH_* variable.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from conftest import LAUNCH, ROOT, run_launch
from launchers import request
from launchers.errors import LaunchError
from launchers.options import values
from launchers.options.profiles import load_profile
from launchers.runopts import BACKEND_OPTIONS, options_from_cli
from launchers.spec import build_spec

# texts a person might write for a number: digits, signs, YAML 1.1's 0x/0o/0b/_/sexagesimal,
# fractions and exponents, spaces, full-width and Arabic-Indic digits
TEXT = st.text(alphabet="0123456789+-_.:xobeE \uff10\uff12\u0663", min_size=1, max_size=8)
INT_KEYS = ("nodes", "gpus_per_node", "master_port", "max_restarts", "spares", "quarantine_after")
NUM_KEYS = ("stop_grace", "hang_timeout")
FAST = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def here(tmp_path, monkeypatch):
    (tmp_path / "t.py").write_text("print('t')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCH_RUNS_ROOT", str(tmp_path / "runs"))
    return tmp_path


def outcome(fn):
    """('ok', the value fn returns), or ('refused', message)."""
    try:
        return ("ok", fn())
    except LaunchError as e:
        return ("refused", str(e))


def same_text(text: str) -> bool:
    """The profile line `k: TEXT` holds exactly TEXT as its scalar (no comment, no sequence, no
    null)."""
    try:
        v = values.read_profile_yaml(f"k: {text}\n")["k"]
    except yaml.YAMLError:
        return False
    return isinstance(v, str) and v == text


def agree(here, key: str, text: str, backend: str = "local") -> None:
    (here / "p.yaml").write_text(f"{key}: {text}\n", encoding="utf-8")
    from_profile = outcome(lambda: getattr(build_spec(backend, {}, ["t.py"], "p.yaml"), key))
    from_flag = outcome(lambda: getattr(build_spec(backend, {key: text}, ["t.py"]), key))
    if from_flag[0] == "refused":
        assert from_profile[0] == "refused", (text, from_profile, from_flag)
        assert "p.yaml" in from_profile[1] and key in from_profile[1], from_profile
    else:
        assert from_profile == from_flag, (text, from_profile, from_flag)


def examples(*pairs):
    """hypothesis examples (key, text), each always tried."""

    def wrap(fn):
        for key, text in pairs:
            fn = example(key=key, text=text)(fn)
        return fn

    return wrap


@FAST
@given(key=st.sampled_from(INT_KEYS + NUM_KEYS), text=TEXT)
@examples(
    ("nodes", "010"),
    ("nodes", "0x10"),
    ("nodes", "1_0"),
    ("nodes", "+2"),
    ("master_port", "+29500"),
    ("nodes", "\uff12"),
    ("nodes", "1:20"),
    ("stop_grace", "1_0.5"),
    ("stop_grace", "2.5"),
    ("nodes", "2"),
    ("master_port", "29500"),
    ("max_restarts", "0"),
    ("stop_grace", "1E0"),
    ("hang_timeout", "1e3"),
)
def test_profile_value_equals_flag_parse(here, key, text):
    assume(same_text(text))
    agree(here, key, text)


@FAST
@given(key=st.sampled_from(("cpus_per_task", "max_requeues", "signal_seconds")), text=TEXT)
@examples(("cpus_per_task", "0x4"), ("cpus_per_task", "4"), ("max_requeues", "\uff13"))
def test_backend_int_option_profile_equals_flag(here, key, text):
    """A backend's own options: the profile's value is the flag's (Opt.from_cli), or both refuse."""
    assume(same_text(text))
    opt = next(o for o in BACKEND_OPTIONS["slurm"] if o.key == key)
    (here / "p.yaml").write_text(f"slurm:\n  {key}: {text}\n", encoding="utf-8")
    from_profile = outcome(lambda: load_profile("p.yaml")["slurm"][key])
    from_flag = outcome(lambda: options_from_cli("slurm", {key: text})[key])
    assert (from_profile[0] == "refused") == (from_flag[0] == "refused"), (
        text,
        from_profile,
        from_flag,
    )
    if from_flag[0] != "refused":
        assert from_profile == from_flag and type(from_flag[1]) is int
    else:
        assert f"{opt.key}" in from_profile[1] and "p.yaml" in from_profile[1]


@FAST
@given(n=st.integers(min_value=-3, max_value=70000), key=st.sampled_from(INT_KEYS))
def test_api_int_equals_flag_of_its_text(here, n, key):
    api = outcome(
        lambda: getattr(
            request.JobSpec(backend="local", program=("t.py",), **{key: n}).resolve(), key
        )
    )
    flag = outcome(lambda: getattr(build_spec("local", {key: str(n)}, ["t.py"]), key))
    assert (api[0] == "refused") == (flag[0] == "refused") and (
        api == flag or api[0] == "refused"
    ), (api, flag)
    assert api[0] == "refused" or type(api[1]) is int


@settings(max_examples=100, deadline=None)
@given(x=st.floats(min_value=1e-6, max_value=1e12, allow_nan=False))
def test_api_seconds_equal_flag_of_their_text(x):
    assert (
        values.parse_number("--stop-grace", x) == values.parse_number("--stop-grace", repr(x)) == x
    )


@pytest.mark.parametrize(
    "text",
    [
        "010",
        "0x10",
        "1_0",
        "+2",
        " 2",
        "2 ",
        "\uff12",
        "\u0663",
        "0b10",
        "1e3",
        "2.0",
        "-0",
        "",
        "00",
    ],
)
def test_int_refused_everywhere(text):
    with pytest.raises(LaunchError, match="plain decimal"):
        values.parse_int("--nodes", text, 1, 65536)


@pytest.mark.parametrize("text,value", [("0", 0), ("7", 7), ("-3", -3), ("65536", 65536)])
def test_int_accepted(text, value):
    assert values.parse_int("--x", text) == value


def test_bool_is_not_an_int():
    with pytest.raises(LaunchError):
        values.parse_int("--nodes", True)
    with pytest.raises(LaunchError):
        values.parse_number("--stop-grace", True)


@pytest.mark.parametrize(
    "text",
    [
        "nodes: 2\nnodes: 3\n",
        "env:\n  A: x\n  A: y\n",
        "slurm:\n  qos: a\n  qos: b\n",
        "nodes: 2\n'nodes': 2\n",
    ],
)
def test_duplicate_key_refused(here, text):
    (here / "p.yaml").write_text(text)
    with pytest.raises(LaunchError, match=r"p\.yaml.*given twice \(lines \d+ and \d+\)"):
        load_profile("p.yaml")


def test_merge_key_override_is_not_a_duplicate(here):
    (here / "p.yaml").write_text("env:\n  <<: {A: '1', B: '2'}\n  A: '3'\n")
    assert load_profile("p.yaml")["env"] == {"A": "3", "B": "2"}


def test_profile_numbers_keep_their_text(here):
    """`010` in env or program words is the text written, not YAML 1.1's 8; slurm time 04:00:00 not
    14400."""
    (here / "p.yaml").write_text(
        "env: {A: 010, B: 0x10, C: 1.50}\nprogram: [t.py, --n, 010]\n"
        "slurm: {time: 04:00:00, cpus_per_task: 4}\n"
    )
    prof = load_profile("p.yaml")
    assert prof["env"] == {"A": "010", "B": "0x10", "C": "1.50"} and prof["program"] == [
        "t.py",
        "--n",
        "010",
    ]
    assert prof["slurm"] == {"time": "04:00:00", "cpus_per_task": 4}
    # a plain str: run.yaml's safe_dump takes it
    assert all(type(v) is str for v in prof["env"].values())
    spec = build_spec("local", {}, [], "p.yaml")
    assert dict(spec.env)["A"] == "010" and spec.program_args == ("--n", "010")


@pytest.mark.parametrize("where", ["flag", "profile", "api"])
@pytest.mark.parametrize(
    "name,flag",
    [
        ("MASTER_PORT", "--master-port"),
        ("LAUNCH_RUN_ID", "--run-dir"),
        ("NNODES", "--nodes"),
        ("LAUNCH_STOP_GRACE", "--stop-grace"),
        ("RANK", "--nodes"),
    ],
)
def test_reserved_env_refused_naming_its_flag(here, where, name, flag):
    # the API's errors name its fields (issue 36): --master-port is JobSpec.master_port
    if where == "api":
        flag = "JobSpec." + flag[2:].replace("-", "_")
    with pytest.raises(LaunchError, match=f"{name} is set by launch.*{flag}"):
        if where == "flag":
            build_spec("local", {"env": (f"{name}=1",)}, ["t.py"])
        elif where == "profile":
            (here / "p.yaml").write_text(f"env: {{{name}: '1'}}\n")
            build_spec("local", {}, ["t.py"], "p.yaml")
        else:
            request.JobSpec(backend="local", program=("t.py",), env={name: "1"}).resolve()


def test_torchrun_sets_only_reserved_names(here):
    """Every variable the node command sets after the user's env is one --env refuses."""
    from launchers import torchrun

    spec = build_spec("local", {"hang_timeout": "5"}, ["t.py"])
    env = dict(
        torchrun.node_command(
            spec, node_rank=0, master_addr="127.0.0.1", master_port=29500, run_id="r", attempt=0
        ).env
    )
    own = set(env) - {"OMP_NUM_THREADS"} - {k for k in env if k.startswith("TORCH_")}
    assert own <= set(values.RESERVED_ENV), own - set(values.RESERVED_ENV)


@pytest.mark.parametrize("where", ["profile", "api"])
def test_nul_in_env_value_refused(here, where):
    with pytest.raises(LaunchError, match="NUL byte"):
        if where == "profile":
            (here / "p.yaml").write_text('env: {A: "x\\0y"}\n')
            build_spec("local", {}, ["t.py"], "p.yaml")
        else:
            request.JobSpec(backend="local", program=("t.py",), env={"A": "x\0y"}).resolve()


def test_module_found_on_the_jobs_pythonpath(here):
    (here / "lib").mkdir()
    (here / "lib" / "only_on_job_path_mod.py").write_text("print('m')\n")
    with pytest.raises(LaunchError, match="'only_on_job_path_mod' cannot be found"):
        build_spec("local", {}, ["-m", "only_on_job_path_mod"])
    spec = build_spec("local", {"env": ("PYTHONPATH=lib",)}, ["-m", "only_on_job_path_mod"])
    assert spec.program == ("-m", "only_on_job_path_mod")
    (here / "p.yaml").write_text("env: {PYTHONPATH: lib}\n")
    assert (
        build_spec("local", {}, ["-m", "only_on_job_path_mod"], "p.yaml").program[1]
        == "only_on_job_path_mod"
    )
    import sys

    assert str(here / "lib") not in sys.path  # the launcher's own path is left as it was


@pytest.mark.parametrize(
    "var,value,flag",
    [
        ("LAUNCH_NODES", "010", "--nodes"),
        ("LAUNCH_NODES", "+2", "--nodes"),
        ("LAUNCH_MAX_RESTARTS", "\uff11", "--max-restarts"),
    ],
)
def test_launch_env_default_refused_like_its_flag(here, var, value, flag):
    env = {**os.environ, "PYTHONPATH": str(ROOT), var: value}
    p = subprocess.run(
        [LAUNCH, "local", "--run-dir", "runs/x", "--", "t.py"],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert (
        f"{flag} (from ${var}) {value!r} is not accepted" in p.stderr
        and "plain decimal" in p.stderr
    ), p.stderr
    assert not (here / "runs").exists()


@pytest.fixture(scope="module")
def newer_run(tmp_path_factory):
    """A real (tiny) local run whose run.yaml says a newer launchers wrote it."""
    d = tmp_path_factory.mktemp("newer")
    (d / "t.py").write_text("print('hello from t')\n")
    p = run_launch("local", "--run-dir", "runs/new", "--", "t.py", cwd=d, timeout=180)
    assert p.returncode == 0, p.stderr
    path = d / "runs" / "new" / "run.yaml"
    data = yaml.safe_load(path.read_text())
    data["versions"]["launchers"] = "99.1.0"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return d / "runs" / "new"


def tree(base) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("verb", ["resume", "cancel", "wait"])
def test_newer_run_dir_refused_naming_the_version(newer_run, verb):
    before = tree(newer_run)
    p = run_launch(verb, str(newer_run), timeout=60)
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert (
        "written by launchers '99.1.0', newer than this launch" in p.stderr
        and "launch status" in p.stderr
    )
    assert len(p.stderr.strip().splitlines()) == 1 and tree(newer_run) == before


def test_newer_run_dir_read_only_by_status_and_logs(newer_run):
    before = tree(newer_run)
    st = run_launch("status", str(newer_run), timeout=60)
    assert st.returncode == 0, st.stderr
    assert (
        "written by: launchers 99.1.0, newer than this one" in st.stdout
        and "COMPLETED" in st.stdout
    )
    logs = run_launch("logs", str(newer_run), timeout=60)
    assert logs.returncode == 0 and "hello from t" in logs.stdout, logs.stderr
    assert tree(newer_run) == before


@pytest.mark.parametrize(
    "theirs,mine,newer",
    [
        ("0.2.0", "0.1.0", True),
        ("0.1.0", "0.1.0", False),
        ("0.1.1", "0.1.0", True),
        ("0.0.9", "0.1.0", False),
        ("1.0", "0.1.0", True),
        ("x", "0.1.0", False),
    ],
)
def test_version_order(theirs, mine, newer):
    from launchers.records import rundircheck

    got = rundircheck.newer_version({"versions": {"launchers": theirs}}, mine, "r", read_only=True)
    assert (got == theirs) if newer else got is None


def test_forward_env_never_forwards_a_reserved_variable(here):
    from launchers import jobenv

    with pytest.raises(
        LaunchError, match="--forward-env MASTER_PORT is set by launch.*--master-port"
    ):
        build_spec("local", {"forward_env": ("MASTER_PORT",)}, ["t.py"])
    spec = build_spec("local", {"forward_env": ("MASTER_*", "MY_*")}, ["t.py"])
    got = jobenv.forwarded(
        spec, {"MASTER_PORT": "1", "MASTER_WEIGHTS": "w", "MY_X": "x", "RANK": "3"}
    )
    assert got == {"MASTER_WEIGHTS": "w", "MY_X": "x"}
