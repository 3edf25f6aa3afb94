"""From stored trials to the model's observations: the history window, drift, and noise.

Trials arrive as running sums per (context, θ, time bucket). Three things happen here before any
model sees them:

1. **The window.** Buckets that started before ``now − history_hours`` are dropped, so the old
   flows of a θ that keeps running age out instead of pinning its mean forever.

2. **Drift.** A path can change under a context (a new peering, a re-routed link) long before the
   window forgets the old regime. For the θ a context has run most (its incumbent, first of all),
   the bucket sequence is split at every point and the two sides' mean utilities compared
   (Welch's z on the exact sums, its variance widened by how much the θ's hours differ from
   one another within each side: ``_within_sides``, so that a day's ordinary ups and downs,
   which every split of a busy θ's hundreds of flows would otherwise call far beyond chance,
   are not read as a new path). When the best split is far beyond chance (``DRIFT_Z``) and
   large (``DRIFT_MIN_SHIFT`` of the utility), every trial of that context before the split is
   dropped: the model then sees the context as new and re-explores it. The split is recomputed
   from the data at every refit (so a takeover finds it again) and also remembered by the
   caller, so that a change found once is not forgotten when the θ that showed it stops running.

3. **Noise.** Buckets of one θ are added into one observation; the variance of its mean is the
   sample variance shrunk toward the context's pooled per-flow variance (``PRIOR_FLOWS``), so two
   flows that happen to agree do not pin the model to a lucky mean.

4. **Hours.** Given the hour levels of ``levels.py``, each observation is moved to the
   context's common condition: its mean less the flow-weighted level of its buckets, its noise
   plus that level's uncertainty.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

import numpy as np

from gemini_api.sums import MIN_FLOW_VARIANCE, Objective
from gemini_api.theta import ThetaSpec

from ..domain import SINGLE_FLOW_STD, FlowSums, Trial, Utility


@dataclass(frozen=True)
class HourLevels:
    """Per context, the θ its levels are measured against, and per (context, bucket) the
    bucket's level less the reference's flow-weighted mean level, with the variance of that
    difference (``levels.py``). Against the reference, the part of the levels' uncertainty that
    every θ of the context shares (where the whole context sits) cancels, as it does when two
    θ are compared; the reference itself is not moved."""

    references: Mapping[int, str]
    buckets: Mapping[tuple[int, datetime], tuple[float, float]]


PRIOR_FLOWS = 4  # weight, in flows, of a context's pooled per-flow variance in a trial's noise
DRIFT_Z = 5.0  # |z| of the best split, far beyond what scanning every split finds by chance
DRIFT_MIN_SHIFT = 0.03  # and the mean utility moved by at least this share of its magnitude
DRIFT_MIN_FLOWS = 30  # flows needed on each side of a split before it is judged
DRIFT_MIN_BUCKETS = 3  # a θ's buckets before it is judged: a split, and one more to tell how
# much its hours differ anyway (a single bucket after the change still counts: the θ that shows
# a change is often replaced at the next refit and runs no second bucket)
DRIFT_THETAS = 3  # θ per context tested for a change: the incumbent and the most-run others
Spread = TypeVar("Spread", float, np.ndarray)  # one context's sums, or every context's at once


@dataclass(frozen=True)
class Observation:
    """One θ in one context, all its buckets since the context's last change, at σ."""

    context_id: int
    theta: dict[str, int]
    theta_key: str
    utility: float
    noise_var: float  # the variance of ``utility``: the flows' noise plus ``level_var``
    flows: int
    last_seen: float
    level_var: float = 0.0  # the part of ``noise_var`` from its hours' estimated levels


def in_window(trials: Iterable[Trial], now: datetime | None, history_hours: float) -> list[Trial]:
    """Trials whose bucket started within the history window (all of them without a clock)."""
    if now is None:
        return list(trials)
    start = now - timedelta(hours=history_hours)
    return [t for t in trials if t.bucket is None or t.bucket >= start]


def _time(t: Trial) -> datetime:
    return t.bucket if t.bucket is not None else t.last_seen


@dataclass(frozen=True)
class Split:
    """Where one θ's buckets change: its last bucket of the old regime, its first of the new,
    and Welch's z of the shift between the two sides."""

    last_before: datetime
    first_after: datetime
    z: float


def best_split(
    buckets: list[Trial], sigma: float, objective: Objective = Objective.FLOW_MEAN
) -> Split | None:
    """The split of one θ's time-ordered buckets with the largest |z| between the mean
    utilities (``objective``) before and after it; None with too few flows or buckets on
    either side. The variance of the difference counts the flows' noise and how much the θ's
    hours differ within each side (``_within_sides``)."""
    if len(buckets) < DRIFT_MIN_BUCKETS:
        return None
    buckets = sorted(buckets, key=_time)
    sides = _within_sides([b.sums.utility(sigma, objective) for b in buckets])
    total = FlowSums.total(b.sums for b in buckets)
    before = FlowSums()
    best: Split | None = None
    for i in range(1, len(buckets)):
        before = before + buckets[i - 1].sums
        after = total - before
        if min(before.flows_for(objective), after.flows_for(objective)) < DRIFT_MIN_FLOWS:
            continue
        z = _shift_z(before.utility(sigma, objective), after.utility(sigma, objective), sides(i))
        if z is not None and (best is None or abs(z) > abs(best.z)):
            best = Split(_time(buckets[i - 1]), _time(buckets[i]), z)
    return best


def _within_sides(means: list[Utility]) -> Callable[[int], float]:
    """For a split before bucket i, the variance the hours add to the difference of the two
    sides' flow-weighted means: τ² Σ (n_b / N)² on each side, τ² the spread of the hours
    beyond their flows' noise *within* the sides (DerSimonian–Laird pooled over both).

    A day's ups and downs are shared by every θ of the hour; a busy θ's hundreds of flows make
    their noise small, so without this every split between a good and a bad stretch of hours
    was far beyond chance and restarted the context's search (the optimiser benchmark's
    ``hourly`` landscape). Taken within the sides, the spread is not inflated by the one step
    a change of path makes, which is what the test looks for. Prefix sums: O(buckets)."""
    w = np.asarray([1.0 / u.var_of_mean for u in means])
    m = np.asarray([u.mean for u in means])
    n = np.asarray([float(u.flows) for u in means])
    cum = [np.concatenate([[0.0], np.cumsum(x)]) for x in (w, w * m, w * m * m, w * w, n, n * n)]

    def side(lo: int, hi: int) -> tuple[float, float, float]:
        sw, swm, swm2, sw2, sn, sn2 = (c[hi] - c[lo] for c in cum)
        return swm2 - swm * swm / sw, sw - sw2 / sw, sn2 / (sn * sn)

    def hours(i: int) -> float:
        k = len(means)
        q_b, scale_b, share_b = side(0, i)
        q_a, scale_a, share_a = side(i, k)
        return _moment_tau2(q_b + q_a, scale_b + scale_a, k - 2) * (share_b + share_a)

    return hours


def between_variance(means: np.ndarray, variances: np.ndarray) -> float:
    """DerSimonian–Laird τ²: the variance among ``means`` beyond their own ``variances``, by the
    method of moments; 0 when Cochran's Q is no more than its degrees of freedom."""
    w = 1.0 / variances
    pooled = float(np.sum(w * means) / np.sum(w))
    q = float(np.sum(w * (means - pooled) ** 2))
    return _moment_tau2(q, float(np.sum(w) - np.sum(w * w) / np.sum(w)), len(means) - 1)


def _moment_tau2(q: float, scale: float, dof: int) -> float:
    """DerSimonian and Laird's moment estimate from Cochran's Q, Σw − Σw²/Σw (summed over the
    groups pooled) and Q's degrees of freedom; 0 where nothing is within the groups."""
    if scale <= 0.0:
        return 0.0
    return max(0.0, (q - dof) / scale)


def _shift_z(old: Utility, new: Utility, hours: float = 0.0) -> float | None:
    """Welch's z for new − old (``hours``: the variance the hours add to the difference), or
    None when the shift is too small to matter."""
    shift = new.mean - old.mean
    if abs(shift) < DRIFT_MIN_SHIFT * max(abs(old.mean), abs(new.mean), 1e-9):
        return None
    se = math.sqrt(old.var_of_mean + new.var_of_mean + hours)
    return shift / se if se > 0 else math.copysign(math.inf, shift)


def change_points(
    trials: Iterable[Trial],
    sigma: float,
    incumbents: Mapping[int, str],
    objective: Objective = Objective.FLOW_MEAN,
) -> dict[int, datetime]:
    """Per context, the start of its current regime when a change is evident in the θ it ran
    most (the published incumbent first).

    A θ that shows the change only bounds it: the change came after its last bucket before the
    split and no later than its first bucket after. A θ that did not run in the bucket where
    the path changed puts its first bucket after later than the change, so the start is the
    context's first bucket after the latest "last before" of the θ that show it: the earliest
    instant every one of them agrees with, which keeps all of the new regime's data (taking
    the latest "first after" instead would drop the new regime's first buckets and restart
    the context's search a second time)."""
    by_theta: dict[int, dict[str, list[Trial]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t.sums.flows_for(objective) > 0:  # a bucket without the objective's sums is no hour
            by_theta[t.context_id][t.theta_key].append(t)
    found: dict[int, datetime] = {}
    for context_id, thetas in by_theta.items():
        order = sorted(thetas, key=lambda k: -sum(b.flow_count for b in thetas[k]))
        incumbent = incumbents.get(context_id)
        if incumbent in thetas:
            order.remove(incumbent)
            order.insert(0, incumbent)
        splits = [best_split(thetas[key], sigma, objective) for key in order[:DRIFT_THETAS]]
        shown = [s for s in splits if s is not None and abs(s.z) >= DRIFT_Z]
        if shown:
            old_until = max(s.last_before for s in shown)
            found[context_id] = min(
                _time(b) for buckets in thetas.values() for b in buckets if _time(b) > old_until
            )
    return found


def since_change(trials: Iterable[Trial], changes: Mapping[int, datetime]) -> list[Trial]:
    """Trials of each context's current regime only."""
    return [t for t in trials if t.context_id not in changes or _time(t) >= changes[t.context_id]]


def _pooled_flow_var(per_trial: list[tuple[int, Utility]]) -> dict[int, float]:
    """Per context, the per-flow variance of utility pooled over its trials of 2+ flows, itself
    shrunk toward SINGLE_FLOW_STD² with the weight of PRIOR_FLOWS flows (``pooled_spread``)."""
    num: dict[int, float] = defaultdict(float)
    dof: dict[int, int] = defaultdict(int)
    for context_id, u in per_trial:
        if u.flows >= 2:
            num[context_id] += u.var_of_mean * u.flows * (u.flows - 1)
            dof[context_id] += u.flows - 1
    return {c: pooled_spread(num[c], dof[c]) for c in dof}


def pooled_spread(num: Spread, dof: Spread) -> Spread:
    """A context's per-flow variance from the sum of squares ``num`` over ``dof`` degrees of
    freedom, shrunk toward SINGLE_FLOW_STD² with the weight of PRIOR_FLOWS flows.

    The context's spread is what every trial of few flows borrows (``shrunk_noise``), so it
    must not rest on a lucky pair either: taken as num / dof, two flows of one θ that agreed
    by chance (27.8 and 28.3 Mbit/s on a satellite path whose flows spread from 2 to 31) set
    every single flow's noise to 0.4 Mbit/s, and the model took one flow's luck for a θ's
    worth. A fleet's contexts have thousands of degrees of freedom, where this is num / dof."""
    return (num + PRIOR_FLOWS * SINGLE_FLOW_STD**2) / (dof + PRIOR_FLOWS)


def shrunk_noise(u: Utility, pooled: float | None) -> float:
    """Variance of a trial's mean, its per-flow variance shrunk toward the context's pooled one
    with the weight of PRIOR_FLOWS flows."""
    prior = SINGLE_FLOW_STD**2 if pooled is None else pooled
    sample = u.var_of_mean * u.flows if u.flows >= 2 else 0.0
    dof = max(u.flows - 1, 0)
    return (dof * sample + PRIOR_FLOWS * prior) / (dof + PRIOR_FLOWS) / u.flows


def _inside_region(
    spec: ThetaSpec, keys: list[str], bounds: Mapping
) -> tuple[np.ndarray, np.ndarray]:
    """θ of each key as an integer row (parsed in one pass), and which lie inside ``bounds``."""
    values = np.fromstring(",".join(keys), sep=",", dtype=np.int64).reshape(len(keys), -1)
    low = np.asarray([bounds[n][0] for n in spec.names])
    high = np.asarray([bounds[n][1] for n in spec.names])
    return values, np.all((values >= low) & (values <= high), axis=1)


def shrunk_noises(n: np.ndarray, var_of_mean: np.ndarray, contexts: np.ndarray) -> np.ndarray:
    """``shrunk_noise`` for every observation at once, with each context's pooled spread."""
    many = n >= 2
    dof = np.where(many, n - 1, 0)
    sample = np.where(many, var_of_mean * n, 0.0)
    index = np.unique(contexts, return_inverse=True)[1]
    num = np.bincount(index, weights=np.where(many, var_of_mean * n * (n - 1), 0.0))
    den = np.bincount(index, weights=dof)
    prior = pooled_spread(num, den)[index]
    return (dof * sample + PRIOR_FLOWS * prior) / (dof + PRIOR_FLOWS) / n


def observations(
    trials: Iterable[Trial],
    sigma: float,
    spec: ThetaSpec,
    bounds: Mapping,
    objective: Objective = Objective.FLOW_MEAN,
    levels: HourLevels | None = None,
) -> list[Observation]:
    """One observation per (context, θ) inside the policy's region, buckets added, of the
    flows that carry ``objective``'s sums, at each context's common hour where ``levels`` has
    one (``levels.py``). Eq. 9 in numpy: a fleet's refit adds up a hundred thousand buckets;
    ``FlowSums.utility`` and ``shrunk_noise`` are the same computations one at a time (checked
    by a test). Other objectives through ``FlowSums.utility`` per group."""
    group_of: dict[tuple[int, str], int] = {}
    gids: list[int] = []
    kept: list[Trial] = []
    for t in trials:
        if t.sums.flows_for(objective) > 0:
            gids.append(group_of.setdefault((t.context_id, t.theta_key), len(group_of)))
            kept.append(t)
    if not group_of:
        return []
    index = np.asarray(gids)
    newest = np.full(len(group_of), -np.inf)
    np.maximum.at(newest, index, np.asarray([t.last_seen.timestamp() for t in kept]))
    n, mean, var_of_mean = moments(index, kept, len(group_of), sigma, objective)
    shift, level_var = _hour_shift(index, kept, len(group_of), n, levels, objective)
    mean = mean - shift
    groups = list(group_of)
    values, inside = _inside_region(spec, [k for _, k in groups], bounds)
    keep = np.flatnonzero(inside)  # the pooled spread is of the region's trials only
    contexts = np.asarray([groups[g][0] for g in keep])
    hours = level_var[keep]
    noise = shrunk_noises(n[keep], var_of_mean[keep], contexts) + hours
    names = spec.names
    columns = zip(  # Python values in one conversion each: per-element numpy indexing is slow
        keep.tolist(),
        values[keep].tolist(),
        mean[keep].tolist(),
        noise.tolist(),
        n[keep].astype(int).tolist(),
        newest[keep].tolist(),
        hours.tolist(),
        strict=True,
    )
    return [
        Observation(groups[g][0], dict(zip(names, row, strict=True)), groups[g][1], u, v, f, t, h)
        for g, row, u, v, f, t, h in columns
    ]


def _hour_shift(
    index: np.ndarray,
    kept: list[Trial],
    count: int,
    flows: np.ndarray,
    levels: HourLevels | None,
    objective: Objective,
) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the flow-weighted level of its buckets and that level's variance (each
    bucket's own; the covariance between a θ's buckets is left out). Zero for the context's
    reference θ, a bucket without a level, and a trial without a bucket (its flows still count
    in the weights: they ran at no known hour)."""
    shift = np.zeros(count)
    var = np.zeros(count)
    if levels is None or not levels.buckets:
        return shift, var
    for g, t in zip(index.tolist(), kept, strict=True):
        if t.bucket is None or levels.references.get(t.context_id) == t.theta_key:
            continue
        level = levels.buckets.get((t.context_id, t.bucket))
        if level is None:
            continue
        w = t.sums.flows_for(objective)
        shift[g] += w * level[0]
        var[g] += w * w * level[1]
    weight = np.maximum(flows, 1.0)
    return shift / weight, var / (weight * weight)


Moments = tuple[np.ndarray, np.ndarray, np.ndarray]  # per group: flows, mean, var of the mean


def moments(
    index: np.ndarray, kept: list[Trial], count: int, sigma: float, objective: Objective
) -> Moments:
    """Flows, mean utility (``objective``) and the variance of that mean of each group of
    trials (``index``: each trial's group, 0 … count − 1)."""
    if objective == Objective.FLOW_MEAN:
        return _eq9(index, [t.sums.astuple() for t in kept], sigma)
    return _by_sums(index, kept, count, sigma, objective)


def _eq9(index: np.ndarray, rows: list[tuple], sigma: float) -> Moments:
    """``FlowSums.utility`` (eq. 9) for every group at once."""
    totals = np.zeros((int(index.max()) + 1, len(rows[0])))
    np.add.at(totals, index, np.asarray(rows, dtype=float))
    n, tpt, tpt_sq, delay, delay_sq, tpt_delay = totals.T
    mean = (tpt - sigma * delay) / n
    second = (tpt_sq - 2 * sigma * tpt_delay + sigma * sigma * delay_sq) / n
    sample_var = np.maximum(second - mean * mean, 0.0) * n / np.maximum(n - 1, 1)
    var_of_mean = np.where(
        n >= 2, np.maximum(sample_var, MIN_FLOW_VARIANCE) / n, SINGLE_FLOW_STD**2
    )
    return n, mean, var_of_mean


def _by_sums(
    index: np.ndarray, kept: list[Trial], count: int, sigma: float, objective: Objective
) -> Moments:
    """``FlowSums.utility`` at ``objective`` for each group of trials."""
    totals = [FlowSums() for _ in range(count)]
    for g, t in zip(index.tolist(), kept, strict=True):
        totals[g] = totals[g] + t.sums
    us = [s.utility(sigma, objective) for s in totals]
    n = np.asarray([u.flows for u in us], dtype=float)
    return n, np.asarray([u.mean for u in us]), np.asarray([u.var_of_mean for u in us])
