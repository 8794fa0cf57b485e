"""--cpu-bind: which CPUs each local rank of a node may run on, decided from the node's own
topology.

Pure pieces (plan, the cpulist and `nvidia-smi topo -m` parsers, hwloc's synthetic descriptions for
tests) and one reader of this machine's topology (/sys/devices/system/node, /sys/devices/system/cpu,
the CPUs this process may use: os.sched_getaffinity). The rank wrapper (launchers.rankexec) plans on
its node and applies its own set; the dry-run of a local job shows the same plan. Stdlib only.

Modes: none (no binding); numa (a rank gets every allowed CPU of one NUMA node: the one its GPU is
attached to when `nvidia-smi topo -m` says, else ranks fill the NUMA nodes in blocks); cores (a rank
gets whole cores of its NUMA node, no two ranks the same core while there are enough); auto (numa
where the node has more than one NUMA node with allowed CPUs, else no binding). Binding is only ever
within the allowed CPUs (a Slurm step's or a container's set is smaller than the machine).
"""

from __future__ import annotations

import os

from .errors import LaunchError, brief

MODES = ("auto", "none", "numa", "cores")
ENV = "LAUNCH_CPU_BIND"  # the mode, in every rank's environment (set by the torchrun builder)
MEMPOLICY = (
    "not applied (the kernel's default: pages come from the NUMA node of the CPU that first "
    "touches them)"
)


class Topology(tuple):
    """(numa, cores, allowed) -- numa: ((NUMA node id, its CPUs), ...) by id; cores: the CPUs
    (hardware threads) of each physical core; allowed: frozenset of the CPUs this process may use.
    A plain tuple, not a namedtuple, and no re on the rank wrapper's path: rankexec imports this
    module, and collections and re would add ~5 ms to every rank's start."""

    __slots__ = ()

    def __new__(cls, numa, cores, allowed) -> Topology:
        return tuple.__new__(cls, (numa, cores, allowed))

    numa = property(lambda self: self[0])
    cores = property(lambda self: self[1])
    allowed = property(lambda self: self[2])

    def __getnewargs__(self) -> tuple:  # copy and pickle call __new__ with these
        return tuple(self)

    def usable_nodes(self) -> list[tuple[int, list[tuple[int, ...]]]]:
        """(node id, its cores restricted to the allowed CPUs) for every NUMA node with an allowed
        CPU."""
        out = []
        for nid, cpus in self.numa:
            mine = set(cpus) & self.allowed
            cores = [tuple(c for c in core if c in mine) for core in self.cores if mine & set(core)]
            if cores:
                out.append((nid, cores))
        return out


def parse_cpulist(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' (the kernel's cpulist format; '' = none) -> (0, 1, 2, 3, 8, 10, 11)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, dash, last = part.strip().partition("-")
        last = last if dash else first
        if not (_number(first) and _number(last)) or int(last) < int(first):
            raise LaunchError(f"CPU list {brief(text)} is malformed; expected e.g. 0-3,8,10-11")
        out.update(range(int(first), int(last) + 1))
    return tuple(sorted(out))


def _number(text: str) -> bool:
    """ASCII digits only (str.isdigit also takes other scripts' digits and superscripts)."""
    return text.isascii() and text.isdigit()


def format_cpulist(cpus) -> str:
    """(0, 1, 2, 3, 8) -> '0-3,8'."""
    cpus, runs = sorted(set(cpus)), []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def read_topology(root: str = "/sys/devices/system") -> Topology:
    """This machine's NUMA nodes and cores from sysfs, and the CPUs this process may use."""
    allowed = frozenset(os.sched_getaffinity(0))
    numa = []
    nodes_dir = os.path.join(root, "node")
    names = os.listdir(nodes_dir) if os.path.isdir(nodes_dir) else []
    for nid in sorted(int(n[4:]) for n in names if n.startswith("node") and _number(n[4:])):
        cpus = parse_cpulist(_read(os.path.join(nodes_dir, f"node{nid}", "cpulist")))
        if cpus:
            numa.append((nid, cpus))
    online = parse_cpulist(_read(os.path.join(root, "cpu", "online")))
    if not numa:  # a kernel without NUMA: one node of every online CPU
        numa = [(0, online)]
    cores: dict[tuple[int, ...], None] = {}
    for c in online:
        sib = os.path.join(root, "cpu", f"cpu{c}", "topology", "thread_siblings_list")
        cores[parse_cpulist(_read(sib)) if os.path.exists(sib) else (c,)] = None
    return Topology(numa=tuple(sorted(numa)), cores=tuple(sorted(cores)), allowed=allowed)


def synthetic(desc: str, allowed=None) -> Topology:
    """A topology from hwloc's synthetic description, e.g. 'package:2 numa:1 core:8 pu:2' or 'node:2
    core:4 pu:1' (levels package/socket, node/numa, l3/l2/l1/group (ignored), core, pu; PUs numbered
    in order, as hwloc's `lstopo --input "..."` does). For tests of plan() on shapes this machine
    does not have."""
    items = [item.partition(":") for item in desc.split()]
    levels = [(k.lower(), int(n)) for k, _, n in items if n.isdigit()]
    kinds = [k for k, _ in levels]
    if "core" not in kinds or len(levels) < len(items) or any(n < 1 for _, n in levels):
        raise LaunchError(
            f"synthetic topology {brief(desc)} is not accepted; e.g. 'package:2 core:8 pu:2'"
        )

    def product(upto: int) -> int:
        out = 1
        for _, n in levels[:upto]:
            out *= n
        return out

    numa_at = max(
        (i + 1 for i, k in enumerate(kinds) if k in ("package", "socket", "node", "numa")),
        default=0,
    )
    nodes, per_node = product(numa_at), product(kinds.index("core") + 1) // product(numa_at)
    pus = product(len(levels)) // product(kinds.index("core") + 1)
    cores = tuple(tuple(range(k * pus, (k + 1) * pus)) for k in range(nodes * per_node))
    numa = tuple(
        (n, tuple(c for core in cores[n * per_node : (n + 1) * per_node] for c in core))
        for n in range(nodes)
    )
    every = frozenset(c for core in cores for c in core)
    return Topology(
        numa=numa, cores=cores, allowed=every if allowed is None else frozenset(allowed) & every
    )


TOPO_NAMES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")  # the header's names after the matrix
DEVICE = r"(GPU|NIC)\d+|mlx\d_\d+"  # a matrix column (older drivers: mlx5_0)


def parse_topo(text: str) -> dict:
    """`nvidia-smi topo -m` -> {"columns": matrix columns (GPU0.., NIC0.. or mlx5_0..), "paths":
    {row: {column: path}} (X self, NV# bonded NVLinks, PIX/PXB/PHB/NODE/SYS), "affinity": {GPU:
    {"cpus", "numa"}}, "nic_names": the NIC Legend's {NIC0: mlx5_0}}. The one reader of this output
    (launchers.gpuhealth.topo judges its matrix; --cpu-bind reads its NUMA Affinity): the tool's
    tab-separated layout and a paste whose tabs became spaces (every cell is one word once the
    header's two- and three-word names are joined); ANSI underlining is dropped. ValueError: not
    this tool's output."""
    import re

    # some drivers underline the header, even into a pipe
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = next((i for i, ln in enumerate(lines) if re.match(r"\s+GPU0\b", ln)), None)
    if head is None:
        raise ValueError("not nvidia-smi topo -m output (no GPU0 header)")
    header = lines[head]
    for name in TOPO_NAMES:
        header = header.replace(name, name.replace(" ", "\0"))
    words = header.split()
    cols = [w for w in words if re.fullmatch(DEVICE, w)]
    extra = [w.replace("\0", " ") for w in words[len(cols) :]]
    rows, affinity = {}, {}
    for ln in lines[head + 1 :]:
        cells = [c.strip() for c in ln.split("\t")] if "\t" in ln else ln.split()
        if ln.strip().startswith("Legend"):
            break
        if not cells or cells[0] not in cols:
            continue
        rows[cells[0]] = dict(zip(cols, cells[1 : 1 + len(cols)]))
        named = dict(zip(extra, [c for c in cells[1 + len(cols) :] if c]))
        if cells[0].startswith("GPU") and named.get("CPU Affinity"):
            affinity[cells[0]] = {"cpus": named["CPU Affinity"], "numa": named.get("NUMA Affinity")}
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, re.M))
    return {"columns": cols, "paths": rows, "affinity": affinity, "nic_names": legend}


def parse_gpu_numa(text: str) -> dict[int, int]:
    """`nvidia-smi topo -m` -> {GPU index: NUMA node id} for the GPUs whose 'NUMA Affinity' is one
    node ({} for output that is not the tool's, e.g. "No devices were found")."""
    try:
        affinity = parse_topo(text)["affinity"]
    except ValueError:
        return {}
    return {int(g[3:]): int(a["numa"]) for g, a in affinity.items() if (a["numa"] or "").isdigit()}


def check_mode(value, what: str = "--cpu-bind") -> str:
    if value not in MODES:
        raise LaunchError(
            f"{what} {brief(value)} is not accepted; choose one of: {', '.join(MODES)}"
        )
    return value


def _node_of_rank(nodes: list, local_world_size: int, gpu_numa) -> list[int]:
    """The index (into nodes) of each local rank's NUMA node: its GPU's where known and usable, else
    in blocks."""
    index = {nid: i for i, (nid, _) in enumerate(nodes)}
    out = []
    for r in range(local_world_size):
        g = (gpu_numa or {}).get(r)
        out.append(index[g] if g in index else r * len(nodes) // local_world_size)
    return out


def _split(units: list[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
    """units shared by n ranks: contiguous even blocks when there are enough, else round robin
    (shared)."""
    if len(units) >= n:
        return [
            tuple(c for u in units[k * len(units) // n : (k + 1) * len(units) // n] for c in u)
            for k in range(n)
        ]
    return [units[k % len(units)] for k in range(n)]


def plan(
    topo: Topology, local_world_size: int, mode: str, gpu_numa: dict[int, int] | None = None
) -> list[tuple[int, ...]]:
    """The CPU set of each local rank ([] = no binding). gpu_numa: {local rank's GPU: its NUMA node
    id}."""
    check_mode(mode)
    nodes = topo.usable_nodes()
    if not nodes:
        raise LaunchError(
            f"--cpu-bind {mode}: no allowed CPU on this node (allowed: "
            f"{format_cpulist(topo.allowed) or 'none'}); give --cpu-bind none"
        )
    if mode == "none" or (mode == "auto" and len(nodes) < 2):
        return []
    where = _node_of_rank(nodes, local_world_size, gpu_numa)
    if mode in ("auto", "numa"):
        return [tuple(sorted(c for core in nodes[i][1] for c in core)) for i in where]
    sets: list[tuple[int, ...]] = [()] * local_world_size
    for i, (_, cores) in enumerate(nodes):
        ranks = [r for r in range(local_world_size) if where[r] == i]
        if not ranks:
            continue
        threads = [
            (core[t],) for t in range(max(map(len, cores))) for core in cores if t < len(core)
        ]
        # first threads of every core, then seconds
        units = cores if len(cores) >= len(ranks) else threads
        for r, cpus in zip(ranks, _split(units, len(ranks))):
            sets[r] = tuple(sorted(cpus))
    return sets


def sharing(sets: list[tuple[int, ...]]) -> str | None:
    """What a reader should know of a plan whose ranks share CPUs (more ranks than cores), else
    None."""
    used = [c for s in sets for c in s]
    if not sets or len(used) == len(set(used)):
        return None
    return (
        f"{len(sets)} ranks share {len(set(used))} CPU(s) ({format_cpulist(set(used))}): fewer "
        "allowed cores than ranks"
    )


def check_allowed(cpus, allowed) -> None:
    """A CPU set outside the CPUs this process may use is refused, in one line."""
    bad = set(cpus) - set(allowed)
    if bad:
        raise LaunchError(
            f"CPU set {format_cpulist(cpus)} is not allowed here: CPU(s) {format_cpulist(bad)} are "
            f"outside the allowed {format_cpulist(allowed)}"
        )


def gpu_numa_here(local_world_size: int, env) -> dict[int, int] | None:
    """{local rank: its GPU's NUMA node} from `nvidia-smi topo -m` on this node (local rank r uses
    the r-th visible GPU); None without nvidia-smi, or when CUDA_VISIBLE_DEVICES names GPUs other
    than by index."""
    import shutil
    import subprocess

    visible = [v.strip() for v in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if v.strip()]
    if not shutil.which("nvidia-smi") or not all(v.isdigit() for v in visible):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    by_gpu = parse_gpu_numa(out)
    gpus = [int(v) for v in visible] or list(range(local_world_size))
    return {r: by_gpu[g] for r, g in enumerate(gpus[:local_world_size]) if g in by_gpu}


def node_plan(mode: str, local_world_size: int, env) -> list[tuple[int, ...]]:
    """plan() on this node: its topology, the CPUs this process may use, its GPUs' NUMA nodes."""
    topo = read_topology()
    many = mode != "none" and len(topo.usable_nodes()) > 1
    return plan(
        topo, local_world_size, mode, gpu_numa_here(local_world_size, env) if many else None
    )


def describe(mode: str, sets: list[tuple[int, ...]], label: str = "local rank") -> list[str]:
    """The dry-run's lines for one machine's plan."""
    if not sets:
        return [f"# cpu-bind {mode}: not bound" + (" (one NUMA node)" if mode == "auto" else "")]
    out = [
        f"# cpu-bind {mode}: "
        + ", ".join(f"{label} {r}: CPUs {format_cpulist(s)}" for r, s in enumerate(sets))
    ]
    note = sharing(sets)
    return out + ([f"# cpu-bind: {note}"] if note else [])
