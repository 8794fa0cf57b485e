"""`nvidia-smi -q -x`: per GPU its bus id, name, persistence and MIG mode, uncorrectable ECC
(volatile), retired pages and pending retirement, row remaps (pending / failure), and the clock
slowdowns that mean heat or power trouble. Older drivers call them clocks_throttle_reason_*, newer
clocks_event_reason_*."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from .finding import Finding

SLOWDOWNS = {  # reason suffix -> words; gpu_idle, applications_clocks_setting etc. are normal
    "hw_slowdown": "hardware slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "hardware power-brake slowdown",
    "sw_thermal_slowdown": "software thermal slowdown",
}


def _text(el, path: str) -> str | None:
    found = el.find(path) if el is not None else None
    if found is None or found.text is None:
        return None
    return found.text.strip() or None


def _count(el, path: str) -> int | None:
    v = _text(el, path)
    return int(v) if v is not None and v.isdigit() else None


def _uncorrectable(g) -> int | None:
    """Volatile uncorrectable ECC errors: double_bit/total (older) or dram+sram uncorrectable
    (newer)."""
    vol = g.find("ecc_errors/volatile")
    if vol is None:
        return None
    old = _count(vol, "double_bit/total")
    if old is not None:
        return old
    parts = [
        _count(vol, p)
        for p in (
            "dram_uncorrectable",
            "sram_uncorrectable",
            "sram_uncorrectable_parity",
            "sram_uncorrectable_secded",
        )
    ]
    parts = [p for p in parts if p is not None]
    return sum(parts) if parts else None


def _slowdowns(g) -> list[str]:
    out = []
    for tag in ("clocks_event_reasons", "clocks_throttle_reasons"):
        reasons = g.find(tag)
        for el in reasons if reasons is not None else []:
            for suffix, words in SLOWDOWNS.items():
                if el.tag.endswith("_reason_" + suffix) and (el.text or "").strip() == "Active":
                    out.append(words)
    return out


def _gpu(i: int, g) -> dict:
    return {
        "index": i,
        "bus_id": g.get("id"),
        "name": _text(g, "product_name"),
        "persistence": _text(g, "persistence_mode"),
        "mig": _text(g, "mig_mode/current_mig"),
        "uncorrectable_ecc": _uncorrectable(g),
        "retired_pages": sum(
            c
            for c in (
                _count(g, "retired_pages/multiple_single_bit_retirement/retired_count"),
                _count(g, "retired_pages/double_bit_retirement/retired_count"),
            )
            if c is not None
        ),
        "pending_retirement": _text(g, "retired_pages/pending_retirement"),
        "remap_pending": _text(g, "remapped_rows/remapped_row_pending"),
        "remap_failure": _text(g, "remapped_rows/remapped_row_failure"),
        "slowdowns": _slowdowns(g),
    }


def parse(text: str) -> dict:
    """The XML's facts: driver, attached GPUs, one dict per GPU. ValueError when it is not that
    XML."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as e:
        raise ValueError(f"not nvidia-smi -q -x output ({e})") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi -q -x output (root element <{root.tag}>)")
    gpus = [_gpu(i, g) for i, g in enumerate(root.findall("gpu"))]
    return {
        "driver": _text(root, "driver_version"),
        "cuda": _text(root, "cuda_version"),
        "attached": _count(root, "attached_gpus"),
        "gpus": gpus,
    }


def _device(g: dict) -> str:
    return f"GPU {g['index']} ({g['bus_id']}, {g['name']})"


def findings(facts: dict, node: str, gpus_per_node: int | None = None) -> list[Finding]:
    out = []
    n = len(facts["gpus"])
    if gpus_per_node and n < gpus_per_node:
        out.append(
            Finding(
                "fail",
                node,
                "node",
                f"nvidia-smi shows {n} GPU(s), --gpus-per-node is {gpus_per_node}",
            )
        )
    for g in facts["gpus"]:
        dev = _device(g)
        if g["uncorrectable_ecc"]:
            out.append(
                Finding(
                    "fail",
                    node,
                    dev,
                    f"{g['uncorrectable_ecc']} uncorrectable ECC error(s) since boot",
                )
            )
        if g["pending_retirement"] == "Yes":
            out.append(
                Finding("fail", node, dev, "page retirement pending (reset the GPU or reboot)")
            )
        if g["remap_pending"] == "Yes":
            out.append(Finding("fail", node, dev, "row remap pending (reset the GPU or reboot)"))
        if g["remap_failure"] == "Yes":
            out.append(Finding("fail", node, dev, "row remap failed (the GPU needs service)"))
        if g["retired_pages"]:
            out.append(Finding("warn", node, dev, f"{g['retired_pages']} retired page(s)"))
        for words in g["slowdowns"]:
            out.append(Finding("warn", node, dev, f"clocks held down: {words} active"))
        if g["mig"] == "Enabled":
            out.append(
                Finding(
                    "warn",
                    node,
                    dev,
                    "MIG mode Enabled (a job sees MIG instances, not the whole GPU)",
                )
            )
        if g["persistence"] == "Disabled":
            out.append(
                Finding(
                    "info",
                    node,
                    dev,
                    "persistence mode Disabled (each job start pays the driver load)",
                )
            )
    return out
