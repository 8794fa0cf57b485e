"""`launch doctor` without clusters: bad input (one line, exit 2, nothing run), the local target for
real (a pass, and a held master port named with its holder), and the verdict's rules on fake probe
records."""

from __future__ import annotations

import json
import os
import socket

import pytest

from conftest import run_launch
from launchers.doctor.checks import NOFILE_FAIL, NOFILE_WARN, SKEW_MAX, Context
from launchers.doctor.report import verdict
from launchers.doctor.targets import NodeRun


def one_line_error(p, *words):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: error: "), p.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert p.stdout == ""


@pytest.mark.parametrize(
    "args,words",
    [
        ((), ("needs a target", "--local", "--hosts", "--hostfile", "--slurm")),
        (("--local", "--collective"), ("--collective needs at least 2 nodes", "local")),
        (
            ("--hosts", "10.0.0.7", "--collective"),
            ("--collective needs at least 2 nodes", "ssh target has 1"),
        ),
        (("--local", "--slurm"), ("one target", "local and slurm")),
        (("--local", "--timeout", "0"), ("--timeout 0.0",)),
        (("--local", "--timeout", "soon"), ("--timeout 'soon'", "a number")),
        (("--local", "--master-port", "80"), ("--master-port '80'", "1024-65535")),
        (("--local", "--nodes", "3"), ("--nodes 3", "--local")),
        (("--hosts", "a,b", "--nodes", "3"), ("--nodes 3 is more than the 2 hosts",)),
    ],
)
def test_bad_input_is_one_line_and_runs_nothing(tmp_path, args, words):
    p = run_launch("doctor", *args, "--runs-root", str(tmp_path / "root"), cwd=tmp_path, timeout=60)
    one_line_error(p, *words)
    assert not (tmp_path / "root").exists()


def doctor_json(*args, cwd, timeout=240, env=None):
    p = run_launch("doctor", *args, "--json", cwd=cwd, timeout=timeout, env=env)
    assert p.returncode in (0, 1), (p.returncode, p.stdout, p.stderr)
    return p.returncode, json.loads(p.stdout)


def test_local_passes_and_leaves_nothing_behind(tmp_path):
    root = tmp_path / "runs" / "deeper"
    facts = tmp_path / "nodes"
    code, rep = doctor_json(
        "--local", "--runs-root", str(root), cwd=tmp_path, env={"LAUNCH_NODE_FACTS_DIR": str(facts)}
    )
    assert code == 0 and rep["ok"] and rep["failures"] == [], rep["failures"]
    (node,) = rep["nodes"]
    # this node's facts, for nccl check --on
    (kept,) = [json.loads(f.read_text()) for f in facts.iterdir()]
    assert kept["node"] == node["host"] == socket.gethostname()
    assert [i["loopback"] for i in kept["interfaces"] if i["name"] == "lo"] == [True], kept
    ch, ref = node["checks"], rep["reference"]
    assert {c["status"] for c in ch.values()} <= {"ok", "skip"}, ch
    for key in ("python", "torch", "launchers"):
        assert ch[key]["value"] == ref[key]
    assert ch["nccl"]["value"] == ("n/a (no CUDA)" if not ref["cuda"] else ref["nccl"])
    assert ch["gpus"]["value"] == (f"{ref['gpus']} GPUs" if ref["gpus"] else "0 GPUs (CPU only)")
    assert ch["shared"]["value"] == "written" and ch["port"]["value"].endswith("free")
    assert not (tmp_path / "runs").exists()  # the probe removed its file and the dirs it made


def test_local_held_port_and_required_gpus_fail_with_what_to_do(tmp_path):
    """A port this test holds: the failure names this process as the holder. --require-gpus on a
    machine without GPUs fails (on a GPU machine it must pass the same check). A bad NCCL_ALGO in
    --env fails."""
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_launch(
            "doctor",
            "--local",
            "--master-port",
            str(port),
            "--require-gpus",
            "--runs-root",
            str(tmp_path),
            "--env",
            "NCCL_ALGO=nonsense",
            cwd=tmp_path,
            timeout=240,
        )
    assert p.returncode == 1, (p.stdout, p.stderr)
    fails = [ln for ln in p.stdout.splitlines() if ln.startswith("FAIL ")]
    port_line = next(ln for ln in fails if " port: " in ln)
    assert (
        f"master port {port} is in use" in port_line and f"held by pid {os.getpid()} " in port_line
    )
    assert "-> stop that process or give a free --master-port" in port_line
    gpu_lines = [ln for ln in fails if " gpus: " in ln]
    assert len(gpu_lines) == (0 if "GPUs (CPU only)" not in p.stdout else 1), p.stdout
    assert all("--require-gpus wants 1" in ln and "->" in ln for ln in gpu_lines)
    (nccl_line,) = [ln for ln in fails if " nccl_env: " in ln]  # validate_env's verdict on --env
    assert "NCCL_ALGO=nonsense" in nccl_line and "Unrecognized element token" in nccl_line
    assert p.stdout.rstrip().splitlines()[-1].startswith("doctor: ")


# --------------------------------------------------------- the verdict on fake records (pure logic)
REF = {
    "python": "3.11.7",
    "executable": "/py",
    "torch": "2.13.0+cpu",
    "launchers": "0.1.0",
    "cuda": False,
    "nccl": None,
    "gpus": 0,
}


def record(node, **kw):
    r = dict(
        REF,
        host=f"h{node}",
        node=node,
        disk={"path": "/r", "free": 50 * 2**30, "total": 1},
        shm={"path": "/dev/shm", "free": 2**33, "total": 1},
        nofile=[65536, 65536],
        env={},
    )
    if node == 0:
        r.update(probe_file="/r/.launch-doctor-x", peers={})
    else:
        r.update(reach=None, shared=True)
    return dict(r, **kw)


def judge(records, skews=None, **ctx):
    runs = [
        NodeRun(k, f"h{k}", result=r, skew=(skews or {}).get(k, 0.0)) for k, r in enumerate(records)
    ]
    c = dict(
        ref=REF,
        first=records[0],
        master="h0",
        port=29500,
        gpus_per_node=None,
        require_gpus=False,
        shared_required=True,
        env={},
        collective=False,
        medians={},
    )
    c.update(ctx)
    return verdict(runs, Context(**c))


def status(rows, node, check):
    return rows[node]["checks"][check].status


def test_gpu_rule_cpu_nodes_pass_unless_gpus_are_required():
    assert status(judge([record(0), record(1)], gpus_per_node=8), 1, "gpus") == "ok"
    assert (
        status(judge([record(0), record(1)], gpus_per_node=8, require_gpus=True), 1, "gpus")
        == "fail"
    )
    rows = judge([record(0, gpus=8), record(1, gpus=4)], gpus_per_node=8)
    assert status(rows, 0, "gpus") == "ok" and status(rows, 1, "gpus") == "fail"
    assert "sees 4 GPUs, --gpus-per-node is 8" in rows[1]["checks"]["gpus"].why
    rows = judge([record(0, gpus=8), record(1, gpus=0)])
    assert status(rows, 1, "gpus") == "fail" and "other nodes do" in rows[1]["checks"]["gpus"].why


def test_limits_skew_and_versions_are_named():
    rows = judge(
        [
            record(0, nofile=[NOFILE_FAIL - 1, 4096]),
            record(1, nofile=[NOFILE_WARN - 1, 8192]),
            record(2, torch="2.12.0"),
        ],
        skews={2: SKEW_MAX + 1},
    )
    assert status(rows, 0, "nofile") == "fail" and status(rows, 1, "nofile") == "warn"
    assert status(rows, 2, "clock") == "fail" and status(rows, 1, "clock") == "ok"
    assert "torch 2.12.0 here, 2.13.0+cpu on the submitting side" in rows[2]["checks"]["torch"].why


def test_not_shared_root_fails_unless_storage_is_not_shared():
    recs = [record(0), record(1, shared=False)]
    rows = judge(recs)
    assert (
        status(rows, 1, "shared") == "fail"
        and "written on node 0 (h0)" in rows[1]["checks"]["shared"].why
    )
    assert status(judge(recs, shared_required=False), 1, "shared") == "skip"


def test_a_slow_node_and_a_slow_link_are_named():
    def col(ar, a2a, links=None):
        return {"all_reduce": ar, "all_to_all": a2a, "links": links or {}}

    recs = [
        record(0, collective=col(1.0, 1.0, {"1": 1.0, "2": 1.0, "3": 0.1})),
        record(1, collective=col(1.0, 1.0)),
        record(2, collective=col(0.2, 1.0)),
        record(3, collective=col(1.0, 1.0)),
    ]
    rows = judge(recs, collective=True)
    assert [status(rows, k, "collective") for k in range(4)] == ["ok", "ok", "warn", "warn"]
    assert "all_reduce busbw 0.200 GB/s" in rows[2]["checks"]["collective"].why
    assert "link node 0 (h0) -> node 3 (h3)" in rows[3]["checks"]["collective"].why
