"""InfiniBand / RoCE ports from `ibstat`, or from /sys/class/infiniband/<dev>/ports/<n>/{state,
phys_state, rate, link_layer} when ibstat is missing. Both give: device, port, state, physical
state, rate, link layer."""

from __future__ import annotations

import re

from .finding import Finding

CA = re.compile(r"^CA '(.+)'")
PORT = re.compile(r"^\s+Port (\d+):")
FIELD = re.compile(r"^\s+([A-Za-z ]+):\s*(.*?)\s*$")
KEYS = {
    "State": "state",
    "Physical state": "phys_state",
    "Rate": "rate",
    "Link layer": "link_layer",
}


def parse_ibstat(text: str) -> list[dict]:
    ports: list[dict] = []
    ca = None
    for ln in text.splitlines():
        m = CA.match(ln)
        if m:
            ca = m.group(1)
            continue
        m = PORT.match(ln)
        if m and ca:
            ports.append({"device": ca, "port": int(m.group(1))})
            continue
        m = FIELD.match(ln)
        if m and ports and ports[-1]["device"] == ca and m.group(1) in KEYS:
            ports[-1][KEYS[m.group(1)]] = m.group(2)
    return ports


def _word(v: str | None) -> str | None:
    """sysfs "4: ACTIVE" -> "Active", "5: LinkUp" -> "LinkUp", "400 Gb/sec (4X NDR)" -> "400"."""
    if v is None:
        return None
    v = v.strip()
    m = re.match(r"^\d+:\s*(\S+)", v)
    if m:
        w = m.group(1)
        return w.capitalize() if w.isupper() else w
    m = re.match(r"^(\d+)\s*Gb/sec", v)
    return m.group(1) if m else v


def parse_sysfs(files: dict[str, str]) -> list[dict]:
    """files: "<dev>/ports/<n>/<attr>" -> content (what the probe read under
    /sys/class/infiniband)."""
    ports: dict[tuple[str, int], dict] = {}
    for path, content in files.items():
        m = re.fullmatch(r"([^/]+)/ports/(\d+)/(state|phys_state|rate|link_layer)", path)
        if m:
            p = ports.setdefault(
                (m.group(1), int(m.group(2))), {"device": m.group(1), "port": int(m.group(2))}
            )
            p[m.group(3)] = _word(content)
    return [ports[k] for k in sorted(ports)]


def findings(ports: list[dict], node: str) -> list[Finding]:
    """A port not Active: fail -- except an Ethernet (RoCE) port whose physical state is Disabled (a
    port switched off on purpose, e.g. a NIC's unused second port): warn. An Active InfiniBand port
    slower than the fastest Active InfiniBand port of the node: warn (a link trained down)."""
    out = []
    rates = [
        float(p["rate"])
        for p in ports
        if p.get("state") == "Active"
        and p.get("link_layer") == "InfiniBand"
        and _number(p.get("rate"))
    ]
    best = max(rates, default=0.0)
    for p in ports:
        dev = f"{p['device']} port {p['port']}"
        if p.get("state") != "Active":
            off = p.get("link_layer") == "Ethernet" and p.get("phys_state") == "Disabled"
            out.append(
                Finding(
                    "warn" if off else "fail",
                    node,
                    dev,
                    f"State {p.get('state')} (physical state "
                    f"{p.get('phys_state')}, {p.get('link_layer', '?')})",
                )
            )
        elif (
            p.get("link_layer") == "InfiniBand"
            and _number(p.get("rate"))
            and float(p["rate"]) < best
        ):
            out.append(
                Finding(
                    "warn", node, dev, f"rate {p['rate']} Gb/s, other InfiniBand ports run {best:g}"
                )
            )
    return out


def _number(v: str | None) -> bool:
    return bool(v) and v.replace(".", "", 1).isdigit()
