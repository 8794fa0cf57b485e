"""`launch doctor --gpu`: the nodes' findings (launchers.gpuhealth.verdict, from the tools' outputs
the probe brought back: launchers.gpuhealth.tools) as the GPU-HEALTH column.
"""

from __future__ import annotations

from ..gpuhealth.finding import Finding, worst
from ..gpuhealth.verdict import node_findings
from .checks import Check, skip

FIX = (
    "drain the node or fix what the line names (nvidia-smi -q, ibstat, dmesg), then run "
    "doctor --gpu again"
)


def gpu_health(r: dict, node: str, gpus_per_node: int | None) -> tuple[Check, list[Finding]]:
    """The column's cell and the node's findings (every level; fail and warn lines are printed)."""
    if "gpu_tools" not in r:
        return skip("?"), []
    found = node_findings(r, node, gpus_per_node)
    level = worst([f for f in found if f.level != "info"])
    fails, warns = (sum(f.level == k for f in found) for k in ("fail", "warn"))
    if level == "fail":
        return Check(
            "fail", f"{fails} fault(s)!", f"{fails} fault(s) found by the GPU/NIC tools", FIX
        ), found
    if level == "warn":
        return Check(
            "warn", f"{warns} warning(s)?", f"{warns} warning(s) from the GPU/NIC tools"
        ), found
    if (r["gpu_tools"].get("smi_xml") or {}).get("missing"):
        return skip("no nvidia-smi"), found
    return Check("ok", "ok"), found
