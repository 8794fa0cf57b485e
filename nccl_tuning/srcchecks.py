"""Per-variable checks read from NCCL's code, per tag (see ncclsrc for the citations).

Each check returns [(severity, message)]. Severity follows what NCCL does:
error = communicator init or the first collective fails (or a value whose plain reading by NCCL
cannot be what was meant and breaks the job); warning = NCCL warns and ignores it ("ignored: NCCL
will use X") or silently does something other than written (says what NCCL will actually do).
"""

from __future__ import annotations

from . import cmodel
from .ncclsrc import (
    DEFAULT_BUFFSIZE,
    DEFAULT_NET_CHUNK,
    LEGACY_LEVELS,
    LL128_NTHREADS,
    NCCL_STEPS,
    NTHREADS,
    WARP_SIZE,
    cite,
    debug_levels,
    debug_subsys,
    maxchannels,
    path_levels,
    per_peer_default,
    vstr,
)


def read_int(value: str, default: int, tag) -> tuple[int, list]:
    """ncclLoadParam (int_empty, int_strtoll): -> (value NCCL uses, problems)."""
    if value == "":
        return default, [
            ("warning", f"is empty: NCCL treats an empty value as unset ({cite('int_empty', tag)})")
        ]
    v, end, erange = cmodel.strtoll(value)
    if erange:
        return default, [
            (
                "warning",
                f"ignored: overflows a 64-bit integer, NCCL will use its "
                f"default ({cite('int_strtoll', tag)}: errno -> default)",
            )
        ]
    if end == 0:
        return 0, [
            (
                "warning",
                f"is not a number: NCCL's strtoll reads it as 0 "
                f"({cite('int_strtoll', tag)}); NCCL does not read words like true/yes",
            )
        ]
    rest = value[end:]
    if rest:
        return v, [
            (
                "warning",
                f"NCCL reads only the leading number (strtoll base 0, "
                f"{cite('int_strtoll', tag)}), so it becomes {v}",
            )
        ]
    if value.strip() not in (str(v), "+" + str(v)):
        return v, [
            (
                "note",
                f"NCCL parses it as {v} (strtoll base 0: leading 0 is octal, 0x hex; "
                f"{cite('int_strtoll', tag)})",
            )
        ]
    return v, []


def nthreads(name: str, value: str, tag) -> list:
    """get_nthreads + nthreads_call / ll128_nthreads_call (NCCL_NTHREADS, NCCL_LL128_NTHREADS)."""
    v, out = read_int(value, -2, tag)
    lo, hi = LL128_NTHREADS if name == "NCCL_LL128_NTHREADS" else NTHREADS
    nt = cmodel.to_int(v)
    got = cmodel.get_nthreads(nt, lo, hi, -2)
    call = cite("ll128_nthreads_call" if name == "NCCL_LL128_NTHREADS" else "nthreads_call", tag)
    src = f"{cite('get_nthreads', tag)}, {call}"
    if nt <= 0:
        return out + [("note", f"{nt} is not positive: NCCL uses its automatic default ({src})")]
    if got != nt:
        why = (
            f"not a multiple of {WARP_SIZE}"
            if nt % WARP_SIZE
            else f"above the maximum {hi}"
            if nt > hi
            else f"below the minimum {lo}"
        )
        return out + [
            (
                "warning",
                f"ignored: {nt} is {why}; NCCL warns and will use {got} "
                f"(accepted: multiples of {WARP_SIZE} in {lo}..{hi}; {src})",
            )
        ]
    return out


def channels(name: str, value: str, tag) -> list:
    """min_nchannels_clamp / min_nchannels_neg / max_nchannels_clamp / max_nchannels_one."""
    v, out = read_int(value, -2, tag)
    v = cmodel.to_int(v)
    top = maxchannels(tag)
    if name in ("NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS"):
        if v > top:
            return out + [
                (
                    "warning",
                    f"{v} is above MAXCHANNELS={top} of NCCL {vstr(tag)}: NCCL "
                    f"clamps it to {top} ({cite('min_nchannels_clamp', tag)})",
                )
            ]
        if v < 0 and v != -2:
            return out + [
                (
                    "warning",
                    f"ignored: negative; NCCL will use 0 ({cite('min_nchannels_neg', tag)})",
                )
            ]
        return out
    if v == -2:
        return out
    if v > top:
        return out + [
            (
                "warning",
                f"{v} is above MAXCHANNELS={top} of NCCL {vstr(tag)}: NCCL "
                f"clamps it to {top} ({cite('max_nchannels_clamp', tag)})",
            )
        ]
    if v < 1:
        return out + [
            (
                "warning",
                f"ignored: {v} is below 1; NCCL will use 1 channel "
                f"({cite('max_nchannels_one', tag)})",
            )
        ]
    return out


def per_peer(value: str, tag) -> list:
    """per_peer_param / per_peer_auto / per_peer_shrink."""
    v, out = read_int(value, -1, tag)
    key = "per_peer_param_30" if tag >= (2, 30, 7) else "per_peer_param"
    if per_peer_default(tag) == "2":
        return out + (
            [("note", f"2 is NCCL {vstr(tag)}'s default ({cite(key, tag)})")] if v == 2 else []
        )
    shrink = (
        f"; with more than one node it also stops NCCL from lowering the per-peer count to "
        f"fit all peers in one round ({cite('per_peer_shrink', tag)})"
        if tag >= (2, 30, 7)
        else ""
    )
    return out + [
        (
            "warning",
            f"replaces NCCL {vstr(tag)}'s automatic per-peer channel count "
            f"(default unset = automatic: scaled with the NIC count and the number of "
            f"ranks, {cite('per_peer_auto', tag)}) by a fixed {v}{shrink}",
        )
    ]


def buffsize(name: str, value: str, tag) -> list:
    """buffsize_param / buffsize_use: used as given, no unit, no lower bound."""
    v, out = read_int(value, -2, tag)
    raw = value.strip()
    if raw[:1].isdigit() and raw.rstrip("bB")[-1:].upper() in ("K", "M", "G", "T"):
        return [
            (
                "error",
                f"NCCL has no size suffixes: it reads {value!r} as {v} bytes and uses "
                f"that as the buffer ({cite('int_strtoll', tag)}, {cite('buffsize_use', tag)}); "
                f"write the number of bytes, e.g. {_bytes(raw)}",
            )
        ]
    if v == -2:
        return out
    if v <= 0:
        return out + [
            (
                "error",
                f"{v}: NCCL uses the value as the buffer size as given "
                f"({cite('buffsize_use', tag)}); only -2 means default; use a positive "
                f"number of bytes",
            )
        ]
    if name == "NCCL_BUFFSIZE" and v == DEFAULT_BUFFSIZE:
        return out + [
            (
                "note",
                f"{v} is NCCL's default ({cite('buffsize_default', tag)}); setting "
                f"it changes nothing",
            )
        ]
    return out


def _bytes(raw: str) -> str:
    digits = "".join(ch for ch in raw if ch.isdigit())
    unit = raw.rstrip("bB")[-1:].upper()
    return str(int(digits or 0) << {"K": 10, "M": 20, "G": 30, "T": 40}[unit])


def debug(value: str, tag) -> list:
    """debug_levels (strcasecmp up to 2.27) / debug_level_param + enum_resolve (2.30)."""
    names = debug_levels(tag)
    if tag >= (2, 30, 7):
        if cmodel.one_of30(value, names) is None:
            return [
                (
                    "warning",
                    f"ignored: not a level; NCCL {vstr(tag)}'s parser rejects it "
                    f"({cite('enum_resolve', tag)}, {cite('debug_level_param', tag)}) and logs "
                    f"only what it logs unset (accepted: {', '.join(names)}; case-insensitive)",
                )
            ]
        token = cmodel.trim30(value)
    else:
        if cmodel.debug_level_old(value, names) is None:
            return [
                (
                    "warning",
                    f"ignored: not a level; NCCL {vstr(tag)} matches none "
                    f"({cite('debug_levels', tag)}), keeps the level at -1 "
                    f"({cite('debug_level_unset', tag)}) and prints nothing (accepted: "
                    f"{', '.join(names)}; case-insensitive, no spaces)",
                )
            ]
        token = value
    out = []
    if token != token.upper():
        out.append(("note", f"NCCL compares it case-insensitively, so it means {token.upper()}"))
    if token.upper() == "TRACE":
        out.append(
            (
                "note",
                "TRACE output exists only in NCCL builds made with TRACE=1; release "
                "builds log like INFO",
            )
        )
    return out


def subsys(value: str, tag) -> list:
    """debug_subsys_strtok (unknown names skipped) / debug_subsys_param + bitset_reject (2.30)."""
    names = debug_subsys(tag)
    opts = [(n, (1 << 64) - 1 if n == "ALL" else 1 << i) for i, n in enumerate(names)]
    body = value[1:] if value.startswith("^") else value
    if tag >= (2, 30, 7):
        if cmodel.bitset30(value, opts) is None:
            bad = [
                t.strip()
                for t in body.split(",")
                if t.strip() and not any(cmodel.iequals30(n, t.strip()) for n in names)
            ]
            return [
                (
                    "warning",
                    f"ignored: {', '.join(repr(b) for b in bad)} is not a subsystem of "
                    f"NCCL {vstr(tag)}, and one bad name rejects the whole value "
                    f"({cite('bitset_reject', tag)}): none of it is applied; the parameter's "
                    f"default is INIT,BOOTSTRAP,ENV ({cite('debug_subsys_param', tag)}) "
                    f"(accepted: {', '.join(names)}; case-insensitive; '^' first excludes)",
                )
            ]
        mask = cmodel.bitset30(value, opts)
    else:
        bad = [
            t
            for _, t in cmodel.strtok(body, ",")
            if not any(cmodel.strcasecmp_eq(t, n) for n in names)
        ]
        if bad:
            return [
                (
                    "warning",
                    f"ignored: {', '.join(repr(b) for b in bad)} is not a subsystem of "
                    f"NCCL {vstr(tag)}; NCCL skips it and uses the others "
                    f"({cite('debug_subsys_strtok', tag)}; accepted: {', '.join(names)}; "
                    f"case-insensitive, no spaces; '^' first excludes)",
                )
            ]
        mask = cmodel.debug_subsys_old(value, opts)
    if mask == 0:
        src = cite("debug_subsys_param" if tag >= (2, 30, 7) else "debug_subsys_strtok", tag)
        return [("warning", f"selects no subsystem: NCCL will print no INFO line at all ({src})")]
    return []


def level(name: str, value: str, tag, env: dict) -> list:
    """level_strcmp / level_legacy / level_table / p2p_disable (NCCL_P2P_LEVEL,
    NCCL_NET_GDR_LEVEL)."""
    names = path_levels(tag)
    if name == "NCCL_P2P_LEVEL" and "NCCL_P2P_DISABLE" in env:
        v, _, _ = cmodel.strtoll(str(env["NCCL_P2P_DISABLE"]))
        if cmodel.to_int(v) == 1:
            return [
                (
                    "warning",
                    f"ignored: NCCL_P2P_DISABLE=1 wins; NCCL will use level LOC "
                    f"(P2P off) ({cite('p2p_disable', tag)})",
                )
            ]
    got = cmodel.get_level(value, names, LEGACY_LEVELS)
    accepted = ", ".join(names)
    if got is None:
        case = (
            f"; levels are compared case-sensitively, write {value.upper()}"
            if value.upper() in names
            else ""
        )
        return [
            (
                "warning",
                f"ignored: not a path level of NCCL {vstr(tag)} "
                f"({cite('level_strcmp', tag)}){case}; NCCL will keep its automatic choice "
                f"(accepted: {accepted}, or a legacy number)",
            )
        ]
    if isinstance(got, str) and value not in names:
        return [
            (
                "note",
                f"legacy number: NCCL reads it as {got} ({cite('level_legacy', tag)}, "
                f"{cite('level_table', tag)}); write the name",
            )
        ]
    return []


def chunk_clamp(env: dict, tag) -> list:
    """chunk_clamp: a p2p chunk larger than BUFFSIZE/NCCL_STEPS is cut down (from 2.21)."""
    if tag < (2, 21, 5):
        return []
    bs = env.get("NCCL_BUFFSIZE")
    buff = DEFAULT_BUFFSIZE if bs is None else cmodel.load_param(str(bs), -2)
    buff = DEFAULT_BUFFSIZE if buff == -2 else buff
    out = []
    for name in ("NCCL_P2P_NET_CHUNKSIZE", "NCCL_P2P_NVL_CHUNKSIZE", "NCCL_P2P_PCI_CHUNKSIZE"):
        if name not in env or buff <= 0:
            continue
        chunk = cmodel.to_int(cmodel.load_param(str(env[name]), DEFAULT_NET_CHUNK))
        if chunk * NCCL_STEPS > buff:
            out.append(
                (
                    name,
                    (
                        "warning",
                        f"{chunk} x NCCL_STEPS ({NCCL_STEPS}) is more than the "
                        f"{buff}-byte NCCL_BUFFSIZE: NCCL clamps the chunk to "
                        f"{buff // NCCL_STEPS} ({cite('chunk_clamp', tag)})",
                    ),
                )
            )
    return out
