"""The planner under fleet conditions: time in the trials, drift, a stable incumbent, candidates
that keep their slots, a model that uses every context's data, and a search that polishes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from gemini_api.theta import load_spec
from gemini_booster.domain import ContextKey, FlowSums, Trial
from gemini_booster.models import Policy
from gemini_booster.policy import acquisition, history
from gemini_booster.policy import planner as planner_module
from gemini_booster.policy.planner import Planner, PolicyState

SPEC = load_spec()
T0 = datetime(2026, 3, 1, tzinfo=UTC)
FREE = ("mult_decrease", "loss_threshold")  # the two parameters these tests search
BOUNDS = {p.name: (p.default, p.default) for p in SPEC.params} | {
    "mult_decrease": (10, 99),
    "loss_threshold": (0, 10),
}


def policy(**kw) -> Policy:
    return Policy(id=1, revision=1, name="p", region="custom", bounds=BOUNDS, **kw)


def theta(a: int, b: int) -> dict[str, int]:
    return {p.name: p.default for p in SPEC.params} | {"mult_decrease": a, "loss_threshold": b}


def flows(mean: float, n: int, rng: np.random.Generator, spread: float = 2.0) -> FlowSums:
    return FlowSums.total(FlowSums.of_flow(x, 0.0) for x in mean + spread * rng.standard_normal(n))


def trial(c: int, th: dict, sums: FlowSums, hour: int) -> Trial:
    when = T0 + timedelta(hours=hour)
    return Trial(c, SPEC.key(th), sums, 0, 1, when, when)


def surface(th: dict, peak: tuple[float, float] = (0.7, 0.3)) -> float:
    x = (th["mult_decrease"] - 10) / 89, th["loss_threshold"] / 10
    return 100.0 - 60.0 * ((x[0] - peak[0]) ** 2 + (x[1] - peak[1]) ** 2)


def grid_trials(c: int, hour: int, rng, peak=(0.7, 0.3), n: int = 40) -> list[Trial]:
    return [
        trial(c, theta(a, b), flows(surface(theta(a, b), peak), n, rng), hour)
        for a in (10, 40, 70, 99)
        for b in (0, 3, 7, 10)
    ]


def test_the_window_drops_old_buckets_of_a_theta_that_keeps_running():
    rng = np.random.default_rng(0)
    th = theta(50, 5)
    old = [trial(1, th, flows(90.0, 100, rng), h) for h in range(0, 48)]
    new = [trial(1, th, flows(60.0, 100, rng), h) for h in range(48, 60)]
    now = T0 + timedelta(hours=60)
    kept = history.in_window(old + new, now, history_hours=12)
    obs = history.observations(kept, 1.0, SPEC, BOUNDS)
    assert len(obs) == 1 and abs(obs[0].utility - 60.0) < 1.0
    everything = history.observations(old + new, 1.0, SPEC, BOUNDS)
    assert everything[0].utility > 80.0  # what a window on last_seen alone would have kept


def test_drift_is_found_in_the_incumbents_buckets_and_old_data_is_dropped():
    rng = np.random.default_rng(1)
    inc = theta(50, 5)
    before = [trial(1, inc, flows(90.0, 80, rng), h) for h in range(15)]
    after = [trial(1, inc, flows(75.0, 80, rng), h) for h in range(15, 18)]
    found = history.change_points(before + after, 1.0, {1: SPEC.key(inc)})
    assert found == {1: T0 + timedelta(hours=15)}
    assert all(t.bucket >= found[1] for t in history.since_change(before + after, found))


def test_no_drift_is_found_in_noise_alone():
    false_alarms = 0
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        inc = theta(50, 5)
        stable = [trial(1, inc, flows(90.0, 80, rng, spread=15.0), h) for h in range(30)]
        false_alarms += bool(history.change_points(stable, 1.0, {1: SPEC.key(inc)}))
    assert false_alarms == 0


def test_after_drift_the_context_re_explores_and_its_incumbent_loses_protection():
    rng = np.random.default_rng(2)
    planner, state, pol = Planner(SPEC), PolicyState(), policy(n_initial_points=4)
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    data = grid_trials(1, 0, rng, peak=(0.9, 0.9))
    inc = theta(99, 10)
    data += [trial(1, inc, flows(surface(inc, (0.9, 0.9)), 80, rng), h) for h in range(1, 15)]
    now = T0 + timedelta(hours=15)
    first = planner.plan(pol, data, contexts, [1], state, now=now)[1]
    assert first.incumbent == inc
    # the optimum moves to the opposite corner: the incumbent's buckets now show it
    data += [trial(1, inc, flows(surface(inc, (0.1, 0.1)), 80, rng), h) for h in range(15, 18)]
    later = planner.plan(
        pol, data, contexts, [1], state, now=now + timedelta(hours=3), incumbents={1: SPEC.key(inc)}
    )[1]
    assert state.changes == {1: T0 + timedelta(hours=15)}
    # only the new regime's data is left (one θ): the context starts over with its design
    assert later.acquisition == "initial design"
    assert later.candidates and all(c != inc for c in later.candidates)


def _flat(rng, n: int, bumped: dict | None = None, gap: float = 0.0) -> list[Trial]:
    """Sixteen θ of equal true utility (plus ``gap`` for ``bumped``), measured with noise."""
    out = []
    for a in (10, 40, 70, 99):
        for b in (0, 3, 7, 10):
            th = theta(a, b)
            mean = 95.0 + (gap if th == bumped else 0.0)
            out.append(trial(1, th, flows(mean, n, rng, spread=20.0), 0))
    return out


def test_a_challenger_replaces_the_incumbent_only_when_better_with_confidence():
    planner, pol = Planner(SPEC), policy(n_initial_points=4)
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    now = T0 + timedelta(hours=1)
    inc, better = theta(40, 3), theta(99, 10)
    unseated = unprotected = 0
    for seed in range(40):  # equal θ, the incumbent measured no better than 15 rivals
        data = _flat(np.random.default_rng(10 + seed), n=20)
        kept = planner.plan(
            pol, data, contexts, [1], PolicyState(), now=now, incumbents={1: SPEC.key(inc)}
        )[1]
        unseated += kept.incumbent != inc
        free = planner.plan(pol, data, contexts, [1], PolicyState(), now=now)[1]
        unprotected += free.incumbent != inc
    # Noise alone: without the published incumbent another θ is picked almost every time; with
    # it, rarely (5 of 40 at the bar of 1 standard deviation; a bar of 0.75 gives 9, none 38).
    assert unprotected >= 30
    assert unseated <= 7
    data = _flat(np.random.default_rng(20), n=400, bumped=better, gap=15.0)
    taken = planner.plan(
        pol, data, contexts, [1], PolicyState(), now=now, incumbents={1: SPEC.key(inc)}
    )[1]
    assert taken.incumbent == better


def exactly(*utilities: float) -> FlowSums:
    """Flows of these utilities (no queueing)."""
    return FlowSums.total(FlowSums.of_flow(u, 0.0) for u in utilities)


# A satellite-like path at σ 0.1 (plannertune, var/lab/s33-fusion/diag-pt): one flow per host and
# round, flows of one θ spread from 2 to 31 by where the random loss falls.
DEFAULT, LUCKY = theta(85, 10), theta(30, 4)
SPREAD_OUT = [((10, 0), 19.4), ((50, 7), 2.7), ((70, 2), 2.1), ((99, 8), 7.2), ((20, 9), 10.7)]


def _noisy_path(*later: Trial) -> dict[str, int]:
    """The incumbent after the default ran twice with flows that agreed by chance, five design
    θ once each, and ``later``."""
    data = [trial(1, DEFAULT, exactly(27.8, 28.3), 0)]
    data += [trial(1, theta(*ab), exactly(u), 0) for ab, u in SPREAD_OUT]
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    return (
        Planner(SPEC)
        .plan(
            policy(n_initial_points=4),
            data + list(later),
            contexts,
            [1],
            PolicyState(),
            now=T0 + timedelta(hours=3),
            incumbents={1: SPEC.key(DEFAULT)},
        )[1]
        .incumbent
    )


def test_one_lucky_flow_does_not_unseat_an_incumbent_on_a_noisy_path():
    """The default's two agreeing flows are not the path's spread: taken as it, every single
    flow was precise to 0.4 Mbit/s and one explorer's flow at 29.5 replaced the default."""
    assert _noisy_path(trial(1, LUCKY, exactly(29.5), 1)) == DEFAULT
    # measured better on enough flows, it still wins
    more = exactly(38.0, 37.1, 38.4, 37.6, 38.8, 37.9)
    assert (
        _noisy_path(
            trial(1, LUCKY, exactly(29.5), 1),
            trial(1, LUCKY, more, 2),
            trial(1, DEFAULT, exactly(27.0, 28.6), 2),
        )
        == LUCKY
    )


def test_a_context_in_its_initial_design_keeps_its_published_incumbent():
    """Before the model is fitted, a design θ's one flow at 26.8 against the default's 26.7 does
    not make it the incumbent; with nothing published, or measured better on many flows, the
    best measured θ still is."""
    data = [trial(1, DEFAULT, exactly(26.7), 0), trial(1, LUCKY, exactly(26.8), 0)]
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    now = T0 + timedelta(hours=1)
    planner, pol = Planner(SPEC), policy(n_initial_points=8)
    kept = planner.plan(
        pol, data, contexts, [1], PolicyState(), now=now, incumbents={1: SPEC.key(DEFAULT)}
    )[1]
    assert kept.acquisition == "initial design"
    assert kept.incumbent == DEFAULT and kept.incumbent_utility == pytest.approx(26.7)
    free = planner.plan(pol, data, contexts, [1], PolicyState(), now=now)[1]
    assert free.incumbent == LUCKY
    # measured better on many flows, a design θ still takes over before the model is fitted
    rng = np.random.default_rng(3)
    clear = [trial(1, DEFAULT, flows(20.0, 40, rng), 0), trial(1, LUCKY, flows(60.0, 40, rng), 0)]
    taken = planner.plan(
        pol, clear, contexts, [1], PolicyState(), now=now, incumbents={1: SPEC.key(DEFAULT)}
    )[1]
    assert taken.acquisition == "initial design" and taken.incumbent == LUCKY


def test_the_initial_design_compares_two_thetas_over_the_buckets_both_ran_in():
    """A θ explored only in a good hour does not unseat an incumbent that was better than it
    in that same hour and also ran in a bad one: over all their buckets the explorer leads by
    the hours' difference (23 against 20), over the hour both ran it trails (23 against 24).
    The hours differ by less than a change of path (no drift is found). Better in the shared
    hour by a clear margin, the explorer still takes over."""
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    now = T0 + timedelta(hours=2)
    planner, pol = Planner(SPEC), policy(n_initial_points=8)
    published = {1: SPEC.key(DEFAULT)}
    good_hour, bad_hour = 0, 1

    def spread(mean: float) -> FlowSums:  # 60 flows, ±15 around ``mean``: a noisy mix
        return exactly(*[mean - 15, mean + 15] * 30)

    incumbent = [
        trial(1, DEFAULT, spread(24.0), good_hour),
        trial(1, DEFAULT, spread(16.0), bad_hour),
    ]
    worse = [*incumbent, trial(1, LUCKY, spread(23.0), good_hour)]
    kept = planner.plan(pol, worse, contexts, [1], PolicyState(), now=now, incumbents=published)
    assert kept[1].acquisition == "initial design"
    assert kept[1].incumbent == DEFAULT
    assert kept[1].incumbent_utility == pytest.approx(20.0)  # its mean over both hours
    better = [*incumbent, trial(1, LUCKY, spread(32.0), good_hour)]
    taken = planner.plan(pol, better, contexts, [1], PolicyState(), now=now, incumbents=published)
    assert taken[1].incumbent == LUCKY
    # in no shared bucket, their means decide as before: 23 against the bad hour's 16
    apart = [incumbent[1], trial(1, LUCKY, spread(23.0), good_hour)]
    moved = planner.plan(pol, apart, contexts, [1], PolicyState(), now=now, incumbents=published)
    assert moved[1].incumbent == LUCKY


def test_each_context_is_modelled_in_its_own_units():
    """Contexts at different levels: each has its own mean, and a spread in proportion to its
    flows' spread (not to its observed utilities', which shrinks as exploration gathers near
    the optimum); one with too few observations is given the pool's units."""
    rng = np.random.default_rng(23)
    contexts = {c: ContextKey("a", f"isp{c}", "c", "d", 0) for c in (1, 2, 3)}
    level_20 = [
        trial(2, theta(a, b), flows(20.0, 40, rng, spread=0.5), 0)
        for a in (10, 70)
        for b in (0, 10)
    ]
    data = grid_trials(1, 0, rng) + level_20
    data.append(trial(3, theta(50, 5), flows(60.0, 40, rng), 0))
    obs = history.observations(data, 0.1, SPEC, BOUNDS)
    scales, pooled = planner_module.context_scales(obs)
    assert set(scales) == {1, 2}
    assert scales[1].mean > 50 and abs(scales[2].mean - 20.0) < 1.0
    assert pooled.mean == pytest.approx(np.mean([o.utility for o in obs]))
    assert 0.2 < scales[2].std / scales[1].std < 0.3  # flows spread 0.5 against 2.0
    ctx1 = [o for o in obs if o.context_id == 1]
    assert planner_module.flow_spread(ctx1) == pytest.approx(2.0, rel=0.15)
    plan = Planner(SPEC).plan(
        policy(n_initial_points=4), data, contexts, [1, 2, 3], PolicyState(), now=T0
    )
    assert plan[2].incumbent_utility is not None and abs(plan[2].incumbent_utility - 20.0) < 3


def test_a_context_keeps_its_units_as_exploration_gathers_near_its_optimum():
    """More rounds at the best θ narrow a context's observed utilities but not its flows'
    spread, so its units (and the prior's width against the noise) stay put."""
    rng = np.random.default_rng(29)
    spread_data = grid_trials(1, 0, rng) + grid_trials(2, 0, rng, peak=(0.3, 0.7))
    near = [
        trial(1, theta(70 + d, b), flows(99.0, 40, rng), 1)
        for d in range(-6, 7)
        for b in (1, 2, 3, 4, 5)
    ]
    before, _ = planner_module.context_scales(history.observations(spread_data, 0.1, SPEC, BOUNDS))
    after, _ = planner_module.context_scales(
        history.observations(spread_data + near, 0.1, SPEC, BOUNDS)
    )

    def ctx1_spread(data: list[Trial]) -> float:
        obs = history.observations(data, 0.1, SPEC, BOUNDS)
        return float(np.std([o.utility for o in obs if o.context_id == 1]))

    assert ctx1_spread(spread_data + near) < 0.8 * ctx1_spread(spread_data)
    assert after[1].std / after[2].std == pytest.approx(before[1].std / before[2].std, rel=0.1)


def test_a_candidate_no_host_has_run_keeps_its_slot():
    """One host ran slot 0's θ since the last refit: that θ is retired, and the seven others
    keep their slots while the acquisition still rates them (30 of 70 over ten seeds; fresh
    picks would match the old ones almost never)."""
    planner, pol = Planner(SPEC), policy(n_initial_points=4, acq_func="EI")
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    now = T0 + timedelta(hours=1)
    kept = 0
    for seed in range(5, 15):
        rng = np.random.default_rng(seed)
        data = grid_trials(1, 0, rng)
        first = planner.plan(pol, data, contexts, [1], PolicyState(), now=now)[1]
        keys = tuple(SPEC.key(c) for c in first.candidates)
        ran = first.candidates[0]
        data.append(trial(1, ran, flows(surface(ran), 40, rng), 1))
        second = planner.plan(
            pol, data, contexts, [1], PolicyState(), now=now, candidates={1: keys}
        )[1]
        assert second.candidates[0] != ran  # retired: it has been run
        kept += sum(
            a == b for a, b in zip(first.candidates[1:], second.candidates[1:], strict=True)
        )
    assert kept >= 20, kept


def test_contextual_plans_use_more_points_than_the_fit_set():
    rng = np.random.default_rng(6)
    planner, state = Planner(SPEC), PolicyState()
    pol = policy(max_model_points=20)
    contexts = {c: ContextKey("a", f"isp{c}", "c", "d", 0) for c in range(1, 5)}
    data = [t for c in contexts for t in grid_trials(c, 0, rng)]  # 64 points
    plans = planner.plan(pol, data, contexts, list(contexts), state, now=T0 + timedelta(hours=1))
    assert len(plans) == 4
    assert state.model_points == 64  # every context's own 16 plus the shared fit set


def test_the_standard_model_uses_more_points_than_the_fit_set():
    rng = np.random.default_rng(6)
    state = PolicyState()
    contexts = {c: ContextKey("a", f"isp{c}", "c", "d", 0) for c in range(1, 5)}
    data = [t for c in contexts for t in grid_trials(c, 0, rng)]  # 64 points
    pol = policy(mode="standard", max_model_points=20)
    Planner(SPEC).plan(pol, data, contexts, list(contexts), state, now=T0 + timedelta(hours=1))
    assert state.model_points == 64  # the fit set's 20 and the 44 most measured of the rest


def test_independent_mode_pools_nothing_between_contexts():
    rng = np.random.default_rng(7)
    pol = policy(mode="independent", n_initial_points=4)
    contexts = {1: ContextKey("a", "b", "c", "d", 0), 2: ContextKey("x", "y", "z", "w", 0)}
    mine = grid_trials(1, 0, rng, peak=(0.2, 0.2))
    theirs = grid_trials(2, 0, rng, peak=(0.9, 0.9))
    now = T0 + timedelta(hours=1)
    alone = Planner(SPEC).plan(pol, mine, contexts, [1], PolicyState(), now=now)[1]
    beside = Planner(SPEC).plan(pol, mine + theirs, contexts, [1], PolicyState(), now=now)[1]
    assert alone.incumbent == beside.incumbent
    assert alone.incumbent_utility == pytest.approx(beside.incumbent_utility, rel=1e-6)


def test_polish_climbs_to_the_maximum_from_poor_starts():
    peak = np.array([0.83, 0.17, 0.5])

    def score(X: np.ndarray) -> np.ndarray:
        return -np.sum((X - peak) ** 2, axis=1)

    starts = np.array([[0.1, 0.9, 0.1], [0.5, 0.5, 0.9]])
    out = acquisition.polish(score, starts, 3)
    assert np.allclose(out, peak, atol=0.02), out


def test_acquisitions_are_scikit_optimizes():
    """EI, PI and LCB computed from a posterior equal scikit-optimize's functions on it."""
    from skopt.acquisition import gaussian_ei, gaussian_lcb, gaussian_pi

    rng = np.random.default_rng(3)
    loss, std = rng.normal(0, 1, 500), np.abs(rng.normal(0, 0.5, 500))
    std[:20] = 0.0  # a point measured without noise: EI and PI give it nothing

    class Fixed:
        def predict(self, X, return_std=True):
            return loss, std

    X, y_opt = np.zeros((500, 2)), -0.3
    theirs = {
        "EI": gaussian_ei(X, Fixed(), y_opt=y_opt, xi=acquisition.XI),
        "PI": gaussian_pi(X, Fixed(), y_opt=y_opt, xi=acquisition.XI),
        "LCB": -gaussian_lcb(X, Fixed(), kappa=acquisition.KAPPA),
    }
    ours = acquisition.scores(X, lambda _: (loss, std), y_opt)
    for kind in acquisition.ACQUISITIONS:
        assert np.allclose(ours[kind], theirs[kind], rtol=1e-12, atol=1e-15), kind


def _two_call_polish(score, starts: np.ndarray, dims: int) -> np.ndarray:
    """The walk as first written: a gradient and a move scored separately at every step."""
    x = np.clip(starts.astype(float), 0.0, 1.0)
    step = np.full(len(x), acquisition.POLISH_STEP0)
    eye = np.eye(dims) * acquisition.POLISH_FD
    for _ in range(acquisition.POLISH_STEPS):
        probes = np.vstack([x, (x[:, None, :] + eye[None, :, :]).reshape(-1, dims)])
        values = score(np.clip(probes, 0.0, 1.0))
        here = values[: len(x)]
        grad = (values[len(x) :].reshape(len(x), dims) - here[:, None]) / acquisition.POLISH_FD
        norm = np.linalg.norm(grad, axis=1, keepdims=True)
        direction = np.divide(grad, norm, out=np.zeros_like(grad), where=norm > 0)
        moved = np.clip(x + step[:, None] * direction, 0.0, 1.0)
        better = score(moved) > here
        x = np.where(better[:, None], moved, x)
        step = np.where(better, step * acquisition.POLISH_GROW, step / 2)
    return x


def test_polish_takes_the_same_walk_with_one_prediction_per_step():
    """Scoring a move with its own probes changes the cost, not the walk."""
    rng = np.random.default_rng(11)
    centres = rng.uniform(0, 1, (5, 4))
    calls = {"n": 0}

    def score(X: np.ndarray) -> np.ndarray:  # several bumps: moves that fail happen
        calls["n"] += 1
        d2 = ((X[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2)
        return np.exp(-d2 / 0.02).sum(axis=1)

    starts = rng.uniform(0, 1, (6, 4))
    expected = _two_call_polish(score, starts, 4)
    calls["n"] = 0
    assert np.array_equal(acquisition.polish(score, starts, 4), expected)
    assert calls["n"] == acquisition.POLISH_STEPS + 1


def test_the_local_posterior_is_scikit_learns_gp_at_that_context():
    """The numpy posterior at one context equals scikit-learn's GP over (θ, h) with the same
    fitted kernel: the same means, variances and covariances."""
    from gemini_booster.policy.local_gp import KernelParams, LocalGP, Training
    from gemini_booster.policy.surrogate import fit_surrogate

    rng = np.random.default_rng(8)
    n, dims = 60, 3
    theta_x = rng.uniform(0, 1, (n, dims))
    codes = rng.integers(0, 3, (n, 5)).astype(float)
    y = np.sin(3 * theta_x[:, 0]) + codes[:, 1] * 0.3 + 0.1 * rng.standard_normal(n)
    noise = np.full(n, 0.01)
    fitted = fit_surrogate(np.hstack([theta_x, codes]), y, noise, context_dims=5, seed=0)
    params = KernelParams.of(fitted.gp.kernel_)
    loss, scaled_noise = (fitted.y_mean - y) / fitted.y_std, noise / fitted.y_std**2
    whole = Training.factor(params, theta_x, codes, loss, scaled_noise)
    # the fit set factored once, a context's own points added by the block update
    cut = 45
    base = Training.factor(params, theta_x[:cut], codes[:cut], loss[:cut], scaled_noise[:cut])
    extended = base.extend(params, theta_x[cut:], codes[cut:], loss[cut:], scaled_noise[cut:])
    context = codes[7]
    test = rng.uniform(0, 1, (25, dims))
    full = np.hstack([test, np.tile(context, (25, 1))])
    mean, std = fitted.gp.predict(full, return_std=True)
    _, cov = fitted.gp.predict(full[:4], return_cov=True)
    for training in (whole, extended):
        local = LocalGP(params, training, context)
        ours_mean, ours_std = local.posterior(test)
        assert np.allclose(ours_mean, mean, atol=1e-6)
        assert np.allclose(ours_std, std, atol=1e-5)
        assert np.allclose(local.joint(test[:4])[1], cov, atol=1e-5)


def test_diverse_top_gives_at_most_k_points_and_none_for_zero():
    """A refit whose published candidates all keep their slots asks for zero new points."""
    X = np.random.default_rng(11).uniform(0, 1, (50, 3))
    score = X.sum(axis=1)
    assert acquisition.diverse_top(X, score, 0) == []
    top = acquisition.diverse_top(X, score, 4)
    assert len(top) == 4 and top[0] == int(np.argmax(score))


def test_diverse_top_never_picks_a_point_ruled_out():
    """Points scored −inf (run already, beside a kept candidate, beyond the exploration cap)
    are not candidates even when too few others remain: the planner fills up at random."""
    X = np.random.default_rng(12).uniform(0, 1, (50, 3))
    score = np.where(np.arange(50) < 3, X.sum(axis=1), -np.inf)
    top = acquisition.diverse_top(X, score, 8)
    assert set(top) <= {0, 1, 2} and len(top) >= 1


def test_a_change_is_dated_from_the_first_bucket_after_the_old_regime():
    """A θ that did not run in the hour the path changed shows the change only at its next
    bucket; the regime still starts at the change, so the new regime's first hour is kept."""
    rng = np.random.default_rng(3)
    inc, other = theta(50, 5), theta(30, 2)
    data = [trial(1, inc, flows(90.0, 80, rng), h) for h in range(15)]
    data += [trial(1, inc, flows(70.0, 80, rng), h) for h in range(15, 18)]
    data += [trial(1, other, flows(85.0, 80, rng), h) for h in range(14)]
    data += [trial(1, other, flows(60.0, 80, rng), h) for h in range(16, 18)]  # not run at 15
    assert history.change_points(data, 1.0, {1: SPEC.key(inc)}) == {1: T0 + timedelta(hours=15)}


def test_after_a_change_the_context_searches_with_ei_for_the_recovery_window():
    rng = np.random.default_rng(4)
    planner, state = Planner(SPEC), PolicyState()
    pol = policy(n_initial_points=4, acq_func="gp_hedge")
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    state.gains = {"EI": -50.0, "PI": 50.0, "LCB": -50.0}  # the hedge would pick PI
    inc = theta(99, 10)
    data = [trial(1, inc, flows(surface(inc, (0.9, 0.9)), 80, rng), h) for h in range(15)]
    data += [trial(1, inc, flows(surface(inc, (0.1, 0.1)), 80, rng), h) for h in range(15, 17)]
    data += grid_trials(1, 16, rng, peak=(0.1, 0.1))
    incumbents = {1: SPEC.key(inc)}
    soon = planner.plan(pol, data, contexts, [1], state, T0 + timedelta(hours=17), incumbents)
    assert state.changes == {1: T0 + timedelta(hours=15)}
    assert soon[1].acquisition == "EI"
    later = T0 + timedelta(hours=15 + planner_module.RECOVERY_HOURS + 1)
    assert planner.plan(pol, data, contexts, [1], state, later, incumbents)[1].acquisition == "PI"


def test_a_policy_of_one_context_plans_as_standard_whatever_its_mode():
    """One context leaves the context kernel nothing to compare and one GP per context is one
    GP: the same data give the standard model's plan, not one that differs by the draws."""
    rng = np.random.default_rng(7)
    contexts = {1: ContextKey("a", "b", "c", "d", 0)}
    data = grid_trials(1, 0, rng, n=20)
    now = T0 + timedelta(hours=1)
    plans = {
        mode: Planner(SPEC).plan(
            policy(mode=mode, n_initial_points=4), data, contexts, [1], PolicyState(), now=now
        )[1]
        for mode in ("contextual", "independent", "standard")
    }
    assert plans["contextual"] == plans["standard"] == plans["independent"]
    two = contexts | {2: ContextKey("e", "b", "c", "d", 0)}
    both = data + grid_trials(2, 0, rng, n=20)
    pooled = Planner(SPEC).plan(
        policy(mode="contextual", n_initial_points=4), both, two, [1], PolicyState(), now=now
    )[1]
    assert pooled != plans["standard"]  # two contexts: the pooled model, not the standard one


def _thin_far_region(rng: np.random.Generator) -> list[Trial]:
    """The best region well measured; a far region (10-40 % below the optimum) in a few
    noisy flows per θ, so that an acquisition's exploration bonus there is large."""
    good = [(a, b) for a in (62, 66, 70, 74, 78) for b in (2, 3, 4)]
    far = [(a, b) for a in (10, 30) for b in (0, 5, 10)] + [(99, 10), (50, 10)]
    out = [trial(1, theta(a, b), flows(surface(theta(a, b)), 200, rng), 0) for a, b in good]
    return out + [
        trial(1, theta(a, b), flows(surface(theta(a, b)), 2, rng, spread=30.0), 0) for a, b in far
    ]


@pytest.mark.parametrize(
    "cap, most, least", [(planner_module.EXPLORE_MAX_LOSS, 12, 0), (10.0, 192, 25)]
)
def test_few_candidates_land_where_the_loss_is_large(monkeypatch, cap, most, least):
    """At the planner's cap (5 % below the incumbent's expected utility), 9 of 192 candidates
    fall in the region 10 % below the optimum; without it (a cap of 1,000 %), 31 do."""
    monkeypatch.setattr(planner_module, "EXPLORE_MAX_LOSS", cap)
    costly = 0
    for seed in range(8):
        for acq in ("LCB", "EI", "PI"):
            plan = Planner(SPEC).plan(
                policy(n_initial_points=4, acq_func=acq),
                _thin_far_region(np.random.default_rng(seed)),
                {1: ContextKey("a", "b", "c", "d", 0)},
                [1],
                PolicyState(),
                now=T0 + timedelta(hours=1),
            )[1]
            assert len(plan.candidates) == planner_module.N_CANDIDATES
            costly += sum(surface(c) < 90.0 for c in plan.candidates)
    assert least <= costly <= most, costly
