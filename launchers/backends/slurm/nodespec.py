"""slurm/spec-a<A>.json: what the launcher resolved for the nodes of one submission (spec, run id,
dist backend, the agent's stop settings, max requeues), so the nodes read it instead of re-deriving
it. Stdlib only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ... import layout
from ...records.rundir import RunDir, redacted_spec, spec_from_record
from ...spec import RunSpec


@dataclass(frozen=True)
class NodeSpec:
    """What a node needs, as the launcher resolved it."""

    run_id: str
    spec: RunSpec
    dist_backend: str
    agent_env: dict[str, str]
    max_requeues: int


def resolve_for_nodes(spec: RunSpec) -> dict[str, Any]:
    """The launcher's resolution of what the nodes would otherwise re-derive."""
    from .options import slurm_options
    from .render import allocation_env

    so = slurm_options(spec)
    return {
        "dist_backend": spec.dist_backend,
        "agent_env": allocation_env(so["signal_seconds"]),
        "max_requeues": so["max_requeues"],
    }


def write_node_spec(rd: RunDir, spec: RunSpec, run_id: str, base_attempt: int) -> None:
    """The submission's spec as JSON next to its sbatch script (same content as run.yaml's, secrets
    ***)."""
    layout.atomic_write(
        layout.path(rd.path, "node_spec", attempt=base_attempt),
        json.dumps(
            {"run_id": run_id, "spec": redacted_spec(spec), "resolved": resolve_for_nodes(spec)},
            indent=1,
        ),
    )


def load_node_spec(rd: RunDir, base_attempt: int) -> NodeSpec:
    """This submission's NodeSpec; run dirs from before the JSON file (or its `resolved`) resolve it
    here."""
    d = layout.read_json(layout.path(rd.path, "node_spec", attempt=base_attempt))
    if d is None:
        d = {"run_id": rd.run_id, "spec": rd.read_run_yaml()["spec"]}
    spec = spec_from_record(d["spec"])
    r = d.get("resolved") or resolve_for_nodes(spec)
    return NodeSpec(
        d["run_id"], spec, r["dist_backend"], dict(r["agent_env"]), int(r["max_requeues"])
    )
