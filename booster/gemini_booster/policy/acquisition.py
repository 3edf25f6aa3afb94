"""Maximising an acquisition function over the whole region, for one context.

scikit-optimize's ``Optimizer`` with ``acq_optimizer="lbfgs"`` scores a random sample of the
space, then polishes the best few points with L-BFGS from there. Done point by point, that is
hundreds of GP predictions per context, too slow for a fleet's hundreds of contexts. Here the
same two stages run batched: one posterior over a pool (random points over the whole region,
perturbations of the best observed θ, the candidates hosts run now), then ``POLISH_STARTS``
projected gradient-ascent walks from the pool's best points, all starts and the finite
differences of one step in a single prediction. Polished points are snapped onto Table III's
grid, added to the pool, and the candidates are the pool's best points at least
``MIN_CANDIDATE_DISTANCE`` apart, so that the hosts of a context explore in parallel rather than
all at one spot.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import ndtr

from .surrogate import ThetaSpace

ACQUISITIONS = ("EI", "PI", "LCB")
POOL_RANDOM = 1024
POOL_LOCAL_PER_ANCHOR = 32
LOCAL_STEP = 0.08  # std of local perturbations, in normalised θ units
POLISH_STARTS = 8
# (pool and starts chosen on benchmarks/optimiser.py, optimiser-search-pool.md: against 256
# random points and 4 starts, lab incumbent regret @20 / @30 1.08 / 0.92 -> 1.05 / 0.81 % over
# 160 seeds, the best θ run for 100 flows 0.70 -> 0.62 % off the optimum; scikit-optimize's
# batch, which found better θ, scores 2,000 random points per ask. 128 local points per
# anchor instead did not help (0.91 % @30). Refit of 200 contexts at 100,000 trials
# 4.45 -> 6.19 s.)
POLISH_STEPS = 10
POLISH_FD = 0.01  # finite-difference step, normalised units
POLISH_STEP0 = 0.05  # first ascent step, normalised units
POLISH_GROW = 1.6  # a step that improved is lengthened by this; one that did not is halved
MIN_CANDIDATE_DISTANCE = 0.05  # normalised L∞ distance between parallel candidates
XI = 0.1  # EI/PI improvement margin, in units of the utility's spread
KAPPA = 1.96  # LCB's multiple of the posterior std
# (both chosen on benchmarks/optimiser.py, optimiser-exploration.md. ξ 0.01 → 0.1: lab
# incumbent regret @20 / @30 1.31 / 1.14 → 1.08 / 0.84 % over 80 seeds, shared24's worst
# context @30 2.89 → 2.60 %, for more exploration (lab fleet regret 3.79 → 3.96 %, which the
# planner's EXPLORE_MAX_LOSS then brings to 3.83). ξ 0.2 and 0.3 explored more (fleet 4.30
# and 4.71 %) for about the same regret, 0 and 0.05 regretted more; κ 1.0, 1.5 and 3.0 did no
# better than scikit-optimize's 1.96.)

Posterior = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # X → (loss mean, loss std)


_INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)


def acquisition_values(loss: np.ndarray, std: np.ndarray, y_opt: float, kind: str) -> np.ndarray:
    """One acquisition (larger is better) from a posterior's loss mean and std: the formulas of
    scikit-optimize's ``gaussian_ei``, ``gaussian_pi`` and ``gaussian_lcb`` (checked equal in
    tests/test_planner.py), without their per-call overhead, which a refit's thousands of
    small calls made a fifth of its time."""
    if kind == "LCB":
        return -(loss - KAPPA * std)
    values = np.zeros_like(loss)
    mask = std > 0
    improve = y_opt - XI - loss[mask]
    scaled = improve / std[mask]
    if kind == "PI":
        values[mask] = ndtr(scaled)
    else:
        pdf = _INV_SQRT_2PI * np.exp(-0.5 * scaled * scaled)
        values[mask] = improve * ndtr(scaled) + std[mask] * pdf
    return values


def score(X: np.ndarray, posterior: Posterior, y_opt: float, kind: str) -> np.ndarray:
    """One acquisition at ``X`` (larger is better)."""
    return acquisition_values(*posterior(X), y_opt, kind)


def scores(X: np.ndarray, posterior: Posterior, y_opt: float) -> dict[str, np.ndarray]:
    """Every acquisition at ``X``, from one posterior evaluation."""
    return _scored(X, posterior, y_opt)[0]


def _scored(
    X: np.ndarray, posterior: Posterior, y_opt: float
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every acquisition at ``X`` and the posterior loss mean there (one evaluation)."""
    loss, std = posterior(X)
    return {kind: acquisition_values(loss, std, y_opt, kind) for kind in ACQUISITIONS}, loss


def pool(
    space: ThetaSpace, anchors: np.ndarray, extra: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Random points over the region, perturbations of the anchors, and ``extra`` points."""
    parts = [space.sample_points(POOL_RANDOM, rng), extra.reshape(-1, space.dims)]
    if len(anchors):
        local = anchors[:, None, :] + rng.normal(
            0.0, LOCAL_STEP, size=(len(anchors), POOL_LOCAL_PER_ANCHOR, space.dims)
        )
        parts += [anchors, space.snap(local.reshape(-1, space.dims))]
    return np.unique(np.vstack(parts), axis=0)


def polish(score: Callable[[np.ndarray], np.ndarray], starts: np.ndarray, dims: int) -> np.ndarray:
    """Projected gradient ascent on ``score`` over [0, 1]^dims from every start at once.

    The gradient is a forward difference. Each step scores the moved points together with
    their own difference probes, in one prediction: a move that improves brings the next
    gradient with it, and one that does not leaves the point, whose gradient is known. So a
    step costs one posterior evaluation, not two, for the same walk."""
    x = np.clip(starts.astype(float), 0.0, 1.0)
    k = len(x)
    step = np.full(k, POLISH_STEP0)
    eye = np.eye(dims) * POLISH_FD

    def with_probes(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        probes = (points[:, None, :] + eye[None, :, :]).reshape(-1, dims)
        values = score(np.clip(np.vstack([points, probes]), 0.0, 1.0))
        here = values[:k]
        return here, (values[k:].reshape(k, dims) - here[:, None]) / POLISH_FD

    here, grad = with_probes(x)
    for _ in range(POLISH_STEPS):
        norm = np.linalg.norm(grad, axis=1, keepdims=True)
        direction = np.divide(grad, norm, out=np.zeros_like(grad), where=norm > 0)
        moved = np.clip(x + step[:, None] * direction, 0.0, 1.0)
        moved_here, moved_grad = with_probes(moved)
        better = moved_here > here
        x = np.where(better[:, None], moved, x)
        here = np.where(better, moved_here, here)
        grad = np.where(better[:, None], moved_grad, grad)
        step = np.where(better, step * POLISH_GROW, step / 2)
    return x


def diverse_top(points: np.ndarray, score: np.ndarray, k: int) -> list[int]:
    """Indices of the best-scoring points, each at least MIN_CANDIDATE_DISTANCE from the rest;
    never a point scored −inf (ruled out: run already, too near a kept candidate, or beyond
    the planner's exploration cap), so fewer than k when fewer remain."""
    chosen: list[int] = []
    if k <= 0:
        return chosen
    for i in np.argsort(-score):
        if not np.isfinite(score[i]):
            break
        if all(np.max(np.abs(points[i] - points[j])) > MIN_CANDIDATE_DISTANCE for j in chosen):
            chosen.append(int(i))
            if len(chosen) == k:
                break
    return chosen


def maximise(
    space: ThetaSpace,
    posterior: Posterior,
    y_opt: float,
    chosen: str,
    anchors: np.ndarray,
    current: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """The searched points (pool and polished), every acquisition's scores at them and the
    posterior loss mean there (which the planner's exploration cap reads)."""
    X = pool(space, anchors, current, rng)
    s, loss = _scored(X, posterior, y_opt)
    starts = X[np.argsort(-s[chosen])[:POLISH_STARTS]]
    polished = polish(lambda Z: score(Z, posterior, y_opt, chosen), starts, space.dims)
    found = _new_rows(np.unique(space.snap(polished), axis=0), X)
    if not len(found):
        return X, s, loss
    more, more_loss = _scored(found, posterior, y_opt)
    # in sorted row order, as np.unique gives the pool: ties between equal scores then break
    # the same way whether a point came from the pool or the polish
    X, order = np.unique(np.vstack([X, found]), axis=0, return_index=True)
    s = {k: np.concatenate([s[k], more[k]])[order] for k in s}
    return X, s, np.concatenate([loss, more_loss])[order]


def _new_rows(points: np.ndarray, known: np.ndarray) -> np.ndarray:
    """The rows of ``points`` that are not rows of ``known`` (grid points compare exactly)."""
    fresh = [not (known == p).all(axis=1).any() for p in points]
    return points[np.asarray(fresh, dtype=bool)]
