"""docs/ARCHITECTURE.md, checked against the tree: its layer table gives every module of launchers/
the layer tests/test_layers.py gives it, every module has a description in its "Modules" section,
and every file of the run dir (launchers/layout.py's FILES) has a row in "Who owns each file of the
run dir" naming its one writer module, a module that really names that file."""

from __future__ import annotations

import re

from launchers.layout import FILES
from test_layers import LAYERS, ROOT, layer_of, modules

DOC = ROOT / "docs" / "ARCHITECTURE.md"
FIELDS = {
    "rank": "R",
    "node": "K",
    "attempt": "A",
    "job": "JOB",
    "step": "STEP",
    "restart": "RESTART",
    "slot": "S",
}


def section(text: str, title: str) -> str:
    """The text under the `## title...` heading, up to the next `## ` heading."""
    start = text.index("\n## " + title)
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def code_block(text: str) -> list[str]:
    return text.split("```")[1].split("\n")[1:]


def doc_layers(text: str) -> dict[str, str]:
    """module (as test_layers.LAYERS names it) -> its layer, from the layer table: `layer 0a  name ...` lines
    (and lines continuing them); `__init__` is the package launchers, `P/` a package's own module,
    `P/*` the package and everything under it, `P/m` a module of it; words in parentheses are
    comments."""  # noqa: E501
    out, layer = {}, None
    for line in code_block(section(text, "The layer rule")):
        line = re.sub(r"\([^)]*\)", "", line)
        words = line.split()
        if words[:1] == ["layer"]:
            layer, words = words[1], words[2:]
        for w in words:
            name = (
                "launchers" if w == "__init__" else "launchers." + w.rstrip("/").replace("/", ".")
            )
            out[name] = layer
    return out


def test_the_layer_table_gives_every_module_its_layer():
    doc = doc_layers(DOC.read_text())
    assert doc == {n: layer for layer, names in LAYERS.items() for n in names}
    assert {m: layer_of(m) for m in modules(ROOT, ("launchers",)) if layer_of(m) is None} == {}


def module_entries(text: str) -> dict[str, str]:
    """`  path  description` entries of the Modules block (path: a file or a package dir/ under launchers/,
    two spaces in), each with its description (the lines indented further below it)."""  # noqa: E501
    out, key = {}, None
    for line in code_block(section(text, "Modules")):
        m = re.match(r"  (\S+?(?:\.py|/))(?:\s|$)", line)
        if m:
            key = m.group(1)
            out[key] = line[m.end() :]
        elif line.startswith("   ") and key is not None:
            out[key] += " " + line.strip()
        else:
            key = None
    return out


def undescribed(entries: dict[str, str]) -> list[str]:
    """Modules of launchers/ with neither an entry of their own (`errors.py`) nor their name as a
    word in the entry of their package (`hang/`: `sample.py ...`); a package's __init__ is described
    by the package's entry."""
    out = []
    for name, path in modules(ROOT, ("launchers",)).items():
        rel = path.relative_to(ROOT / "launchers").as_posix()
        if rel in entries or (path.name == "__init__.py" and rel[: -len("__init__.py")] in entries):
            continue
        parts = rel.split("/")
        dirs = ["/".join(parts[:i]) + "/" for i in range(len(parts) - 1, 0, -1)]
        if not any(re.search(rf"\b{re.escape(path.stem)}\b", entries.get(d, "")) for d in dirs):
            out.append(rel)
    return out


def test_every_module_has_a_description():
    entries = module_entries(DOC.read_text())
    assert undescribed(entries) == []
    here = {
        p.relative_to(ROOT / "launchers").as_posix() for p in (ROOT / "launchers").rglob("*.py")
    }
    dirs = {
        d.relative_to(ROOT / "launchers").as_posix() + "/"
        for d in (ROOT / "launchers").rglob("*")
        if d.is_dir() and (d / "__init__.py").exists()
    }
    assert [e for e in entries if e not in here | dirs] == []  # no entry for a module that is gone


def run_dir_rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(the paths of the first column, the modules of the last) per row of the run dir's table."""
    rows = []
    for line in section(text, "Who owns each file of the run dir").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (
            line.startswith("|")
            and len(cells) >= 3
            and not set(cells[0]) <= set("-")
            and cells[0] != "file"
        ):
            rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[-1])))
    return rows


def shown(template: str) -> str:
    """A FILES path as the doc writes it: `status/rank<R>.json`."""
    return re.sub(r"\{(\w+)\}", lambda m: f"<{FIELDS[m.group(1)]}>", template)


def names(token: str, path: str) -> bool:
    token = token.removesuffix("/")
    return token == path or (path[-1] in "_-" and token.startswith(path))


def ownership_faults(text: str) -> list[str]:
    known = modules(ROOT)
    bad, rows = [], run_dir_rows(text)
    for paths, mods in rows:
        if len(mods) != 1 or mods[0] not in known:
            bad.append(
                f"row {paths}: its writer column must name one module of the tree, not {mods}"
            )
    for key, template in FILES.items():
        found = [mods for paths, mods in rows if any(names(p, shown(template)) for p in paths)]
        if len(found) != 1:
            bad.append(f"{key} ({shown(template)}): {len(found)} rows name it (one must)")
        elif len(found[0]) == 1 and found[0][0] in known:
            source = known[found[0][0]].read_text()
            spelled = [f'"{key}"', f"'{key}'"] + ([f'"{template}"'] if "{" not in template else [])
            if not any(s in source for s in spelled):
                bad.append(
                    f"{key}: its writer {found[0][0]} never names it ({' or '.join(spelled)})"
                )
    return bad


def test_every_run_dir_file_has_one_writer_module_that_names_it():
    assert ownership_faults(DOC.read_text()) == []


def test_a_wrong_layer_a_missing_description_and_a_file_without_a_writer_are_caught():
    text = DOC.read_text()
    moved = text.replace("layer 0d  layout", "layer 0d  ").replace(
        "layer 0e  ", "layer 0e  layout  "
    )
    assert doc_layers(moved)["launchers.layout"] == "0e" != layer_of("launchers.layout")
    entries = module_entries(text)
    del entries["errors.py"]
    entries["hang/"] = entries["hang/"].replace("sample.py", "")
    assert undescribed(entries) == ["errors.py", "hang/sample.py"]
    table = section(text, "Who owns each file of the run dir")
    gone = "\n".join(line for line in table.splitlines() if "`nodes.json`" not in line)
    wrong = table.replace("| `launchers.records.fence` |", "| `launchers.records.rundir` |")
    assert ownership_faults(text.replace(table, gone)) == [
        "node_ledger (nodes.json): 0 rows name it (one must)"
    ]
    assert ownership_faults(text.replace(table, wrong)) == [
        "generation: its writer launchers.records.rundir never names it "
        '("generation" or \'generation\' or "status/generation")'
    ]
