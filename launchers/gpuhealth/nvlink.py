"""`nvidia-smi nvlink -s` (--status): per GPU, each link's speed or `<inactive>`."""

from __future__ import annotations

import re

from .finding import Finding

GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: (.*)\)\s*$")
LINK = re.compile(r"^\s+Link (\d+): (.*?)\s*$")


def parse(text: str) -> list[dict]:
    """[{index, name, uuid, links: {n: "25 GB/s" | None (inactive)}}]; lines before the first GPU
    ignored."""
    gpus: list[dict] = []
    for ln in text.splitlines():
        m = GPU.match(ln)
        if m:
            gpus.append(
                {"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3), "links": {}}
            )
            continue
        m = LINK.match(ln)
        if m and gpus:
            gpus[-1]["links"][int(m.group(1))] = None if m.group(2) == "<inactive>" else m.group(2)
    return gpus


def findings(gpus: list[dict], node: str) -> list[Finding]:
    """Every inactive link of a GPU that has active ones: fail (a GPU with no active link at all has
    no NVLink in use -- a PCIe card -- and is not judged here)."""
    out = []
    for g in gpus:
        down = [n for n, speed in g["links"].items() if speed is None]
        if down and len(down) < len(g["links"]):
            out.append(
                Finding(
                    "fail",
                    node,
                    f"GPU {g['index']} ({g['name']})",
                    f"NVLink {', '.join(map(str, down))} inactive of {len(g['links'])}",
                )
            )
    return out
