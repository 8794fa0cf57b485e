"""validate(env, nccl_version, production) -> [Finding]: NCCL's parsers, replayed before launch.

Severity: error (NCCL fails, or the setting silently does something else than written),
warning (works, but likely not what was meant, or risky), note (harmless, worth knowing).
Every message names what is accepted and why.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from . import tokens
from .errors import NcclTuningError
from .knowledge import (BUILTIN_NETS, DEBUG_LEVELS, DEBUG_SUBSYS, DEBUGGING_CLASS, NAME_SINCE,
                        NAMES, NEWEST, NOT_NCCL, OLDEST, PATH_LEVELS, PATH_LEVELS_INTERNAL, REMOVED,
                        REPLACEMENTS, SPECS, TORCH_NAMES, parse_int, parse_version, vstr)

SEVERITIES = ("error", "warning", "note")


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


def validate(env: dict, nccl_version=None, production: bool = True) -> list[Finding]:
    """Check every NCCL_* (and PyTorch TORCH_NCCL_*) variable in env; other names are ignored."""
    version = resolve_version(nccl_version)
    out: list[Finding] = []
    if version > NEWEST:
        out.append(Finding("note", "nccl-version", vstr(version),
                           f"newer than the newest known rules ({vstr(NEWEST)}); checked with those"))
    elif version < OLDEST:
        out.append(Finding("note", "nccl-version", vstr(version),
                           f"older than the oldest known rules ({vstr(OLDEST)}); checked with those"))
        version = OLDEST
    rules = min(version, NEWEST)
    for name in sorted(env):
        value = str(env[name])
        found = [Finding(sev, name, value, msg) for sev, msg in _check(name, value, rules)]
        if name in DEBUGGING_CLASS and name not in REMOVED and not found:
            sev = "warning" if production else "note"
            found.append(Finding(sev, name, value, (
                "is in NCCL's debugging class ('use with caution': pinning it stops NCCL from "
                "choosing the best setting and may hurt after upgrades); in production keep it only "
                "with a measured reason")))
        out.extend(found)
    out.extend(_cross_checks(env, rules))
    return out


def has_errors(findings) -> bool:
    return any(f.severity == "error" for f in findings)


def _did_you_mean(name: str, pool) -> str:
    close = difflib.get_close_matches(name, sorted(pool), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _check(name: str, value: str, version: tuple) -> list[tuple[str, str]]:
    if not name.startswith("NCCL_"):
        if name in TORCH_NAMES or not name.startswith(("TORCH_NCCL_", "TORCH_FR_")):
            return []
        return [("warning", "is not a PyTorch NCCL variable PyTorch is known to read"
                 + _did_you_mean(name, TORCH_NAMES))]
    if name in NOT_NCCL:
        reader, instead = NOT_NCCL[name]
        sev = "warning" if reader.startswith("PyTorch") else "error"
        return [(sev, f"is not read by NCCL (read by {reader}); use {instead}")]
    if name in REMOVED:
        return [("warning", f"was removed from NCCL and is ignored; use "
                 f"{REPLACEMENTS.get(name, 'nothing')}")]
    if name not in NAMES:
        return [("error", f"is not a variable NCCL {vstr(NEWEST)} reads, so it has no effect"
                 + _did_you_mean(name, NAMES))]
    since = NAME_SINCE.get(name)
    if since and since > version:
        return [("warning", f"is read only since NCCL {vstr(since)}; NCCL {vstr(version)} "
                 f"ignores it")]
    if name in ("NCCL_ALGO", "NCCL_PROTO"):
        return _check_list(name, value, version)
    if name == "NCCL_DEBUG_SUBSYS":
        return _check_subsys(value, version)
    if name == "NCCL_NET" and value.lower() not in [n.lower() for n in BUILTIN_NETS]:
        return [("note", f"NCCL's own networks are {', '.join(BUILTIN_NETS)}; any other value "
                 f"must be the name of a loaded network plugin or NCCL init fails")]
    if name in ("NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE"):
        if "%p" not in value and name == "NCCL_DEBUG_FILE":
            return [("warning", "has no %p (pid): every process on a host truncates and writes "
                     "the same file; use e.g. /path/%h.%p.log")]
        return []
    spec = SPECS.get(name)
    if spec is None:
        return []
    if spec.kind in ("int", "bool"):
        return _check_int(name, value, spec)
    if spec.kind == "enum":
        return _check_enum(name, value, spec, version)
    if spec.kind == "level":
        return _check_level(value)
    return []


def _check_list(name, value, version):
    parsed = tokens.parse_list(name, value, version)
    if not parsed.ok:
        return parsed.problems
    out = list(parsed.problems)
    empty = tokens.empty_collectives(name, parsed, version)
    if empty:
        return out + [("error", tokens.empty_message(name, empty, version))]
    if name == "NCCL_ALGO":
        off = tokens.disabled_summary(parsed, version)
        out.append(("warning", (
            "NCCL_ALGO only chooses among algorithms for broadcast, reduce, all_gather, "
            "reduce_scatter and all_reduce: it does not affect all-to-all (send/recv); "
            + (f"for the dense collectives it switches off what NCCL would otherwise pick by "
               f"size and topology: {off}" if off else "here it disables nothing"))))
    elif not value.lstrip().startswith("^") and any("LL128" in s for s in parsed.enabled.values()) \
            and "ll128" in value.lower():
        out.append(("warning", "forces LL128 on: NCCL enables LL128 by default only on platforms "
                    "where it is validated; elsewhere it risks silent data corruption"))
    return out


def _check_subsys(value, version):
    body = value[1:] if value.startswith("^") else value
    bad, newer = [], []
    for tok in [t for t in body.split(",") if t]:
        hit = [s for s in DEBUG_SUBSYS if s.lower() == tok.lower()]
        if not hit:
            bad.append(tok)
        elif DEBUG_SUBSYS[hit[0]] > version:
            newer.append(f"{hit[0]} (needs NCCL >= {vstr(DEBUG_SUBSYS[hit[0]])})")
    out = []
    if bad:
        out.append(("warning", f"{', '.join(repr(b) for b in bad)} not a subsystem (accepted: "
                    f"{', '.join(DEBUG_SUBSYS)}; case-insensitive; '^' excludes); NCCL ignores it"))
    if newer:
        out.append(("warning", f"{', '.join(newer)}: NCCL {vstr(version)} ignores it"))
    return out


_TRUE_WORDS = ("true", "yes", "on", "false", "no", "off", "enable", "enabled", "disable")


def _check_int(name, value, spec):
    p = parse_int(value)
    accepted = _accepted_int(spec)
    if value.strip() == "":
        return [("warning", f"is empty; NCCL treats an empty value as unset (accepted: {accepted})")]
    if not p.digits:
        hint = (" (NCCL does not read words, only numbers: write 1 or 0)"
                if value.strip().lower() in _TRUE_WORDS else "")
        return [("error", f"is not an integer; NCCL's strtoll reads it as 0{hint} "
                 f"(accepted: {accepted})")]
    if p.overflow:
        return [("error", f"overflows a 64-bit integer; NCCL ignores it and keeps its default "
                 f"(accepted: {accepted})")]
    out = []
    if p.rest.strip():
        unit = " (NCCL has no size suffixes: write the number of bytes)" if \
            p.rest.strip()[:1].upper() in "KMGT" else ""
        out.append(("warning", f"NCCL reads only the leading number (strtoll base 0), so it "
                    f"becomes {p.value}{unit}"))
    v = p.value
    if spec.choices and v not in spec.choices:
        out.append(("error", f"is {v}; accepted: {accepted}. NCCL warns and replaces it"))
    elif (spec.lo is not None and v < spec.lo) or (spec.hi is not None and v > spec.hi):
        out.append(("error", f"is {v}, out of range (accepted: {accepted})"))
    elif spec.pow2 and v > 0 and v & (v - 1):
        out.append(("warning", f"is {v}, not a power of two; NCCL recommends powers of two"))
    elif spec.default is not None and v == spec.default and not out:
        base = " (parsed base 0: leading 0 is octal, 0x hex)" if value.strip() != str(v) else ""
        out.append(("note", f"{v} is NCCL's default{base}; setting it changes nothing"))
    if not out and value.strip() != str(v) and value.strip().lstrip("+") != str(v):
        out.append(("note", f"NCCL parses it as {v} (strtoll base 0: leading 0 is octal, 0x hex)"))
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


def _check_enum(name, value, spec, version):
    accepted = ", ".join(spec.choices)
    if value in spec.choices:
        if name == "NCCL_DEBUG":
            if DEBUG_LEVELS[value] > version:
                return [("error", f"{value} needs NCCL >= {vstr(DEBUG_LEVELS[value])}; NCCL "
                         f"{vstr(version)} does not know it (accepted: {accepted})")]
            if value == "TRACE":
                return [("note", "TRACE output exists only in NCCL builds made with TRACE=1; "
                         "release builds log like INFO")]
        return []
    folded = [c for c in spec.choices if c.lower() == value.lower()]
    if folded and not spec.case_sensitive:
        return [("note", f"NCCL compares it case-insensitively, so it means {folded[0]}")]
    if folded:
        return [("error", f"NCCL compares it case-sensitively, so '{value}' is not "
                 f"{folded[0]} and is ignored (accepted: {accepted})")]
    return [("error", f"is not accepted (accepted: {accepted}"
             + ("; case-sensitive)" if spec.case_sensitive else "; case-insensitive)"))]


def _check_level(value):
    accepted = ", ".join(PATH_LEVELS)
    if value in PATH_LEVELS:
        return []
    if value in PATH_LEVELS_INTERNAL:
        return [("note", f"{value} is matched by NCCL but not documented (documented: {accepted})")]
    if value.upper() in PATH_LEVELS + PATH_LEVELS_INTERNAL:
        return [("error", f"NCCL compares levels case-sensitively (strcmp), so '{value}' is "
                 f"silently ignored and NCCL keeps its automatic choice; write {value.upper()} "
                 f"(accepted: {accepted})")]
    if value[:1].isdigit():
        return [("warning", f"numeric levels are the legacy form; write a name (accepted: "
                 f"{accepted})")]
    return [("error", f"is not a path level (accepted: {accepted}; case-sensitive); NCCL "
             f"ignores it and keeps its automatic choice")]


def _int_of(env, name):
    if name not in env:
        return None
    p = parse_int(str(env[name]))
    return p.value if p.digits and not p.overflow else None


def _cross_checks(env, version) -> list[Finding]:
    out = []
    lo, hi = _int_of(env, "NCCL_MIN_NCHANNELS"), _int_of(env, "NCCL_MAX_NCHANNELS")
    if lo is not None and hi is not None and lo > hi:
        out.append(Finding("warning", "NCCL_MIN_NCHANNELS", str(env["NCCL_MIN_NCHANNELS"]),
                           f"is larger than NCCL_MAX_NCHANNELS={hi}; NCCL caps it at the maximum"))
    nt, ns = _int_of(env, "NCCL_SOCKET_NTHREADS"), _int_of(env, "NCCL_NSOCKS_PERTHREAD")
    if nt and ns and nt * ns > 64:
        out.append(Finding("error", "NCCL_NSOCKS_PERTHREAD", str(env["NCCL_NSOCKS_PERTHREAD"]),
                           f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = {nt * ns}; NCCL "
                           f"accepts at most 64 sockets per connection"))
    if "NCCL_ALGO" in env and "NCCL_PROTO" in env:
        a = tokens.parse_list("NCCL_ALGO", str(env["NCCL_ALGO"]), version)
        p = tokens.parse_list("NCCL_PROTO", str(env["NCCL_PROTO"]), version)
        if a.ok and p.ok:
            gaps = tokens.combination_gaps(a, p, version)
            if gaps:
                out.append(Finding("error", "NCCL_PROTO", str(env["NCCL_PROTO"]), (
                    f"with NCCL_ALGO={env['NCCL_ALGO']} no enabled algorithm supports an enabled "
                    f"protocol for {tokens._colls(gaps)} (CollNet, NVLS, NVLSTree and PAT run "
                    f"only with Simple); such a collective fails with 'no algorithm/protocol "
                    f"available'")))
    return out


def check_severity(sev: str) -> str:
    if sev not in SEVERITIES:
        raise NcclTuningError(f"severity {sev!r} is not one of {', '.join(SEVERITIES)}")
    return sev
