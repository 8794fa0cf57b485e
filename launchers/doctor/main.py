"""`launch doctor`'s flow: settle the input (bad input: one line, exit 2, nothing run), probe every
node of the target and the submitting side at once, judge, print."""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from typing import TextIO

from .. import layout, ports
from ..containers import containeropts
from ..diagnosis import nodefacts
from ..errors import LaunchError
from ..options.specvalues import parse_env, parse_port, positive_int
from .checks import Context
from .options import from_cli
from .report import as_json, failures, render, verdict
from .targets import reference, run_local, run_slurm, run_ssh

TARGETS = "--local, --hosts h1,h2 or --hostfile FILE (SSH), or --slurm [--partition P --nodes N]"
DEFAULT_TIMEOUT, SLURM_NODES = 30.0, 2
TOOL_TIMEOUT = 20.0  # seconds each node tool (nvidia-smi -L, --gpu's tools) has to answer


def target_of(opts: dict) -> str:
    given = [
        t
        for t, on in (
            ("local", opts.get("local")),
            ("slurm", opts.get("slurm")),
            ("ssh", opts.get("hosts") or opts.get("hostfile")),
        )
        if on
    ]
    if not given:
        raise LaunchError(f"launch doctor needs a target: {TARGETS}")
    if len(given) > 1:
        raise LaunchError(
            f"launch doctor takes one target, got {' and '.join(given)}; accepted: {TARGETS}"
        )
    return given[0]


def ssh_hosts(opts: dict, nodes: int | None):
    from ..ssh.hostfile import hosts_from_options, resolve
    from ..ssh.sshmodel import settings as ssh_settings

    settings = ssh_settings(opts)
    entries = hosts_from_options(opts)
    if nodes is not None and nodes > len(entries):
        raise LaunchError(f"--nodes {nodes} is more than the {len(entries)} hosts given")
    return resolve(entries[: nodes or len(entries)], settings.ssh_config), settings


def settle(opts: dict) -> dict:
    """Every input checked before anything runs; the settings of this doctor run."""
    target = target_of(opts)
    nodes = positive_int("--nodes", opts["nodes"]) if "nodes" in opts else None
    timeout = opts.get("timeout", DEFAULT_TIMEOUT)
    if not 0 < timeout <= 600:
        raise LaunchError(f"--timeout {timeout!r} is not accepted; expected seconds in (0, 600]")
    s = dict(
        target=target,
        timeout=timeout,
        env=parse_env(opts.get("env") or ()),
        gpus=positive_int("--gpus-per-node", opts["gpus_per_node"])
        if "gpus_per_node" in opts
        else None,
        python=opts.get("python") or sys.executable,
        root=layout.runs_root(opts.get("run_root")),
        token=secrets.token_hex(8),
        hosts=None,
        settings=None,
    )
    s["port"] = (
        parse_port(opts["master_port"])
        if "master_port" in opts
        else ports.derive_port("launch-doctor:" + s["token"])
    )
    # as `launch local` does: the first free candidate
    if target == "local" and "master_port" not in opts:
        s["port"] = ports.choose_port("launch-doctor:" + s["token"], None, "127.0.0.1")
    if target == "local":
        if nodes not in (None, 1):
            raise LaunchError(
                f"--nodes {nodes} is not accepted with --local; the local target is this one "
                "machine"
            )
        s["nodes"] = 1
    elif target == "slurm":
        s["nodes"] = nodes or SLURM_NODES
    else:
        s["hosts"], s["settings"] = ssh_hosts(opts, nodes)
        s["nodes"] = len(s["hosts"])
    if opts.get("container_runtime") is not None or opts.get("container_image") is not None:
        s["container"] = containeropts.doctor_binaries(
            opts.get("container_runtime") or "auto", target
        )
        if target == "slurm" and "pyxis" in containeropts.doctor_runtimes(
            opts.get("container_runtime") or "auto", target
        ):
            # pyxis lives in srun (a SPANK plugin): asked here, one line
            containeropts.check_srun_pyxis()
    if opts.get("container_image") is not None:  # per runtime: how a node tells it has the image
        s["image"] = containeropts.doctor_image(
            opts["container_image"], target, opts.get("container_runtime")
        )
    if opts.get("collective") and s["nodes"] < 2:
        raise LaunchError(
            f"--collective needs at least 2 nodes; the {target} target has {s['nodes']}"
        )
    return s


def probe_all(s: dict, opts: dict) -> list:
    base = {
        "token": s["token"],
        "root": s["root"],
        "cwd": os.getcwd(),
        "port": s["port"],
        "nnodes": s["nodes"],
        "timeout": s["timeout"],
        "collective": bool(opts.get("collective")),
        "mb": 1,
        "gpu": bool(opts.get("gpu")),
        "tool_timeout": min(TOOL_TIMEOUT, s["timeout"]),
        "container_bins": list(s.get("container", ("", ()))[1]),
        "image_checks": s.get("image") or {},
    }
    if s["target"] == "local":
        return run_local(s["python"], base, s["timeout"] + 120)
    if s["target"] == "slurm":
        return run_slurm(
            s["python"], base, dict(opts, gpus_per_node=s["gpus"]), s["nodes"], s["timeout"]
        )
    return run_ssh(s["hosts"], s["settings"], s["python"], base, s["timeout"])


def remember(runs: list, s: dict) -> None:
    """Each answering node's interfaces and HCA ports into the node facts cache (launch nccl check
    --on NODE), under the name doctor prints (an SSH host's name, its address kept too); not kept:
    one warning line."""
    for n in runs:
        h = s["hosts"][n.node] if s["hosts"] else None
        if n.result is None:
            continue
        try:
            nodefacts.record(
                h.entry.name if h else n.host, n.result, address=h.hostname if h else None
            )
        except OSError as e:
            print(
                f"launch: warning: node {n.node} [{n.host}]: its facts were not kept in "
                f"{nodefacts.cache_dir()}: {e.strerror or e}",
                file=sys.stderr,
            )


def run(raw: dict, out: TextIO = sys.stdout) -> int:
    """`launch doctor` with the CLI's raw option values; returns the exit code."""
    t0 = time.monotonic()
    opts = from_cli(raw)
    s = settle(opts)
    ref: dict = {}
    th = threading.Thread(
        target=lambda: ref.update(reference(120, os.getcwd(), s["root"])), daemon=True
    )
    th.start()
    runs = probe_all(s, opts)
    th.join(150)
    first = runs[0].result or {}
    if "python" not in ref:  # the submitting side could not even run the probe: compare with node 0
        ref = dict(first, error=ref.get("error", "no answer"))
    master = (
        s["hosts"][0].hostname
        if s["hosts"]
        else ("127.0.0.1" if s["target"] == "local" else runs[0].host)
    )
    ctx = Context(
        ref=ref,
        first=first,
        master=master,
        port=s["port"],
        gpus_per_node=s["gpus"],
        require_gpus=bool(opts.get("require_gpus")),
        shared_required=opts.get("shared_storage") is not False,
        env=s["env"],
        collective=bool(opts.get("collective")),
        medians={},
        gpu=bool(opts.get("gpu")),
        container=s.get("container"),
        image=opts.get("container_image"),
    )
    rows = verdict(runs, ctx)
    remember(runs, s)
    wall = time.monotonic() - t0
    head = {
        "target": s["target"],
        "nodes": s["nodes"],
        "master": f"{master}:{s['port']}",
        "run_root": s["root"],
    }
    if opts.get("json"):
        out.write(json.dumps(as_json(rows, head, ref, wall), indent=1) + "\n")
    else:
        out.write(
            render(
                rows,
                f"launch doctor: {s['target']}, {s['nodes']} node(s), master {master}:{s['port']}, "
                f"run root {s['root']}",
                ref,
                wall,
            )
        )
    return 1 if failures(rows) else 0
