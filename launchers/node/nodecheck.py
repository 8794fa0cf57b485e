"""The preflight's check of a node, run with the job's python on every node before anything starts
(SSH: over each host's connection; local: once here, in the nodes' environment): the working
directory there, torch and launchers importable (importlib.util.find_spec: found, nothing imported),
the program present, the node log directory creatable, and on the master the first free port of the
candidates. Stdlib only.

The check is the stdlib module launchers.nodeside.check, sent inline (`python -c CHECK JSON`: it
works before `launchers` is importable there) and answers one line, `CHECK {host, errors[, port]}`;
answer() reads it, and says why when the python gave none.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from typing import Mapping, Sequence

from ..nodeside import source

CHECK = source("check")
TIMEOUT_S = 60


def argv(
    python: str,
    cwd: str,
    program: Sequence[str],
    dirs: Sequence[str] = (),
    ports: Sequence[int] = (),
    extra: Mapping[str, list] | None = None,
) -> list[str]:
    """The check's command: the job's python, the inline script, its argument (no secret in it);
    extra: what a container job looks for instead (launchers.containers.container.host_check:
    modules, runtime binaries, no program)."""
    arg = {
        "cwd": cwd,
        "program": list(program),
        "dirs": list(dirs),
        "ports": list(ports),
        **(extra or {}),
    }
    return [python, "-c", CHECK, json.dumps(arg)]


def shell(words: Sequence[str]) -> str:
    """argv() as one shell line (what sshd runs)."""
    return " ".join(shlex.quote(w) for w in words)


def answer(
    stdout: str, stderr: str, code: int | None, python: str
) -> tuple[dict | None, list[str]]:
    """(the check's record, the node's errors) from the python's output; no record when it gave no
    answer: not found (exit 127) or dead before answering (its last stderr line)."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith("CHECK ")), None)
    if line is None:
        why = (
            f"python {python!r} not found"
            if code == 127
            else (stderr.strip().splitlines() or [f"exit code {code}"])[-1]
        )
        return None, [f"{why} (give --python)"]
    rec = json.loads(line[6:])
    return rec, list(rec["errors"])


def run_here(
    python: str,
    env: Mapping[str, str],
    cwd: str,
    program: Sequence[str],
    extra: Mapping[str, list] | None = None,
) -> list[str]:
    """The check run on this machine (the local backend's nodes), in the nodes' environment: its
    errors."""
    try:
        r = subprocess.run(
            argv(python, cwd, program, extra=extra),
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except OSError as e:
        return [f"python {python!r} cannot be run ({e.strerror}) (give --python)"]
    except subprocess.TimeoutExpired:
        return [f"python {python!r} did not answer the check within {TIMEOUT_S} s"]
    return answer(r.stdout, r.stderr, r.returncode, python)[1]


def where(nodes: int, host: str = "") -> str:
    """The local backend's nodes, all on this machine (host: its name, when the error is about the
    host), as an error names them."""
    at = f" on host {host}" if host else ""
    return f"node 0{at} (this machine)" if nodes == 1 else f"nodes 0-{nodes - 1}{at} (this machine)"
