"""Presets (YAML data), combining, resolve(), and the `nccl` click group (pure logic)."""

import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from nccl_tuning import apply as A
from nccl_tuning import presets as P
from nccl_tuning.cli import nccl
from nccl_tuning.errors import NcclTuningError
from nccl_tuning.validate import has_errors, validate

SHIPPED = ["debug", "default", "dense", "ib", "moe", "roce", "tcp"]


def run(*args):
    return CliRunner().invoke(nccl, list(args))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_shipped_presets_listed():
    assert P.known_names() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_preset_passes_check(name):
    res = run("check", name)
    assert res.exit_code == 0, res.output
    assert "\nerror " not in "\n" + res.output
    env, findings = A.resolve(name, run_dir="/runs/r1")
    assert not has_errors(findings)
    assert all("{run_dir}" not in v for v in env.values())


def test_every_shipped_var_has_a_reason_and_moe_forces_no_algo_proto():
    for p in P.list_presets():
        assert all(reason for _, reason in p.vars.values())
    moe = P.load("moe")
    assert "NCCL_ALGO" not in moe.vars and "NCCL_PROTO" not in moe.vars
    # revisited against the source (issue 14): only the p2p chunk has a reason for 2.21-2.30
    assert list(moe.vars) == ["NCCL_P2P_NET_CHUNKSIZE"] and moe.min_nccl == (2, 21, 0)
    reason = moe.vars["NCCL_P2P_NET_CHUNKSIZE"][1]
    assert all(t in reason for t in ("2.21.5", "2.23.4", "2.24.3", "2.27.7", "2.30.7"))
    assert "NCCL_NCHANNELS_PER_NET_PEER" not in moe.vars  # would switch off the automatic count
    assert P.load("default").vars == {}


def test_seed_preset_refused_with_exactly_three_findings(tmp_path):
    path = write(
        tmp_path,
        "folklore.yaml",
        """\
        name: folklore
        description: the MoE preset from the seed article
        affects: [all_to_all]
        vars:
          NCCL_ALGO: {value: "ring", reason: "article"}
          NCCL_PROTO: {value: "shm", reason: "article"}
          NCCL_SHM_DISABLE: {value: "0", reason: "article"}
        """,
    )
    res = run("check", str(path))
    assert res.exit_code == 1
    lines = [
        ln for ln in res.output.splitlines() if ln.split(" ")[0] in ("error", "warning", "note")
    ]
    assert [ln.split(":")[0] for ln in lines] == [
        "warning NCCL_ALGO=ring",
        "error NCCL_PROTO=shm",
        "note NCCL_SHM_DISABLE=0",
    ]
    with pytest.raises(NcclTuningError, match="NCCL_PROTO=shm"):
        A.resolve(str(path))
    res = run(
        "check",
        "--env",
        "NCCL_ALGO=ring",
        "--env",
        "NCCL_PROTO=shm",
        "--env",
        "NCCL_SHM_DISABLE=0",
        "--nccl-version",
        "2.23",
    )
    assert res.exit_code == 1 and res.output.count("\nerror ") + res.output.startswith("error") == 1
    assert "ignored: 'shm' is not a protocol NCCL 2.23.4 knows" in res.output
    assert "nccl-2.23.4/src/enqueue.cc:1848" in res.output  # the first collective fails


def test_combine_and_conflicts(tmp_path):
    presets, env, origin = P.combine("moe,roce")
    assert [p.name for p in presets] == ["moe", "roce"]
    assert origin["NCCL_IB_GID_INDEX"] == "roce" and env["NCCL_P2P_NET_CHUNKSIZE"] == "524288"
    P.combine("moe,dense")  # disjoint variables: no conflict
    with pytest.raises(NcclTuningError, match="NCCL_NET is 'IB' in ib but 'Socket' in tcp"):
        P.combine("ib,tcp")
    mine = write(
        tmp_path,
        "mine.yaml",
        """\
        name: mine
        description: bigger chunk
        affects: [all_to_all]
        vars:
          NCCL_P2P_NET_CHUNKSIZE: {value: "262144", reason: "measured"}
        """,
    )
    with pytest.raises(
        NcclTuningError, match=r"conflict: NCCL_P2P_NET_CHUNKSIZE .* in moe .* in mine"
    ):
        P.combine(f"moe,{mine}")
    res = run("check", "ib,tcp")
    assert res.exit_code == 2 and "conflict" in res.output


def test_unknown_preset_lists_known():
    with pytest.raises(NcclTuningError) as e:
        P.load("moee")
    assert "known: debug, default, dense, ib, moe, roce, tcp" in str(e.value)
    res = run("show", "moee")
    assert res.exit_code == 2 and "unknown NCCL preset 'moee'" in res.output


@pytest.mark.parametrize(
    "body,match",
    [
        ("name: x\ndescription: d\naffects: []\nvars: {}\ncolour: red\n", "unknown key"),
        ("name: x\ndescription: d\naffects: []\n", "missing key"),
        (
            "name: x\ndescription: d\naffects: []\nvars:\n  NCCL_BUFFSIZE: {value: 4194304, "
            "reason: r}\n",
            "must be a quoted string",
        ),
        (
            "name: x\ndescription: d\naffects: []\nvars:\n  NCCL_BUFFSIZE: {value: '1', reason: "
            "3}\n",
            "must be a quoted string",
        ),
        (
            "name: x\ndescription: d\naffects: []\nvars:\n  NCCL_BUFFSIZE: {value: '1', why: r}\n",
            "unknown key",
        ),
        (
            "name: x\ndescription: d\naffects: []\nvars:\n  NCCL_BUFFSIZE: {value: '1'}\n",
            "missing 'reason'",
        ),
        ("name: x\ndescription: d\naffects: [alltoall]\nvars: {}\n", "accepted: all, all_reduce"),
        (
            "name: x\ndescription: d\naffects: []\nvars:\n  NCCL_DEBUG_FILE: {value: '{home}/x', "
            "reason: r}\n",
            "placeholder {home}",
        ),
        ("name: x\ndescription: d\naffects: []\nmin_nccl: 2.14\nvars: {}\n", "quoted string"),
        ("name: x\ndescription: d\naffects: []\nvars: [a, b]\n", "'vars' must be a mapping"),
        ("- just\n- a list\n", "must be a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_preset_files(tmp_path, body, match):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(NcclTuningError, match=match) as e:
        P.load(str(path))
    assert "\n" not in str(e.value)
    res = run("check", str(path))
    assert res.exit_code == 2 and res.output.startswith("launch: error: preset file")


def test_extra_dir_and_name_mismatch(tmp_path):
    write(
        tmp_path,
        "site.yaml",
        """\
        name: site
        description: site fabric
        affects: [all]
        vars:
          NCCL_SOCKET_IFNAME: {value: "ib0", reason: "our IPoIB interface"}
        """,
    )
    write(tmp_path, "wrong.yaml", "name: other\ndescription: d\naffects: []\nvars: {}\n")
    assert "site" in P.known_names([tmp_path])
    env, _ = A.resolve("moe,site", extra_dirs=[tmp_path])
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    with pytest.raises(NcclTuningError, match="'name' is 'other'"):
        P.load("wrong", [tmp_path])
    assert run("check", "site", "--preset-dir", str(tmp_path)).exit_code == 0


def test_resolve_run_dir_versions_and_min_nccl():
    env, findings = A.resolve("debug", run_dir="/runs/r7")
    assert env["NCCL_DEBUG_FILE"] == "/runs/r7/nccl/%h.%p.log"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith("/runs/r7/nccl/")
    assert A.required_dirs(env) == ["/runs/r7/nccl"]
    with pytest.raises(NcclTuningError, match="needs NCCL >= 2.21"):
        A.resolve("moe", nccl_version="2.18")
    with pytest.raises(NcclTuningError, match="not a version"):
        A.resolve("moe", nccl_version="new")
    env, _ = A.resolve("")
    assert env == {}


def test_show_formats():
    out = run("show", "moe").output
    assert "export NCCL_P2P_NET_CHUNKSIZE=524288" in out and "# [moe] " in out
    conf = run("show", "debug", "--format", "conf", "--run-dir", "/r").output
    assert "NCCL_DEBUG=INFO\n" in conf and "NCCL_DEBUG_FILE=/r/nccl/%h.%p.log" in conf
    assert "# TORCH_NCCL_DUMP_ON_TIMEOUT is not NCCL's" in conf
    sb = run("show", "moe,roce", "--format", "sbatch").output
    assert sb.startswith("#!/bin/bash") and "export NCCL_IB_TC=106" in sb
    import yaml

    data = yaml.safe_load(run("show", "moe", "--format", "yaml").output)
    assert data["vars"]["NCCL_P2P_NET_CHUNKSIZE"]["value"] == "524288"
    assert run("show", "moe", "--format", "toml").exit_code == 2


def test_check_env_file_and_environment(tmp_path):
    f = write(
        tmp_path, "nccl.conf", "# site conf\nNCCL_PROTO=LL,Simple\nexport NCCL_BUFFSIZE='4M'\n"
    )
    res = run("check", "--env-file", str(f))
    assert res.exit_code == 1 and "error NCCL_BUFFSIZE=4M" in res.output
    bad = write(tmp_path, "bad.env", "NCCL_PROTO\n")
    assert run("check", "--env-file", str(bad)).exit_code == 2
    assert run("check", "--env", "NCCL_PROTO").exit_code == 2
    res = CliRunner().invoke(nccl, ["check"], env={"NCCL_PROTOCOL": "LL", "NCCL_DEBUG": "WARN"})
    assert res.exit_code == 1 and "did you mean NCCL_PROTO?" in res.output
    res = run("check", "moe", "--env", "NCCL_BUFFSIZE=4M")  # explicit env overrides the preset
    assert "error NCCL_BUFFSIZE=4M" in res.output


def test_module_entry_point_and_no_torch():
    out = subprocess.run(
        [sys.executable, "-m", "nccl_tuning.cli", "check", "--env", "NCCL_PROTO=shm"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and out.stdout.startswith("error NCCL_PROTO=shm: ")
    code = (
        "import sys, nccl_tuning.cli, nccl_tuning.apply, nccl_tuning.validate; "
        "assert 'torch' not in sys.modules"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_validate_matches_resolve_for_combined():
    env, findings = A.resolve("moe,roce")
    assert [str(f) for f in findings] == [str(f) for f in validate(env)]


@pytest.mark.parametrize("tag", ["2.21.5", "2.23.4", "2.24.3", "2.27.7", "2.30.7"])
def test_moe_reason_holds_per_source_tag(tag):
    """The moe chunk is not clamped (init.cc chunk_clamp: chunk x NCCL_STEPS <= default BUFFSIZE)
    and nothing in moe switches off an automatic NCCL choice, in every tag 2.21-2.30."""
    fs = validate(P.load("moe").env(), tag, production=False)
    assert not has_errors(fs)
    assert not any("clamps" in f.message or "automatic" in f.message for f in fs), fs
    fs = validate({**P.load("moe").env(), "NCCL_NCHANNELS_PER_NET_PEER": "4"}, tag)
    assert any("automatic per-peer channel count" in f.message for f in fs)
