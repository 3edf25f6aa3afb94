"""Hour levels: what a time bucket did to every θ of a context, so the model compares θ, not hours.

A context's hosts run the incumbent beside the explorers, so whatever an hour brings (the hour's
load, a day's cross traffic, which flows happened to arrive) every θ that ran in that hour
shares. The model has no term for the hour: a θ explored only in a good hour reads as better
than one measured at good and bad hours alike, by the hours' difference and not its own. The
FlashPass mix tuning, whose rounds ran workloads a factor of two apart, left the paper's θ that
way at the model's first refit (posterior z +2.93 for a θ run in one good round only:
benchmarks/results/flashpass.md, "The mix tuning rerun at 448af28").

So before the model sees them, the observations are moved to a common hour. Each cell (θ, hour)
of a context is read as y = μ_θ + ℓ_hour + noise, the hour's level ℓ a random effect:

1. **How much the hours differ.** The variance τ² of the hour levels beyond what the flows'
   noise explains: DerSimonian and Laird's method of moments (the random-effects estimator of
   meta-analysis, which has no setting to tune) on the bucket means of the θ that ran in most
   of the context's buckets (hosts run the incumbent every hour, so its buckets trace the
   hours). When its buckets differ no more than their noise says, τ² = 0 and nothing moves.
2. **The levels,** from every θ that ran in an hour at once: μ and ℓ by weighted least squares
   with ℓ shrunk toward 0 with prior variance τ² (``_solve``: per context, a system of a row
   per hour, inverted through the few θ that ran in more than one hour). An hour of few flows
   moves little; a θ that was alone in its hour keeps its own mean. After the incumbent
   changes, the new one's hours are levelled by whatever else ran in them.
3. **Every observation** subtracts the flow-weighted mean of its buckets' levels, and its noise
   grows by the levels' own uncertainty (``history.observations``). Utilities are then those
   of an average hour of the context.

The initial design's test compares two θ over the buckets both ran in (``Planner._paired``),
which needs no estimate; this carries the same idea to the model, where a θ's buckets are many
and partly shared.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime

import numpy as np

from gemini_api.sums import Objective

from ..domain import Trial
from . import history
from .history import HourLevels

MIN_LEVEL_BUCKETS = 2  # buckets of the reference θ needed before hours can be told apart


def bucket_levels(
    trials: Iterable[Trial],
    sigma: float,
    incumbents: Mapping[int, str],
    objective: Objective = Objective.FLOW_MEAN,
) -> HourLevels:
    """(context, bucket) → (level, its variance) for every context whose hours differ beyond
    their noise; contexts whose hours do not are absent."""
    by_context: dict[int, list[Trial]] = defaultdict(list)
    for t in trials:
        if t.bucket is not None and t.sums.flows_for(objective) > 0:
            by_context[t.context_id].append(t)
    out: dict[tuple[int, datetime], tuple[float, float]] = {}
    for context_id, kept in by_context.items():
        cells = _cells(kept, sigma, objective)
        tau2 = _hours_spread(cells, incumbents.get(context_id))
        if tau2 > 0.0:
            for bucket, level in _solve(cells, tau2).items():
                out[(context_id, bucket)] = level
    return out


class _Cells:
    """One context's (θ, bucket) cells: mean utility, variance of that mean, flows."""

    def __init__(self, keys: list[tuple[str, datetime]], moments: history.Moments):
        self.thetas = sorted({k for k, _ in keys})
        self.buckets = sorted({b for _, b in keys})
        theta_of = {k: i for i, k in enumerate(self.thetas)}
        bucket_of = {b: i for i, b in enumerate(self.buckets)}
        self.theta = np.asarray([theta_of[k] for k, _ in keys])
        self.bucket = np.asarray([bucket_of[b] for _, b in keys])
        self.flows, self.mean, self.var = moments


def _cells(trials: list[Trial], sigma: float, objective: Objective) -> _Cells:
    cell_of: dict[tuple[str, datetime], int] = {}
    index = [
        cell_of.setdefault((t.theta_key, t.bucket), len(cell_of))  # type: ignore[arg-type]
        for t in trials
    ]
    moments = history.moments(np.asarray(index), trials, len(cell_of), sigma, objective)
    return _Cells(list(cell_of), moments)


def _hours_spread(cells: _Cells, incumbent: str | None) -> float:
    """τ² from the reference θ's buckets (0 with one θ or too few of its buckets)."""
    if len(cells.thetas) < 2:
        return 0.0
    counts = np.bincount(cells.theta, minlength=len(cells.thetas))
    flows = np.bincount(cells.theta, weights=cells.flows, minlength=len(cells.thetas))
    ref = max(
        range(len(cells.thetas)),
        key=lambda i: (counts[i], cells.thetas[i] == incumbent, flows[i], cells.thetas[i]),
    )
    mine = cells.theta == ref
    if int(mine.sum()) < MIN_LEVEL_BUCKETS:
        return 0.0
    return between_variance(cells.mean[mine], cells.var[mine])


def _solve(cells: _Cells, tau2: float) -> dict[datetime, tuple[float, float]]:
    """Each bucket's shrunk level and its posterior variance: the weighted least squares of
    y = μ_θ + ℓ_b with a prior ℓ ~ N(0, τ²), μ profiled out.

    With B the θ × bucket weights (1 / variance of each cell's mean), W_θ its row sums and Y the
    weighted means, the levels solve A ℓ = Σ_θ Y − Bᵀ (Σ_b Y / W) with A = diag(Σ_θ B + 1/τ²)
    − Bᵀ diag(1/W) B, and A⁻¹'s diagonal is each level's variance. A θ seen in one bucket
    cancels out of both sides (its own mean absorbs it), so only θ of two or more buckets enter:
    the incumbents and repeated candidates, a handful against a window's hundreds of hours.
    A is then a diagonal less a product of that handful of rows, inverted by the Woodbury
    identity in O(hours · θ²) rather than O(hours³)."""
    repeated = np.bincount(cells.theta, minlength=len(cells.thetas)) >= 2
    keep = repeated[cells.theta]
    rows = np.cumsum(repeated) - 1  # each repeated θ's row
    shape = (int(repeated.sum()), len(cells.buckets))
    weight = np.zeros(shape)
    np.add.at(weight, (rows[cells.theta[keep]], cells.bucket[keep]), 1.0 / cells.var[keep])
    weighted = np.zeros(shape)
    np.add.at(
        weighted, (rows[cells.theta[keep]], cells.bucket[keep]), (cells.mean / cells.var)[keep]
    )
    diag = weight.sum(axis=0) + 1.0 / tau2
    row_weight = weight.sum(axis=1)
    rhs = weighted.sum(axis=0) - weight.T @ (weighted.sum(axis=1) / row_weight)
    # A⁻¹ = D⁻¹ + D⁻¹ Bᵀ C⁻¹ B D⁻¹, C = diag(W) − B D⁻¹ Bᵀ (Woodbury; C is θ × θ)
    scaled = weight / diag
    inner = np.linalg.inv(np.diag(row_weight) - scaled @ weight.T)
    level = rhs / diag + scaled.T @ (inner @ (scaled @ rhs))
    var = 1.0 / diag + np.einsum("ib,ij,jb->b", scaled, inner, scaled)
    return {b: (float(lv), float(v)) for b, lv, v in zip(cells.buckets, level, var, strict=True)}


def between_variance(means: np.ndarray, variances: np.ndarray) -> float:
    """DerSimonian–Laird τ²: the variance among ``means`` beyond their own ``variances``, by the
    method of moments; 0 when Cochran's Q is no more than its degrees of freedom."""
    w = 1.0 / variances
    pooled = float(np.sum(w * means) / np.sum(w))
    q = float(np.sum(w * (means - pooled) ** 2))
    scale = float(np.sum(w) - np.sum(w * w) / np.sum(w))
    if scale <= 0.0:
        return 0.0
    return max(0.0, (q - (len(means) - 1)) / scale)
