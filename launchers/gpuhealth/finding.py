"""A finding: one fact about one device of one node, in one line."""

from __future__ import annotations

from dataclasses import asdict, dataclass

LEVELS = ("fail", "warn", "info")


@dataclass(frozen=True)
class Finding:
    level: str  # fail (the node should not run the job) | warn | info
    node: str  # the node's name as doctor shows it
    device: str  # "GPU 0 (00000000:04:00.0)", "mlx5_2 port 1", "node"
    fact: str  # what the tool said, in words

    def line(self) -> str:
        return f"{self.node} {self.device}: {self.fact}"

    def as_dict(self) -> dict:
        return asdict(self)


def worst(found: list[Finding]) -> str | None:
    for level in LEVELS:
        if any(f.level == level for f in found):
            return level
    return None
