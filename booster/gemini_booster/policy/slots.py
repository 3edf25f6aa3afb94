"""The candidate slots: which θ a context's explorers run next.

A context publishes ``N_CANDIDATES`` candidates; explorer hosts are spread over the slots, so
a θ that keeps its slot keeps its hosts. Filled in this order:

1. the incumbent's *challenger* (``incumbent``) is measured again until it is confirmed or
   falls back — a sequential test over its own flows — in the slot it had, if it had one;
2. a published candidate no host has run yet stays in its slot while it scores at least
   ``KEEP_SCORE_SHARE`` of the best (hosts are not moved for a marginal gain);
3. the rest are the best-scoring searched points that this context has not run, farther than
   ``acquisition.MIN_CANDIDATE_DISTANCE`` from those kept and from each other; random θ
   where the pool is too crowded to give enough.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gemini_api.theta import Bounds, ThetaSpec

from . import acquisition
from .history import Observation
from .surrogate import ThetaSpace

N_CANDIDATES = 8
KEEP_SCORE_SHARE = 0.1  # an unrun candidate keeps its slot above this share of the best score
NEAREST_CHUNK = 256  # points per distance block in nearest()
SAME_POINT = 1e-9  # L∞ gap (normalised θ units) below which two encoded θ are one point


def fill_slots(
    spec: ThetaSpec,
    space: ThetaSpace,
    bounds: Bounds,
    own: Sequence[Observation],
    X: np.ndarray,
    score: np.ndarray,
    challenger: dict[str, int] | None,
    published: Sequence[str],
    rng: np.random.Generator,
) -> tuple[dict[str, int], ...]:
    """N_CANDIDATES θ for one context from the searched points ``X`` and their ``score``,
    keeping what it ``published`` where the rules above allow."""
    run = {o.theta_key for o in own}
    top = float(np.max(score))
    slots: list[dict[str, int] | None] = [None] * N_CANDIDATES
    kept: list[np.ndarray] = []
    published = tuple(published)[:N_CANDIDATES]
    if challenger is not None:
        key = spec.key(challenger)
        slots[published.index(key) if key in published else 0] = challenger
        kept.append(space.encode([challenger])[0])
    for i, key in enumerate(published):
        theta = spec.from_key(key)
        if slots[i] is not None or key in run or spec.violations(theta, bounds):
            continue
        x = space.encode([theta])[0]
        j = int(np.argmin(np.max(np.abs(X - x), axis=1)))
        if np.max(np.abs(X[j] - x)) < SAME_POINT and score[j] >= KEEP_SCORE_SHARE * top:
            slots[i] = theta
            kept.append(x)
    free = [i for i, s in enumerate(slots) if s is None]
    if run:  # a θ already run here is known to the model: hosts explore new ones
        ran = set(space.grid_rows(space.encode([o.theta for o in own])))
        seen = [row in ran for row in space.grid_rows(X)]
        score = np.where(seen, -np.inf, score)
    if kept:
        far = nearest(X, np.asarray(kept)) > acquisition.MIN_CANDIDATE_DISTANCE
        score = np.where(far, score, -np.inf)
    fresh = [space.decode(X[j : j + 1])[0] for j in acquisition.diverse_top(X, score, len(free))]
    fresh += space.sample(len(free) - len(fresh), rng)  # a crowded pool: random
    for i, theta in zip(free, fresh, strict=True):
        slots[i] = theta
    return tuple(s for s in slots if s is not None)


def nearest(X: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Each row of X's L∞ distance to the nearest of ``points`` (normalised θ units), in
    chunks of NEAREST_CHUNK points so that a context with thousands of θ stays small."""
    gaps_min = np.full(len(X), np.inf)
    for i in range(0, len(points), NEAREST_CHUNK):
        chunk = points[i : i + NEAREST_CHUNK]
        gaps = np.abs(X[:, None, :] - chunk[None, :, :]).max(axis=2)
        gaps_min = np.minimum(gaps_min, gaps.min(axis=1))
    return gaps_min
