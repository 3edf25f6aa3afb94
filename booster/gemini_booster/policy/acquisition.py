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
from dataclasses import dataclass

import numpy as np
from skopt.acquisition import gaussian_ei, gaussian_lcb, gaussian_pi

from .surrogate import ThetaSpace

ACQUISITIONS = ("EI", "PI", "LCB")
POOL_RANDOM = 256
POOL_LOCAL_PER_ANCHOR = 32
LOCAL_STEP = 0.08  # std of local perturbations, in normalised θ units
POLISH_STARTS = 4
POLISH_STEPS = 10
POLISH_FD = 0.01  # finite-difference step, normalised units
POLISH_STEP0 = 0.05  # first ascent step, normalised units
POLISH_GROW = 1.6  # a step that improved is lengthened by this; one that did not is halved
MIN_CANDIDATE_DISTANCE = 0.05  # normalised L∞ distance between parallel candidates
XI = 0.01  # EI/PI improvement margin, in units of the utility's spread
KAPPA = 1.96  # LCB's multiple of the posterior std

Posterior = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # X → (loss mean, loss std)


@dataclass(frozen=True)
class _Fixed:
    """A posterior computed once, in the form scikit-optimize's acquisition functions call."""

    loss: np.ndarray
    std: np.ndarray

    def predict(self, X, return_std: bool = True):
        return self.loss, self.std


def score(X: np.ndarray, posterior: Posterior, y_opt: float, kind: str) -> np.ndarray:
    """One acquisition at ``X`` (larger is better)."""
    fixed = _Fixed(*posterior(X))
    if kind == "EI":
        return gaussian_ei(X, fixed, y_opt=y_opt, xi=XI)
    if kind == "PI":
        return gaussian_pi(X, fixed, y_opt=y_opt, xi=XI)
    return -gaussian_lcb(X, fixed, kappa=KAPPA)


def scores(X: np.ndarray, posterior: Posterior, y_opt: float) -> dict[str, np.ndarray]:
    """Every acquisition at ``X``, from one posterior evaluation."""
    fixed = _Fixed(*posterior(X))
    return {kind: score(X, lambda _: (fixed.loss, fixed.std), y_opt, kind) for kind in ACQUISITIONS}


def pool(
    space: ThetaSpace, anchors: np.ndarray, extra: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Random points over the region, perturbations of the anchors, and ``extra`` points."""
    parts = [space.encode(space.sample(POOL_RANDOM, rng)), extra.reshape(-1, space.dims)]
    if len(anchors):
        local = anchors[:, None, :] + rng.normal(
            0.0, LOCAL_STEP, size=(len(anchors), POOL_LOCAL_PER_ANCHOR, space.dims)
        )
        parts += [anchors, space.encode(space.decode(local.reshape(-1, space.dims)))]
    return np.unique(np.vstack(parts), axis=0)


def polish(score: Callable[[np.ndarray], np.ndarray], starts: np.ndarray, dims: int) -> np.ndarray:
    """Projected gradient ascent on ``score`` over [0, 1]^dims from every start at once."""
    x = np.clip(starts.astype(float), 0.0, 1.0)
    step = np.full(len(x), POLISH_STEP0)
    eye = np.eye(dims) * POLISH_FD
    for _ in range(POLISH_STEPS):
        probes = np.vstack([x, (x[:, None, :] + eye[None, :, :]).reshape(-1, dims)])
        values = score(np.clip(probes, 0.0, 1.0))
        here = values[: len(x)]
        grad = (values[len(x) :].reshape(len(x), dims) - here[:, None]) / POLISH_FD
        norm = np.linalg.norm(grad, axis=1, keepdims=True)
        direction = np.divide(grad, norm, out=np.zeros_like(grad), where=norm > 0)
        moved = np.clip(x + step[:, None] * direction, 0.0, 1.0)
        better = score(moved) > here
        x = np.where(better[:, None], moved, x)
        step = np.where(better, step * POLISH_GROW, step / 2)
    return x


def diverse_top(points: np.ndarray, score: np.ndarray, k: int) -> list[int]:
    """Indices of the best-scoring points, each at least MIN_CANDIDATE_DISTANCE from the rest."""
    chosen: list[int] = []
    if k <= 0:
        return chosen
    for i in np.argsort(-score):
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
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The searched points (pool and polished) and every acquisition's scores at them."""
    X = pool(space, anchors, current, rng)
    s = scores(X, posterior, y_opt)
    starts = X[np.argsort(-s[chosen])[:POLISH_STARTS]]
    polished = polish(lambda Z: score(Z, posterior, y_opt, chosen), starts, space.dims)
    snapped = space.encode(space.decode(polished))
    X = np.unique(np.vstack([X, snapped]), axis=0)
    return X, scores(X, posterior, y_opt)
