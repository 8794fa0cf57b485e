"""The doctor's verdict: every node's checks (launchers.doctor.checks), the collective's bandwidths
against their median, the table printed (one row per node), a line per failed check saying what to
do, and --json."""

from __future__ import annotations

import statistics
from dataclasses import asdict

from .checks import (
    SLOW,
    Check,
    Context,
    container_runtime,
    gpus,
    master_port,
    nccl_env,
    reach,
    resources,
    shared,
    skip,
    versions,
)
from .gpucheck import gpu_health
from .targets import NodeRun

COLUMNS = (
    "reachable",
    "python",
    "torch",
    "launchers",
    "nccl",
    "gpus",
    "port",
    "master",
    "shared",
    "disk",
    "shm",
    "nofile",
    "clock",
    "nccl_env",
)
TITLES = {
    "reachable": "REACH",
    "master": "REACHES-MASTER",
    "nccl_env": "NCCL-ENV",
    "nofile": "NOFILE",
    "gpu_health": "GPU-HEALTH",
    "container": "CONTAINER",
}


def medians(runs: list[NodeRun]) -> dict:
    vals: dict[str, list[float]] = {"all_reduce": [], "all_to_all": [], "links": []}
    for n in runs:
        col = (n.result or {}).get("collective") or {}
        for key in ("all_reduce", "all_to_all"):
            if key in col:
                vals[key].append(col[key])
        vals["links"] += list(col.get("links", {}).values())
    return {k: statistics.median(v) for k, v in vals.items() if v}


def collective(run: NodeRun, c: Context, runs: list[NodeRun], others_failed: bool) -> Check:
    r = run.result
    if "collective_error" in r:
        return Check(
            "fail",
            "error!",
            f"the collective failed here: {r['collective_error']}",
            "see the other failures; a firewall between nodes or a wrong interface "
            "(GLOO_SOCKET_IFNAME)",
        )
    col = r.get("collective")
    if col is None:
        if others_failed:
            return skip("not run")
        return Check(
            "fail", "not run!", "the collective did not run here", "run again with --timeout longer"
        )
    slow, m = [], c.medians
    for key in ("all_reduce", "all_to_all"):
        if col[key] < SLOW * m[key]:
            slow.append(f"{key} busbw {col[key]:.3f} GB/s, median {m[key]:.3f} GB/s (a slow node)")
    link = ((runs[0].result or {}).get("collective") or {}).get("links", {}).get(str(run.node))
    if link is not None and link < SLOW * m["links"]:
        slow.append(
            f"link node 0 ({runs[0].host}) -> node {run.node} ({run.host}) {link:.3f} GB/s, median "
            f"{m['links']:.3f} GB/s (a slow link)"
        )
    value = (
        f"ar {col['all_reduce']:.2f} a2a {col['all_to_all']:.2f}"
        + (f" p2p {link:.2f}" if link else "")
        + " GB/s"
    )
    if slow:
        return Check(
            "warn", value + "?", "; ".join(slow), "look at that node's NIC, cabling and load"
        )
    return Check("ok", value)


def node_checks(run: NodeRun, c: Context, runs: list[NodeRun]) -> dict[str, Check]:
    if run.result is None:
        first = "python" if run.reached else "reachable"
        fix = (
            "check the host is up and its key is known (verify, then add it to --known-hosts), or "
            "--connect-timeout"
            if first == "reachable"
            else "give --python with the nodes' interpreter"
        )
        out = {k: skip("?") for k in (*COLUMNS, *(["container"] if c.container else []))}
        out[first] = Check("fail", "no!" if first == "reachable" else "missing!", run.error, fix)
        if first == "python":
            out["reachable"] = Check("ok", "yes")
        return out
    r = run.result
    master_run = runs[0] if runs else None
    any_gpus = any((n.result or {}).get("gpus") for n in runs)
    return {
        "reachable": Check("ok", "yes"),
        **versions(r, c),
        "gpus": gpus(r, c, any_gpus),
        "port": master_port(run, c),
        "master": reach(run, c, master_run),
        "shared": shared(run, c, master_run),
        **resources(run),
        "nccl_env": nccl_env(r, c),
        **({"container": container_runtime(r, c)} if c.container else {}),
    }


def verdict(runs: list[NodeRun], c: Context) -> list[dict]:
    rows = [
        {"node": n.node, "host": n.host, "checks": node_checks(n, c, runs), "findings": []}
        for n in runs
    ]
    if c.gpu:
        for n, row in zip(runs, rows):
            if n.result is None:
                row["checks"]["gpu_health"] = skip("?")
                continue
            row["checks"]["gpu_health"], row["findings"] = gpu_health(
                n.result, f"node {n.node} [{n.host}]", c.gpus_per_node
            )
    if c.collective:
        failed = any(ch.status == "fail" for row in rows for ch in row["checks"].values())
        c.medians = medians(runs)
        for n, row in zip(runs, rows):
            row["checks"]["collective"] = collective(n, c, runs, failed) if n.result else skip("?")
    return rows


def failures(rows: list[dict], statuses=("fail",)) -> list[str]:
    out = []
    for row in rows:
        for name, ch in row["checks"].items():
            if name == "gpu_health":  # one line per finding: node, device, fact
                out += [
                    f"{'FAIL' if f.level == 'fail' else 'WARN'} {f.line()}"
                    for f in row.get("findings", ())
                    if f.level in statuses
                ]
                continue
            if ch.status in statuses:
                what = "FAIL" if ch.status == "fail" else "WARN"
                out.append(
                    f"{what} node {row['node']} [{row['host']}] {name}: {ch.why}"
                    + (f" -> {ch.fix}" if ch.fix else "")
                )
    return out


def render(rows: list[dict], head: str, ref: dict, wall: float) -> str:
    cols = [
        k
        for k in (*COLUMNS, "container", "gpu_health", "collective")
        if any(k in r["checks"] for r in rows)
    ]
    table = [["NODE", "HOST", *(TITLES.get(k, k.upper()) for k in cols)]]
    table += [[str(r["node"]), r["host"], *(r["checks"][k].value for k in cols)] for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    lines = [
        head,
        "here: " + ", ".join(f"{k} {ref.get(k)}" for k in ("python", "torch", "launchers")),
    ]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(t, widths)).rstrip() for t in table]
    bad, warn = failures(rows), failures(rows, ("warn",))
    lines += bad + warn
    sick = sum(any(ch.status == "fail" for ch in r["checks"].values()) for r in rows)
    lines.append(
        f"doctor: {len(bad)} check(s) failed on {sick} of {len(rows)} node(s) in {wall:.1f} s"
        if bad
        else f"doctor: every check passed on {len(rows)} node(s) in {wall:.1f} s"
    )
    return "\n".join(lines) + "\n"


def as_json(rows: list[dict], head: dict, ref: dict, wall: float) -> dict:
    return dict(
        head,
        reference=ref,
        wall_s=round(wall, 3),
        ok=not failures(rows),
        failures=failures(rows),
        warnings=failures(rows, ("warn",)),
        nodes=[
            dict(
                node=r["node"],
                host=r["host"],
                checks={k: asdict(v) for k, v in r["checks"].items()},
                findings=[f.as_dict() for f in r.get("findings", ())],
            )
            for r in rows
        ],
    )
