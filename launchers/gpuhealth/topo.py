"""`nvidia-smi topo -m`: the matrix of paths between GPUs and NICs (X self, NV# a bonded set of # NVLinks,
PIX/PXB/PHB/NODE/SYS PCIe paths from nearest to farthest), each GPU's CPU and NUMA affinity, and the NIC
names from the "NIC Legend" when present (no fixture here has one yet: NICs are then named NIC0...).
Columns are tab- or space-separated (both occur in real pastes)."""
from __future__ import annotations

import re

from .finding import Finding

PCIE = ("PIX", "PXB", "PHB", "NODE", "SYS")       # nearest first


def _cells(line: str) -> list[str]:
    """The row's name, its matrix cells, then what follows (affinities)."""
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    return line.split()


def parse(text: str) -> dict:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)          # some drivers underline the header, even into a pipe
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = next((i for i, ln in enumerate(lines) if re.match(r"\s+GPU0\b", ln)), None)
    if head is None:
        raise ValueError("not nvidia-smi topo -m output (no GPU0 header)")
    header = lines[head].split("\t") if "\t" in lines[head] else re.split(r"\s{2,}", lines[head].strip())
    cols = [c.strip() for c in header if re.fullmatch(r"(GPU|NIC|mlx5_|mlx4_)\S*", c.strip())]
    rows, affinity = {}, {}
    for ln in lines[head + 1:]:
        cells = _cells(ln)
        name = cells[0] if cells else ""
        if name not in cols:
            if ln.strip().startswith("Legend"):
                break
            continue
        rows[name] = dict(zip(cols, cells[1:1 + len(cols)]))
        rest = [c for c in cells[1 + len(cols):] if c]
        if name.startswith("GPU") and rest:
            affinity[name] = {"cpus": rest[0], "numa": rest[1] if len(rest) > 1 else None}
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, re.M))
    return {"columns": cols, "paths": rows, "affinity": affinity, "nic_names": legend}


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
    """GPU pairs without NVLink where other pairs have it (a link down or a GPU off the fabric): fail; a
    GPU whose nearest NIC is across the CPU interconnect (SYS) while NICs exist: info (NCCL's traffic for it
    crosses sockets)."""
    out, g = [], gpus(facts)
    pairs = [(a, b, facts["paths"].get(a, {}).get(b, "?")) for i, a in enumerate(g) for b in g[i + 1:]]
    if any(p.startswith("NV") for _, _, p in pairs):
        for a, b, p in pairs:
            if not p.startswith("NV"):
                out.append(Finding("fail", node, f"{a}-{b}", f"path {p}, not NVLink, while other GPU pairs use NVLink"))
    for gpu in g:
        near = nearest_nic(facts, gpu)
        if near and near[1] == "SYS":
            out.append(Finding("info", node, gpu, f"nearest NIC {near[0]} is across the CPU interconnect (SYS)"))
    return out
