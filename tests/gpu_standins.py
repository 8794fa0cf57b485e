"""Stand-in GPU/NIC tools for the cluster tests of `--preflight gpu`: executables that print real
outputs captured on other machines (tests/data/gpu/, sources in tests/data/gpu/sources.md), picked
by the node's `hostname` -- the SSH test hosts and the Slurm dev nodes share this machine's
filesystem but each has its own hostname (UTS namespace: sshhost<k>, lnode<k>), so the tools' faulty
outputs are "placed" on one node only; the simulated nodes of `launch local` share this machine:
there the tools pick by the node's slot (LAUNCH_NODE_SLOT, told to each node and to its --preflight
gpu check). They reach a node's PATH through a `--python` wrapper that puts their folder first and
runs the real python."""

from __future__ import annotations

import json
import shlex
import stat
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data" / "gpu"


def _tool(path: Path, body: str) -> None:
    path.write_text(
        "#!/bin/sh\n# stand-in printing real outputs captured elsewhere "
        f"(tests/data/gpu/sources.md)\n{body}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _by_host(outputs: dict[str, str], default: str, key: str = "$(hostname)") -> str:
    """A shell `case` on the hostname (or another key): the fixture to print there (default
    elsewhere)."""
    arms = "".join(
        f"  {shlex.quote(h)}) cat {shlex.quote(str(DATA / rel))} ;;\n" for h, rel in outputs.items()
    )
    return f'case "{key}" in\n{arms}  *) cat {shlex.quote(str(DATA / default))} ;;\nesac'


# 8 GPUs: GPU0-3 on NUMA node 0, GPU4-7 on node 1
TOPO = "topo/go-gpuallocator-issue-17-rtx4090-pcie.txt"


def per_host_tools(
    bin_dir: Path,
    smi_xml: str,
    ibstat: dict[str, str],
    ibstat_default: str,
    key: str = "$(hostname)",
    topo: str | None = None,
) -> Path:
    """nvidia-smi (-q -x: smi_xml everywhere; topo -m: the fixture topo everywhere when given, e.g.
    TOPO; other arguments exit 9) and ibstat (by hostname, or by `key`: "$LAUNCH_NODE_SLOT" for
    launch local's slots); returns bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    topo_arm = f'  "topo -m") cat {shlex.quote(str(DATA / topo))} ;;\n' if topo else ""
    _tool(
        bin_dir / "nvidia-smi",
        f'case "$*" in\n  "-q -x") cat {shlex.quote(str(DATA / smi_xml))} ;;\n'
        f"{topo_arm}  *) exit 9 ;;\nesac",
    )
    _tool(bin_dir / "ibstat", _by_host(ibstat, ibstat_default, key))
    return bin_dir


def python_with_tools(path: Path, bin_dir: Path, python: str = sys.executable) -> str:
    """A --python for the nodes: the stand-ins first on PATH, then the real interpreter."""
    _tool(
        path,
        f'PATH={shlex.quote(str(bin_dir))}:"$PATH"; export PATH\nexec {shlex.quote(python)} "$@"',
    )
    return str(path)


def check_slot0_swapped(run_dir: Path, host: str = "") -> None:
    """A --nodes 2 --spares 1 --preflight gpu run whose slot 0 showed the Down port: nodes.json has
    slot 0 quarantined before attempt 0 (kind gpu, its line, never run: no node) and the run on
    slots 1 and 2, the policy's replace with no person."""
    led = json.loads((Path(run_dir) / "nodes.json").read_text())
    assert led["pool"] == {"active": [1, 2], "spares": [], "quarantined": [0]}
    (gone,) = led["slots"]["0"]["attempts"]
    assert (gone["kind"], led["slots"]["0"]["quarantined"], "node" in gone) == ("gpu", True, False)
    assert gone["failure"].startswith(f"--preflight gpu: slot 0 [{host}") and gone[
        "failure"
    ].endswith("]: mlx5_7 port 1: State Down (physical state LinkUp, InfiniBand)"), gone
    assert [(d["action"], d["person"]) for d in led["decisions"]] == [("replace", "no")]


def python_with_gpus(
    path: Path,
    bin_dir: Path,
    nodes: str = "*",
    key: str = "NODE_RANK",
    python: str = sys.executable,
) -> str:
    """A --python for the nodes with the stand-ins on PATH only on the nodes whose NODE_RANK matches
    the shell pattern `nodes` ("*": every node; "0": node 0 only -- the others then have no
    nvidia-smi at all), whatever host or slot runs them (key="LAUNCH_NODE_SLOT": by the node's slot
    of the pool): `--dist-backend auto` decided on each node (launchers.nodebackend). The stand-in
    knows one GPU, so there CUDA_VISIBLE_DEVICES is 0, as on a node whose cgroup shows a job its own
    GPU only: the dev cluster's gres binds one of 8 stand-in device files, whichever is free (a
    loaded cluster gave another test's job GPU 3, which this GPU-list has not)."""
    _tool(
        path,
        f'case "${{{key}:-}}" in\n  {nodes}) PATH={shlex.quote(str(bin_dir))}:"$PATH" '
        "CUDA_VISIBLE_DEVICES=0\n    export PATH CUDA_VISIBLE_DEVICES ;;\nesac\nexec "
        f'{shlex.quote(python)} "$@"',
    )
    return str(path)
