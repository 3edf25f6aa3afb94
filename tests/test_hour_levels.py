"""Hour levels (``policy/levels.py``): an hour's level, shared by every θ that ran in it, is
taken out of the observations before the model compares θ."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from gemini_api.sums import Objective
from gemini_booster.domain import ContextKey, FlowSums
from gemini_booster.policy import history, levels
from gemini_booster.policy import planner as planner_module
from gemini_booster.policy.planner import Planner, PolicyState
from tests.test_planner import BOUNDS, SPEC, T0, policy, theta, trial

REFERENCE, EXPLORER = theta(85, 10), theta(30, 4)


def spread(mean: float, n: int = 60, width: float = 15.0) -> FlowSums:
    """``n`` flows at ``mean`` ± ``width`` (no queueing): at ± 15 the variance of their mean is
    228.8 / n."""
    pair = [mean - width, mean + width]
    return FlowSums.total(FlowSums.of_flow(u, 0.0) for u in pair * (n // 2))


def test_between_variance_is_the_spread_of_the_means_beyond_their_noise():
    """DerSimonian–Laird by hand: means 0 and 2 of variance 1 each: Q = 2 on one degree of
    freedom, Σw − Σw²/Σw = 1, so τ² = 1. Means that differ by less than their noise: 0."""
    assert levels.between_variance(np.array([0.0, 2.0]), np.array([1.0, 1.0])) == pytest.approx(1.0)
    assert levels.between_variance(np.array([0.0, 1.0]), np.array([1.0, 1.0])) == 0.0
    assert levels.between_variance(np.array([5.0, 5.0, 5.0]), np.array([1.0, 2.0, 3.0])) == 0.0


def test_an_explorer_of_the_good_hour_is_moved_to_the_common_hour():
    """The reference ran hours at 24, 16 and 16; the explorer ran the good hour only, at 23 (1
    below the reference there). Its raw mean (23) beats the reference's (18.67) by the hour's
    level; moved by the good hour's shrunk level, it trails the reference, as it did in the
    hour both ran, and its noise grows by the level's uncertainty. The reference stays."""
    ref = [trial(1, REFERENCE, spread(m), h) for h, m in enumerate((24.0, 16.0, 16.0))]
    data = [*ref, trial(1, EXPLORER, spread(23.0), 0)]
    hours = levels.bucket_levels(data, 0.1, {})
    raw = {o.theta_key: o for o in history.observations(data, 0.1, SPEC, BOUNDS)}
    moved = {o.theta_key: o for o in history.observations(data, 0.1, SPEC, BOUNDS, levels=hours)}
    ref_key, exp_key = SPEC.key(REFERENCE), SPEC.key(EXPLORER)
    assert moved[ref_key].utility == pytest.approx(raw[ref_key].utility)  # its levels sum to 0
    assert raw[exp_key].utility == pytest.approx(23.0)
    # by hand: s² = 228.8/60 = 3.81; Q = (5.33² + 2·2.67²)/3.81 = 11.2 on 2 dof; Σw − Σw²/Σw =
    # 2/3.81, so τ² = 17.5. Solving the two θ and three hours: μ_ref = 18.67 and the good hour's
    # level (1/3.81)/(1/3.81 + 1/17.5)·(24 − 18.67) = 4.38
    assert hours.references == {1: SPEC.key(REFERENCE)}
    assert hours.buckets[(1, T0)][0] == pytest.approx(4.38, abs=0.01)
    assert moved[exp_key].utility == pytest.approx(23.0 - 4.38, abs=0.01)
    assert moved[exp_key].utility < moved[ref_key].utility
    assert moved[exp_key].noise_var > raw[exp_key].noise_var


def test_nothing_moves_when_the_hours_differ_by_no_more_than_their_noise():
    ref = [trial(1, REFERENCE, spread(m), h) for h, m in enumerate((20.0, 20.5, 19.5))]
    data = [*ref, trial(1, EXPLORER, spread(23.0), 0)]
    assert levels.bucket_levels(data, 0.1, {}) == history.HourLevels({}, {})


def _rotating_hours(explorer_good: float) -> list:
    """Six hours alternating good (30) and bad (15) for the incumbent; θ explored in a bad hour
    each (a little below it there), and EXPLORER in the two good hours at ``explorer_good``."""
    good = (0, 2, 4)
    data = [trial(1, REFERENCE, spread(30.0 if h in good else 15.0), h) for h in range(6)]
    for h, (a, b) in zip((1, 3, 5), ((10, 0), (50, 7), (99, 2)), strict=True):
        data.append(trial(1, theta(a, b), spread(14.0), h))
    data += [trial(1, EXPLORER, spread(explorer_good), h) for h in (0, 2)]
    return data


def _incumbent(data: list) -> dict[str, int]:
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    plans = Planner(SPEC).plan(
        policy(n_initial_points=2),
        data,
        contexts,
        [1],
        PolicyState(),
        now=T0 + timedelta(hours=6),
        incumbents={1: SPEC.key(REFERENCE)},
    )
    assert plans[1].acquisition not in ("initial design", "random")  # the model decided
    return plans[1].incumbent


def test_the_model_does_not_take_a_good_hour_for_a_better_theta(monkeypatch):
    """A θ run only in good hours (31 where the incumbent did 30) leads the incumbent's mean
    over all hours (22.5) by the hours' difference: without hour levels the model switches to
    it; with them it is about one unit better and stays behind the switching bar. A θ clearly
    better within its hours (40 against 30) still takes over."""
    same_hour = _rotating_hours(31.0)
    assert _incumbent(same_hour) == REFERENCE
    assert _incumbent(_rotating_hours(40.0)) == EXPLORER
    nothing = history.HourLevels({}, {})
    monkeypatch.setattr(planner_module.levels, "bucket_levels", lambda *a, **k: nothing)
    assert _incumbent(same_hour) == EXPLORER  # what the model did before hour levels


def _hours(levels_by_hour: list[float], first_hour: int = 0) -> list:
    return [
        trial(1, REFERENCE, spread(m, 200), first_hour + h) for h, m in enumerate(levels_by_hour)
    ]


UPS_AND_DOWNS = [17.0, 16.0, 18.0, 24.0, 23.0, 22.0, 24.0, 17.0, 16.0, 18.0, 23.0, 22.0]  # in runs


def _largest_z_without_the_hours(buckets: list) -> float:
    """The drift test as it was: Welch's z on the exact sums of each split's two sides."""
    zs = []
    for i in range(1, len(buckets)):
        before = FlowSums.total(t.sums for t in buckets[:i]).utility(0.1)
        after = FlowSums.total(t.sums for t in buckets[i:]).utility(0.1)
        z = history._shift_z(before, after)
        zs.append(0.0 if z is None else abs(z))
    return max(zs)


def test_the_hours_ordinary_ups_and_downs_are_not_a_change_of_path():
    """Twelve hours of the incumbent, 200 flows each, the hours between 16 and 24 in runs: a
    split's two sides differ far beyond their flows' noise (without the hours' variance the
    largest z is above DRIFT_Z, and the context's search restarted), but no more than the
    hours differ anyway. A halving amid the same ups and downs is still found, at the
    hour it happened."""
    steady = _hours(UPS_AND_DOWNS)
    assert _largest_z_without_the_hours(steady) > history.DRIFT_Z
    incumbent = {1: SPEC.key(REFERENCE)}
    assert history.change_points(steady, 0.1, incumbent) == {}
    moved = steady[:6] + _hours([m * 0.5 for m in UPS_AND_DOWNS[6:]], first_hour=6)
    assert history.change_points(moved, 0.1, incumbent) == {1: T0 + timedelta(hours=6)}


def _dense_levels(keys, flows, mean, var, tau2, ref):
    """The levels' least squares solved directly: unknowns μ_θ and ℓ_b, prior ℓ ~ N(0, τ²);
    then each level less the reference θ's flow-weighted mean level, and that difference's
    variance from the full covariance."""
    thetas = sorted({k for k, _ in keys})
    buckets = sorted({b for _, b in keys})
    nt, nb = len(thetas), len(buckets)
    design = np.zeros((len(keys), nt + nb))
    for row, (k, b) in enumerate(keys):
        design[row, thetas.index(k)] = design[row, nt + buckets.index(b)] = 1.0
    precision = design.T @ (design / var[:, None])
    precision[nt:, nt:] += np.eye(nb) / tau2
    cov = np.linalg.inv(precision)
    level = (cov @ (design.T @ (mean / var)))[nt:]
    cov = cov[nt:, nt:]
    share = np.zeros(nb)
    for (k, b), n in zip(keys, flows, strict=True):
        if k == thetas[ref]:
            share[buckets.index(b)] += n
    share /= share.sum()
    against = np.eye(nb) - share[None, :]  # row b: ℓ_b less the reference's mean level
    return against @ level, np.diag(against @ cov @ against.T)


def test_the_levels_are_the_least_squares_of_theta_plus_hour_with_the_prior():
    """Random designs (θ in one or many hours, uneven noise and flows): the Woodbury solve of
    ``levels._solve`` gives the levels, taken against the reference θ, and the variances of
    those differences, as the full least squares does."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        n_theta, n_hours = int(rng.integers(2, 12)), int(rng.integers(2, 30))
        keys = sorted(
            {
                (f"θ{rng.integers(n_theta)}", T0 + timedelta(hours=int(rng.integers(n_hours))))
                for _ in range(3 * n_hours)
            }
        )
        flows = rng.integers(2, 200, len(keys)).astype(float)
        mean = rng.normal(20.0, 3.0, len(keys))
        var = rng.uniform(0.1, 2.0, len(keys))
        cells = levels._Cells(keys, (flows, mean, var))
        ref = int(np.argmax(np.bincount(cells.theta)))
        got = levels._solve(cells, 1.7, ref)
        want, want_var = _dense_levels(keys, flows, mean, cells.var, 1.7, ref)
        assert [got[b][0] for b in cells.buckets] == pytest.approx(list(want), abs=1e-9)
        assert [got[b][1] for b in cells.buckets] == pytest.approx(list(want_var), abs=1e-9)


def test_an_explorer_is_charged_only_the_uncertainty_of_its_hour_against_the_reference():
    """The incumbent ran six hours (30 and 15 in turn, 200 flows each), an explorer one. Where
    the whole context sits is uncertain too, but that part is shared by every θ and cancels
    when two are compared: the explorer's added noise is the variance of its hour's level
    less the reference's mean level, s²(1 − 1/6) for the reference's bucket variance s²
    (τ² ≫ s², so the levels are hardly shrunk), not the level's own variance."""
    data = [trial(1, REFERENCE, spread(30.0 if h % 2 == 0 else 15.0, 200), h) for h in range(6)]
    data.append(trial(1, EXPLORER, spread(31.0, 200), 0))
    hours = levels.bucket_levels(data, 0.1, {})
    obs = {o.theta_key: o for o in history.observations(data, 0.1, SPEC, BOUNDS, levels=hours)}
    s2 = FlowSums.total([spread(30.0, 200)]).utility(0.1).var_of_mean
    assert obs[SPEC.key(EXPLORER)].level_var == pytest.approx(s2 * (1 - 1 / 6), rel=0.05)
    assert obs[SPEC.key(REFERENCE)].level_var == 0.0
    # the flows' spread the model's units rest on leaves the levels' part out
    raw = {o.theta_key: o for o in history.observations(data, 0.1, SPEC, BOUNDS)}
    assert planner_module.flow_spread(obs.values()) == pytest.approx(
        planner_module.flow_spread(raw.values())
    )


def test_two_flows_that_happen_to_agree_do_not_set_the_hours():
    """A θ of two flows per hour whose flows agree (27.8 and 28.3; 40.0 and 40.5) has its
    noise shrunk toward the context's spread, as in the model's observations, and so moves the
    hours little against the reference's 60 flows per hour."""
    base = [trial(1, REFERENCE, spread(m), h) for h, m in enumerate((24.0, 16.0, 16.0))]
    lucky = theta(50, 7)
    pair = [
        trial(1, lucky, FlowSums.total(FlowSums.of_flow(u, 0.0) for u in us), h)
        for h, us in ((1, (27.8, 28.3)), (2, (40.0, 40.5)))
    ]
    with_pair = levels.bucket_levels(base + pair, 0.1, {})
    for h, level in ((0, 4.38), (1, -2.19), (2, -2.19)):
        assert with_pair.buckets[(1, T0 + timedelta(hours=h))][0] == pytest.approx(level, abs=0.6)


def test_a_theta_that_ran_in_exactly_the_incumbents_hours_is_compared_hour_by_hour():
    """In the initial design, an explorer 1.5 above the incumbent in each of the same six hours
    (hours at 30 and 15 in turn) replaces it: over the same buckets the hours cancel, and
    the comparison is of the flows as measured, without the levels' estimate."""
    data = [trial(1, REFERENCE, spread(30.0 if h % 2 == 0 else 15.0, 200), h) for h in range(6)]
    data += [trial(1, EXPLORER, spread(31.5 if h % 2 == 0 else 16.5, 200), h) for h in range(6)]
    plans = Planner(SPEC).plan(
        policy(n_initial_points=8),
        data,
        {1: ContextKey("a", "b", "c", "d", 0)},
        [1],
        PolicyState(),
        now=T0 + timedelta(hours=6),
        incumbents={1: SPEC.key(REFERENCE)},
    )
    assert plans[1].acquisition == "initial design" and plans[1].incumbent == EXPLORER


def test_buckets_without_the_objectives_flows_are_not_hours_of_the_drift_test():
    """Under the completion objective an older agent's bucket (eq. 9 sums only) has no flows
    of the objective: it is left out of the drift test, not read as an hour at utility 0 that
    inflates how much hours differ and hid a drop of 12 % (split z −5.9 alone, −4.4 with it)."""
    rng = np.random.default_rng(3)

    def completion(m: float) -> FlowSums:
        return FlowSums.total(
            FlowSums.of_record(1_000_000, int(8e6 / max(x, 1)), 0.0) for x in rng.normal(m, 3, 40)
        )

    hours = [trial(1, REFERENCE, completion(20.0 if h < 6 else 17.5), h) for h in range(12)]
    old_agent = FlowSums.total(FlowSums.of_flow(x, 0.0) for x in rng.normal(20, 3, 100))
    mixed = [trial(1, REFERENCE, old_agent, -1), *hours]
    incumbent = {1: SPEC.key(REFERENCE)}
    found = history.change_points(hours, 0.1, incumbent, Objective.COMPLETION)
    assert found == {1: T0 + timedelta(hours=6)}
    assert history.change_points(mixed, 0.1, incumbent, Objective.COMPLETION) == found


def test_levels_of_nearly_noiseless_cells_are_finite_or_left_out():
    """Cells at the variance floor (weights of 10¹²) and hours far apart (τ² 10⁶): the system
    is nearly singular; the levels come back finite, or the context gets none (never an
    exception inside a refit)."""
    keys = [("ref", T0 + timedelta(hours=h)) for h in range(6)]
    keys += [(f"e{h}", T0 + timedelta(hours=h)) for h in range(6)] + [("two", T0)]
    keys.append(("two", T0 + timedelta(hours=1)))
    mean = np.asarray([20.0 + 5 * (h % 2) for h in range(6)] + [21.0] * 6 + [22.0, 27.0])
    var = np.asarray([1e-12] * 6 + [0.5] * 6 + [1e-12, 1e-12])
    cells = levels._Cells(keys, (np.full(len(keys), 1e6), mean, var))
    cells.var = var  # as measured, not shrunk: the floor itself
    got = levels._solve(cells, 1e6, cells.thetas.index("ref"))
    assert all(np.isfinite(v[0]) and np.isfinite(v[1]) for v in got.values())
