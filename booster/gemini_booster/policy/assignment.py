"""Which hosts of a context explore, and which candidate each explorer runs.

Both are fixed functions of the host's name, the context and a rotation slot, not of the plan's
version: a refit that keeps the incumbent and a candidate leaves every host on the θ it already
runs. Re-drawing the explorers at every refit (as a hash over the plan version would) moves a
share of the fleet between θ at each publish, which is churn the fleet pays for and the model
learns nothing from. The planner keeps a surviving candidate in its slot, so an explorer changes
θ only when its candidate is retired or the rotation moves it.

**Rotation.** Each host has a fixed position in [0, 1) per context; the explorers are the hosts
whose position lies in a window of width ``share`` on that circle. With a fixed window a context
of one or two hosts has a fair chance (1 − share per host) that no host ever explores: on a
Zipf-shaped fleet that is half of the tail, and those contexts never measure anything but their
incumbent. The window therefore starts at ``slot × ROTATION_STEP`` (mod 1), the slot being the
clock's ``ROTATION_HOURS``-long period: every host explores ``share`` of the slots, so the
fleet's exploring share (and the cost the planner's cap bounds) is what the policy says, and
every context with traffic gets explorers within a few slots. The step is the golden ratio's
conjugate, whose multiples fill the circle evenly: no host waits more than a few slots, and the
period is not a divisor of a day, so a context that exists only in one time-of-day block still
sees the window pass over its hosts. The slot is a function of the clock alone, so replicas
answering the same host agree (save across a slot boundary, for their clock skew).

The cost of rotating is churn at each slot boundary: the hosts the window leaves and enters
change θ (at most 2 × share of a context's hosts per slot, fewer where the windows overlap).
Without a clock (``now`` None) the window stays at slot 0: the fixed assignment.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from datetime import datetime
from typing import TypeVar

from ..domain import ContextKey

T = TypeVar("T")

ROTATION_HOURS = 6  # the exploring window moves once per this many hours of the clock
ROTATION_STEP = (math.sqrt(5.0) - 1.0) / 2.0  # the window's move per slot, share of the circle


def exploration_position(host: str, key: ContextKey) -> float:
    """A host's fixed position in [0, 1) in one context: the lowest ``share`` explore in slot 0."""
    return zlib.crc32(f"{host}|{tuple(key)}".encode()) / 2**32


def rotation_slot(now: datetime | None) -> int:
    """The rotation slot of ``now`` (0 without a clock): whole ROTATION_HOURS since the epoch."""
    if now is None:
        return 0
    return int(now.timestamp() // (ROTATION_HOURS * 3600))


def explores(host: str, key: ContextKey, share: float, slot: int) -> bool:
    """Whether ``host`` explores in context ``key`` during rotation slot ``slot``."""
    start = (slot * ROTATION_STEP) % 1.0
    return (exploration_position(host, key) - start) % 1.0 < share


def candidate_slot(host: str, key: ContextKey, slots: int) -> int:
    """The candidate slot an exploring host runs; the same slot across refits."""
    return zlib.crc32(f"slot|{host}|{tuple(key)}".encode()) % slots


def assign(
    host: str,
    key: ContextKey,
    incumbent: T,
    candidates: Sequence[T],
    share: float,
    now: datetime | None = None,
) -> tuple[T, bool]:
    """What ``host`` runs in context ``key`` at ``now``: (θ, exploratory)."""
    if candidates and explores(host, key, share, rotation_slot(now)):
        return candidates[candidate_slot(host, key, len(candidates))], True
    return incumbent, False
