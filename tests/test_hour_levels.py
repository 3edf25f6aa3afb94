"""Hour levels (``policy/levels.py``): an hour's level, shared by every θ that ran in it, is
taken out of the observations before the model compares θ."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

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
    level; moved by the good hour's shrunk level, it trails by about that 1, as it did in the
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
    assert hours[(1, T0)][0] == pytest.approx(4.38, abs=0.01)
    assert moved[exp_key].utility == pytest.approx(23.0 - 4.38, abs=0.01)
    assert moved[exp_key].utility < moved[ref_key].utility
    assert moved[exp_key].noise_var > raw[exp_key].noise_var


def test_nothing_moves_when_the_hours_differ_by_no_more_than_their_noise():
    ref = [trial(1, REFERENCE, spread(m), h) for h, m in enumerate((20.0, 20.5, 19.5))]
    data = [*ref, trial(1, EXPLORER, spread(23.0), 0)]
    assert levels.bucket_levels(data, 0.1, {}) == {}


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
    monkeypatch.setattr(planner_module.levels, "bucket_levels", lambda *a, **k: {})
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


def _dense_levels(keys, mean, var, tau2):
    """The levels' least squares solved directly: unknowns μ_θ and ℓ_b, prior ℓ ~ N(0, τ²)."""
    thetas = sorted({k for k, _ in keys})
    buckets = sorted({b for _, b in keys})
    nt, nb = len(thetas), len(buckets)
    design = np.zeros((len(keys), nt + nb))
    for row, (k, b) in enumerate(keys):
        design[row, thetas.index(k)] = design[row, nt + buckets.index(b)] = 1.0
    precision = design.T @ (design / var[:, None])
    precision[nt:, nt:] += np.eye(nb) / tau2
    cov = np.linalg.inv(precision)
    solution = cov @ (design.T @ (mean / var))
    return solution[nt:], np.diag(cov)[nt:]


def test_the_levels_are_the_least_squares_of_theta_plus_hour_with_the_prior():
    """Random designs (θ in one or many hours, uneven noise): the Woodbury solve of
    ``levels._solve`` gives the levels and variances of the full least squares."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        n_theta, n_hours = int(rng.integers(2, 12)), int(rng.integers(2, 30))
        keys = sorted(
            {
                (f"θ{rng.integers(n_theta)}", T0 + timedelta(hours=int(rng.integers(n_hours))))
                for _ in range(3 * n_hours)
            }
        )
        mean = rng.normal(20.0, 3.0, len(keys))
        var = rng.uniform(0.1, 2.0, len(keys))
        cells = levels._Cells(keys, (np.full(len(keys), 20.0), mean, var))
        got = levels._solve(cells, 1.7)
        want, want_var = _dense_levels(keys, mean, var, 1.7)
        assert [got[b][0] for b in cells.buckets] == pytest.approx(list(want), abs=1e-9)
        assert [got[b][1] for b in cells.buckets] == pytest.approx(list(want_var), abs=1e-9)
