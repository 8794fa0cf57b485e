"""Simulation of NCCL's NCCL_ALGO / NCCL_PROTO list parser, per NCCL version.

parse_list(var, value, version) returns what NCCL would enable for each collective plus the
problems NCCL would hit (see knowledge.py for the parser rules mirrored here).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .knowledge import (ALGORITHMS, ALGO_PROTOCOLS, COLLECTIVES, PER_COLLECTIVE_SINCE, PROTOCOLS,
                        STRICT_TOKENS_SINCE, vstr)

PRETTY = {"Broadcast": "broadcast", "Reduce": "reduce", "AllGather": "all_gather",
          "ReduceScatter": "reduce_scatter", "AllReduce": "all_reduce"}


@dataclass
class ParsedList:
    enabled: dict[str, set[str]]                 # collective -> enabled elements (canonical names)
    problems: list[tuple[str, str]] = field(default_factory=list)   # (severity, message)

    @property
    def ok(self) -> bool:
        return not any(sev == "error" for sev, _ in self.problems)


def elements(var: str) -> dict[str, tuple]:
    return ALGORITHMS if var == "NCCL_ALGO" else PROTOCOLS


def available(var: str, version: tuple) -> list[str]:
    return [e for e, since in elements(var).items() if since <= version]


def supported(coll: str, version: tuple) -> set[str]:
    """Algorithms NCCL `version` implements for collective `coll`."""
    return {a for a, since in COLLECTIVES[coll].items()
            if since <= version and ALGORITHMS[a] <= version}


def _accepted(var: str, version: tuple) -> str:
    return ", ".join(available(var, version))


def _match(token: str, names: list[str]) -> str | None:
    for name in names:
        if token.lower() == name.lower():          # strcasecmp
            return name
    return None


def _unknown_text(var: str, tokens: list[str], version: tuple) -> str:
    kind = "an algorithm" if var == "NCCL_ALGO" else "a protocol"
    parts = []
    for tok in tokens:
        newer = _match(tok, list(elements(var)))
        if newer and newer == tok:
            parts.append(f"'{tok}' needs NCCL >= {vstr(elements(var)[newer])}")
        elif newer:
            parts.append(f"'{tok}' ({newer}) needs NCCL >= {vstr(elements(var)[newer])}")
        else:
            parts.append(f"'{tok}' is not {kind}")
    return "; ".join(parts)


def _apply_entry(var, elem_list, colls, enabled, version, unknown):
    names = available(var, version)
    unset = elem_list.startswith("^")
    body = elem_list[1:] if unset else elem_list
    for c in colls:
        enabled[c] = set(names) if unset else set()
    for tok in [t for t in body.split(",") if t]:          # strtok skips empty tokens
        name = _match(tok, names)
        if name is None:
            unknown.append(tok)
            continue
        for c in colls:
            (enabled[c].discard if unset else enabled[c].add)(name)


def parse_list(var: str, value: str, version: tuple) -> ParsedList:
    names = available(var, version)
    enabled = {c: set(names) for c in COLLECTIVES}
    result = ParsedList(enabled)
    unknown: list[str] = []
    strict = version >= STRICT_TOKENS_SINCE
    accepted = _accepted(var, version)
    if version >= PER_COLLECTIVE_SINCE:
        entries = [e for e in value.split(";") if e]
        if not entries:
            entries = [""]
        for i, entry in enumerate(entries):
            prefix, sep, elem_list = entry.partition(":")
            if not sep:
                if i > 0:
                    result.problems.append(("error", (
                        f"every entry except the first must name a collective "
                        f"(e.g. 'allreduce:tree,ring;allgather:ring'); NCCL {vstr(version)} fails "
                        f"communicator init ('All entries except the first must have a prefix')")))
                    return result
                prefix, elem_list = None, entry
            colls = list(COLLECTIVES) if prefix is None else [c for c in COLLECTIVES
                                                               if c.lower() == prefix.lower()]
            if not colls:
                result.problems.append(("error", (
                    f"'{prefix}' is not a collective (accepted prefixes: "
                    f"{', '.join(c.lower() for c in COLLECTIVES)}; case-insensitive); NCCL "
                    f"{vstr(version)} fails communicator init ('Unrecognized prefix token')")))
                return result
            _apply_entry(var, elem_list.split(":")[0], colls, enabled, version, unknown)
    else:
        if ":" in value or ";" in value:
            result.problems.append(("error", (
                f"the per-collective syntax 'collective:list;...' needs NCCL >= "
                f"{vstr(PER_COLLECTIVE_SINCE)}; NCCL {vstr(version)} reads each entry as one "
                f"unknown token and ignores it silently, so the setting does not do what it says")))
            return result
        _apply_entry(var, value, list(COLLECTIVES), enabled, version, unknown)
    if unknown:
        text = _unknown_text(var, unknown, version)
        what = "algorithms" if var == "NCCL_ALGO" else "protocols"
        if strict:
            result.problems.append(("error", (
                f"{text} (accepted: {accepted}; case-insensitive; '^' excludes); NCCL "
                f"{vstr(version)} fails communicator init with 'Unrecognized element token'")))
        else:
            empty = [c for c in COLLECTIVES if not _usable(var, c, enabled[c], version)]
            if empty:
                result.problems.append(("error", (
                    f"{text} (accepted: {accepted}; case-insensitive; '^' excludes); NCCL "
                    f"{vstr(version)} ignores unknown tokens silently, which leaves no {what} "
                    f"enabled for {_colls(empty)}: the first such collective fails with 'no "
                    f"algorithm/protocol available' while all-to-all (send/recv) keeps working "
                    f"and hides it")))
            else:
                result.problems.append(("warning", (
                    f"{text} (accepted: {accepted}); NCCL {vstr(version)} ignores it silently")))
    return result


def _usable(var, coll, enabled, version) -> bool:
    if var == "NCCL_ALGO":
        return bool(enabled & supported(coll, version))
    return bool(enabled)


def _colls(colls) -> str:
    return ", ".join(PRETTY[c] for c in colls)


def empty_collectives(var: str, parsed: ParsedList, version: tuple) -> list[str]:
    return [c for c in COLLECTIVES if not _usable(var, c, parsed.enabled[c], version)]


def empty_message(var: str, colls: list[str], version: tuple) -> str:
    if var == "NCCL_ALGO":
        need = "; ".join(f"{PRETTY[c]} supports {', '.join(sorted(supported(c, version)))}"
                         for c in colls)
        return (f"leaves {_colls(colls)} with no algorithm ({need} in NCCL {vstr(version)}); "
                f"such a collective fails with 'no algorithm/protocol available'")
    return (f"leaves {_colls(colls)} with no protocol (accepted: {_accepted(var, version)}); "
            f"such a collective fails with 'no algorithm/protocol available'")


def disabled_summary(parsed: ParsedList, version: tuple) -> str:
    """'all_reduce: Tree, NVLS; all_gather, reduce_scatter: PAT' -- what NCCL_ALGO switches off."""
    groups: dict[tuple, list[str]] = {}
    for c in COLLECTIVES:
        off = tuple(sorted(supported(c, version) - parsed.enabled[c]))
        if off:
            groups.setdefault(off, []).append(c)
    return "; ".join(f"{_colls(cs)}: {', '.join(off)}" for off, cs in groups.items())


def combination_gaps(algos: ParsedList, protos: ParsedList, version: tuple) -> list[str]:
    """Collectives where no enabled algorithm supports any enabled protocol."""
    gaps = []
    for c in COLLECTIVES:
        ok = any(protos.enabled[c] & ALGO_PROTOCOLS[a]
                 for a in algos.enabled[c] & supported(c, version))
        if not ok and algos.enabled[c] & supported(c, version) and protos.enabled[c]:
            gaps.append(c)
    return gaps
