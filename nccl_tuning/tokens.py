"""NCCL_ALGO / NCCL_PROTO the way a given NCCL source tag reads and applies them.

parse_list(var, value, tag) runs the C model of that tag's parseList (cmodel.parse_list_flat up
to 2.23, cmodel.parse_list_prefixed from 2.24) and says what NCCL does with the result;
effective(algo, proto, tag) replays the enable rules of src/graph/tuning.cc (defaults, the CollNet
fallback before 2.24, Ring kept for non-allreduce in 2.18, the Ring restore of 2.21/2.23) and
returns, per collective, the algorithm/protocol pairs that can still run.
Every message names its source line (ncclsrc.cite).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import cmodel
from .ncclsrc import (
    CONDITIONAL,
    FUNCS,
    PROTOS,
    SIMPLE_ONLY,
    algorithms,
    cite,
    coll_algorithms,
    vstr,
)

PRETTY = {
    "Broadcast": "broadcast",
    "Reduce": "reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "AllReduce": "all_reduce",
}
PREFIXED_SINCE = (2, 24, 3)


@dataclass
class ParsedList:
    values: dict[str, dict[str, int]]  # collective -> element -> 0 | 1 | 2 (2: LL128 default)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (severity, message)
    ignored: list[str] = field(default_factory=list)  # tokens NCCL skipped

    @property
    def ok(self) -> bool:
        return not any(sev == "error" for sev, _ in self.problems)

    def enabled(self, coll: str) -> set[str]:
        return {e for e, v in self.values[coll].items() if v}


def elements(var: str, tag) -> tuple:
    return algorithms(tag) if var == "NCCL_ALGO" else PROTOS


def default_values(var: str, tag) -> dict:
    """ll128_default: every element 1, except LL128 2 ('only where the platform allows')."""
    return {c: {e: (2 if e == "LL128" else 1) for e in elements(var, tag)} for c in FUNCS}


def colls(names) -> str:
    return ", ".join(PRETTY[c] for c in names)


def parse_list(var: str, value: str, tag) -> ParsedList:
    elems = elements(var, tag)
    kind = "algorithm" if var == "NCCL_ALGO" else "protocol"
    if tag < PREFIXED_SINCE:
        return _parse_flat(value, tag, elems, kind)
    start = [v for c in FUNCS for v in default_values(var, tag)[c].values()]
    flat, problem = cmodel.parse_list_prefixed(value, [f for f in FUNCS], elems, start)
    n = len(elems)
    out = ParsedList({c: dict(zip(elems, flat[i * n : (i + 1) * n])) for i, c in enumerate(FUNCS)})
    if problem:
        out.problems.append(("error", _prefixed_error(problem, kind, ", ".join(elems), tag)))
    return out


def _parse_flat(value: str, tag, elems: tuple, kind: str) -> ParsedList:
    """Before 2.24.3: one list for every collective; unknown tokens are skipped with a warning."""
    accepted = ", ".join(elems)
    flat = cmodel.parse_list_flat(value, elems)
    out = ParsedList({c: dict(zip(elems, flat)) for c in FUNCS})
    body = value[1:] if value.startswith("^") else value
    out.ignored = [
        t for _, t in cmodel.strtok(body, ",") if not any(cmodel.strcasecmp_eq(t, e) for e in elems)
    ]
    if out.ignored:
        now = ", ".join(e for e in elems if out.values["AllReduce"][e]) or "none"
        syntax = (
            " (the per-collective 'coll:list;...' form needs NCCL >= 2.24)"
            if any(":" in t or ";" in t for t in out.ignored)
            else ""
        )
        out.problems.append(
            (
                "warning",
                (
                    f"ignored: {', '.join(repr(t) for t in out.ignored)} is not a {kind} NCCL "
                    f"{vstr(tag)} knows{syntax}; NCCL will use {kind}s {now} (accepted: "
                    f"{accepted}; case-insensitive; '^' excludes; unknown tokens are skipped: "
                    f"{cite('list_strtok', tag)})"
                ),
            )
        )
    if value == "":
        out.problems.append(
            (
                "warning",
                (
                    f"is set but empty: NCCL {vstr(tag)} still parses it and disables every {kind} "
                    f"({cite('parse_list', tag)})"
                ),
            )
        )
    return out


def _prefixed_error(problem: tuple, kind: str, accepted: str, tag) -> str:
    """From 2.24.3 a bad 'coll:list;...' fails communicator init: what is wrong, and NCCL's line for
    it."""
    what, tok = problem
    if what == "first-prefix":
        return (
            f"entry {tok!r} has no 'collective:' prefix but is not the first entry (a "
            f"leading ';' counts: {cite('fulltoken_check', tag)}); NCCL {vstr(tag)} fails "
            f"communicator init ('All entries except the first must have a prefix', "
            f"{cite('first_prefix', tag)})"
        )
    if what == "crash":
        return (
            f"its first entry {tok!r} is made only of ':': NCCL {vstr(tag)} takes the prefix "
            f"as the list, finds none, and reads elemList[0] through a NULL pointer "
            f"({cite('elemlist_null', tag)}): the process crashes (SIGSEGV) at "
            f"communicator init"
        )
    if what == "prefix":
        return (
            f"{tok!r} is not a collective (accepted prefixes: "
            f"{', '.join(f.lower() for f in FUNCS)}; case-insensitive); NCCL {vstr(tag)} "
            f"fails communicator init ('Unrecognized prefix token', "
            f"{cite('unknown_prefix', tag)})"
        )
    known = [e for e in algorithms((9, 0, 0)) if cmodel.strcasecmp_eq(tok, e)]
    why = f"{known[0]} needs a newer NCCL" if known else f"not a {kind}"
    return (
        f"{tok!r} is {why} (accepted: {accepted}; case-insensitive; '^' excludes; "
        f"no spaces); NCCL {vstr(tag)} fails communicator init ('Unrecognized element "
        f"token', {cite('unknown_element', tag)})"
    )


def effective(algo: ParsedList | None, proto: ParsedList | None, tag):
    """-> (pairs, notes): pairs[coll] = {(algo, proto)} NCCL can still pick (LL128 at 2 counts: the
    platform decides); notes = [(severity, message, blamed var)] for the fallbacks that fired."""
    a_vals = algo.values if algo else default_values("NCCL_ALGO", tag)
    p_vals = proto.values if proto else default_values("NCCL_PROTO", tag)
    a_vals = {c: dict(v) for c, v in a_vals.items()}
    notes = []
    if tag < PREFIXED_SINCE and algo is not None:
        v = a_vals["AllReduce"]
        if not any(v.get(x) for x in ("Ring", "Tree", "NVLS", "NVLSTree")):
            for c in FUNCS:
                a_vals[c]["Ring"] = a_vals[c]["Tree"] = 1
            notes.append(
                (
                    "warning",
                    (
                        "leaves none of Ring, Tree, NVLS, NVLSTree enabled: where CollNet is "
                        f"not supported (no CollNet plugin), NCCL {vstr(tag)} silently "
                        f"re-enables Ring and Tree ({cite('collnet_fallback', tag)})"
                    ),
                    "NCCL_ALGO",
                )
            )
    pairs, restored = {}, []
    for c in FUNCS:
        got = set()
        for a in coll_algorithms(c, tag) & set(algorithms(tag)):
            on = a_vals[c][a] or (tag < (2, 21, 5) and a == "Ring" and c != "AllReduce")
            if not on:
                continue
            for p in PROTOS:
                if p_vals[c][p] and not (a in SIMPLE_ONLY and p != "Simple"):
                    got.add((a, p))
        if not got and (2, 21, 5) <= tag < PREFIXED_SINCE:
            got = _ring_restore(p_vals[c], tag)
            if got:
                restored.append(c)
        pairs[c] = got
    if restored:
        notes.append(_restore_note(restored, pairs, p_vals, tag))
    if tag < (2, 21, 5) and algo is not None:
        kept = [c for c in FUNCS if c != "AllReduce" and not a_vals[c]["Ring"]]
        if kept:
            notes.append(
                (
                    "note",
                    (
                        f"does not switch Ring off for {colls(kept)}: NCCL {vstr(tag)} never "
                        f"disables Ring outside all_reduce ({cite('ring_never_disabled', tag)})"
                    ),
                    "NCCL_ALGO",
                )
            )
    return pairs, notes


def _ring_restore(p_vals, tag) -> set:
    """check_avail in 2.21/2.23: a collective with nothing left gets Ring back (ring_restore);
    2.23 zeroes ringbdw for disabled protocols first (ringbdw_zero), 2.21 does not."""
    if tag >= (2, 23, 4):
        return {("Ring", p) for p in PROTOS if p_vals[p]}
    return {("Ring", p) for p in PROTOS}


def _restore_note(restored, pairs, p_vals, tag):
    protos = sorted({p for c in restored for _, p in pairs[c]})
    extra = (
        "; LL128 included without its platform check, since 2.21 does not clear the Ring "
        "bandwidths of disabled protocols (fixed in 2.23)"
        if tag < (2, 23, 4)
        else ""
    )
    blame = "NCCL_PROTO" if not any(any(p_vals[c].values()) for c in restored) else "NCCL_ALGO"
    return (
        "warning",
        (
            f"leaves {colls(restored)} with nothing enabled: NCCL {vstr(tag)} silently falls "
            f"back to Ring with {', '.join(protos)} ({cite('ring_restore', tag)}){extra}"
        ),
        blame,
    )


def empty_message(empty, tag) -> str:
    return (
        f"leaves {colls(empty)} with no algorithm/protocol pair NCCL {vstr(tag)} can run "
        f"(CollNet, NVLS, NVLSTree and PAT run only with Simple; Broadcast and Reduce only "
        f"with Ring): the first such call fails with 'no algorithm/protocol available' "
        f"({cite('no_algorithm', tag)}), while all-to-all (send/recv) keeps working and hides it"
    )


def conditional_only(pairs) -> list[str]:
    return [c for c, got in pairs.items() if got and {a for a, _ in got} <= CONDITIONAL]


def forced_ll128(parsed: ParsedList) -> list[str]:
    """Collectives where LL128 went from 2 (platform check) to 1 (forced on)."""
    return [c for c in FUNCS if parsed.values[c].get("LL128") == 1]


def disabled_summary(parsed: ParsedList, tag) -> str:
    """'all_reduce: NVLS, Tree; all_gather, reduce_scatter: PAT' -- what NCCL_ALGO switches off."""
    groups: dict[tuple, list[str]] = {}
    for c in FUNCS:
        off = tuple(
            sorted(
                a
                for a in coll_algorithms(c, tag) & set(algorithms(tag))
                if not parsed.values[c].get(a)
            )
        )
        if off:
            groups.setdefault(off, []).append(c)
    return "; ".join(f"{colls(cs)}: {', '.join(off)}" for off, cs in groups.items())
