"""The architecture, checked: every module's imports (also those inside functions) follow the layer rule and
make no cycle, and modules and functions stay small (docs/ARCHITECTURE.md)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("launchers", "nccl_tuning", "workloads")

# errors, layout, spec  <-  torchrun, rundir, procs  <-  backends  <-  api  <-  cli
LAYERS = {
    0: ("launchers", "launchers.errors", "launchers.layout", "launchers.spec", "launchers.runopts",
        "launchers.ckptptr", "launchers.heartbeat", "launchers.request", "launchers.cpubind", "launchers.values",
        "launchers.secretenv", "launchers.notify", "launchers.containeropts",
        "launchers.snapshot", "launchers.stops", "launchers.recovery", "launchers.nodeledger",
        "launchers.timeline", "launchers.fence", "launchers.sbatchopts", "launchers.siteledger", "launchers.nodeside"),
    1: ("launchers.torchrun", "launchers.rundir", "launchers.procs", "launchers.ports", "launchers.follow",
        "launchers.hostfile", "launchers.sshconn", "launchers.rankexec", "launchers.remote", "launchers.hang",
        "launchers.rankcause", "launchers.firstfail", "launchers.container", "launchers.manifest",
        "launchers.nodecheck", "launchers.integrations", "launchers.restarts", "launchers.imagepull",
        "launchers.show", "launchers.runindex", "launchers.sweep", "launchers.gpuhealth", "launchers.clusters",
        "launchers.nodefacts", "launchers.clusterssh", "launchers.extcache", "launchers.trust",
        "launchers.nodebackend", "launchers.runjson"),
    2: ("launchers.backends",),
    3: ("launchers.api", "launchers.jobenv", "launchers.explain", "launchers.doctor",
        "launchers.client", "launchers.top",
        "launchers.detach", "launchers.sweeprun", "launchers.viacluster", "launchers.clusterrun", "launchers.pipeline"),
    4: ("launchers.cli", "launchers.clihelp", "launchers.entry", "launchers.slurmnode", "launchers.nodescli"),
}
# what nccl_tuning and workloads may use of the launcher: the layout, the run dir and the API
OPEN_TO_OTHERS = ("launchers", "launchers.errors", "launchers.layout", "launchers.ckptptr", "launchers.rundir",
                  "launchers.runopts", "launchers.spec", "launchers.api", "launchers.heartbeat", "launchers.fence",
                  "launchers.nodefacts", "launchers.clihelp")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def layer_of(module: str) -> int | None:
    best = None
    for layer, names in LAYERS.items():
        for n in names:
            if (module == n or module.startswith(n + ".")) and (best is None or len(n) > len(best[1])):
                best = (layer, n)
    return best[0] if best else None


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, relative ones resolved; `from P import m`
    counts as importing module P.m when that is a module."""
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
    return [f"{path}:{n.lineno}: imports private {a.name!r} from {n.module or '.'}"
            for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]


def rule_violations(root: Path, packages=PACKAGES) -> list[str]:
    """Imports against the layer rule, and import cycles between modules."""
    known = modules(root, packages)
    bad, graph = [], {}
    for name, path in known.items():
        graph[name] = set()
        for mod, line in imports(name, path, known):
            where = f"{path.relative_to(root)}:{line}"
            top = mod.split(".")[0]
            if name.startswith("launchers") and top in ("torch", "workloads"):
                bad.append(f"{where}: the launcher imports {mod}")
            if top not in PACKAGES:
                continue
            if mod in known and mod != name:
                graph[name].add(mod)
            if name.startswith("launchers") and top == "launchers":
                mine, theirs = layer_of(name), layer_of(mod)
                if mine is None or theirs is None:
                    bad.append(f"{where}: {name if mine is None else mod} has no layer in tests/test_layers.py")
                elif theirs > mine:
                    bad.append(f"{where}: {name} (layer {mine}) imports {mod} (layer {theirs}): a back-edge")
            elif name.startswith("launchers") and top == "nccl_tuning" and (layer_of(name) or 0) < 3:
                bad.append(f"{where}: {name} imports {mod}; only the API (and above) may use nccl_tuning")
            elif not name.startswith("launchers") and top == "launchers" and mod not in OPEN_TO_OTHERS:
                bad.append(f"{where}: {name} imports {mod}; outside the launcher only {', '.join(OPEN_TO_OTHERS)}")
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


def size_violations(root: Path, packages=("launchers", "workloads")) -> list[str]:
    bad = []
    for name, path in modules(root, packages).items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            bad.append(f"{path.relative_to(root)}: {text.count(chr(10))} lines (at most {MAX_MODULE_LINES})")
        for n in ast.walk(ast.parse(text, str(path))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = n.end_lineno - n.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    bad.append(f"{path.relative_to(root)}:{n.lineno}: {n.name}() has {length} lines "
                               f"(at most {MAX_FUNCTION_LINES})")
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


def test_a_back_edge_a_cycle_and_a_forbidden_import_are_caught(tmp_path):
    """A synthetic tree: errors imports the CLI inside a function (back-edge and cycle), a backend imports the
    API, nccl_tuning imports a backend, a workload imports the CLI, a private name crosses modules."""
    for pkg in PACKAGES:
        write(tmp_path, f"{pkg}/__init__.py", "")
    write(tmp_path, "launchers/backends/__init__.py", "")
    write(tmp_path, "launchers/errors.py", "def f():\n    from .cli import main\n    return main\n")
    write(tmp_path, "launchers/cli.py", "from .errors import f\nmain = f\n")
    write(tmp_path, "launchers/api.py", "X = 1\n")
    write(tmp_path, "launchers/backends/local.py", "from .. import api\nfrom ..errors import _hidden\n")
    write(tmp_path, "nccl_tuning/runner.py", "def g():\n    from launchers.backends.local import api\n")
    write(tmp_path, "workloads/train.py", "import launchers.cli\nfrom launchers import layout\n")
    bad = "\n".join(rule_violations(tmp_path))
    assert "launchers.errors (layer 0) imports launchers.cli (layer 4): a back-edge" in bad
    assert "import cycle: launchers.cli -> launchers.errors -> launchers.cli" in bad
    assert "launchers.backends.local (layer 2) imports launchers.api (layer 3)" in bad
    assert "nccl_tuning.runner imports launchers.backends.local" in bad
    assert "workloads.train imports launchers.cli" in bad
    assert "launchers.layout" not in bad.replace("only launchers, launchers.errors, launchers.layout", "")
    assert "imports private '_hidden'" in "\n".join(size_violations(tmp_path))


def test_a_long_function_and_a_long_module_are_caught(tmp_path):
    write(tmp_path, "launchers/__init__.py", "")
    write(tmp_path, "workloads/__init__.py", "")
    write(tmp_path, "launchers/long.py", "def f():\n" + "    x = 1\n" * 60 + "\n" * 400)
    bad = "\n".join(size_violations(tmp_path))
    assert "f() has 61 lines" in bad and "launchers/long.py: 461 lines" in bad
