"""Results of an experiment per day and per arm, with 95 % intervals, from per-host-day sums.

What is stored per (arm, host, day) is a ``FlowSums`` and the slow-flow count, so every metric
is a ratio of sums over flows: mean utility at any σ is Σ(x − σ·d) / Σn, mean throughput Σx / Σn,
mean queueing delay Σd / Σn, slow-flow share Σslow / Σn. Point estimates are exact from the sums
(the same numbers as eq. 9 over every flow).

An experiment may name the completion-time objective instead (``Experiment.objective``, as a
policy may): utility is then Σbits / Σduration − σ · Σd / Σn over the flows that carry its sums
(``CompletionSums``), a combination of two ratios of sums; throughput is Σbits / Σduration and
delay Σd / Σn over the same flows. Point estimates are again exact, and the intervals below are
the same jackknife over hosts applied to the combination.

Intervals: hosts, not flows, are the unit of randomisation, and flows of one host share its
path, load and hardware, so they are correlated; an interval from the per-flow variance
(var/N) treats N flows as N independent draws and is far too narrow when they are not (in
the statistics test's simulation it covers the truth in 55 % of experiments, not 95 %). So:

- **An arm on a day or over the experiment** is a ratio estimator over hosts, Σ_h U_h / Σ_h N_h,
  with the jackknife (leave one host out) variance (H−1)/H · Σ_h ((U_h − ū·N_h) / (N − N_h))², a
  cluster-robust variance with each host's leverage accounted for, and a t quantile with H − 1
  degrees of freedom. It needs only each host's sums, it holds whatever the correlation of flows
  within a host, and it weighs hosts by their flows, as eq. 9 does. The t quantile has Kish's
  effective number of hosts, (ΣN_h)² / ΣN_h², less one, as degrees of freedom: H − 1 for hosts of
  equal size, fewer when a few hosts carry most flows. (With the plain linearised variance,
  H/(H−1) · Σ_h (U_h − ū·N_h)² / N², and H − 1 degrees of freedom, 95 % intervals covered 92–94 %
  in simulations with 20–30 hosts per arm of very unequal sizes; this way 94–96 %.)
- **Difference of two arms without crossover** (and on any one day, when each host runs one
  arm): the two arms' hosts are disjoint, so the variances add; Welch–Satterthwaite degrees of
  freedom.
- **Difference with a crossover** (over the whole experiment): every host ran both arms, one per
  period, so the comparison is within host: d_h = mean of the host's flows under the arm −
  mean under control. A period effect (traffic changes from one week to the next) is removed
  by averaging the two sequence groups: Δ = ½(mean d | control first + mean d | arm first),
  variance ¼(s₁²/n₁ + s₂²/n₂), Welch degrees of freedom (the AB/BA analysis). Each host weighs
  the same here, so it estimates the host-average effect, which equals the flow-weighted one
  when the effect does not depend on a host's traffic. Until both sequence groups have two
  hosts with flows in both periods, the difference is the parallel one over the first period.

The core functions take arrays whose last axis is the hosts and any leading axes as batches,
so the test simulates a thousand experiments in one call of the same code the API uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from gemini_api.sums import Objective

from ..domain import FlowSums
from .assignment import host_group
from .domain import Experiment

LEVEL = 0.95  # two-sided level of every interval in results
Metric = Literal["utility", "throughput", "delay", "slow_share"]
METRICS: tuple[Metric, ...] = ("utility", "throughput", "delay", "slow_share")
Method = Literal["parallel", "crossover", "parallel_first_period"]
MIN_PAIRED_HOSTS = 2  # per sequence group, for a within-host variance
Array = NDArray[np.float64]


@dataclass(frozen=True)
class Ratios:
    """Vectorised estimates: the mean, the variance of the mean, and degrees of freedom
    (NaN where there is no variance: fewer than two hosts)."""

    mean: Array
    var: Array
    df: Array


def ratio(num: Array, den: Array) -> Ratios:
    """Σnum / Σden over the last axis (hosts), with the cluster-robust variance; hosts with no
    flows (den 0) are not counted."""
    return combination([(1.0, num, den)], den)


# One ratio of a linear combination: (coefficient, per-host numerators, per-host denominators).
Term = tuple[float, Array, Array]


def _leave_one_out(num: Array, den: Array) -> tuple[Array, Array, NDArray[np.bool_]]:
    """Σnum / Σden, each host's leave-one-host-out change of it, and the hosts it counts."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    used = den > 0
    total = den.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = num.sum(axis=-1) / total
        # Each host's residual over the flows of the others: the ratio without that host,
        # subtracted from the ratio (jackknife), so a host holding many of the flows is not
        # under-counted.
        loo = np.where(used, (num - mean[..., None] * den) / (total[..., None] - den), 0.0)
    return mean, loo, used


def combination(terms: Sequence[Term], flows: Array) -> Ratios:
    """Σ_k c_k · Σnum_k / Σden_k over the last axis (hosts), e.g. eq. 9's Σ(x − σ·d) / Σn (one
    ratio) or the completion objective's Σbits / Σduration − σ · Σd / Σn (two). The jackknife
    variance: leaving a host out changes the combination by the same combination of each
    ratio's change, exactly, so ``(H − 1)/H · Σ_h (Σ_k c_k · change_k,h)²``. ``flows`` per
    host weigh the hosts in Kish's effective number (the degrees of freedom)."""
    flows = np.asarray(flows, dtype=float)
    mean, loo = np.zeros(flows.shape[:-1]), np.zeros(flows.shape)
    used = np.zeros(flows.shape, dtype=bool)
    for c, num, den in terms:
        m, change, u = _leave_one_out(num, den)
        mean, loo, used = mean + c * m, loo + c * change, used | u
    hosts = used.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = (hosts - 1) / hosts * (loo**2).sum(axis=-1)
        # Kish's effective number of hosts: H for equal hosts, fewer when a few carry most
        # flows, whose residuals then dominate the variance and make it less certain.
        effective = flows.sum(axis=-1) ** 2 / (flows**2).sum(axis=-1)
    ok = hosts >= 2
    return Ratios(
        mean,
        np.where(ok, var, np.nan),
        np.where(ok, np.maximum(effective - 1, 1.0), np.nan),
    )


def welch_df(v1: Array, df1: Array, v2: Array, df2: Array) -> Array:
    """Welch–Satterthwaite degrees of freedom of a sum of two independent variances."""
    with np.errstate(invalid="ignore", divide="ignore"):
        df = (v1 + v2) ** 2 / (v1**2 / df1 + v2**2 / df2)
    # Both variances zero: the data give no spread at all; take the smaller count.
    return np.where(np.isfinite(df), df, np.minimum(df1, df2))


def parallel_difference(arm: Ratios, control: Ratios) -> Ratios:
    """arm − control for disjoint sets of hosts."""
    return Ratios(
        arm.mean - control.mean,
        arm.var + control.var,
        welch_df(arm.var, arm.df, control.var, control.df),
    )


def crossover_difference(
    arm_num: Array, arm_den: Array, ctl_num: Array, ctl_den: Array, arm_first: NDArray[np.bool_]
) -> Ratios:
    """arm − control from hosts that ran both, one per period (AB/BA), period effect removed.
    ``arm_first`` marks the hosts that ran the arm in the first period."""
    paired = (np.asarray(arm_den) > 0) & (np.asarray(ctl_den) > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.asarray(arm_num) / arm_den - np.asarray(ctl_num) / ctl_den
    return within_host_difference(d, paired, arm_first)


def within_host_difference(
    d: Array, paired: NDArray[np.bool_], arm_first: NDArray[np.bool_]
) -> Ratios:
    """The AB/BA estimate from each host's own arm − control difference ``d`` (used where
    ``paired``: the host has flows under both)."""
    means, variances, counts = [], [], []
    for sequence in (~arm_first, arm_first):
        use = paired & sequence
        n = use.sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            m = np.where(use, d, 0.0).sum(axis=-1) / n
            s2 = np.where(use, (d - m[..., None]) ** 2, 0.0).sum(axis=-1) / (n - 1)
        ok = n >= MIN_PAIRED_HOSTS
        means.append(np.where(ok, m, np.nan))
        variances.append(np.where(ok, s2 / n, np.nan))
        counts.append(np.where(ok, n - 1.0, np.nan))
    return Ratios(
        (means[0] + means[1]) / 2,
        (variances[0] + variances[1]) / 4,
        welch_df(variances[0] / 4, counts[0], variances[1] / 4, counts[1]),
    )


def t_quantile(p: float, df: Array) -> Array:
    with np.errstate(invalid="ignore"):
        return np.asarray(stats.t.ppf(p, df), dtype=float)


def interval(r: Ratios, level: float = LEVEL) -> tuple[Array, Array]:
    """Two-sided ``level`` interval, (low, high); NaN where there is no variance."""
    half = t_quantile(0.5 + level / 2, r.df) * np.sqrt(r.var)
    return r.mean - half, r.mean + half


def upper_bound(r: Ratios, confidence: float) -> Array:
    """One-sided: the true value is below this with ``confidence``."""
    return r.mean + t_quantile(confidence, r.df) * np.sqrt(r.var)


# --- results from stored records -------------------------------------------------------------


@dataclass(frozen=True)
class HostDay:
    """One arm's flows on one host on one experiment day (a row of ``experiment_host_days``)."""

    arm: str
    host: str
    day: date
    sums: FlowSums
    slow_flows: int


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its standard error, 95 % interval and degrees of freedom (None
    where there is no variance: fewer than two hosts)."""

    mean: float | None
    stderr: float | None
    low: float | None
    high: float | None
    df: float | None

    @classmethod
    def of(cls, r: Ratios) -> Estimate:
        low, high = interval(r)
        return cls(*(_num(v) for v in (r.mean, np.sqrt(r.var), low, high, r.df)))


def _num(v: Array | float) -> float | None:
    x = float(v)
    return x if np.isfinite(x) else None


@dataclass(frozen=True)
class ArmResult:
    arm: str
    hosts: int
    flows: int
    metrics: dict[str, Estimate]


@dataclass(frozen=True)
class Difference:
    """``arm`` − ``control`` per metric; positive utility favours ``arm``."""

    arm: str
    control: str
    method: Method
    hosts: int  # hosts behind the estimate (paired hosts for a crossover)
    metrics: dict[str, Estimate]
    ratios: dict[str, Ratios]  # the same, for the guardrail's one-sided bounds


@dataclass(frozen=True)
class Period:
    arms: list[ArmResult]
    differences: list[Difference]


@dataclass(frozen=True)
class DayResult(Period):
    day: date
    period: int


@dataclass(frozen=True)
class Results:
    sigma: float
    days: list[DayResult]
    overall: Period


class _Table:
    """The records as columns, with per-host sums for any subset of them, and each metric as
    the ratios of sums the experiment's objective makes it."""

    def __init__(self, experiment: Experiment, records: Sequence[HostDay]):
        self.objective = experiment.objective
        self.hosts = sorted({r.host for r in records})
        index = {h: i for i, h in enumerate(self.hosts)}
        arms = {a: i for i, a in enumerate(experiment.arm_names)}
        kept = [r for r in records if r.arm in arms]
        self.arm = np.array([arms[r.arm] for r in kept], dtype=int)
        self.host = np.array([index[r.host] for r in kept], dtype=int)
        self.day = np.array([r.day.toordinal() for r in kept], dtype=int)
        self.flows = np.array([r.sums.flow_count for r in kept], dtype=float)
        self.tpt = np.array([r.sums.tpt_sum for r in kept], dtype=float)
        self.delay = np.array([r.sums.delay_sum for r in kept], dtype=float)
        self.slow = np.array([r.slow_flows for r in kept], dtype=float)
        done = [r.sums.completion for r in kept]
        self.done_flows = np.array([c.flow_count for c in done], dtype=float)
        self.done_mbit = np.array([c.mbit_sum for c in done], dtype=float)
        self.done_seconds = np.array([c.seconds_sum for c in done], dtype=float)
        self.done_delay = np.array([c.delay_sum for c in done], dtype=float)

    def terms(self, metric: Metric, sigma: float) -> tuple[list[Term], Array]:
        """The metric as ratios of record columns, and the flows it is over. Eq. 9: one ratio
        over all flows. Completion: utility Σbits/Σduration − σ·Σd/Σn and throughput
        Σbits/Σduration, delay Σd/Σn, over the flows carrying its sums; the slow-flow share
        is over all flows either way."""
        if self.objective == Objective.COMPLETION and metric != "slow_share":
            rate = (1.0, self.done_mbit, self.done_seconds)
            delay = (1.0, self.done_delay, self.done_flows)
            by_metric = {"utility": [rate, (-sigma, *delay[1:])], "throughput": [rate]}
            return by_metric.get(metric, [delay]), self.done_flows
        if metric == "utility":
            num = self.tpt - sigma * self.delay
        else:
            num = {"throughput": self.tpt, "delay": self.delay, "slow_share": self.slow}[metric]
        return [(1.0, num, self.flows)], self.flows

    def per_host(self, values: Array, mask: NDArray[np.bool_]) -> Array:
        summed = np.bincount(self.host[mask], weights=values[mask], minlength=len(self.hosts))
        return np.asarray(summed, dtype=float)

    def metric(self, metric: Metric, sigma: float, mask: NDArray[np.bool_]) -> Ratios:
        """The metric over the records in ``mask``, hosts as the unit."""
        terms, flows = self.terms(metric, sigma)
        per_host = [(c, self.per_host(n, mask), self.per_host(d, mask)) for c, n, d in terms]
        return combination(per_host, self.per_host(flows, mask))

    def host_values(self, metric: Metric, sigma: float, mask: NDArray[np.bool_]) -> Array:
        """Each host's own value of the metric over the records in ``mask`` (NaN without
        flows)."""
        terms, _ = self.terms(metric, sigma)
        out = np.zeros(len(self.hosts))
        with np.errstate(invalid="ignore", divide="ignore"):
            for c, n, d in terms:
                out = out + c * self.per_host(n, mask) / self.per_host(d, mask)
        return out

    def objective_flows(self, mask: NDArray[np.bool_]) -> Array:
        """Per host, the flows in ``mask`` that the objective is computed over."""
        return self.per_host(self.terms("utility", 0.0)[1], mask)


def _arm_ratios(t: _Table, mask: NDArray[np.bool_], sigma: float) -> dict[str, Ratios]:
    return {m: t.metric(m, sigma, mask) for m in METRICS}


def _arm_result(name: str, t: _Table, mask: NDArray[np.bool_], sigma: float) -> ArmResult:
    flows = t.objective_flows(mask)
    ratios = _arm_ratios(t, mask, sigma)
    estimates = {m: Estimate.of(r) for m, r in ratios.items()}
    return ArmResult(name, int((flows > 0).sum()), int(flows.sum()), estimates)


def _parallel(
    t: _Table, arm: int, ctl: int, where: NDArray[np.bool_], sigma: float
) -> tuple[dict[str, Ratios], int]:
    a, c = where & (t.arm == arm), where & (t.arm == ctl)
    ra, rc = _arm_ratios(t, a, sigma), _arm_ratios(t, c, sigma)
    hosts = int((t.objective_flows(a) > 0).sum() + (t.objective_flows(c) > 0).sum())
    return {m: parallel_difference(ra[m], rc[m]) for m in METRICS}, hosts


def _difference(
    name: str, control: str, method: Method, hosts: int, ratios: dict[str, Ratios]
) -> Difference:
    return Difference(
        name, control, method, hosts, {m: Estimate.of(r) for m, r in ratios.items()}, ratios
    )


def _crossover(
    experiment: Experiment, t: _Table, arm: int, ctl: int, sigma: float
) -> tuple[dict[str, Ratios], int] | None:
    """The within-host difference, or None while too few hosts have both periods."""
    a, c = t.arm == arm, t.arm == ctl
    groups = np.array([host_group(experiment, h) for h in t.hosts], dtype=float)
    # Group g runs arm g in the first period.
    arm_first = groups == arm
    paired = (t.objective_flows(a) > 0) & (t.objective_flows(c) > 0)
    if min((paired & arm_first).sum(), (paired & ~arm_first).sum()) < MIN_PAIRED_HOSTS:
        return None
    out: dict[str, Ratios] = {}
    for m in METRICS:
        # The slow-flow share is over all flows: pair on those for it.
        both = paired
        if m == "slow_share":
            both = (t.per_host(t.flows, a) > 0) & (t.per_host(t.flows, c) > 0)
        d = t.host_values(m, sigma, a) - t.host_values(m, sigma, c)
        out[m] = within_host_difference(d, both, arm_first)
    return out, int(paired.sum())


def _overall_differences(experiment: Experiment, t: _Table, sigma: float) -> list[Difference]:
    names = experiment.arm_names
    ctl = names.index(experiment.control)
    everything = np.ones(len(t.arm), dtype=bool)
    out = []
    for i, name in enumerate(names):
        if i == ctl:
            continue
        if experiment.crossover_day is None:
            ratios, hosts = _parallel(t, i, ctl, everything, sigma)
            out.append(_difference(name, experiment.control, "parallel", hosts, ratios))
            continue
        within = _crossover(experiment, t, i, ctl, sigma)
        if within is not None:
            ratios, hosts = within
            out.append(_difference(name, experiment.control, "crossover", hosts, ratios))
            continue
        first = t.day < experiment.crossover_day.toordinal()
        ratios, hosts = _parallel(t, i, ctl, first, sigma)
        out.append(_difference(name, experiment.control, "parallel_first_period", hosts, ratios))
    return out


def _day(experiment: Experiment, t: _Table, day: date, sigma: float) -> DayResult:
    on_day = t.day == day.toordinal()
    names = experiment.arm_names
    ctl = names.index(experiment.control)
    arms = [_arm_result(n, t, on_day & (t.arm == i), sigma) for i, n in enumerate(names)]
    diffs = []
    for i, name in enumerate(names):
        if i != ctl:
            ratios, hosts = _parallel(t, i, ctl, on_day, sigma)
            diffs.append(_difference(name, experiment.control, "parallel", hosts, ratios))
    return DayResult(arms, diffs, day, experiment.period(day))


def results(
    experiment: Experiment,
    records: Iterable[HostDay],
    sigma: float | None = None,
    days: Iterable[date] | None = None,
) -> Results:
    """Per day (every day of the experiment, or ``days``) and over the whole experiment."""
    s = experiment.sigma if sigma is None else sigma
    t = _Table(experiment, list(records))
    names = experiment.arm_names
    wanted = experiment.days() if days is None else sorted(set(days))
    overall = Period(
        [_arm_result(n, t, t.arm == i, s) for i, n in enumerate(names)],
        _overall_differences(experiment, t, s),
    )
    return Results(s, [_day(experiment, t, d, s) for d in wanted], overall)
