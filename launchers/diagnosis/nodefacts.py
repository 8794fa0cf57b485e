"""What `launch doctor` learned about each node, kept for later commands (`launch nccl check --on
NODE`): its network interfaces and InfiniBand/RoCE HCA ports. The one owner of that cache.

One small JSON file per node in $LAUNCH_NODE_FACTS_DIR, else $XDG_CACHE_HOME/launchers/nodes
(~/.cache when unset): `<node>.json` (the name made safe for a file name) with the node's name as
doctor prints it, its address when that differs, its own host name, the time, `interfaces` ([{name,
operstate, loopback}], from /sys/class/net) and `hca_ports` ([{device, port, state, rate,
link_layer, ...}], from /sys/class/infiniband, read by launchers.gpuhealth.ib). Written by doctor
only (record(), atomic replace: the newest run wins); read by anyone (find(), devices()). A cache:
losing it loses nothing but the facts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time

from ..errors import LaunchError
from ..gpuhealth.ib import parse_sysfs
from ..layout import atomic_write, read_json

SAFE = re.compile(r"[^A-Za-z0-9._-]")


def cache_dir() -> str:
    """LAUNCH_NODE_FACTS_DIR, else $XDG_CACHE_HOME/launchers/nodes (~/.cache when unset)."""
    if os.environ.get("LAUNCH_NODE_FACTS_DIR"):
        return os.path.abspath(os.environ["LAUNCH_NODE_FACTS_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "launchers", "nodes")


def file_name(node: str) -> str:
    """The node's file: its name when that is a safe file name, else the name made safe plus a short
    hash of the real one (two names that differ never share a file)."""
    safe = SAFE.sub("_", node).lstrip(".") or "_"
    if safe != node:
        safe += "-" + hashlib.sha256(node.encode()).hexdigest()[:8]
    return safe + ".json"


def from_probe(result: dict) -> dict:
    """The facts kept from one node's probe record (launchers.doctor.probe: `net`, `hca_files`)."""
    ifs = [
        {
            "name": str(i.get("name")),
            "operstate": i.get("operstate"),
            "loopback": bool(i.get("loopback")),
        }
        for i in result.get("net") or ()
        if isinstance(i, dict) and i.get("name")
    ]
    return {"interfaces": ifs, "hca_ports": parse_sysfs(result.get("hca_files") or {})}


def record(node: str, result: dict, address: str | None = None, when: float | None = None) -> str:
    """Write what the probe said of node (its name as doctor prints it); returns the file
    written."""
    rec = {
        "node": node,
        "hostname": result.get("host"),
        "time": time.strftime(
            "%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() if when is None else when)
        ),
        **from_probe(result),
    }
    if address and address != node:
        rec["address"] = address
    path = os.path.join(cache_dir(), file_name(node))
    atomic_write(path, json.dumps(rec, indent=1) + "\n", durable=False)
    return path


def known() -> list[dict]:
    """Every node's record in the cache (unreadable files left out), by name."""
    try:
        names = sorted(n for n in os.listdir(cache_dir()) if n.endswith(".json"))
    except OSError:
        return []
    recs = [read_json(os.path.join(cache_dir(), n)) for n in names]
    return sorted(
        (r for r in recs if r and isinstance(r.get("node"), str)), key=lambda r: r["node"]
    )


def find(name: str) -> dict:
    """The record of the node called name (its name, address or own host name); a node doctor never
    saw: one line naming it and the nodes it knows."""
    recs = known()
    for key in ("node", "address", "hostname"):
        for r in recs:
            if r.get(key) == name:
                return r
    have = ", ".join(r["node"] for r in recs)
    raise LaunchError(
        f"--on {name!r}: launch doctor has not seen that node "
        + (
            f"(it knows: {have}); run `launch doctor` on it first"
            if have
            else f"(it knows none in {cache_dir()}); run `launch doctor` on it first"
        )
    )


def devices(rec: dict) -> dict:
    """What nccl_tuning.validate(devices=) takes: interface names, HCA ports as 'dev:port'."""
    return {
        "NCCL_SOCKET_IFNAME": [i["name"] for i in rec.get("interfaces") or ()],
        "NCCL_IB_HCA": [f"{p['device']}:{p['port']}" for p in rec.get("hca_ports") or ()],
    }


def describe(rec: dict) -> str:
    """One line: the node, when doctor saw it, its interfaces and HCA ports with their states."""
    ifs = (
        ", ".join(
            f"{i['name']} ({'loopback' if i.get('loopback') else i.get('operstate') or '?'})"
            for i in rec.get("interfaces") or ()
        )
        or "none"
    )
    hcas = (
        ", ".join(
            f"{p['device']}:{p['port']} ({p.get('state') or '?'}"
            + (f", {p['rate']} Gb/s" if p.get("rate") else "")
            + ")"
            for p in rec.get("hca_ports") or ()
        )
        or "none"
    )
    at = f" at {rec['address']}" if rec.get("address") else ""
    return (
        f"on {rec['node']}{at} (launch doctor, {rec.get('time', '?')}): interfaces {ifs}; "
        f"HCA ports {hcas}"
    )
