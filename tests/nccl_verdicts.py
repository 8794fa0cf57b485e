"""Tables of NCCL parser verdicts: inputs and the verdict NCCL's code gives them, per parser and tag.

What is recorded here replaces a differential harness that compiled NCCL's C parsers (parseList and
getNthreads of src/graph/tuning.cc, ncclLoadParam of src/misc/param.cc, the NCCL_DEBUG_SUBSYS loop of
src/debug.cc up to 2.27, the 2.30 enum/bitset parsers of src/include/param/) and compared them with
nccl_tuning.cmodel on 1,200 seeded values per parser and tag: NCCL and cmodel agreed on all 40,744.
NCCL's code is read, never copied or built, so the agreement is kept as facts: for each parser and tag
the values that reach every branch of cmodel the whole generated set reaches, plus the first values
generated, each with its verdict, in tests/data/nccl_verdicts.json. The verdict strings are the ones
the harness printed (a list parser: "<rc> <list...>", "5" for an init failure, "SIG11" for NCCL's NULL
dereference; integers in decimal; "X" for a rejected 2.30 bitset).

Regenerate (only after a reading of NCCL's code shows cmodel must change, and say so in the commit):
    .venv/bin/python tests/nccl_verdicts.py tests/data/nccl_verdicts.json
"""  # noqa: E501

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nccl_tuning import cmodel  # noqa: E402
from nccl_tuning import ncclsrc as S  # noqa: E402

TABLE = Path(__file__).resolve().parent / "data" / "nccl_verdicts.json"
N = 1200  # generated values per parser and tag (as the harness had)
SEED = 14
FIRST = 96  # the first generated values kept besides the branch-covering ones
KINDS = ("algo", "proto", "int", "nthreads", "subsys", "level")


def kinds(tag) -> tuple:
    """The parsers recorded for a tag (the 2.30 enum parser exists from 2.30 only)."""
    return KINDS if tag >= (2, 30, 7) else KINDS[:-1]


def subsys_options(tag):
    names = sorted(set(S.debug_subsys((2, 30, 7))) - {"ALL"})
    bit = {n: 1 << i for i, n in enumerate(names)}
    return [(n, (2**64 - 1) if n == "ALL" else bit[n]) for n in S.debug_subsys(tag)]


def verdict(kind: str, tag, v: str) -> str:
    """What NCCL's code gives value v, in the harness's words, computed by cmodel."""
    if kind in ("algo", "proto"):
        elems = S.algorithms(tag) if kind == "algo" else S.PROTOS
        if tag >= (2, 24, 3):
            start = [2 if kind == "proto" and e == "LL128" else 1 for _ in S.FUNCS for e in elems]
            lst, problem = cmodel.parse_list_prefixed(v, S.FUNCS, elems, start)
            return (
                "SIG11"
                if problem and problem[0] == "crash"
                else "5"
                if problem
                else "0 " + " ".join(map(str, lst))
            )
        return "0 " + " ".join(map(str, cmodel.parse_list_flat(v, elems)))
    if kind == "int":
        return str(cmodel.load_param(v, -2))
    if kind == "nthreads":
        env = cmodel.to_int(cmodel.load_param(v, -2))
        return f"{cmodel.get_nthreads(env, 64, 512, 256)} {cmodel.get_nthreads(env, 160, 640, 640)}"
    if kind == "subsys":
        if tag >= (2, 30, 7):
            m = cmodel.bitset30(v, subsys_options(tag))
            return "X" if m is None else str(m)
        return str(cmodel.debug_subsys_old(v, subsys_options(tag)))
    if kind == "level":
        i = cmodel.one_of30(v, S.debug_levels(tag))
        return str(-1 if i is None else i + 1)
    raise ValueError(kind)


# ---- the seeded generators (each parser's own alphabet)
# -------------------------------------------------


def rcase(rng, word):
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in word)


def distinct(make, n):
    seen = {}
    for _ in range(50 * n):
        seen.setdefault(make(), None)
        if len(seen) == n:
            break
    assert len(seen) == n, f"generator gave only {len(seen)} distinct values"
    return list(seen)


def gen_lists(rng, names, prefixes, n):
    junk = ["", " ", "foo", "shm", "alltoall", "ring ", " tree", "PAT", "nvls_tree"]
    seps = [",", ",", ";", ":", "^", ",,", ";;", "::", " "]

    def make():
        parts = []
        for _ in range(rng.randint(0, 7)):
            r = rng.random()
            pool = names if r < 0.55 else prefixes if r < 0.75 else junk
            parts.append(rcase(rng, rng.choice(pool)))
            parts.append(rng.choice(seps))
        s = "".join(parts[:-1] if parts and rng.random() < 0.6 else parts)
        return ("^" + s) if rng.random() < 0.2 else s

    return distinct(make, n)


def gen_ints(rng, n):
    atoms = [
        "0",
        "1",
        "7",
        "8",
        "9",
        "32",
        "64",
        "96",
        "100",
        "0x",
        "0X",
        "ff",
        "1f",
        "-",
        "+",
        " ",
        "\t",
        "k",
        "M",
        "G",
        "08",
        "010",
        "9223372036854775807",
        "9223372036854775808",
        "99999999999999999999",
        "4294967360",
        "2147483648",
        "abc",
        ".",
    ]
    return distinct(lambda: "".join(rng.choice(atoms) for _ in range(rng.randint(0, 4))), n)


def gen_names(rng, names, n, sep=","):
    junk = ["", " ", "\t", "foo", "all", "Info ", " WARN", "alloc_host", "^"]

    def make():
        k = rng.randint(0, 4)
        items = [
            (rng.choice([" ", "", "\t"]) if rng.random() < 0.3 else "")
            + rcase(rng, rng.choice(names if rng.random() < 0.75 else junk))
            + (rng.choice([" ", "\t"]) if rng.random() < 0.2 else "")
            for _ in range(k)
        ]
        s = sep.join(items)
        return ("^" + s) if rng.random() < 0.2 else s

    return distinct(make, n)


def generated(kind: str, tag) -> list[str]:
    """The harness's inputs for a parser and tag (same seeds, same order)."""
    if kind in ("algo", "proto"):
        rng = random.Random(f"{SEED}{tag}{kind}")
        elems = S.algorithms(tag) if kind == "algo" else S.PROTOS
        return gen_lists(rng, elems, [f.lower() for f in S.FUNCS], N)
    if kind == "int":
        return gen_ints(random.Random(f"{SEED}{tag}int"), N)
    if kind == "nthreads":
        rng = random.Random(f"{SEED}{tag}nt")
        values = gen_ints(rng, N // 2)
        return values + [
            v for v in distinct(lambda: str(rng.randint(-300, 3000)), N) if v not in values
        ]
    if kind == "subsys":
        return gen_names(random.Random(f"{SEED}{tag}subsys"), S.debug_subsys(tag), N)
    if kind == "level":
        return gen_names(random.Random(f"{SEED}level"), S.debug_levels(tag), N, sep="")
    raise ValueError(kind)


# ---- branch coverage of cmodel (line-to-line arcs inside nccl_tuning/cmodel.py)
# -------------------------


def arcs(kind: str, tag, value: str) -> frozenset:
    """The arcs of cmodel's code that computing one verdict takes."""
    target = cmodel.__file__
    seen, last = set(), {}

    def local(frame, event, arg):
        if event == "line":
            seen.add((frame.f_code.co_name, last.get(frame), frame.f_lineno))
            last[frame] = frame.f_lineno
        elif event == "return":
            seen.add((frame.f_code.co_name, last.get(frame), "return"))
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == target else None

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        verdict(kind, tag, value)
    finally:
        sys.settrace(old)
    return frozenset(seen)


def select(kind: str, tag) -> list[str]:
    """The first FIRST generated values, then every value that reaches an arc none before it
    reached."""
    values = generated(kind, tag)
    chosen, covered = list(values[:FIRST]), set()
    for v in chosen:
        covered |= arcs(kind, tag, v)
    for v in values[FIRST:]:
        a = arcs(kind, tag, v)
        if not a <= covered:
            chosen.append(v)
            covered |= a
    return chosen


def key(kind: str, tag) -> str:
    return f"{kind}/{S.vstr(tag)}"


def record(path: Path) -> dict:
    cases = {
        key(k, t): [[v, verdict(k, t, v)] for v in select(k, t)] for t in S.TAGS for k in kinds(t)
    }
    data = {
        "about": __doc__.strip().splitlines()[0],
        "generated_per_parser_and_tag": N,
        "seed": SEED,
        "cases": cases,
    }
    tables = ",\n".join(
        f"{json.dumps(k)}: [\n" + ",\n".join(json.dumps(c) for c in v) + "\n]"
        for k, v in cases.items()
    )
    head = json.dumps({k: v for k, v in data.items() if k != "cases"})[:-1]
    path.write_text(f'{head},\n"cases": {{\n{tables}\n}}}}\n')
    return data


def load() -> dict:
    return json.loads(TABLE.read_text())["cases"]


if __name__ == "__main__":
    out = record(Path(sys.argv[1]) if len(sys.argv) > 1 else TABLE)
    print(f"{sum(len(c) for c in out['cases'].values())} cases in {len(out['cases'])} tables")
