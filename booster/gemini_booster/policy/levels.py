"""Hour levels: what a time bucket did to every θ of a context, so the model compares θ, not hours.

A context's hosts run the incumbent beside the explorers, so whatever an hour brings (the hour's
load, a day's cross traffic, which flows happened to arrive) every θ that ran in that hour
shares. The model has no term for the hour: a θ explored only in a good hour reads as better
than one measured at good and bad hours alike, by the hours' difference and not its own. The
FlashPass mix tuning, whose rounds ran workloads a factor of two apart, left the paper's θ that
way at the model's first refit (posterior z +2.93 for a θ run in one good round only:
benchmarks/results/flashpass.md, "The mix tuning rerun at 448af28").

So before the model sees them, the observations are moved to one common condition:

1. **The reference.** The θ that ran in most of the context's buckets (the published incumbent
   on a tie, then the most flows). Hosts run it every hour, so its bucket means trace the hours'
   levels, each with the noise of its own flows.
2. **How much the hours differ.** The variance τ² of the reference's bucket means beyond what
   their noise explains, by DerSimonian and Laird's method of moments (the random-effects
   estimator of meta-analysis, which has no setting to tune). When the buckets differ no more
   than their flows' noise says, τ² = 0 and nothing moves.
3. **Each hour's level,** shrunk toward the mean by τ² / (τ² + s_b²) (s_b² the variance of the
   bucket's mean), so a bucket of few flows moves its θ little; then centred on the reference's
   own flows, so the reference's observation stays as measured.
4. **Every other θ's observation** subtracts the flow-weighted mean of its buckets' levels, and
   its noise grows by the levels' own uncertainty (``history.observations``).

Buckets the reference did not run in have no level: flows there stay as measured. The initial
design's test compares two θ over the buckets both ran in (``Planner._paired``), which needs no
estimate; this carries the same idea to the model, where a θ's buckets are many and partly
shared.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from gemini_api.sums import Objective

from ..domain import Trial

MIN_LEVEL_BUCKETS = 2  # buckets of the reference needed before hours can be told apart


@dataclass(frozen=True)
class ContextLevels:
    """One context's hour levels: the reference θ, and per bucket its level's (offset, variance)
    in utility units, centred so that the reference's flow-weighted offset is zero."""

    reference: str
    buckets: Mapping[datetime, tuple[float, float]]


def reference_theta(thetas: Mapping[str, list[Trial]], incumbent: str | None) -> str:
    """The θ of most buckets; the published incumbent on a tie, then the θ of most flows."""
    return max(
        thetas,
        key=lambda k: (
            len({t.bucket for t in thetas[k]}),
            k == incumbent,
            sum(t.flow_count for t in thetas[k]),
            k,
        ),
    )


def bucket_levels(
    trials: Iterable[Trial],
    sigma: float,
    incumbents: Mapping[int, str],
    objective: Objective = Objective.FLOW_MEAN,
) -> dict[int, ContextLevels]:
    """Per context whose reference θ's buckets differ beyond their noise, the hour levels."""
    by_context: dict[int, dict[str, list[Trial]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t.bucket is not None and t.sums.flows_for(objective) > 0:
            by_context[t.context_id][t.theta_key].append(t)
    out: dict[int, ContextLevels] = {}
    for context_id, thetas in by_context.items():
        if len(thetas) < 2:  # one θ: nothing to compare it with
            continue
        ref = reference_theta(thetas, incumbents.get(context_id))
        levels = _levels(thetas[ref], sigma, objective)
        if levels:
            out[context_id] = ContextLevels(ref, levels)
    return out


def _levels(
    buckets: list[Trial], sigma: float, objective: Objective
) -> dict[datetime, tuple[float, float]]:
    """The reference's buckets' shrunk, centred levels; empty when τ² is zero."""
    sums: dict[datetime, list[Trial]] = defaultdict(list)
    for t in buckets:
        sums[t.bucket].append(t)  # type: ignore[index]  # bucket_levels kept bucketed trials only
    if len(sums) < MIN_LEVEL_BUCKETS:
        return {}
    keys = sorted(sums)
    moments = [_bucket_utility(sums[b], sigma, objective) for b in keys]
    m = np.asarray([u[0] for u in moments])
    s2 = np.asarray([u[1] for u in moments])
    n = np.asarray([u[2] for u in moments], dtype=float)
    tau2 = between_variance(m, s2)
    if tau2 <= 0.0:
        return {}
    w = 1.0 / (s2 + tau2)
    centre = float(np.sum(w * m) / np.sum(w))
    keep = tau2 / (tau2 + s2)
    offset = keep * (m - centre)
    var = tau2 * s2 / (tau2 + s2)
    offset = offset - float(np.sum(n * offset) / np.sum(n))
    return {b: (float(o), float(v)) for b, o, v in zip(keys, offset, var, strict=True)}


def _bucket_utility(trials: list[Trial], sigma: float, objective: Objective) -> tuple:
    total = trials[0].sums
    for t in trials[1:]:
        total = total + t.sums
    u = total.utility(sigma, objective)
    return u.mean, u.var_of_mean, u.flows


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
