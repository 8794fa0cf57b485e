"""Issue 34 item 5 (part): the programs launch runs on a node are real modules
(launchers/nodeside/), seen by the layer, size and lint checks; no module of launchers/ holds a
Python program in a string. What is still sent as `python -c` (the node may have no launchers) is
the modules' own text and runs on a bare interpreter; what runs as `python -m` (the SSH reach check)
runs so."""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from launchers.containers import imagepull
from launchers.doctor.probe import GONE, PROBE
from launchers.node import nodecheck
from launchers.nodeagent import reach_line

MAX_PROGRAM_LINES = 5  # a string that parses as Python, imports something and is longer: a program


def programs_in_strings(root: Path) -> list[str]:
    """Every string constant in launchers/ that is a Python program: it parses, imports, spans > 5
    lines."""
    bad = []
    for path in sorted((root / "launchers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                not (isinstance(node, ast.Constant) and isinstance(node.value, str))
                or node.value.count("\n") < MAX_PROGRAM_LINES
            ):
                continue
            try:
                tree = ast.parse(node.value)
            except (SyntaxError, ValueError):
                continue
            if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree)):
                bad.append(f"{path.relative_to(root)}:{node.lineno}: a Python program in a string")
    return bad


def test_no_launcher_module_holds_a_python_program_in_a_string(tmp_path):
    assert programs_in_strings(ROOT) == []
    # the rule catches what launchers/node/nodecheck.py held before
    (tmp_path / "launchers").mkdir()
    (tmp_path / "launchers" / "m.py").write_text(
        "CHECK = r'''\nimport json, sys\na = json.loads(sys.argv[1])\n"
        "if a:\n    print(a)\nprint('CHECK')\n'''\n"
    )
    assert programs_in_strings(tmp_path) == ["launchers/m.py:1: a Python program in a string"]


def bare(code: str, arg: dict, cwd: Path) -> subprocess.CompletedProcess:
    """python -c as on a node with no launchers: no site-packages (-S), no environment paths
    (-I)."""
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, json.dumps(arg)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_the_inline_programs_run_on_a_bare_python(tmp_path):
    probe = bare(PROBE, {"facts_only": True, "cwd": str(tmp_path), "root": str(tmp_path)}, tmp_path)
    lines = probe.stdout.splitlines()
    assert lines[0].startswith("DOCTOR-T ") and lines[-1] == "DOCTOR-END", probe.stderr
    rec = json.loads(
        "".join(json.loads(ln[len("DOCTOR+ ") :]) for ln in lines if ln.startswith("DOCTOR+ "))
    )
    assert (
        "launchers_error" in rec and "torch_error" in rec and rec["disk"]["path"] == str(tmp_path)
    )
    check = bare(
        nodecheck.CHECK,
        {"cwd": str(tmp_path), "program": ["nope.py"], "modules": ["json"]},
        tmp_path,
    )
    assert nodecheck.answer(check.stdout, check.stderr, check.returncode, "py")[1] == [
        "program file nope.py does not exist there"
    ]
    pull = bare(
        imagepull.PULL,
        {"image": "localhost:1/launch-none:0", "answer_s": 10, "pull_s": 10},
        tmp_path,
    )
    rec = json.loads(pull.stdout.split("IMAGE ", 1)[1])  # no podman, or no registry on port 1
    assert rec["pulled"] is False and rec["error"] and rec["host"] == socket.gethostname()
    gone = bare(GONE, {"port": free_port(), "token": "t", "node": 1, "wait": 0}, tmp_path)
    assert gone.returncode == 0 and gone.stdout == "" and gone.stderr == ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_reach_check_runs_as_a_module_in_the_working_directory():
    base = {"port": free_port(), "token": "0123abcd", "addr": "127.0.0.1", "clients": 1}
    master = subprocess.Popen(
        [
            "bash",
            "-c",
            reach_line(sys.executable, str(ROOT), dict(base, role="master", id=0, timeout=30)),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert master.stdout.readline().strip() == "LISTENING"
        client = subprocess.run(
            [
                "bash",
                "-c",
                reach_line(sys.executable, str(ROOT), dict(base, role="client", id=1, timeout=20)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert (client.returncode, client.stdout) == (0, "REACHED\n"), client.stderr
        assert master.stdout.read().strip() == "SERVED 1" and master.wait(30) == 0
    finally:
        master.kill()
        master.wait()
