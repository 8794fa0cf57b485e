"""`nvidia-smi topo -m`: the matrix of paths between GPUs and NICs (X self, NV# a bonded set of #
NVLinks, PIX/PXB/PHB/NODE/SYS PCIe paths from nearest to farthest), each GPU's CPU and NUMA
affinity, and the NIC names from the "NIC Legend" when present (no fixture here has one yet: NICs
are then named NIC0...). The output is read by the one parser of it, launchers.cpubind.parse_topo
(--cpu-bind reads the same tool's NUMA Affinity); this module judges what it read."""

from __future__ import annotations

from ..cpubind import parse_topo as parse
from .finding import Finding

__all__ = ["PCIE", "parse", "gpus", "nics", "nearest_nic", "findings"]

PCIE = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first


def gpus(facts: dict) -> list[str]:
    return [c for c in facts["columns"] if c.startswith("GPU")]


def nics(facts: dict) -> list[str]:
    return [c for c in facts["columns"] if not c.startswith("GPU")]


def nearest_nic(facts: dict, gpu: str) -> tuple[str, str] | None:
    """(NIC name, path) of the NIC closest to the GPU, or None without NICs."""
    row = facts["paths"].get(gpu, {})
    best = None
    for nic in nics(facts):
        path = row.get(nic, "SYS")
        rank = PCIE.index(path) if path in PCIE else len(PCIE)
        if best is None or rank < best[0]:
            best = (rank, facts["nic_names"].get(nic, nic), path)
    return (best[1], best[2]) if best else None


def findings(facts: dict, node: str) -> list[Finding]:
    """GPU pairs without NVLink where other pairs have it (a link down or a GPU off the fabric):
    fail; a GPU whose nearest NIC is across the CPU interconnect (SYS) while NICs exist: info
    (NCCL's traffic for it crosses sockets)."""
    out, g = [], gpus(facts)
    pairs = [
        (a, b, facts["paths"].get(a, {}).get(b, "?")) for i, a in enumerate(g) for b in g[i + 1 :]
    ]
    if any(p.startswith("NV") for _, _, p in pairs):
        for a, b, p in pairs:
            if not p.startswith("NV"):
                out.append(
                    Finding(
                        "fail",
                        node,
                        f"{a}-{b}",
                        f"path {p}, not NVLink, while other GPU pairs use NVLink",
                    )
                )
    for gpu in g:
        near = nearest_nic(facts, gpu)
        if near and near[1] == "SYS":
            out.append(
                Finding(
                    "info", node, gpu, f"nearest NIC {near[0]} is across the CPU interconnect (SYS)"
                )
            )
    return out
