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
3. **Against the reference.** The levels are taken less the reference θ's flow-weighted mean
   level, with the variance of that difference: the part of their uncertainty every θ of the
   context shares (where the whole context sits) cancels when two θ are compared, so it is not
   charged to each. The reference's observation stays as measured; every other observation
   subtracts the flow-weighted mean of its buckets' levels, and its noise grows by their
   variance (``history.observations``). Utilities are then those of the reference's hours.

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
from .history import between_variance

MIN_LEVEL_BUCKETS = 2  # buckets of the reference θ needed before hours can be told apart


def bucket_levels(
    trials: Iterable[Trial],
    sigma: float,
    incumbents: Mapping[int, str],
    objective: Objective = Objective.FLOW_MEAN,
) -> history.HourLevels:
    """The hour levels of every context whose hours differ beyond their noise, each against
    the context's reference θ; contexts whose hours do not are absent."""
    by_context: dict[int, list[Trial]] = defaultdict(list)
    for t in trials:
        if t.bucket is not None and t.sums.flows_for(objective) > 0:
            by_context[t.context_id].append(t)
    references: dict[int, str] = {}
    buckets: dict[tuple[int, datetime], tuple[float, float]] = {}
    for context_id, kept in by_context.items():
        cells = _cells(kept, sigma, objective)
        ref = _reference(cells, incumbents.get(context_id))
        if ref is None:
            continue
        mine = cells.theta == ref
        tau2 = between_variance(cells.mean[mine], cells.var[mine])
        solved = _solve(cells, tau2, ref) if tau2 > 0.0 else None
        if solved:
            references[context_id] = cells.thetas[ref]
            buckets.update(((context_id, b), level) for b, level in solved.items())
    return history.HourLevels(references, buckets)


class _Cells:
    """One context's (θ, bucket) cells: flows, mean utility, and the variance of that mean
    with the flows' spread shrunk toward the context's (``history.shrunk_noises``), so that two
    flows which happen to agree do not pin an hour's level, as they may not pin a θ's mean."""

    def __init__(self, keys: list[tuple[str, datetime]], moments: history.Moments):
        self.thetas = sorted({k for k, _ in keys})
        self.buckets = sorted({b for _, b in keys})
        theta_of = {k: i for i, k in enumerate(self.thetas)}
        bucket_of = {b: i for i, b in enumerate(self.buckets)}
        self.theta = np.asarray([theta_of[k] for k, _ in keys])
        self.bucket = np.asarray([bucket_of[b] for _, b in keys])
        self.flows, self.mean, raw = moments
        self.var = history.shrunk_noises(self.flows, raw, np.zeros(len(keys), dtype=int))


def _cells(trials: list[Trial], sigma: float, objective: Objective) -> _Cells:
    cell_of: dict[tuple[str, datetime], int] = {}
    index = [
        cell_of.setdefault((t.theta_key, t.bucket), len(cell_of))  # type: ignore[arg-type]
        for t in trials
    ]
    moments = history.moments(np.asarray(index), trials, len(cell_of), sigma, objective)
    return _Cells(list(cell_of), moments)


def _reference(cells: _Cells, incumbent: str | None) -> int | None:
    """The θ of most buckets (the published incumbent on a tie, then the most flows); None
    with a single θ, or too few of its buckets to tell hours apart."""
    if len(cells.thetas) < 2:
        return None
    counts = np.bincount(cells.theta, minlength=len(cells.thetas))
    flows = np.bincount(cells.theta, weights=cells.flows, minlength=len(cells.thetas))
    ref = max(
        range(len(cells.thetas)),
        key=lambda i: (counts[i], cells.thetas[i] == incumbent, flows[i], cells.thetas[i]),
    )
    return ref if counts[ref] >= MIN_LEVEL_BUCKETS else None


def _solve(cells: _Cells, tau2: float, ref: int) -> dict[datetime, tuple[float, float]]:
    """Each bucket's level less the reference θ's flow-weighted mean level, and the variance
    of that difference: the weighted least squares of y = μ_θ + ℓ_b with a prior
    ℓ ~ N(0, τ²), μ profiled out. Empty when the system cannot be solved to finite values.

    With B the θ × bucket weights (1 / variance of each cell's mean), W_θ its row sums and Y the
    weighted means, the levels solve A ℓ = Σ_θ Y − Bᵀ (Σ_b Y / W) with A = diag(Σ_θ B + 1/τ²)
    − Bᵀ diag(1/W) B, whose inverse is the levels' covariance. A θ seen in one bucket cancels
    out of both sides (its own mean absorbs it), so only θ of two or more buckets enter: the
    incumbents and repeated candidates, a handful against a window's hundreds of hours. A is
    then a diagonal less a product of that handful of rows, inverted by the Woodbury identity
    in O(hours · θ²) rather than O(hours³); the θ × θ matrix's diagonal is summed from the
    other θ's weights, never as a difference of two nearly equal sums."""
    repeated = np.bincount(cells.theta, minlength=len(cells.thetas)) >= 2
    keep = repeated[cells.theta]
    rows = np.cumsum(repeated) - 1  # each repeated θ's row
    at = (rows[cells.theta[keep]], cells.bucket[keep])
    shape = (int(repeated.sum()), len(cells.buckets))
    weight = np.zeros(shape)
    np.add.at(weight, at, 1.0 / cells.var[keep])
    weighted = np.zeros(shape)
    np.add.at(weighted, at, (cells.mean / cells.var)[keep])
    diag = weight.sum(axis=0) + 1.0 / tau2
    row_weight = weight.sum(axis=1)
    rhs = weighted.sum(axis=0) - weight.T @ (weighted.sum(axis=1) / row_weight)
    scaled = weight / diag  # E = B D⁻¹
    inner = -scaled @ weight.T  # C = diag(W) − B D⁻¹ Bᵀ, its diagonal below
    np.fill_diagonal(inner, np.sum(weight * _others(weight, 1.0 / tau2) / diag, axis=1))
    try:
        inner = np.linalg.inv(inner)
    except np.linalg.LinAlgError:
        return {}

    def cov_times(x: np.ndarray) -> np.ndarray:  # A⁻¹ x = D⁻¹ x + Eᵀ C⁻¹ E x
        return x / diag + scaled.T @ (inner @ (scaled @ x))

    mine = cells.theta == ref
    share = np.bincount(cells.bucket[mine], cells.flows[mine], shape[1])
    share = share / share.sum()  # the reference's flows by bucket
    level = cov_times(rhs)
    toward = cov_times(share)
    var_each = 1.0 / diag + np.einsum("ib,ij,jb->b", scaled, inner, scaled)
    var = np.maximum(var_each - 2.0 * toward + float(share @ toward), 0.0)
    level = level - float(share @ level)
    if not (np.all(np.isfinite(level)) and np.all(np.isfinite(var))):
        return {}
    return {b: (float(lv), float(v)) for b, lv, v in zip(cells.buckets, level, var, strict=True)}


def _others(weight: np.ndarray, prior: float) -> np.ndarray:
    """Per row and column, the prior plus the other rows' weights, summed from both sides
    (exclusive prefix and suffix sums) rather than as the column's total less the row's."""
    zero = np.zeros((1, weight.shape[1]))
    before = np.vstack([zero, np.cumsum(weight, axis=0)[:-1]])
    after = np.vstack([np.cumsum(weight[::-1], axis=0)[::-1][1:], zero])
    return prior + before + after
