"""Kernel messages (`dmesg`): the driver's `NVRM: Xid (PCI:<bus>): <n>, ...` lines. What each Xid
means is NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors); the ones listed here as fail
point at the GPU or its links, the rest are most often the application's own (an illegal address, a
page fault) and warn."""

from __future__ import annotations

import re

from .finding import Finding

XID = re.compile(r"NVRM: Xid \((PCI:[0-9a-fA-F:.]+)\): (\d+),\s*(.*)$")
FAIL = {  # Xid -> short words; everything else warns
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remap",
    64: "ECC page retirement / row remap failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


def parse(text: str) -> list[dict]:
    """[{pci, xid, detail, line}] in the order logged."""
    out = []
    for ln in text.splitlines():
        m = XID.search(ln)
        if m:
            out.append(
                {
                    "pci": m.group(1),
                    "xid": int(m.group(2)),
                    "detail": m.group(3).strip(),
                    "line": ln.strip(),
                }
            )
    return out


def findings(events: list[dict], node: str) -> list[Finding]:
    """One finding per (device, Xid), with how often it was logged."""
    seen: dict[tuple[str, int], list[dict]] = {}
    for e in events:
        seen.setdefault((e["pci"], e["xid"]), []).append(e)
    out = []
    for (pci, xid), evs in seen.items():
        words = FAIL.get(xid)
        times = f" ({len(evs)} times)" if len(evs) > 1 else ""
        detail = evs[-1]["detail"]
        detail = detail if len(detail) <= 120 else detail[:117] + "..."
        out.append(
            Finding(
                "fail" if words else "warn",
                node,
                f"GPU {pci}",
                f"Xid {xid}{' ' + words if words else ''}{times}: {detail}",
            )
        )
    return out
