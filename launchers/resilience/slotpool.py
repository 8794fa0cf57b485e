"""The node slots of a run (issue 23): Pool -- the active slots in node-rank order, the idle spares,
the quarantined ones -- and the two moves the recovery policy (launchers.resilience.recovery) makes
on it: swap (a slot out, the first spare in) and grow (idle spares back up to --nodes MAX). Pure
(stdlib only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Pool:
    """The node slots of a run: `active` in node-rank order (active[0] is node 0, the rendezvous
    host), idle spares in the order they are taken, quarantined ones never used again in the run."""

    active: tuple[int, ...]
    spares: tuple[int, ...] = ()
    quarantined: tuple[int, ...] = ()

    @classmethod
    def fresh(
        cls,
        nodes: int,
        spares: int,
        quarantined: tuple[int, ...] = (),
        known: tuple[int, ...] = (),
        least: int = 0,
    ) -> "Pool":
        """Slots 0..nodes+spares-1 (and those `known` already) less the quarantined ones: the first
        `nodes` active, the rest spares (a pool short of slots after quarantines -- fewer than
        `least`, default `nodes` -- takes the lowest slots, quarantined or not: nothing else is
        there)."""
        slots = sorted({*range(nodes + spares), *known})
        free = [s for s in slots if s not in quarantined]
        if len(free) < (least or nodes):
            free = slots
        return cls(tuple(free[:nodes]), tuple(free[nodes:]), tuple(sorted(quarantined)))

    def to_dict(self) -> dict[str, list[int]]:
        return {
            "active": list(self.active),
            "spares": list(self.spares),
            "quarantined": list(self.quarantined),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Pool":
        return cls(
            *(tuple(int(s) for s in d.get(k) or ()) for k in ("active", "spares", "quarantined"))
        )


def grow(pool: Pool, high: int, benched: tuple[int, ...] = ()) -> Pool:
    """The pool with idle spares (never quarantined) taken back into the active ones, last, up to
    `high` nodes (--nodes MIN:MAX: a shrunk run grows back to MAX at a restart); `benched`: slots
    that stay out (benched by this very decision)."""
    back = tuple(s for s in pool.spares if s not in benched)[: max(0, high - len(pool.active))]
    return replace(
        pool, active=pool.active + back, spares=tuple(s for s in pool.spares if s not in back)
    )


def swap(pool: Pool, slot: int, bench: bool = False) -> Pool:
    """The pool with `slot` out of the active ones and the first spare in, last (none left: one node
    fewer). bench: the slot is not quarantined, it goes to the back of the spares (a later
    replacement may take it again)."""
    active = tuple(s for s in pool.active if s != slot) + pool.spares[:1]
    spares = pool.spares[1:] + ((slot,) if bench else ())
    return replace(pool, active=active, spares=spares)
