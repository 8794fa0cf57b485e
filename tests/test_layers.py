"""The architecture, checked: every module's imports (also those inside functions) follow the layer
rule and make no cycle, and modules and functions of every package stay small (docs/ARCHITECTURE.md;
its tables are checked against this file by tests/test_architecture_doc.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("launchers", "nccl_tuning", "workloads")

# Layers 0 and 1 are ordered sub-layers (0a < 0b < ... < 1a < ... < 1e), derived from the real
# import graph (each module one above the highest module of its own layer it imports): a module in a
# sub-layer imports only from sub-layers below its own, never a module of its own sub-layer. Layers
# 2, 3 and 4 are whole: a module there may import its own layer too (still no cycle). "P.*" is
# package P and every module under it; any other name is the one module (a new module of launchers/
# gets no layer until it is added here and to docs/ARCHITECTURE.md).
L = "launchers."
LAYERS = {
    "0a": (
        "launchers",
        L + "records",
        L + "resilience",
        L + "ledgers",
        L + "frozen",
        L + "credentials",
        L + "containers",
        L + "ssh",
        L + "options",
        L + "node",
        L + "diagnosis",
        L + "clitools",
        L + "errors",
        L + "stops",
        L + "frozen.statcache",
        L + "ssh.sshimport",
        L + "nodeside",
        L + "nodeside.check",
        L + "nodeside.gone",
        L + "nodeside.gputools",
        L + "nodeside.pull",
        L + "nodeside.reach",
        L + "nodeside.procenv",
        L + "containers.imageref",
        L + "credentials.secretshape",
        L + "options.opthelp",
        L + "memcodec",
        L + "memplan",
        L + "dsmemory",
        L + "node.memfiles",
        L + "resilience.slurmpolicy",
        L + "resilience.slotpool",
    ),
    "0b": (
        L + "options.values",
        L + "options.notifytarget",
        L + "containers.containeropts",
        L + "cpubind",
        L + "options.sbatchopts",
        L + "nodeside.probe",
        L + "nodeside.agentgate",
        L + "warmclient",
    ),
    "0c": (
        L + "warmfork",
        L + "runopts",
        L + "credentials.secretenv",
        L + "resilience.recovery",
        L + "node.memstore",
        L + "resilience.recoveryopts",
    ),
    "0d": (
        L + "node.rankchild",
        L + "ledgers.ledgerfile",
        L + "layout",
        L + "options.apiflags",
        L + "options.profiles",
        L + "options.specvalues",
    ),
    "0e": (
        L + "records.rundircheck",
        L + "records.fence",
        L + "ledgers.nodeledger",
        L + "records.notify",
        L + "frozen.snaptree",
        L + "frozen.snapstore",
    ),
    "0f": (
        L + "ckptptr",
        L + "ledgers.siteledger",
        L + "frozen.snapshot",
        L + "resilience.timeline",
        L + "nodeside.zygote",
    ),
    "0g": (L + "heartbeat", L + "spec"),
    "0h": (L + "request", L + "memckpt"),
    "1a": (
        L + "torchrun",
        L + "procs",
        L + "ports",
        L + "ssh.hostfile",
        L + "containers.imagepull",
        L + "integrations",
        L + "records.manifest",
        L + "node.nodecheck",
        L + "node.rankcause",
        L + "sweep",
        L + "gpuhealth",
        L + "gpuhealth.finding",
        L + "gpuhealth.tools",
        L + "hang",
        L + "hang.verdict",
    ),
    "1b": (
        L + "ssh.clusters",
        L + "containers.container",
        L + "frozen.extcache",
        L + "diagnosis.firstfail",
        L + "records.runindex",
        L + "ssh.sshmodel",
        L + "trust",
        L + "gpuhealth.ib",
        L + "gpuhealth.nvlink",
        L + "gpuhealth.smi",
        L + "gpuhealth.topo",
        L + "gpuhealth.xid",
        L + "hang.sample",
        L + "records.runrecords",
    ),
    "1c": (
        L + "records.rundir",
        L + "show",
        L + "ssh.clusterssh",
        L + "ssh.sshconn",
        L + "nodebackend",
        L + "diagnosis.nodefacts",
        L + "gpuhealth.verdict",
        L + "hang.stacks",
    ),
    "1d": (
        L + "follow",
        L + "rankexec",
        L + "resilience.restarts",
        L + "runjson",
        L + "hang.watch",
        L + "ssh.sshwatch",
    ),
    "1e": (L + "nodeagent",),
    "2": (L + "backends.*",),
    "3": (
        L + "api",
        L + "jobenv",
        L + "diagnosis.explain",
        L + "doctor.*",
        L + "client",
        L + "runhandle",
        L + "diagnosis.top",
        L + "detach",
        L + "sweeprun",
        L + "ssh.viacluster",
        L + "ssh.clusterrun",
        L + "pipeline",
        L + "runstatus",
        L + "backendof",
    ),
    "4": (
        L + "cli",
        L + "clitools.clihelp",
        L + "entry",
        L + "slurmnode",
        L + "remote",
        L + "clitools.nodescli",
        L + "warmstart",
        L + "clitools.clibase",
        L + "clitools.cliruns",
        L + "clitools.clidoctor",
    ),
}
ORDER = list(LAYERS)
# what nccl_tuning and workloads may use of the launcher: the layout, the run dir and the API
OPEN_TO_OTHERS = (
    "launchers",
    "launchers.errors",
    "launchers.layout",
    "launchers.ckptptr",
    "launchers.records.rundir",
    "launchers.runopts",
    "launchers.spec",
    "launchers.api",
    "launchers.heartbeat",
    "launchers.records.fence",
    "launchers.diagnosis.nodefacts",
    "launchers.clitools.clihelp",
    "launchers.memckpt",
    "launchers.memcodec",
    "launchers.integrations",
)
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def layer_of(module: str) -> str | None:
    for layer, names in LAYERS.items():
        for n in names:
            if module == n.removesuffix(".*") or (n.endswith(".*") and module.startswith(n[:-1])):
                return layer
    return None


def strict(layer: str) -> bool:
    """A sub-layer (0a, 1c): its modules import only from below it."""
    return not layer.isdigit()


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, relative ones resolved; `from P import
    m` counts as importing module P.m when that is a module."""
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.append((sub if sub in known else mod, node.lineno))
    return out


def private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path}:{n.lineno}: imports private {a.name!r} from {n.module or '.'}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]


# node-side programs that import torch: they run on a node in a process of their own (`python -c` of
# their text, launchers.nodeside.source); no module of the launcher may import them
NODE_PROGRAMS = (
    "launchers.nodeside.probe",
    "launchers.nodeside.zygote",
    "launchers.nodeside.agentgate",
)
# rank-side modules: they run in a rank's process (the workloads' loop, a user's program through
# launchers.integrations) and use torch there, imported inside the functions that need it, never at
# module level (so `import launchers...` and the CLI stay torch-free:
# test_rank_side_modules_load_without_torch)
RANK_SIDE = ("launchers.memckpt", "launchers.memcodec", "launchers.dsmemory")


def rule_violations(root: Path, packages=PACKAGES) -> list[str]:
    """Imports against the layer rule, and import cycles between modules."""
    known = modules(root, packages)
    bad, graph = [], {}
    for name, path in known.items():
        graph[name] = set()
        for mod, line in imports(name, path, known):
            where = f"{path.relative_to(root)}:{line}"
            top = mod.split(".")[0]
            if (
                name.startswith("launchers")
                and top == "workloads"
                or top == "torch"
                and name.startswith("launchers")
                and name not in NODE_PROGRAMS + RANK_SIDE
            ):
                bad.append(f"{where}: the launcher imports {mod}")
            if mod in NODE_PROGRAMS and name != mod:
                bad.append(f"{where}: {mod} is a node's program, shipped as text, never imported")
            if top not in PACKAGES:
                continue
            if mod in known and mod != name:
                graph[name].add(mod)
            if name.startswith("launchers") and top == "launchers":
                mine, theirs = layer_of(name), layer_of(mod)
                if mine is None or theirs is None:
                    bad.append(
                        f"{where}: {name if mine is None else mod} has no layer in "
                        "tests/test_layers.py"
                    )
                elif ORDER.index(theirs) > ORDER.index(mine):
                    bad.append(
                        f"{where}: {name} (layer {mine}) imports {mod} (layer {theirs}): a "
                        "back-edge"
                    )
                elif theirs == mine and strict(mine) and mod != name:
                    bad.append(
                        f"{where}: {name} imports {mod}, both in sub-layer {mine}: it must sit "
                        "above it"
                    )
            elif (
                name.startswith("launchers")
                and top == "nccl_tuning"
                and ORDER.index(layer_of(name) or "0a") < ORDER.index("3")
            ):
                bad.append(
                    f"{where}: {name} imports {mod}; only the API (and above) may use nccl_tuning"
                )
            elif (
                not name.startswith("launchers")
                and top == "launchers"
                and mod not in OPEN_TO_OTHERS
            ):
                bad.append(
                    f"{where}: {name} imports {mod}; outside the launcher only "
                    f"{', '.join(OPEN_TO_OTHERS)}"
                )
    return bad + [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def size_violations(root: Path, packages=PACKAGES) -> list[str]:
    bad = []
    for name, path in modules(root, packages).items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            bad.append(
                f"{path.relative_to(root)}: {text.count(chr(10))} lines (at most "
                f"{MAX_MODULE_LINES})"
            )
        for n in ast.walk(ast.parse(text, str(path))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = n.end_lineno - n.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    bad.append(
                        f"{path.relative_to(root)}:{n.lineno}: {n.name}() has {length} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
        bad += private_imports(path)
    return bad


def test_the_tree_follows_the_layer_rule_without_cycles():
    assert rule_violations(ROOT) == []


def test_modules_and_functions_are_small_and_no_private_name_crosses_a_module():
    assert size_violations(ROOT) == []


def test_every_launcher_module_has_a_layer():
    missing = [m for m in modules(ROOT, ("launchers",)) if layer_of(m) is None]
    assert missing == []


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_rank_side_modules_load_without_torch():
    """RANK_SIDE modules import torch only inside functions: the launcher, its CLI and the
    integrations load without it (and without numpy)."""
    known = modules(ROOT, ("launchers",))
    for name in RANK_SIDE:
        top = [
            n
            for n in ast.parse(known[name].read_text()).body
            if isinstance(n, (ast.Import, ast.ImportFrom))
        ]
        assert not [
            n.lineno
            for n in top
            for a in n.names
            if "torch" in f"{getattr(n, 'module', '')}.{a.name}"
        ]
    code = (
        "import sys, launchers.cli, launchers.integrations, launchers.memckpt, "
        "launchers.memcodec, launchers.dsmemory; assert not {'torch', 'numpy'} & "
        "set(sys.modules), sorted({'torch', 'numpy'} & set(sys.modules))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]


def test_a_back_edge_a_cycle_and_a_forbidden_import_are_caught(tmp_path):
    """A synthetic tree: errors imports the CLI inside a function (back-edge and cycle), a backend
    imports the API, nccl_tuning imports a backend, a workload imports the CLI, a private name
    crosses modules."""
    for pkg in PACKAGES:
        write(tmp_path, f"{pkg}/__init__.py", "")
    write(tmp_path, "launchers/backends/__init__.py", "")
    write(tmp_path, "launchers/errors.py", "def f():\n    from .cli import main\n    return main\n")
    write(tmp_path, "launchers/cli.py", "from .errors import f\nmain = f\n")
    write(tmp_path, "launchers/api.py", "X = 1\n")
    write(tmp_path, "launchers/stops.py", "from . import errors\n")
    write(tmp_path, "launchers/newmod.py", "from . import errors\n")
    write(
        tmp_path,
        "launchers/backends/local.py",
        "from .. import api\nfrom ..errors import _hidden\n",
    )
    write(
        tmp_path,
        "nccl_tuning/runner.py",
        "def g():\n    from launchers.backends.local import api\n",
    )
    write(tmp_path, "workloads/train.py", "import launchers.cli\nfrom launchers import layout\n")
    bad = "\n".join(rule_violations(tmp_path))
    assert "launchers.errors (layer 0a) imports launchers.cli (layer 4): a back-edge" in bad
    assert "import cycle: launchers.cli -> launchers.errors -> launchers.cli" in bad
    assert "launchers.backends.local (layer 2) imports launchers.api (layer 3)" in bad
    assert (
        "launchers.stops imports launchers.errors, both in sub-layer 0a: it must sit above it"
        in bad
    )
    assert "launchers.newmod has no layer in tests/test_layers.py" in bad
    assert "nccl_tuning.runner imports launchers.backends.local" in bad
    assert "workloads.train imports launchers.cli" in bad
    assert "launchers.layout" not in bad.replace(
        "only launchers, launchers.errors, launchers.layout", ""
    )
    assert "imports private '_hidden'" in "\n".join(size_violations(tmp_path))


def test_a_long_function_and_a_long_module_are_caught(tmp_path):
    write(tmp_path, "launchers/__init__.py", "")
    write(tmp_path, "workloads/__init__.py", "")
    write(tmp_path, "nccl_tuning/wide.py", "x = 1\n" * 401)
    write(tmp_path, "launchers/long.py", "def f():\n" + "    x = 1\n" * 60 + "\n" * 400)
    bad = "\n".join(size_violations(tmp_path))
    assert "f() has 61 lines" in bad and "launchers/long.py: 461 lines" in bad
    assert "nccl_tuning/wide.py: 401 lines" in bad
