"""`launch doctor --gpu`: the nodes' tool outputs (launchers.doctor.gputools) through the parsers
(launchers.gpuhealth) into findings -- one line each: node, device, fact -- and the GPU-HEALTH column.

A node without nvidia-smi is a skip ("no nvidia-smi"), not a failure: a CPU node runs gloo jobs, and
--require-gpus / --gpus-per-node already fail the GPUS column where GPUs are required. A tool that is
missing is skipped; one that ran and failed, or whose output cannot be read, is a warning naming it.
"""
from __future__ import annotations

from ..gpuhealth import ib, nvlink, smi, topo, xid
from ..gpuhealth.finding import Finding, worst
from .checks import Check, skip

FIX = "drain the node or fix what the line names (nvidia-smi -q, ibstat, dmesg), then run doctor --gpu again"


def _ran(tools: dict, key: str) -> str | None:
    t = tools.get(key) or {}
    return t.get("out") if "out" in t and not t.get("rc") else None


def _tool_trouble(tools: dict, key: str, node: str, what: str) -> list[Finding]:
    t = tools.get(key) or {}
    if t.get("timeout") and key == "smi_xml":      # nvidia-smi hangs: a GPU or the driver is in trouble
        return [Finding("fail", node, "node", f"{t['error']} (a GPU or the driver hangs)")]
    if t.get("error") and not t.get("skipped"):
        return [Finding("warn", node, "node", f"{what}: {t['error']}")]
    if t.get("rc"):
        return [Finding("warn", node, "node", f"{what} exited {t['rc']}: {t.get('err') or 'no message'}")]
    return []


def _parsed(parse, text: str, node: str, what: str):
    try:
        return parse(text), []
    except ValueError as e:
        return None, [Finding("warn", node, "node", f"{what}: output not understood ({e})")]


def smi_findings(tools: dict, node: str, gpus_per_node: int | None) -> list[Finding]:
    out = _tool_trouble(tools, "smi_xml", node, "nvidia-smi -q -x")
    text = _ran(tools, "smi_xml")
    if text is not None:
        facts, bad = _parsed(smi.parse, text, node, "nvidia-smi -q -x")
        out += bad + (smi.findings(facts, node, gpus_per_node) if facts else [])
    out += _tool_trouble(tools, "topo", node, "nvidia-smi topo -m")
    text = _ran(tools, "topo")
    if text is not None and text.strip():
        facts, bad = _parsed(topo.parse, text, node, "nvidia-smi topo -m")
        out += bad + (topo.findings(facts, node) if facts else [])
    text = _ran(tools, "nvlink")
    if text is not None:
        out += nvlink.findings(nvlink.parse(text), node)
    return out


def nic_findings(tools: dict, node: str) -> list[Finding]:
    text = _ran(tools, "ibstat")
    if text is not None:
        return ib.findings(ib.parse_ibstat(text), node)
    files = tools.get("ib_sysfs")
    return ib.findings(ib.parse_sysfs(files), node) if files else []


def node_findings(r: dict, node: str, gpus_per_node: int | None) -> list[Finding]:
    tools = r.get("gpu_tools") or {}
    out: list[Finding] = []
    if (tools.get("smi_xml") or {}).get("missing"):
        out.append(Finding("info", node, "node", "no nvidia-smi: GPU checks skipped"))
    else:
        out += smi_findings(tools, node, gpus_per_node)
    out += nic_findings(tools, node)
    text = _ran(tools, "dmesg")
    if text is not None:
        out += xid.findings(xid.parse(text), node)
    elif (tools.get("dmesg") or {}).get("rc"):
        out.append(Finding("info", node, "node", "kernel messages not readable here (dmesg): Xid check skipped"))
    return out


def gpu_health(r: dict, node: str, gpus_per_node: int | None) -> tuple[Check, list[Finding]]:
    """The column's cell and the node's findings (every level; fail and warn lines are printed)."""
    if "gpu_tools" not in r:
        return skip("?"), []
    found = node_findings(r, node, gpus_per_node)
    level = worst([f for f in found if f.level != "info"])
    fails, warns = (sum(f.level == k for f in found) for k in ("fail", "warn"))
    if level == "fail":
        return Check("fail", f"{fails} fault(s)!", f"{fails} fault(s) found by the GPU/NIC tools", FIX), found
    if level == "warn":
        return Check("warn", f"{warns} warning(s)?", f"{warns} warning(s) from the GPU/NIC tools"), found
    if (r["gpu_tools"].get("smi_xml") or {}).get("missing"):
        return skip("no nvidia-smi"), found
    return Check("ok", "ok"), found
