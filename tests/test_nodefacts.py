"""Issue 24 item 3: what `launch doctor` learns of a node's interfaces and HCA ports (the probe's
readers, on a sysfs tree laid out as the kernel lays it out), kept per node
(launchers.diagnosis.nodefacts), and `launch nccl check --on NODE` saying which of them
NCCL_SOCKET_IFNAME / NCCL_IB_HCA select there."""

from __future__ import annotations

import json
import os

import pytest

from conftest import run_launch
from launchers.diagnosis import nodefacts
from launchers.errors import LaunchError
from launchers.nodeside.gputools import ib_sysfs
from launchers.nodeside.probe import net_sysfs
from nccl_tuning.validate import validate

IB_PORT = {
    "state": "4: ACTIVE\n",
    "phys_state": "5: LinkUp\n",
    "rate": "400 Gb/sec (4X NDR)\n",
    "link_layer": "InfiniBand\n",
}


def write_tree(root, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def readers() -> dict:
    """The probe's own reader functions (the node-side modules the nodes run), here."""
    return {"net_sysfs": net_sysfs, "ib_sysfs": ib_sysfs}


def test_the_probe_reads_interfaces_and_hca_ports_from_sysfs(tmp_path):
    write_tree(
        tmp_path,
        {
            "net/lo/operstate": "unknown\n",
            "net/lo/flags": "0x9\n",
            "net/eth0/operstate": "up\n",
            "net/eth0/flags": "0x1003\n",
            "net/ib0/operstate": "down\n",  # no flags file: not loopback by name
            "net/bonding_masters": "bond0\n",
        },
    )  # a file, not an interface
    write_tree(
        tmp_path,
        {f"ib/{dev}/ports/1/{k}": v for dev in ("mlx5_1", "mlx5_10") for k, v in IB_PORT.items()},
    )
    write_tree(tmp_path, {"ib/mlx5_1/ports/2/state": "1: DOWN\n"})
    r = readers()
    got = {
        "host": "gpu1",
        "net": r["net_sysfs"](str(tmp_path / "net")),
        "hca_files": r["ib_sysfs"](str(tmp_path / "ib")),
    }
    facts = nodefacts.from_probe(got)
    assert facts["interfaces"] == [
        {"name": "eth0", "operstate": "up", "loopback": False},
        {"name": "ib0", "operstate": "down", "loopback": False},
        {"name": "lo", "operstate": "unknown", "loopback": True},
    ]
    assert [(p["device"], p["port"], p["state"]) for p in facts["hca_ports"]] == [
        ("mlx5_1", 1, "Active"),
        ("mlx5_1", 2, "Down"),
        ("mlx5_10", 1, "Active"),
    ]
    assert (
        facts["hca_ports"][0]["rate"] == "400"
        and facts["hca_ports"][0]["link_layer"] == "InfiniBand"
    )
    assert (
        r["net_sysfs"](str(tmp_path / "none")) == []
        and r["ib_sysfs"](str(tmp_path / "none")) is None
    )
    assert nodefacts.from_probe({"host": "old"}) == {"interfaces": [], "hca_ports": []}


def test_the_cache_round_trip_names_and_unknown_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCH_NODE_FACTS_DIR", str(tmp_path / "nodes"))
    with pytest.raises(LaunchError, match=r"'gpu1'.*knows none.*run `launch doctor`"):
        nodefacts.find("gpu1")
    probe = {
        "host": "gpu1.cluster",
        "net": [{"name": "eth0", "operstate": "up", "loopback": False}],
        "hca_files": {"mlx5_0/ports/1/state": "4: ACTIVE\n"},
    }
    path = nodefacts.record("gpu1", probe, address="10.0.0.1")
    odd = nodefacts.record("../we ird", dict(probe, host="other"))
    assert os.path.basename(path) == "gpu1.json"
    assert os.path.dirname(odd) == str(tmp_path / "nodes") and "/" not in os.path.basename(odd)[:-5]
    assert sorted(os.listdir(tmp_path / "nodes")) == sorted(
        [os.path.basename(path), os.path.basename(odd)]
    )
    for name in ("gpu1", "10.0.0.1", "gpu1.cluster"):  # its name, its address, its own host name
        rec = nodefacts.find(name)
        assert (rec["node"], rec["address"]) == ("gpu1", "10.0.0.1")
    assert nodefacts.devices(rec) == {"NCCL_SOCKET_IFNAME": ["eth0"], "NCCL_IB_HCA": ["mlx5_0:1"]}
    assert nodefacts.find("../we ird")["node"] == "../we ird"
    # doctor saw no HCA there
    bare = nodefacts.devices({"node": "cpu1", "interfaces": [], "hca_ports": []})
    (err,) = [
        f
        for f in validate({"NCCL_IB_HCA": "mlx5_0"}, "2.30.7", devices=bare)
        if f.severity == "error"
    ]
    assert "selects none of this node's HCA ports (it has none;" in err.message
    with pytest.raises(LaunchError, match=r"'gpu9'.*it knows: \.\./we ird, gpu1\)"):
        nodefacts.find("gpu9")
    monkeypatch.delenv("LAUNCH_NODE_FACTS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert nodefacts.cache_dir() == str(tmp_path / "xdg" / "launchers" / "nodes")


def node(name, ifs, hcas):
    return {
        "host": name,
        "net": [{"name": i, "operstate": "up", "loopback": i == "lo"} for i in ifs],
        "hca_files": {f"{d}/ports/1/state": "4: ACTIVE\n" for d in hcas},
    }


@pytest.mark.parametrize(
    "args,code,lines",
    [
        (
            [
                "--env",
                "NCCL_IB_HCA=mlx5_1",
                "--env",
                "NCCL_SOCKET_IFNAME=eth",
                "--on",
                "gpu1",
                "--on",
                "gpu2",
            ],
            1,
            [
                "on gpu1 (launch doctor, ",
                "  warning NCCL_IB_HCA=mlx5_1: 'mlx5_1' is a prefix: on this node NCCL also "
                "selects mlx5_10 ",
                "  note NCCL_IB_HCA=mlx5_1: on this node it selects mlx5_1:1, mlx5_10:1 (of "
                "mlx5_1:1, mlx5_10:1; ",
                "  note NCCL_SOCKET_IFNAME=eth: on this node it selects eth0, eth1 (of eth0, "
                "eth1, ib0, lo; ",
                "on gpu2 (launch doctor, ",
                "  error NCCL_IB_HCA=mlx5_1: selects none of this node's HCA ports (mlx5_0:1; ",
                "checked 2 variable(s) with NCCL 2.30.7 rules on gpu1, gpu2: 1 error(s), ",
            ],
        ),
        (
            ["--env", "NCCL_IB_HCA==mlx5_1", "--on", "gpu1"],
            0,
            [
                "  note NCCL_IB_HCA==mlx5_1: on this node it selects mlx5_1:1 (of mlx5_1:1, "
                "mlx5_10:1; ",
            ],
        ),
    ],
)
def test_nccl_check_on_a_node_says_what_the_value_selects_there(
    tmp_path, monkeypatch, args, code, lines
):
    facts = tmp_path / "nodes"
    monkeypatch.setenv("LAUNCH_NODE_FACTS_DIR", str(facts))  # run_launch passes os.environ on
    nodefacts.record("gpu1", node("gpu1", ["eth0", "eth1", "ib0", "lo"], ["mlx5_1", "mlx5_10"]))
    nodefacts.record("gpu2", node("gpu2", ["eth0", "lo"], ["mlx5_0"]))
    p = run_launch("nccl", "check", "--nccl-version", "2.30.7", *args, cwd=tmp_path, timeout=60)
    assert p.returncode == code, (p.stdout, p.stderr)
    out = p.stdout.splitlines()
    for want in lines:
        assert any(ln.startswith(want) for ln in out), (want, p.stdout)
    if "gpu2" in args:  # each node's findings under its own line, in the order given
        at = [i for i, ln in enumerate(out) if ln.startswith("on ")]
        assert [out[i].split()[1] for i in at] == ["gpu1", "gpu2"]
        assert not any(
            "also selects mlx5_10" in ln or "it selects mlx5_1" in ln for ln in out[at[1] :]
        )
    assert json.loads((facts / "gpu1.json").read_text())["node"] == "gpu1"
