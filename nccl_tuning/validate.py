"""validate(env, nccl_version, production) -> [Finding]: NCCL's parsers, replayed before launch.

The rules are those read from NCCL's code at each tag (ncclsrc.TAGS), the tag at or below the
version asked for (a note says which when it is not the version itself). Severity: error = NCCL
fails communicator init or the first collective, or reads the value as something that breaks the
job; warning = NCCL warns and ignores it ("ignored: NCCL will use X"), silently does something else
than written (forced LL128, Ring+Tree re-enabled, clamping: the message says what NCCL will do), or
the setting is risky; note = harmless, worth knowing. Messages cite nccl-<tag>/file:line.

validate_env(env, version) is the entry point for the launcher: any resolved env (preset,
profile, --env, forwarded), torch-free and cheap to import.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from . import ifcheck, srcchecks, tokens
from .knowledge import (
    BUILTIN_NETS,
    DEBUGGING_CLASS,
    NAME_SINCE,
    NAMES,
    NEWEST,
    NOT_NCCL,
    REMOVED,
    REPLACEMENTS,
    SPECS,
    TORCH_NAMES,
    parse_int,
    parse_version,
    vstr,
)
from .ncclsrc import cite, if_rules_tag, rules_tag


@dataclass(frozen=True)
class Finding:
    severity: str
    variable: str
    value: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity} {self.variable}={self.value}: {self.message}"


def resolve_version(nccl_version) -> tuple[int, int, int]:
    if nccl_version is None:
        return NEWEST
    if isinstance(nccl_version, tuple):
        return nccl_version
    return parse_version(nccl_version)


def validate(
    env: dict, nccl_version=None, production: bool = True, devices: dict | None = None
) -> list[Finding]:
    """Check every NCCL_* (and PyTorch TORCH_NCCL_*) variable in env; other names are ignored.
    devices: what a node has, when known ({"NCCL_SOCKET_IFNAME": interface names,
    "NCCL_IB_HCA": ["mlx5_0:1", ...]}): those variables then say what they select there."""
    version = resolve_version(nccl_version)
    tag, note = rules_tag(version)
    out: list[Finding] = []
    if note:
        iftag = if_rules_tag(version)[0]
        if iftag != tag and {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"} & set(env):
            note += f" (NCCL_SOCKET_IFNAME and NCCL_IB_HCA with {vstr(iftag)}'s, read at that tag)"
        out.append(Finding("note", "nccl-version", vstr(version), note))
    for name in sorted(env):
        value = str(env[name])
        found = [
            Finding(sev, name, value, msg)
            for sev, msg in _check(name, value, version, tag, env, devices or {})
        ]
        if name in DEBUGGING_CLASS and name not in REMOVED and not found:
            sev = "warning" if production else "note"
            found.append(
                Finding(
                    sev,
                    name,
                    value,
                    (
                        "is in NCCL's debugging class ('use with caution': pinning it stops NCCL "
                        "from choosing the best setting and may hurt after upgrades); in "
                        "production keep it only with a measured reason"
                    ),
                )
            )
        out.extend(found)
    out.extend(_cross_checks(env, tag))
    return out


def validate_env(env: dict, version: str | None = None, production: bool = True) -> list[Finding]:
    """The whole resolved environment of a job, whatever set each variable. version None: the NCCL
    pip installed next to torch (nvidia-nccl-cu*), else the newest tag read. Non-NCCL names are
    skipped. A version string that is not a version raises NcclTuningError (a ValueError)."""
    from .knowledge import installed_nccl_version

    v = parse_version(version) if version else (installed_nccl_version() or NEWEST)
    return validate({str(k): str(val) for k, val in env.items()}, v, production)


def has_errors(findings) -> bool:
    return any(f.severity == "error" for f in findings)


def _did_you_mean(name: str, pool) -> str:
    close = difflib.get_close_matches(name, sorted(pool), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


_SOURCE_CHECKS = {
    "NCCL_NTHREADS": srcchecks.nthreads,
    "NCCL_LL128_NTHREADS": srcchecks.nthreads,
    "NCCL_MIN_NCHANNELS": srcchecks.channels,
    "NCCL_MAX_NCHANNELS": srcchecks.channels,
    "NCCL_MIN_NRINGS": srcchecks.channels,
    "NCCL_MAX_NRINGS": srcchecks.channels,
    "NCCL_BUFFSIZE": srcchecks.buffsize,
    "NCCL_LL_BUFFSIZE": srcchecks.buffsize,
    "NCCL_LL128_BUFFSIZE": srcchecks.buffsize,
    "NCCL_P2P_NET_CHUNKSIZE": srcchecks.buffsize,
    "NCCL_P2P_NVL_CHUNKSIZE": srcchecks.buffsize,
    "NCCL_P2P_PCI_CHUNKSIZE": srcchecks.buffsize,
}


def _check(
    name: str, value: str, version: tuple, tag: tuple, env: dict, devices: dict
) -> list[tuple[str, str]]:
    if not name.startswith("NCCL_"):
        if name in TORCH_NAMES or not name.startswith(("TORCH_NCCL_", "TORCH_FR_")):
            return []
        return [
            (
                "warning",
                "is not a PyTorch NCCL variable PyTorch is known to read"
                + _did_you_mean(name, TORCH_NAMES),
            )
        ]
    if name in NOT_NCCL:
        reader, instead = NOT_NCCL[name]
        sev = "warning" if reader.startswith("PyTorch") else "error"
        return [(sev, f"is not read by NCCL (read by {reader}); use {instead}")]
    if name in REMOVED:
        return [
            (
                "warning",
                f"was removed from NCCL and is ignored; use {REPLACEMENTS.get(name, 'nothing')}",
            )
        ]
    if name not in NAMES:
        return [
            (
                "error",
                f"is not a variable NCCL {vstr(NEWEST)} reads, so it has no effect"
                + _did_you_mean(name, NAMES),
            )
        ]
    since = NAME_SINCE.get(name)
    if since and since > version:
        return [
            ("warning", f"is read only since NCCL {vstr(since)}; NCCL {vstr(version)} ignores it")
        ]
    if name in ("NCCL_ALGO", "NCCL_PROTO"):
        return _check_list(name, value, tag)
    if name in _SOURCE_CHECKS:
        return _SOURCE_CHECKS[name](name, value, tag)
    if name == "NCCL_NCHANNELS_PER_NET_PEER":
        return srcchecks.per_peer(value, tag)
    if name == "NCCL_DEBUG":
        return srcchecks.debug(value, tag)
    if name == "NCCL_DEBUG_SUBSYS":
        return srcchecks.subsys(value, tag)
    if name in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL"):
        return srcchecks.level(name, value, tag, env)
    if name in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"):
        return ifcheck.check(name, value, version, devices.get(name))
    return _check_other(name, value, tag)


def _check_other(name, value, tag):
    if name == "NCCL_NET" and value.lower() not in [n.lower() for n in BUILTIN_NETS]:
        return [
            (
                "note",
                f"NCCL's own networks are {', '.join(BUILTIN_NETS)}; any other value "
                f"must be the name of a loaded network plugin or NCCL init fails",
            )
        ]
    if name == "NCCL_DEBUG_FILE" and "%p" not in value:
        return [
            (
                "warning",
                "has no %p (pid): every process on a host truncates and writes "
                "the same file; use e.g. /path/%h.%p.log",
            )
        ]
    spec = SPECS.get(name)
    if spec is None:
        return []
    if spec.kind in ("int", "bool"):
        return _check_int(value, spec, tag)
    if spec.kind == "enum":
        return _check_enum(value, spec)
    return []


def _check_list(name, value, tag):
    parsed = tokens.parse_list(name, value, tag)
    out = list(parsed.problems)
    if not parsed.ok:
        return out
    if name == "NCCL_ALGO":
        off = tokens.disabled_summary(parsed, tag)
        out.append(
            (
                "warning",
                (
                    "NCCL_ALGO only chooses among algorithms for broadcast, reduce, all_gather, "
                    "reduce_scatter and all_reduce: it does not affect all-to-all (send/recv); "
                    + (
                        "for the dense collectives it switches off what NCCL would otherwise "
                        f"pick by size and topology: {off}"
                        if off
                        else "here it disables nothing"
                    )
                ),
            )
        )
        return out
    forced = tokens.forced_ll128(parsed)
    if forced:
        how = (
            "'^' sets every protocol it does not list to 1"
            if "^" in value
            else "listing LL128 sets it to 1"
        )
        out.append(
            (
                "warning",
                (
                    f"forces LL128 on for {tokens.colls(forced)}: {how}, which skips the "
                    "platform check NCCL applies to its default value 2 "
                    f"({cite('ll128_platform', tag)}); NCCL enables LL128 by default only where "
                    "it is validated, elsewhere it risks silent data corruption"
                ),
            )
        )
    return out


def _check_int(value, spec, tag):
    """Variables whose reading code was not read per tag: the integer is read like
    every NCCL_PARAM (int_strtoll); the accepted range is NCCL's documented one."""
    v, out = srcchecks.read_int(value, spec.default if isinstance(spec.default, int) else 0, tag)
    if any(sev == "warning" for sev, _ in out) and value.strip() == "":
        return out
    accepted = _accepted_int(spec)
    where = " (documented range; the code reading it was not read per tag)"
    if spec.choices and v not in spec.choices:
        out.append(("error", f"is {v}; accepted: {accepted}{where}"))
    elif (spec.lo is not None and v < spec.lo) or (spec.hi is not None and v > spec.hi):
        out.append(("error", f"is {v}, out of range (accepted: {accepted}){where}"))
    elif spec.pow2 and v > 0 and v & (v - 1):
        out.append(("warning", f"is {v}, not a power of two; NCCL recommends powers of two"))
    elif spec.default is not None and v == spec.default and not out:
        out.append(("note", f"{v} is NCCL's default; setting it changes nothing"))
    return out


def _accepted_int(spec) -> str:
    if spec.choices:
        return ", ".join(str(c) for c in spec.choices)
    if spec.kind == "bool":
        return "0 or 1"
    lo = "" if spec.lo is None else str(spec.lo)
    hi = "" if spec.hi is None else str(spec.hi)
    rng = f"{lo}..{hi}" if hi else f">= {lo}"
    return rng + (f" {spec.unit}" if spec.unit else "") + (", a power of two" if spec.pow2 else "")


def _check_enum(value, spec):
    accepted = ", ".join(spec.choices)
    if value in spec.choices:
        return []
    folded = [c for c in spec.choices if c.lower() == value.lower()]
    if folded and not spec.case_sensitive:
        return [("note", f"NCCL compares it case-insensitively, so it means {folded[0]}")]
    if folded:
        return [
            (
                "error",
                f"NCCL compares it case-sensitively, so '{value}' is not "
                f"{folded[0]} and is ignored (accepted: {accepted})",
            )
        ]
    return [
        (
            "error",
            f"is not accepted (accepted: {accepted}"
            + ("; case-sensitive)" if spec.case_sensitive else "; case-insensitive)"),
        )
    ]


def _int_of(env, name):
    if name not in env:
        return None
    p = parse_int(str(env[name]))
    return p.value if p.digits and not p.overflow else None


def _cross_checks(env, tag) -> list[Finding]:
    out = []
    lo, hi = _int_of(env, "NCCL_MIN_NCHANNELS"), _int_of(env, "NCCL_MAX_NCHANNELS")
    if lo is not None and hi is not None and lo > hi > 0:
        out.append(
            Finding(
                "warning",
                "NCCL_MIN_NCHANNELS",
                str(env["NCCL_MIN_NCHANNELS"]),
                f"is larger than NCCL_MAX_NCHANNELS={hi}; NCCL caps it at the maximum",
            )
        )
    nt, ns = _int_of(env, "NCCL_SOCKET_NTHREADS"), _int_of(env, "NCCL_NSOCKS_PERTHREAD")
    if nt and ns and nt * ns > 64:
        out.append(
            Finding(
                "error",
                "NCCL_NSOCKS_PERTHREAD",
                str(env["NCCL_NSOCKS_PERTHREAD"]),
                f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = {nt * ns}; NCCL "
                f"accepts at most 64 sockets per connection",
            )
        )
    for name, (sev, msg) in srcchecks.chunk_clamp(env, tag):
        out.append(Finding(sev, name, str(env[name]), msg))
    return out + _list_effects(env, tag)


def _list_effects(env, tag) -> list[Finding]:
    """What NCCL_ALGO and NCCL_PROTO together leave runnable, per collective."""
    if "NCCL_ALGO" not in env and "NCCL_PROTO" not in env:
        return []
    parsed = {
        n: tokens.parse_list(n, str(env[n]), tag) if n in env else None
        for n in ("NCCL_ALGO", "NCCL_PROTO")
    }
    if any(p is not None and not p.ok for p in parsed.values()):
        return []  # init fails already; said once
    pairs, notes = tokens.effective(parsed["NCCL_ALGO"], parsed["NCCL_PROTO"], tag)
    out = [
        Finding(
            sev,
            var if var in env else next(iter(n for n in parsed if n in env)),
            str(env.get(var, env.get("NCCL_ALGO", env.get("NCCL_PROTO")))),
            msg,
        )
        for sev, msg, var in notes
    ]
    empty = [c for c, got in pairs.items() if not got]
    if empty:
        alone, _ = tokens.effective(parsed["NCCL_ALGO"], None, tag)
        blame = (
            "NCCL_ALGO"
            if "NCCL_PROTO" not in env or not all(alone[c] for c in empty)
            else "NCCL_PROTO"
        )
        blame = blame if blame in env else "NCCL_PROTO"
        out.append(Finding("error", blame, str(env[blame]), tokens.empty_message(empty, tag)))
    cond = tokens.conditional_only(pairs)
    if cond:
        var = "NCCL_ALGO" if "NCCL_ALGO" in env else "NCCL_PROTO"
        out.append(
            Finding(
                "warning",
                var,
                str(env[var]),
                (
                    f"leaves {tokens.colls(cond)} only algorithms that need particular hardware "
                    "or plugins (CollNet, NVLS, NVLSTree, PAT); where they are unavailable the "
                    "call fails with 'no algorithm/protocol available' "
                    f"({cite('no_algorithm', tag)})"
                ),
            )
        )
    return out
