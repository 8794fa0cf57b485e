"""NCCL_SOCKET_IFNAME and NCCL_IB_HCA: what a value selects, per NCCL tag (ncclsrc.IF_TAGS).

Both go through the same reader steps, read in NCCL's code at each tag: a leading '^' excludes what
the list matches, then a leading '=' makes the names exact; otherwise each name is a *prefix*
(mlx5_1 also selects mlx5_10..mlx5_19, eth1 also eth10); ':port' restricts an HCA to one port
(socket interfaces are matched with port -1, so a port there means nothing). The models are
cmodel.parse_string_list_*, match_if_list and if_selector; the citations are ncclsrc.IF_CITES.

Each check returns [(severity, message)]: a note saying what the value selects (on the given devices
when they are known), a warning for the prefix trap and for parts NCCL ignores or cannot match, an
error where NCCL would select nothing (NCCL_SOCKET_IFNAME: init fails; NCCL_IB_HCA: the IB transport
finds no device and NCCL falls back to TCP sockets).
"""

from __future__ import annotations

from . import cmodel
from .ncclsrc import (
    IF_PREFIX_MAX,
    MAX_IFS,
    cite,
    if_auto,
    if_key,
    if_parser,
    if_rules_tag,
    max_ib_devs,
    skips_not_running,
    vstr,
)


def parse_devices(items, with_port: bool) -> list[tuple[str, int]]:
    """'eth0' or, for HCAs, 'mlx5_0:1' (no port: port 1) -> [(name, port)]."""
    out = []
    for item in items:
        name, _, port = str(item).partition(":")
        if with_port:
            out.append((name, int(port) if port.strip().isdigit() else 1))
        else:
            out.append((name, -1))
    return out


def check(name: str, value: str, version: tuple, devices=None) -> list:
    """NCCL_SOCKET_IFNAME / NCCL_IB_HCA. devices: the node's interface names, or its HCA ports as
    'mlx5_0:1' (None = unknown)."""
    tag, _ = if_rules_tag(version)
    ib = name == "NCCL_IB_HCA"
    if not ib and len(value) <= 1:
        order = ", then ".join(if_auto(tag))
        return [
            (
                "warning",
                f"ignored: NCCL {vstr(tag)} reads NCCL_SOCKET_IFNAME only when it is "
                f"longer than one character ({cite('sock_len', tag)}); it picks an interface "
                f"itself: {order} ({cite('sock_auto', tag)})",
            )
        ]
    limit = max_ib_devs(tag) if ib else MAX_IFS
    sel = cmodel.if_selector(value, limit, if_parser(tag))
    how = f"{_reader(ib, 'not', tag)}, {_reader(ib, 'exact', tag)}, {cite('if_match', tag)}"
    out = [("note", f"NCCL {vstr(tag)} {_describe(sel, ib, tag)} ({how})")]
    out += _entry_problems(value, sel, ib, tag, limit)
    known = None if devices is None else parse_devices(devices, ib)
    out += _prefix_trap(value, sel, known, tag)
    if known is not None:
        return out + _on_node(sel, known, ib, tag)
    if not _can_select(sel, ib):
        out.append(
            (
                "error",
                f"selects no {'HCA port' if ib else 'interface'} on any node: {_nothing(ib, tag)}",
            )
        )
    return out


def _reader(ib: bool, key: str, tag) -> str:
    """The citation of the IB or the socket reader's line for key (not / exact / match)."""
    return cite(if_key(("ib_" if ib else "sock_") + key, tag), tag)


def _describe(sel, ib: bool, tag) -> str:
    excluded, exact, entries = sel
    what = "HCA ports" if ib else "interfaces"
    if not entries:
        return (
            f"selects no {what}: '^' with an empty list excludes everything "
            f"({cite('if_empty_all', tag)})"
            if excluded
            else f"selects every {what[:-1]} (an empty list does not restrict; "
            f"{cite('if_empty_all', tag)})"
        )
    names = []
    for ref, port in entries:
        one = f"'{ref}'" if exact else f"names starting with '{ref}'"
        if ib:
            one += " (any port)" if port == -1 else f" port {port}"
        names.append(one)
    listed = ", ".join(names)
    return f"selects every {what[:-1]} except {listed}" if excluded else f"selects {what}: {listed}"


def _entry_problems(value: str, sel, ib: bool, tag, limit: int) -> list:
    excluded, exact, entries = sel
    out = []
    everything = cmodel.if_selector(value, 10**6, if_parser(tag))[2]
    if len(everything) > limit:
        key = "ib_max" if ib else "max_ifs"
        out.append(
            (
                "warning",
                f"has {len(everything)} entries: NCCL {vstr(tag)} reads only the "
                f"first {limit} ({cite(if_key(key, tag), tag)}); ignored: "
                f"{', '.join(r for r, _ in everything[limit:])}",
            )
        )
    body = value.lstrip("^").lstrip("=")
    if ":" in body and not ib:
        out.append(
            (
                "note",
                f"':port' means nothing for socket interfaces: NCCL matches them with "
                f"port -1, which matches any port ({cite(if_key('sock_match', tag), tag)}, "
                f"{cite('if_port_match', tag)})",
            )
        )
    for ref, port in entries:
        out += _ref_problems(value, ref, port, ib, tag)
    if exact and entries:
        out.append(
            ("note", f"'=': names are matched exactly, not as prefixes ({cite('if_match', tag)})")
        )
    return out


def _ref_problems(value: str, ref: str, port: int, ib: bool, tag) -> list:
    """One listed name (and its :port): a name no device can have, too long, or a port that matches
    none."""
    out = []
    if ib and port == -1 and if_parser(tag) == "tok" and _empty_port(value, ref):
        out.append(
            (
                "note",
                f"'{ref}:' with no port: NCCL {vstr(tag)} reads it as any port "
                f"({cite('if_port_tok', tag)}); NCCL up to 2.27 reads port 0, which matches none",
            )
        )
    bad = _implausible(ref)
    if bad:
        out.append(
            (
                "warning",
                f"'{ref}' {bad}, so it matches no device name "
                f"({cite('if_parse', tag)}, {cite('if_match', tag)})",
            )
        )
    if len(ref) > IF_PREFIX_MAX:
        out.append(
            (
                "warning",
                f"'{ref[:20]}...' is longer than {IF_PREFIX_MAX} characters: "
                + (
                    "NCCL cuts it there"
                    if if_parser(tag) == "tok"
                    else "NCCL writes past its 64-byte name buffer (undefined behaviour)"
                )
                + f" ({cite('if_parse', tag)})",
            )
        )
    if ib and port != -1 and port < 1:
        why = (
            f"; NCCL {vstr(tag)} reads an empty port as atoi('') = 0 "
            f"({cite('if_port_scan', tag)}); 2.30.7 reads it as any port"
            if port == 0 and if_parser(tag) == "scan" and _empty_port(value, ref)
            else ""
        )
        out.append(
            (
                "warning",
                f"'{ref}' port {port} matches no port: ports are numbered "
                f"from 1 ({cite(if_key('ib_ports', tag), tag)}) and only -1 means any "
                f"({cite('if_port_match', tag)}){why}",
            )
        )
    return out


def _empty_port(value: str, ref: str) -> bool:
    return any(e.split(":")[0] == ref and e.split(":")[1:2] == [""] for e in value.split(","))


def _implausible(ref: str) -> str:
    if any(ch.isspace() for ch in ref):
        return "contains a space (NCCL keeps it as part of the name)"
    if ref[:1] in "^=":
        return f"starts with '{ref[0]}' ('^' must come first, then '=', once, for the whole list)"
    return ""


def _trailing_number(ref: str) -> str:
    digits = len(ref) - len(ref.rstrip("0123456789"))
    return ref[len(ref) - digits :] if digits else ""


def _prefix_trap(value: str, sel, known, tag) -> list:
    """A listed name ending in a number is also a prefix of longer numbers (mlx5_1: mlx5_10..19)."""
    excluded, exact, entries = sel
    if exact:
        return []
    out = []
    verb = "excludes" if excluded else "selects"
    fix = "^=" + value[1:] if excluded else "=" + value
    for ref, port in entries:
        number = _trailing_number(ref)
        if not number or _implausible(ref) or (port != -1 and port < 1):
            continue  # not a number, or the entry matches nothing anyway
        more = sorted({n for n, _ in known or () if n != ref and n.startswith(ref)})
        if more:
            out.append(
                (
                    "warning",
                    f"'{ref}' is a prefix: on this node NCCL also {verb} "
                    f"{', '.join(more)} ({cite('if_match', tag)}); write '{fix}'",
                )
            )
        elif number.startswith("0"):
            continue  # mlx5_0, eth0: no longer number starts with 0
        elif known is None:
            out.append(
                (
                    "warning",
                    f"'{ref}' is a prefix: NCCL also {verb} {ref}0..{ref}9 and "
                    f"any other name starting with {ref} ({cite('if_match', tag)}); for "
                    f"exactly these names write '{fix}'",
                )
            )
        else:
            out.append(
                (
                    "note",
                    f"'{ref}' is a prefix ({cite('if_match', tag)}): no other name here "
                    f"starts with it, but on a node with {ref}0.. NCCL would also {verb[:-1]} "
                    f"those; '{fix}' says exactly these",
                )
            )
    return out


def _can_select(sel, ib: bool) -> bool:
    """Whether the value can select anything on some node (names and ports NCCL could match)."""
    excluded, _, entries = sel
    if excluded:
        return bool(entries)
    return not entries or any(
        not _implausible(r) and (not ib or p == -1 or p >= 1) for r, p in entries
    )


def _nothing(ib: bool, tag) -> str:
    if ib:
        net = "net_disabled_27" if tag >= (2, 27, 7) else "net_disabled"
        return (
            f"NCCL's IB transport finds no device ({cite(if_key('ib_none', tag), tag)}) and "
            f"NCCL moves on to the next network, TCP sockets ({cite(net, tag)})"
        )
    return (
        f"NCCL finds no socket interface and communicator init fails "
        f"('Bootstrap : no socket interface found', {cite('bootstrap_none', tag)})"
    )


def _on_node(sel, known, ib: bool, tag) -> list:
    what = "HCA ports" if ib else "interfaces"
    got = [(n, p) for n, p in known if cmodel.if_selects(sel, n, p if ib else -1)]

    def shown(devs):
        return ", ".join(f"{n}:{p}" if ib else n for n, p in devs)

    running = (
        f"; from 2.30.7 only interfaces that are RUNNING count ({cite('sock_running_30', tag)})"
        if not ib and skips_not_running(tag)
        else ""
    )
    how = _reader(ib, "match", tag) + (f", {cite('if_port_match', tag)}" if ib else "")
    if got:
        return [
            ("note", f"on this node it selects {shown(got)} (of {shown(known)}; {how}){running}")
        ]
    return [
        (
            "error",
            f"selects none of this node's {what} ({shown(known) or 'it has none'}; "
            f"{how}): {_nothing(ib, tag)}",
        )
    ]
