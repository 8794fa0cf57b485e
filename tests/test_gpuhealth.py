"""GPU/NIC tool parsers (launchers.gpuhealth) on real outputs captured on real machines and
published by others (tests/data/gpu/, each file's source in tests/data/gpu/sources.md; none invented
or edited), and `launch doctor --local --gpu` reading them on this machine through stand-in tools
first on PATH."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import run_launch
from launchers.gpuhealth import ib, nvlink, smi, topo, verdict, xid

DATA = Path(__file__).parent / "data" / "gpu"


def text(rel: str) -> str:
    return (DATA / rel).read_text()


def lines(found, level=None) -> list[str]:
    return [f.line() for f in found if level is None or f.level == level]


def test_every_fixture_has_its_source_named():
    sources = text("sources.md")
    files = {
        str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "sources.md"
    }
    named = {
        f
        for f in files
        if f"`{f}`" in sources
        or (f.startswith("sysfs_ib/gpud-h100/") and "`sysfs_ib/gpud-h100/" in sources)
    }
    assert files and named == files, sorted(files - named)


@pytest.mark.parametrize(
    "name,gpu,mig,persistence,ecc",
    [
        ("netdata-tesla-p100.xml", "Tesla P100-PCIE-16GB", "N/A", "Disabled", 0),
        # volatile N/A (MIG)
        ("netdata-a100-sxm4-mig.xml", "NVIDIA A100-SXM4-40GB", "Enabled", "Disabled", None),
        ("netdata-rtx-4090-driver-535.xml", "NVIDIA GeForce RTX 4090", "N/A", "Enabled", None),
    ],
)
def test_smi_xml_reads_real_outputs(name, gpu, mig, persistence, ecc):
    facts = smi.parse(text(f"nvidia_smi/{name}"))
    (g,) = facts["gpus"]
    assert facts["attached"] == 1 and facts["driver"]
    assert (g["name"], g["mig"], g["persistence"], g["uncorrectable_ecc"]) == (
        gpu,
        mig,
        persistence,
        ecc,
    )
    assert g["retired_pages"] == 0 and g["slowdowns"] == [] and g["bus_id"].startswith("0000")


def test_smi_findings_name_node_device_and_fact():
    a100 = smi.findings(smi.parse(text("nvidia_smi/netdata-a100-sxm4-mig.xml")), "node 0 [gpu7]", 8)
    assert lines(a100, "fail") == [
        "node 0 [gpu7] node: nvidia-smi shows 1 GPU(s), --gpus-per-node is 8"
    ]
    assert lines(a100, "warn") == [
        "node 0 [gpu7] GPU 0 (00000000:00:04.0, NVIDIA A100-SXM4-40GB): MIG mode Enabled "
        "(a job sees MIG instances, not the whole GPU)"
    ]
    assert smi.findings(smi.parse(text("nvidia_smi/netdata-rtx-4090-driver-535.xml")), "n", 1) == []
    with pytest.raises(ValueError, match="not nvidia-smi -q -x output"):
        smi.parse(text("topo/nccl-issue-1617-h100-nv6.txt"))


def test_topo_reads_nvlink_and_pcie_matrices():
    h100 = topo.parse(text("topo/nccl-issue-1617-h100-nv6.txt"))
    assert topo.gpus(h100) == ["GPU0", "GPU1", "GPU2", "GPU3"] and topo.nics(h100) == [
        "NIC0",
        "NIC1",
        "NIC2",
        "NIC3",
    ]
    assert {h100["paths"]["GPU0"][g] for g in ("GPU1", "GPU2", "GPU3")} == {"NV6"}
    assert [topo.nearest_nic(h100, g) for g in topo.gpus(h100)] == [
        (f"NIC{i}", "PIX") for i in range(4)
    ]
    assert h100["affinity"]["GPU2"] == {"cpus": "7,15,23,31", "numa": "7"}
    assert topo.findings(h100, "n") == []
    pcie = topo.parse(text("topo/go-gpuallocator-issue-17-rtx4090-pcie.txt"))
    assert len(topo.gpus(pcie)) == 8 and pcie["paths"]["GPU6"]["NIC1"] == "PHB"
    assert pcie["affinity"]["GPU4"] == {"cpus": "56-111,168-223", "numa": "1"}
    found = topo.findings(pcie, "n")  # no NVLink anywhere: nothing fails; 7 GPUs far from any NIC
    assert lines(found, "fail") == [] and len(lines(found, "info")) == 7
    assert "n GPU6:" not in " ".join(lines(found))


def test_nvlink_inactive_link_is_one_line():
    v100 = nvlink.parse(text("nvlink/azhpc-diagnostics-issue-73-v100-inactive.txt"))
    assert [(g["index"], g["links"][3], g["links"][0]) for g in v100] == [(3, None, "25.781 GB/s")]
    assert lines(nvlink.findings(v100, "node 1 [dgx2]")) == [
        "node 1 [dgx2] GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive of 6"
    ]
    a100 = nvlink.parse(text("nvlink/gpud-nvidia-smi.nvlink.status.a100.txt"))
    assert len(a100) == 8 and all(
        len(g["links"]) == 12 and None not in g["links"].values() for g in a100
    )
    assert nvlink.findings(a100, "n") == []


def test_ibstat_down_ports():
    ib_down = ib.findings(
        ib.parse_ibstat(text("ibstat/network-operator-issue-249-ib-down.txt")), "node 2 [h]"
    )
    assert [(f.level, f.line()) for f in ib_down] == [
        ("fail", "node 2 [h] mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand)")
    ]
    some = ib.parse_ibstat(text("ibstat/gpud-ibstat.47.0.h100.some.down.0.txt"))
    assert len(some) == 12 and sum(p["state"] == "Active" for p in some) == 9
    found = ib.findings(some, "n")  # the Down ones are RoCE ports switched off (Disabled): warn
    assert [(f.level, f.device) for f in found] == [("warn", f"mlx5_{k} port 1") for k in (2, 7, 8)]
    assert (
        ib.findings(ib.parse_ibstat(text("ibstat/gpud-ibstat.47.0.h100.all.active.0.txt")), "n")
        == []
    )


def test_sysfs_infiniband_tree():
    root = DATA / "sysfs_ib" / "gpud-h100"
    files = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    ports = ib.parse_sysfs(files)
    assert len(ports) == 9 and all(
        p["state"] == "Active" and p["phys_state"] == "LinkUp" for p in ports
    )
    assert {p["rate"] for p in ports if p["link_layer"] == "InfiniBand"} == {"400"}
    assert ib.findings(ports, "n") == []


def test_xid_lines_from_dmesg():
    events = xid.parse(text("xid/gpud-dmesg-with-xid-119.log"))
    assert events and {(e["pci"], e["xid"]) for e in events} == {("PCI:0000:9b:00", 119)}
    (f,) = xid.findings(events, "node 0 [h100-7]")
    assert f.level == "fail" and f.line().startswith(
        f"node 0 [h100-7] GPU PCI:0000:9b:00: Xid 119 GSP RPC timeout ({len(events)} times): "
    )
    assert xid.parse(text("ibstat/gpud-ibstat.47.0.h100.all.active.0.txt")) == []


STAND_IN = """#!/bin/sh
# stand-in for {tool}: prints a real output captured on another machine (tests/data/gpu/sources.md)
{body}
"""


def stand_ins(
    bin_dir: Path, smi_xml=None, topo_m=None, nvlink_s=None, ibstat=None, dmesg=None
) -> None:
    """Executables first on PATH that cat real fixtures; an argument left None leaves that tool
    out."""
    bin_dir.mkdir()
    cases = [
        (args, DATA / rel)
        for args, rel in (("-q -x", smi_xml), ("topo -m", topo_m), ("nvlink -s", nvlink_s))
        if rel
    ]
    if cases:
        body = (
            'case "$*" in\n'
            + "".join(f'  "{a}") cat "{p}" ;;\n' for a, p in cases)
            + "  *) exit 9 ;;\nesac"
        )
        write_tool(bin_dir / "nvidia-smi", STAND_IN.format(tool="nvidia-smi", body=body))
    for name, rel in (("ibstat", ibstat), ("dmesg", dmesg)):
        if rel:
            write_tool(bin_dir / name, STAND_IN.format(tool=name, body=f'cat "{DATA / rel}"'))


def write_tool(path: Path, script: str) -> None:
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def doctor_gpu(tmp_path, bin_dir: Path | None, *extra):
    path = f"{bin_dir}:{os.environ['PATH']}" if bin_dir else os.environ["PATH"]
    p = run_launch(
        "doctor",
        "--local",
        "--gpu",
        "--json",
        "--run-root",
        str(tmp_path / "runs"),
        *extra,
        cwd=tmp_path,
        timeout=240,
        env={"PATH": path},
    )
    assert p.returncode in (0, 1), (p.returncode, p.stdout, p.stderr)
    return p.returncode, json.loads(p.stdout)


def test_doctor_gpu_names_each_fault_of_the_node(tmp_path):
    """The probe runs the tools it finds on PATH; here they are stand-ins (shell scripts) that print
    real outputs from other machines -- the content is real, only the way it reaches the probe is a
    stand-in. A Down InfiniBand port, an inactive NVLink and an Xid 119 each give their own FAIL
    line."""
    stand_ins(
        tmp_path / "bin",
        smi_xml="nvidia_smi/netdata-tesla-p100.xml",
        nvlink_s="nvlink/azhpc-diagnostics-issue-73-v100-inactive.txt",
        ibstat="ibstat/network-operator-issue-249-ib-down.txt",
        dmesg="xid/gpud-dmesg-with-xid-119.log",
    )
    code, rep = doctor_gpu(tmp_path, tmp_path / "bin")
    assert code == 1 and not rep["ok"]
    (node,) = rep["nodes"]
    assert (
        node["checks"]["gpu_health"]["status"] == "fail"
        and node["checks"]["gpu_health"]["value"] == "3 fault(s)!"
    )
    who = f"node 0 [{node['host']}]"
    gpu_fails = [ln for ln in rep["failures"] if ln.startswith(f"FAIL {who} ")]
    assert gpu_fails[:2] == [
        f"FAIL {who} GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive of 6",
        f"FAIL {who} mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand)",
    ]
    assert (
        gpu_fails[2].startswith(f"FAIL {who} GPU PCI:0000:9b:00: Xid 119 GSP RPC timeout")
        and len(gpu_fails) == 3
    )
    levels = {(f["level"], f["device"]) for f in node["findings"]}
    # persistence Disabled
    assert ("info", "GPU 0 (00000000:00:04.0, Tesla P100-PCIE-16GB)") in levels
    # no topo stand-in given
    assert any("nvidia-smi topo -m exited 9" in w for w in rep["warnings"])


def test_doctor_gpu_healthy_tools_pass_and_text_report(tmp_path):
    stand_ins(
        tmp_path / "bin",
        smi_xml="nvidia_smi/netdata-rtx-4090-driver-535.xml",
        topo_m="topo/nccl-issue-1617-h100-nv6.txt",
        nvlink_s="nvlink/gpud-nvidia-smi.nvlink.status.a100.txt",
        ibstat="ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    code, rep = doctor_gpu(tmp_path, tmp_path / "bin")
    (node,) = rep["nodes"]
    assert node["checks"]["gpu_health"] == {"status": "ok", "value": "ok", "why": "", "fix": ""}, (
        node["findings"]
    )
    assert not [
        ln for ln in rep["failures"] + rep["warnings"] if "gpu_health" in ln or " GPU" in ln
    ]


@pytest.mark.slow
def test_doctor_gpu_names_an_nvidia_smi_that_never_answers(tmp_path):
    """A stand-in nvidia-smi that never answers (what a hung GPU does to it): the node fails, named,
    within the tool timeout (min(20 s, --timeout)); the other nvidia-smi calls are not made."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_tool(
        bin_dir / "nvidia-smi", "#!/bin/sh\n# stand-in for a hung nvidia-smi\nexec sleep 60\n"
    )
    code, rep = doctor_gpu(tmp_path, bin_dir, "--timeout", "3")
    (node,) = rep["nodes"]
    who = f"node 0 [{node['host']}]"
    assert (
        code == 1
        and f"FAIL {who} node: nvidia-smi -q -x gave no answer in 3 s (a GPU or the driver hangs)"
        in rep["failures"]
    ), rep["failures"]
    assert [f for f in node["findings"] if "topo" in f["fact"] or "nvlink" in f["fact"]] == []


def test_doctor_gpu_without_nvidia_smi_is_a_skip(tmp_path):
    """This machine's own tools, with nvidia-smi kept off PATH: a skip, never a failure of its
    own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("python3", "sh", "cat", "dmesg", "ibstat"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bin_dir / tool)
    p = run_launch(
        "doctor",
        "--local",
        "--gpu",
        "--json",
        "--run-root",
        str(tmp_path / "runs"),
        cwd=tmp_path,
        timeout=240,
        env={"PATH": str(bin_dir)},
    )
    assert p.returncode in (0, 1), (p.stdout, p.stderr)
    (node,) = json.loads(p.stdout)["nodes"]
    assert node["checks"]["gpu_health"]["value"] == "no nvidia-smi"
    assert {
        "level": "info",
        "node": f"node 0 [{node['host']}]",
        "device": "node",
        "fact": "no nvidia-smi: GPU checks skipped",
    } in node["findings"]


def test_preflight_gpu_stops_the_launch_naming_the_node(tmp_path):
    """`launch local --preflight gpu`: the node's tools (stand-ins printing real outputs of a faulty
    node: a Down InfiniBand port, an Xid 119) stop the launch before anything starts -- one line for
    the bad node, exit 2, no run dir."""
    stand_ins(
        tmp_path / "bin",
        smi_xml="nvidia_smi/netdata-rtx-4090-driver-535.xml",
        ibstat="ibstat/network-operator-issue-249-ib-down.txt",
        dmesg="xid/gpud-dmesg-with-xid-119.log",
    )
    (tmp_path / "hello.py").write_text("print('HELLO')\n")
    p = run_launch(
        "local",
        "--preflight",
        "gpu",
        "--run-dir",
        "runs/r",
        "--",
        "hello.py",
        cwd=tmp_path,
        timeout=240,
        env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"},
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = [
        ln for ln in p.stderr.splitlines() if not ln.startswith("launch: preflight gpu: warning: ")
    ]
    assert err[0] == "launch: error: --preflight gpu: 1 bad node(s) of 1, nothing started", p.stderr
    (bad,) = err[1:]
    assert (
        bad.startswith("node 0 [")
        and "]: mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand); "
        "GPU PCI:0000:9b:00: Xid 119 GSP RPC timeout"
        in bad
    ), bad
    assert not (tmp_path / "runs").exists()


def test_preflight_gpu_passes_a_healthy_node_and_refuses_unknown_checks(tmp_path):
    stand_ins(
        tmp_path / "bin",
        smi_xml="nvidia_smi/netdata-rtx-4090-driver-535.xml",
        ibstat="ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    (tmp_path / "hello.py").write_text("print('HELLO')\n")
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    p = run_launch(
        "local",
        "--preflight",
        "gpu",
        "--run-dir",
        "runs/r",
        "--",
        "hello.py",
        cwd=tmp_path,
        timeout=240,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert "HELLO" in (tmp_path / "runs/r/logs/node0/rank0.log").read_text()
    p = run_launch(
        "local",
        "--preflight",
        "gpus",
        "--run-dir",
        "runs/x",
        "--",
        "hello.py",
        cwd=tmp_path,
        timeout=60,
        env=env,
    )
    assert (
        p.returncode == 2
        and p.stderr.strip()
        == "launch: error: --preflight 'gpus' is not accepted; choose one of: gpu"
    ), p.stderr
    assert not (tmp_path / "runs/x").exists()


def test_preflight_gpu_with_a_spare_swaps_the_bad_node_0(tmp_path):
    """`launch local --nodes 2 --spares 1 --preflight gpu`: every slot of the pool is checked before
    anything starts (the stand-in ibstat, picked by LAUNCH_NODE_SLOT, shows a Down port on slot 0
    only); the policy quarantines slot 0 (kind gpu, its line as the why) and the run starts on slots
    1 and 2 -- slot 1 is node 0 -- world 2, COMPLETED; no rank ran on slot 0; `launch status` shows
    the ledger, no person involved."""
    from gpu_standins import check_slot0_swapped, per_host_tools

    per_host_tools(
        tmp_path / "bin",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {"0": "ibstat/network-operator-issue-249-ib-down.txt"},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
        key="${LAUNCH_NODE_SLOT:-}",
    )
    (tmp_path / "hello.py").write_text(
        "import os\nprint('HELLO rank %s of %s on slot %s' % tuple(os.environ[k] for k "
        "in ('RANK', 'WORLD_SIZE', 'LAUNCH_NODE_SLOT')))\n"
    )
    p = run_launch(
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--spares",
        "1",
        "--preflight",
        "gpu",
        "--run-dir",
        "runs/r",
        "--",
        "hello.py",
        cwd=tmp_path,
        timeout=240,
        env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"},
    )
    assert p.returncode == 0, (p.stdout, p.stderr)
    run = tmp_path / "runs/r"
    assert json.loads((run / "status.json").read_text())["state"] == "COMPLETED"
    assert [a["slots"] for a in yaml.safe_load((run / "run.yaml").read_text())["attempts"]] == [
        [1, 2]
    ]
    said = sorted(
        ln
        for f in run.glob("logs/node*/rank*.log")
        for ln in f.read_text().splitlines()
        if ln.startswith("HELLO")
    )
    assert said == ["HELLO rank 0 of 2 on slot 1", "HELLO rank 1 of 2 on slot 2"], said
    check_slot0_swapped(run)
    out = run_launch("status", "runs/r", cwd=tmp_path, check=True).stdout
    assert (
        "slot 0: 1 strike, quarantined (attempt 0: --preflight gpu: slot 0 [" in out
        and "before attempt 0 (--preflight gpu; person: no): replace -- slot 0: failed the GPU "
        "check: quarantined; the run starts on slots 1, 2"
        in out
    ), out


def test_python_api_takes_preflight_like_the_cli(tmp_path, monkeypatch):
    from launchers.errors import LaunchError
    from launchers.request import JobSpec
    from launchers.spec import RunSpec as Recorded

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hello.py").write_text("print('HELLO')\n")
    spec = JobSpec(backend="local", program=("hello.py",), preflight=("gpu",)).resolve()
    # run.yaml round trip
    assert spec.preflight == ("gpu",) and Recorded.from_dict(spec.to_dict()) == spec
    assert JobSpec(backend="local", program=("hello.py",)).resolve().preflight == ()
    with pytest.raises(
        LaunchError, match=r"^JobSpec.preflight 'nvlink' is not accepted; choose one of: gpu$"
    ):
        JobSpec(backend="local", program=("hello.py",), preflight=("nvlink",)).resolve()


def test_preflight_gpu_is_taken_on_every_backend(tmp_path, monkeypatch):
    """Slurm too: its node tasks run the check when the job runs
    (launchers.backends.slurm.gpugate)."""
    from launchers.request import JobSpec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hello.py").write_text("print('HELLO')\n")
    for backend in ("local", "slurm"):
        spec = JobSpec(backend=backend, program=("hello.py",), preflight=("gpu",)).resolve()
        assert (spec.backend, spec.preflight) == (backend, ("gpu",))


def test_preflight_lines_and_a_slurm_node_s_decision_on_its_peers_verdicts():
    found = verdict.node_findings(
        {
            "gpu_tools": {
                "smi_xml": {"missing": True},
                "ibstat": {"out": text("ibstat/network-operator-issue-249-ib-down.txt"), "rc": 0},
                "dmesg": {"out": text("xid/gpud-dmesg-with-xid-119.log"), "rc": 0},
            }
        },
        "node 1 [lnode2]",
        None,
    )
    line = verdict.bad_line(found, "node 1 [lnode2]")
    assert line.startswith(
        "node 1 [lnode2]: mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand); "
        "GPU PCI:0000:9b:00: Xid 119 GSP RPC timeout"
    ), line
    assert verdict.bad_line([f for f in found if f.level != "fail"], "n") is None
    ok = {"bad": None}
    assert verdict.peers_verdict({0: ok, 1: ok}, 2, 0) is None
    assert (
        verdict.peers_verdict({0: ok, 1: {"bad": line}, 2: None}, 3, 0)
        == f"--preflight gpu: 1 bad node(s) of 3, nothing started (node 0 not started): {line}"
    )
    assert (
        verdict.peers_verdict({0: ok, 1: None, 2: None}, 3, 0)
        == "--preflight gpu: no verdict from node(s) 1, 2 in time, nothing started (node 0 not "
        "started)"
    )


def test_slurm_gate_one_bad_node_stops_every_node(tmp_path, monkeypatch):
    """The Slurm node task's gate (slurm.gpugate.check_node) on this machine, with the stand-ins a
    cluster test uses: the faulty ibstat output is placed on this hostname only. As node 1 it writes
    its bad verdict and stops; as node 0 (healthy tools) it reads node 1's verdict and stops too,
    naming node 1; alone, it passes."""
    import socket

    from gpu_standins import per_host_tools, python_with_tools
    from launchers.backends.slurm.gpugate import check_node
    from launchers.errors import LaunchError

    me = socket.gethostname()
    bad_bin = per_host_tools(
        tmp_path / "bad",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {me: "ibstat/network-operator-issue-249-ib-down.txt"},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    good_bin = per_host_tools(
        tmp_path / "good",
        "nvidia_smi/netdata-rtx-4090-driver-535.xml",
        {"some-other-host": "ibstat/network-operator-issue-249-ib-down.txt"},
        "ibstat/gpud-ibstat.47.0.h100.all.active.0.txt",
    )
    py = python_with_tools(tmp_path / "py", bad_bin)
    assert subprocess.run(
        [py, "-c", "import shutil; print(shutil.which('ibstat'))"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip() == str(bad_bin / "ibstat")
    where = {"job": "77", "step": "0", "restart": 0}
    monkeypatch.setenv("PATH", f"{bad_bin}:{os.environ['PATH']}")
    with pytest.raises(LaunchError) as bad:
        check_node(str(tmp_path / "run"), dict(where, node=1), 2, 1, lambda: False)
    mine = f"node 1 [{me}]: mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand)"
    assert str(bad.value).startswith(
        f"--preflight gpu: 1 bad node(s) of 2, nothing started: {mine}"
    ), bad.value
    rec = json.loads((tmp_path / "run/slurm/gpucheck-77-0-r0-node1.json").read_text())
    assert rec["node"] == 1 and rec["bad"].startswith(mine)
    monkeypatch.setenv("PATH", f"{good_bin}:{os.environ['PATH']}")
    with pytest.raises(LaunchError) as peer:
        check_node(str(tmp_path / "run"), dict(where, node=0), 2, 1, lambda: False)
    assert (
        str(peer.value)
        == f"--preflight gpu: 1 bad node(s) of 2, nothing started (node 0 not started): "
        f"{rec['bad']}"
    )
    assert check_node(str(tmp_path / "run2"), dict(where, node=0), 1, 1, lambda: False) is None
