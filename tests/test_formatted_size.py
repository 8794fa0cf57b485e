"""Issue 34 item 6: the size limits (400 lines a module, 60 a function: tests/test_layers.py) hold
on the code as the formatter writes it -- `ruff format` with a 100-column limit, the field's style
-- not only on the code as it is typed (at 120 columns the same code is ~30% shorter). Every package
is measured: launchers, nccl_tuning, workloads. The tree itself is not reformatted: each module is
formatted into a temporary copy and measured there."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from test_layers import MAX_FUNCTION_LINES, MAX_MODULE_LINES, PACKAGES, ROOT, modules

RUFF = Path(sys.executable).with_name("ruff")
COLUMNS = 100


def formatted(root: Path, into: Path) -> dict[str, str]:
    """Every module of PACKAGES as `ruff format --line-length 100` writes it: {path relative to
    root: text}."""
    paths = [p.relative_to(root) for p in modules(root, PACKAGES).values()]
    for rel in paths:
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, into / rel)
    p = subprocess.run(
        [str(RUFF), "format", "--isolated", "--line-length", str(COLUMNS), "--quiet", str(into)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    return {str(rel): (into / rel).read_text() for rel in paths}


def sizes(texts: dict[str, str]) -> dict[str, int]:
    """What is over the limits: {module path: lines, "path::function": lines}."""
    out = {}
    for rel, text in texts.items():
        if text.count("\n") > MAX_MODULE_LINES:
            out[rel] = text.count("\n")
        for n in ast.walk(ast.parse(text, rel)):
            if (
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
            ):
                out.setdefault(f"{rel}::{n.name}", n.end_lineno - n.lineno + 1)
    return out


def test_formatted_modules_and_functions_keep_to_the_limits(tmp_path):
    over = sizes(formatted(ROOT, tmp_path))
    assert not over, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function once formatted "
        f"(`ruff format --line-length {COLUMNS}`): {over}"
    )


def test_the_measure_counts_what_the_formatter_writes(tmp_path):
    """A function of 41 typed lines (each 105 columns) that the formatter spreads over more than 60
    is over; the tree measured is not changed."""
    (tmp_path / "src" / "launchers").mkdir(parents=True)
    (tmp_path / "src" / "launchers" / "x.py").write_text(
        "def f():\n"
        + "".join(
            f"    v{i} = dict(alpha=1, beta=2, gamma=3, delta=4, epsilon=5, zeta=6, eta=7, "
            "theta=8, iota=9, kappa=10)\n"
            for i in range(40)
        )
    )
    texts = formatted(tmp_path / "src", tmp_path / "out")
    assert sizes(texts)["launchers/x.py::f"] > MAX_FUNCTION_LINES
    # the tree is untouched
    assert (tmp_path / "src" / "launchers" / "x.py").read_text().count("\n") == 41
