"""Sweep: the bench once per candidate preset (each its own launcher job and run dir), then
results.csv (all rows + preset), plots, recommendation.yaml and an NCCL tuner-plugin CSV.

out/
  runs/<preset>/          the bench job's run dir (run.yaml, logs/, results.csv)
  logs/<preset>.log       the launcher's own output for that job
  results.csv             every row of every preset, column `preset` first
  plots/busbw_<op>.png    busbw vs message size, one line per preset
  recommendation.yaml     per op: size bands with the best preset and its gain over default; overall
  tuner.csv               NCCL example tuner plugin config (see TUNER_HEADER)

Gain of preset P at a size = time(default) / time(P) - 1 (= busbw ratio - 1). A gain counts only
above the noise floor: max(--noise, spread_pct of both runs at that size); below it the band keeps
`default`, so nothing slower than default (or not measurably faster) is ever recommended.
Torch-free.
"""

from __future__ import annotations

import math
import os
import re

import yaml

from . import presets as P
from . import results as R
from . import runner
from .apply import resolve
from .errors import NcclTuningError

BASELINE = "default"
WORKLOADS = {"moe": ["all_to_all"], "dense": ["all_reduce", "reduce_scatter", "all_gather"]}
TUNER_COLL = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
TUNER_ALGO = {
    "tree": "tree",
    "ring": "ring",
    "collnetdirect": "collnet_direct",
    "collnetchain": "collnet_chain",
    "nvls": "nvls",
    "nvlstree": "nvls_tree",
    "pat": "pat",
}
TUNER_PROTO = {"ll": "ll", "ll128": "ll128", "simple": "simple"}
TUNER_COLUMNS = (
    "collective",
    "min_bytes",
    "max_bytes",
    "algorithm",
    "protocol",
    "channels",
    "nNodes",
    "nRanks",
)
TUNER_HEADER = """\
# NCCL tuner plugin config (the CSV format of NCCL's ext-tuner/example; NCCL_TUNER_CONFIG_FILE=<this>)
# columns: collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks
#   collective  allreduce|allgather|reducescatter|broadcast|reduce (all-to-all is send/recv: no row)
#   min_bytes,max_bytes  message-size band (bytes, inclusive) where the preset won by more than noise
#   algorithm   tree|ring|collnet_direct|collnet_chain|nvls|nvls_tree|pat (from the winner's NCCL_ALGO)
#   protocol    ll|ll128|simple (from the winner's NCCL_PROTO)
#   channels    NCCL_MIN_NCHANNELS when it equals NCCL_MAX_NCHANNELS in the winner, else -1 (default)
#   nNodes,nRanks  the shape this was measured on (rows match only that shape)
# Rows exist only for bands won by a preset that forces exactly one algorithm and one protocol;
# bands won by other presets (buffer/channel/transport knobs) need that preset's env, not the tuner.
"""  # noqa: E501


def plan(
    presets_text: str,
    out: str,
    workload: str | None,
    dominant: str | None,
    preset_dirs=(),
    ops=None,
) -> tuple[list[str], list[str], dict]:
    """Validate the sweep's inputs -> (presets with the baseline first, dominant ops,
    {label: resolved env}). Combined presets are written with '+': default,moe,moe+roce."""
    if os.path.exists(out):
        raise NcclTuningError(
            f"--out {out} exists; a sweep never overwrites (choose a new directory)"
        )
    names = P.split_spec(presets_text.replace(" ", ""))
    if not names:
        raise NcclTuningError("no candidate preset (e.g. --nccl-preset moe --nccl-preset dense)")
    if BASELINE not in [label(n) for n in names]:
        names.insert(0, BASELINE)
    envs = {
        label(n): resolve(
            n.replace("+", ","), run_dir=os.path.join(out, "runs", label(n)), extra_dirs=preset_dirs
        )[0]
        for n in names
    }
    labels = [label(n) for n in names]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise NcclTuningError(f"--nccl-preset names {', '.join(dup)} twice")
    if workload and workload not in WORKLOADS:
        raise NcclTuningError(f"--workload {workload!r} is not one of {', '.join(WORKLOADS)}")
    dom = runner.parse_ops(dominant) if dominant else list(WORKLOADS.get(workload) or [])
    if ops is not None and dom and not set(dom) & set(ops):
        raise NcclTuningError(
            f"the dominant op(s) {','.join(dom)} are not benchmarked (--ops "
            f"{','.join(ops)}); add them to --ops"
        )
    return names, [o for o in dom if ops is None or o in ops], envs


def label(preset: str) -> str:
    """'moe' -> moe, 'moe,roce' -> moe+roce, './x/mine.yaml' -> mine (used for dirs and the CSV)."""
    parts = [
        os.path.splitext(os.path.basename(p))[0] if P.is_path(p) else p for p in preset.split("+")
    ]
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", "+".join(parts))


def run(cfg: runner.BenchConfig, names: list[str], out: str, echo=print) -> dict:
    """Run every preset's bench job (sequentially) -> {label: (exit code, rows)}."""
    for n in names:  # the launcher itself validates each job before anything is written
        runner.dry_run(
            cfg, os.path.abspath(os.path.join(out, "runs", label(n))), n.replace("+", ",")
        )
    for sub in ("runs", "logs"):
        os.makedirs(os.path.join(out, sub))
    done = {}
    for i, n in enumerate(names, 1):
        lab = label(n)
        rd = os.path.abspath(os.path.join(out, "runs", lab))
        echo(
            f"[{i}/{len(names)}] preset {lab}: {cfg.backend} {cfg.nodes}x{cfg.gpus_per_node}, "
            f"run dir {rd}"
        )
        code, rows = runner.run(
            cfg,
            rd,
            n.replace("+", ","),
            os.path.join(out, "logs", f"{lab}.log"),
            progress=lambda line, lab=lab: echo(f"  {lab:>10} | {line}"),
        )
        for r in rows:
            r["preset"] = lab
        state = "ok" if code == 0 and rows else f"FAILED (exit {code}; see {out}/logs/{lab}.log)"
        echo(f"[{i}/{len(names)}] preset {lab}: {len(rows)} results, {state}")
        done[lab] = (code, rows)
    return done


def recommend(rows: list[dict], dominant: list[str], noise_pct: float, workload=None) -> dict:
    """The recommendation (a plain dict, written as YAML) from all rows of a sweep."""
    by = {(r["preset"], r["op"], r["bytes"]): r for r in rows}
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    ops = list(dict.fromkeys(r["op"] for r in rows))
    if BASELINE not in presets:
        raise NcclTuningError(
            f"no results for the baseline preset {BASELINE!r}; nothing to compare"
        )
    first = rows[0]
    dominant = [o for o in dominant or () if o in ops] or ops
    rec = {
        "baseline": BASELINE,
        "presets": presets,
        "backend": first.get("backend"),
        "ranks": first["ranks"],
        "noise_pct": noise_pct,
        "workload": workload,
        "dominant_ops": dominant,
        "ops": {},
    }
    for op in ops:
        sizes_ = sorted({r["bytes"] for r in rows if r["op"] == op and r["preset"] == BASELINE})
        points = [_best_at(by, presets, op, s, noise_pct) for s in sizes_]
        rec["ops"][op] = {"bands": _bands(points)}
    rec.update(_overall(by, presets, rec["dominant_ops"], noise_pct))
    if rec.get("backend") == "gloo":
        rec["caveat_backend"] = (
            "measured on gloo (CPU): NCCL variables have no effect there, so "
            "differences are noise; rerun on GPUs with NCCL before acting"
        )
    return rec


def _best_at(by, presets, op, size, noise_pct) -> dict:
    base = by[(BASELINE, op, size)]
    best, gain, floor, leader = BASELINE, 0.0, noise_pct, None
    for p in presets:
        r = by.get((p, op, size))
        if p == BASELINE or r is None or r["wrong"]:
            continue
        g = (base["time_us"] / r["time_us"] - 1) * 100
        fl = max(noise_pct, base.get("spread_pct") or 0.0, r.get("spread_pct") or 0.0)
        if leader is None or g > leader[1]:
            leader = (p, g)
        if g > fl and g > gain:
            best, gain, floor = p, g, fl
    out = {"bytes": size, "best": best, "gain_pct": round(gain, 2), "noise_pct": round(floor, 2)}
    if best == BASELINE and leader and leader[1] > 0:
        out["within_noise"] = {"preset": leader[0], "gain_pct": round(leader[1], 2)}
    return out


def _bands(points) -> list[dict]:
    bands = []
    for p in points:
        if bands and bands[-1]["best"] == p["best"]:
            b = bands[-1]
            b["max_bytes"] = p["bytes"]
            b["_gains"].append(p["gain_pct"])
        else:
            bands.append(
                {
                    "min_bytes": p["bytes"],
                    "max_bytes": p["bytes"],
                    "best": p["best"],
                    "_gains": [p["gain_pct"]],
                }
            )
        if "within_noise" in p:
            bands[-1].setdefault("within_noise", []).append(
                f"{p['within_noise']['preset']} +{p['within_noise']['gain_pct']}% at {p['bytes']} B"
            )
    for b in bands:
        g = b.pop("_gains")
        b["gain_pct_min"], b["gain_pct_max"] = min(g), max(g)
    return bands


def _overall(by, presets, dominant, noise_pct) -> dict:
    """Geometric-mean speed-up over default on the dominant ops, across all sizes."""
    scores = {}
    for p in presets:
        if p == BASELINE:
            continue
        ratios, spreads = [], []
        for (q, op, size), r in by.items():
            base = by.get((BASELINE, op, size))
            if q == p and op in dominant and base and not r["wrong"]:
                ratios.append(base["time_us"] / r["time_us"])
                spreads += [base.get("spread_pct") or 0.0, r.get("spread_pct") or 0.0]
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            scores[p] = ((gm - 1) * 100, max([noise_pct, *spreads]))
    ranking = sorted(scores.items(), key=lambda kv: -kv[1][0])
    out = {"gains_over_default_pct": {p: round(g, 2) for p, (g, _) in ranking}}
    ops = ",".join(dominant)
    if ranking and ranking[0][1][0] > ranking[0][1][1]:
        p, (g, fl) = ranking[0]
        out.update(
            recommended=p,
            gain_pct=round(g, 2),
            reason=(
                f"{p} is {g:.1f}% faster than default (geometric mean over all sizes of "
                f"{ops}), above the noise floor of {fl:.1f}%"
            ),
        )
        if len(ranking) > 1 and ranking[0][1][0] - ranking[1][1][0] <= fl:
            out["caveat"] = (
                f"{ranking[1][0]} is within noise of {p} ({ranking[1][1][0]:.1f}% vs {g:.1f}%)"
            )
    else:
        lead = f"; best was {ranking[0][0]} at {ranking[0][1][0]:+.1f}%" if ranking else ""
        out.update(
            recommended=BASELINE,
            gain_pct=0.0,
            reason=f"no preset beat default by more than the noise floor on {ops}{lead}",
        )
        if ranking:
            out["caveat"] = (
                "differences are within noise (noise floor "
                f"{ranking[0][1][1]:.1f}%); keep default or measure with more "
                "--iters/--repeats"
            )
    return out


def tuner_rows(rec: dict, preset_env: dict, nodes: int) -> list[dict]:
    """Tuner-plugin rows for bands won by a preset forcing one algorithm and one protocol."""
    out = []
    for op, info in rec["ops"].items():
        if op not in TUNER_COLL:
            continue
        for b in info["bands"]:
            env = preset_env.get(b["best"]) or {}
            algo = TUNER_ALGO.get(env.get("NCCL_ALGO", "").strip().lower())
            proto = TUNER_PROTO.get(env.get("NCCL_PROTO", "").strip().lower())
            if b["best"] == BASELINE or not algo or not proto:
                continue
            lo, hi = env.get("NCCL_MIN_NCHANNELS"), env.get("NCCL_MAX_NCHANNELS")
            channels = lo if lo and lo == hi and lo.isdigit() else "-1"
            out.append(
                {
                    "collective": TUNER_COLL[op],
                    "min_bytes": b["min_bytes"],
                    "max_bytes": b["max_bytes"],
                    "algorithm": algo,
                    "protocol": proto,
                    "channels": channels,
                    "nNodes": nodes,
                    "nRanks": rec["ranks"],
                }
            )
    return out


def write_outputs(out: str, done: dict, dominant, noise_pct, workload, preset_env, nodes) -> dict:
    from . import plots

    rows = [r for _, (_, rs) in done.items() for r in rs]
    if not rows:
        raise NcclTuningError(f"no preset produced results; see {out}/logs/")
    R.write_csv(os.path.join(out, "results.csv"), rows, ("preset", *R.COLUMNS))
    pngs = plots.plot_busbw(rows, os.path.join(out, "plots"))
    rec = recommend(rows, dominant, noise_pct, workload)
    rec["failed_presets"] = [p for p, (code, rs) in done.items() if code != 0 or not rs]
    rec["plots"] = [os.path.relpath(p, out) for p in pngs]
    tuner = tuner_rows(rec, preset_env, nodes)
    with open(os.path.join(out, "tuner.csv"), "x") as f:
        f.write(TUNER_HEADER)
        if not tuner:
            f.write(
                "# (no rows: no band was won by a preset that forces NCCL_ALGO and NCCL_PROTO)\n"
            )
        for t in tuner:
            f.write(",".join(str(t[c]) for c in TUNER_COLUMNS) + "\n")
    rec["tuner_rows"] = len(tuner)
    with open(os.path.join(out, "recommendation.yaml"), "x") as f:
        yaml.safe_dump(rec, f, sort_keys=False, width=100)
    return rec
