"""Which hosts of a context explore, and which candidate each explorer runs.

Both are fixed functions of the host's name and the context, not of the plan's version: a refit
that keeps the incumbent and a candidate leaves every host on the θ it already runs. Re-drawing
the explorers at every refit (as a hash over the plan version would) moves a share of the fleet
between θ at each publish, which is churn the fleet pays for and the model learns nothing from.
The planner keeps a surviving candidate in its slot, so an explorer changes θ only when its
candidate is retired.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TypeVar

from ..domain import ContextKey

T = TypeVar("T")


def exploration_position(host: str, key: ContextKey) -> float:
    """A host's fixed position in [0, 1) in one context: the lowest ``share`` explore."""
    return zlib.crc32(f"{host}|{tuple(key)}".encode()) / 2**32


def candidate_slot(host: str, key: ContextKey, slots: int) -> int:
    """The candidate slot an exploring host runs; the same slot across refits."""
    return zlib.crc32(f"slot|{host}|{tuple(key)}".encode()) % slots


def assign(
    host: str, key: ContextKey, incumbent: T, candidates: Sequence[T], share: float
) -> tuple[T, bool]:
    """What ``host`` runs in context ``key``: (θ, exploratory)."""
    if candidates and exploration_position(host, key) < share:
        return candidates[candidate_slot(host, key, len(candidates))], True
    return incumbent, False
