"""The Python API's `submit(spec, cluster=NAME)` (issue 36): `launch slurm --cluster NAME` from
Python. The spec becomes the CLI's words (request.JobSpec.cli_args), the tree is uploaded and the
job submitted by the login node's own launch (launchers.ssh.viacluster, the same door as the CLI:
secrets over the connection's stdin), and the run it made is a client.ClusterRun: it lives on the
cluster, and its status, wait and cancel are asked of the login node here (ask(): `launch
status|wait|cancel RUN --cluster NAME`)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from typing import Any

from ..errors import LaunchError
from ..request import JobSpec
from ..runjson import DryRun


def ask(verb: str, args: list[str], cluster: str, profile: str | None = None) -> tuple[int, str]:
    """`launch VERB ARGS` on the cluster's login node: (its exit code, what it printed on stdout);
    its stderr (progress, the end line, errors) stays the caller's."""
    from .viacluster import forward

    with tempfile.TemporaryFile("w+") as out, contextlib.redirect_stdout(io.StringIO()) as said:
        code = forward(verb, args, cluster, profile, out=out)
        out.seek(0)
        return code, said.getvalue() + out.read()


def last_object(text: str, what: str) -> dict[str, Any]:
    """The JSON object a `--json` verb printed (the last one that starts a line; it may span
    lines)."""
    starts = [0] * text.startswith("{") + [
        i + 1 for i, ch in enumerate(text) if ch == "\n" and text[i + 1 : i + 2] == "{"
    ]
    for at in reversed(starts):
        try:
            got = json.JSONDecoder().raw_decode(text, at)[0]
        except ValueError:
            continue
        if isinstance(got, dict):
            return got
    raise LaunchError(f"{what}: the login node's launch printed no JSON object")


def submit(spec: JobSpec, cluster: str, dry_run: bool) -> dict[str, Any] | DryRun:
    """submit(spec, cluster=NAME): a Slurm job through the cluster's login node -> the run's record
    as `launch slurm --json` prints it there (client.ClusterRun wraps it); dry_run: what it would
    run (the upload and the login node's command), nothing contacted."""
    if not isinstance(cluster, str) or not cluster:
        raise TypeError(
            f"submit cluster must be a cluster's name (a str of the clusters file), got {cluster!r}"
        )
    if spec.backend != "slurm":
        raise LaunchError(
            f"JobSpec.backend {spec.backend!r} with cluster={cluster!r}: accepted: 'slurm' (a "
            "cluster of the clusters file runs Slurm jobs)"
        )
    words = spec.cli_args() + (["--dry-run"] if dry_run else ["--json"]) + ["--", *spec.program]
    profile = os.fspath(spec.profile) if spec.profile is not None else None
    code, text = ask("slurm", words, cluster, profile)
    if dry_run:
        return DryRun(text, "")
    rec = last_object(text, f"cluster {cluster}: launch slurm (exit code {code})")
    if code != 0:
        raise LaunchError(
            f"cluster {cluster}: launch slurm exited {code}: "
            f"{rec.get('reason') or rec.get('state')}"
        )
    return rec
