"""One node's GPU check, from its tools' raw outputs (launchers.gpuhealth.tools) to findings (one
line each: node, device, fact) and to the preflight's verdict: the one line that names a bad node,
or none. The same code judges every backend's nodes: `launch doctor --gpu` and `--preflight gpu` on
local and SSH (the submitting side reads the probe's answer), and each Slurm node task on its own
node (launchers.backends.slurm.node), which then waits for every node's verdict before anything
starts.

A node without nvidia-smi is a skip ("no nvidia-smi"), not a failure: a CPU node runs gloo jobs, and
--require-gpus / --gpus-per-node already fail the GPUS column where GPUs are required. A tool that
is missing is skipped; one that ran and failed, or whose output cannot be read, is a warning naming
it.
"""

from __future__ import annotations

from . import ib, nvlink, smi, topo, xid
from .finding import Finding


def _ran(tools: dict, key: str) -> str | None:
    t = tools.get(key) or {}
    return t.get("out") if "out" in t and not t.get("rc") else None


def _tool_trouble(tools: dict, key: str, node: str, what: str) -> list[Finding]:
    t = tools.get(key) or {}
    if t.get("timeout") and key == "smi_xml":  # nvidia-smi hangs: a GPU or the driver is in trouble
        return [Finding("fail", node, "node", f"{t['error']} (a GPU or the driver hangs)")]
    if t.get("error") and not t.get("skipped"):
        return [Finding("warn", node, "node", f"{what}: {t['error']}")]
    if t.get("rc"):
        return [
            Finding(
                "warn", node, "node", f"{what} exited {t['rc']}: {t.get('err') or 'no message'}"
            )
        ]
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
    """r: a node's answer holding `gpu_tools` (the doctor's probe, or {"gpu_tools":
    tools.run(...)})."""
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
        out.append(
            Finding(
                "info", node, "node", "kernel messages not readable here (dmesg): Xid check skipped"
            )
        )
    return out


def bad_line(found: list[Finding], label: str) -> str | None:
    """The preflight's one line for a node with faults (`node 1 [host]: dev: fact; dev: fact`), else
    None."""
    fails = [f"{f.device}: {f.fact}" for f in found if f.level == "fail"]
    return f"{label}: " + "; ".join(fails) if fails else None


def warnings(found: list[Finding]) -> list[str]:
    return [f.line() for f in found if f.level == "warn"]


def summary(bad: list[str], nnodes: int) -> str:
    """The first line of a preflight that stops: how many nodes are bad (each then named on its own
    line)."""
    return f"--preflight gpu: {len(bad)} bad node(s) of {nnodes}, nothing started"


def peers_verdict(verdicts: dict, nnodes: int, me: int) -> str | None:
    """A Slurm node's decision once it has read every node's verdict file ({node: {"bad": line|None}
    or None when not there}): None when all nodes passed, else why this node does not start (naming
    the bad nodes, or the nodes whose verdict never came)."""
    missing = [k for k in range(nnodes) if verdicts.get(k) is None]
    bad = [verdicts[k]["bad"] for k in range(nnodes) if k not in missing and verdicts[k].get("bad")]
    if bad:
        return f"{summary(bad, nnodes)} (node {me} not started): " + " | ".join(bad)
    if missing:
        return (
            f"--preflight gpu: no verdict from node(s) {', '.join(map(str, missing))} in time, "
            f"nothing started (node {me} not started)"
        )
    return None
