"""The optimiser's parts: eq. 9 from sums, the context kernel, bounded model size."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from gemini_api.theta import load_spec
from gemini_booster.domain import ContextKey, FlowSums, Trial, Utility
from gemini_booster.models import Policy
from gemini_booster.policy.history import Observation, shrunk_noise
from gemini_booster.policy.kernels import ContextKernel
from gemini_booster.policy.planner import Planner, PolicyState, fit_set
from gemini_booster.policy.surrogate import ThetaSpace


def test_utility_and_its_variance_match_per_flow_values():
    rng = np.random.default_rng(0)
    tpt, delay = rng.gamma(4, 5, 400), rng.gamma(2, 3, 400)
    sigma = 0.7
    sums = FlowSums(
        400, tpt.sum(), (tpt**2).sum(), delay.sum(), (delay**2).sum(), (tpt * delay).sum()
    )
    u = sums.utility(sigma)
    per_flow = tpt - sigma * delay
    assert u.mean == pytest.approx(per_flow.mean())
    assert u.var_of_mean == pytest.approx(per_flow.var(ddof=1) / 400)


def test_context_kernel_is_psd_and_its_gradient_is_right():
    rng = np.random.default_rng(1)
    X = rng.integers(0, 4, size=(30, 5)).astype(float)
    k = ContextKernel(weights=(0.3, 0.1, 0.2, 0.05, 0.4, 0.02))
    K, grad = k(X, eval_gradient=True)
    assert np.linalg.eigvalsh(K).min() > -1e-9
    assert np.allclose(np.diag(K), k.diag(X))
    eps = 1e-6
    for i in range(len(k.theta)):
        theta = k.theta.copy()
        theta[i] += eps
        kp = k.clone_with_theta(theta)
        assert np.allclose((kp(X) - K) / eps, grad[:, :, i], atol=1e-4)


def test_the_fit_set_is_bounded_and_shared_fairly_by_contexts_most_measured_first():
    """The hyperparameters are fitted on a bounded set drawn round-robin over contexts, each
    context's most-measured θ first: not its best means, which are mostly lucky noise."""
    now = datetime.now(UTC)
    obs = [
        Observation(
            c, {"x": i}, f"{c}:{i}", float(i % 97), 1.0, 1 + (i * 37) % 100, now.timestamp()
        )
        for c in range(50)
        for i in range(100)
    ]
    kept = fit_set(obs, 400)
    assert len(kept) == 400
    for c in range(50):
        mine = [o for o in kept if o.context_id == c]
        assert len(mine) == 8
        floor = sorted((o.flows for o in obs if o.context_id == c), reverse=True)[7]
        assert all(o.flows >= floor for o in mine)
    assert fit_set(obs[:300], 400) == obs[:300]


def test_a_trial_of_few_flows_borrows_its_contexts_spread():
    """Two flows that agree by chance are not taken as a precise mean; ten thousand are."""
    pooled = 4.0  # per-flow variance seen across the context's trials
    lucky = Utility(mean=9.0, var_of_mean=0.001 / 2, flows=2)
    assert shrunk_noise(lucky, pooled) == pytest.approx((1 * 0.001 + 4 * 4.0) / 5 / 2)
    assert shrunk_noise(lucky, pooled) > 1.5  # not 0.0005
    many = Utility(mean=9.0, var_of_mean=3.0 / 10_000, flows=10_000)
    assert shrunk_noise(many, pooled) == pytest.approx(3.0 / 10_000, rel=1e-3)
    single = Utility(mean=9.0, var_of_mean=25.0, flows=1)
    assert shrunk_noise(single, pooled) == pytest.approx(4.0)  # the context's spread, not 5²


def test_a_contexts_spread_from_two_agreeing_flows_is_not_taken_as_it_is():
    """The context's pooled spread is itself shrunk toward SINGLE_FLOW_STD² (PRIOR_FLOWS' weight):
    a pair of flows that agreed by chance (27.8, 28.3 on a path whose flows spread from 2 to
    31) does not make every single flow precise to 0.4 Mbit/s; ten thousand flows' spread
    stands as measured."""
    from gemini_booster.policy.history import _pooled_flow_var, observations

    spec = load_spec()
    bounds = spec.region_bounds("production")
    when = datetime(2026, 3, 1, tzinfo=UTC)
    default, other = spec.default(), spec.default() | {"mult_decrease": 60}

    def trial(theta: dict, *utilities: float) -> Trial:
        sums = FlowSums.total(FlowSums.of_flow(u, 0.0) for u in utilities)
        return Trial(1, spec.key(theta), sums, 0, 1, when, when)

    got = observations([trial(default, 27.8, 28.3), trial(other, 19.4)], 0.1, spec, bounds)
    single = next(o for o in got if o.flows == 1)
    pair = 0.5 * (28.3 - 27.8) ** 2  # the pair's sample variance
    assert single.noise_var == pytest.approx((pair + 4 * 5.0**2) / (1 + 4))
    many = Utility(mean=9.0, var_of_mean=3.0 / 10_000, flows=10_000)
    assert _pooled_flow_var([(1, many)])[1] == pytest.approx(3.0, rel=1e-2)


def test_cold_start_design_spans_the_region_from_its_first_points():
    spec = load_spec()
    bounds = {p.name: (p.default, p.default) for p in spec.params}
    bounds |= {"mult_decrease": (10, 99), "loss_threshold": (0, 10)}
    space = ThetaSpace(spec, bounds)
    design = space.design(8, seed=3)
    X = space.encode(design)
    # a Latin hypercube: 8 distinct values of each parameter, from one end of its range to
    # the other (on the integer grid, strata are as fine as the grid allows)
    for j in range(space.dims):
        assert len(set(X[:, j])) == 8 and X[:, j].min() <= 0.15 and X[:, j].max() >= 0.85, X
    # farthest point first: the first two already sit at opposite ends of some parameter
    assert np.abs(X[0] - X[1]).max() >= 0.6, X[:2]
    assert design == space.design(8, seed=3)  # reproducible: a restart hands out the same


def _trial(context_id: int, theta: dict, utility: float, flows: int, when: datetime) -> Trial:
    sums = FlowSums.total(FlowSums.of_flow(utility + 0.1 * (i % 2), 0.0) for i in range(flows))
    return Trial(context_id, load_spec().key(theta), sums, 0, 1, when, when)


def test_initial_plans_hand_out_the_design_points_not_yet_tried():
    spec = load_spec()
    policy = Policy(
        id=1,
        revision=1,
        name="p",
        n_initial_points=6,
        region="custom",
        bounds={p.name: (p.default, p.default) for p in spec.params} | {"mult_decrease": (10, 99)},
    )
    planner = Planner(spec)
    now = datetime.now(UTC)
    contexts = {7: ContextKey("a", "b", "c", "d", 0)}
    first = planner.plan(policy, [], contexts, [7], PolicyState(), now=now)[7]
    assert first.acquisition == "initial design" and len(first.candidates) == 6
    tried = [_trial(7, first.candidates[0], 5.0, 3, now)]
    second = planner.plan(policy, tried, contexts, [7], PolicyState(), now=now)[7]
    assert second.candidates == first.candidates[1:]


def test_theta_space_encodes_and_decodes_as_scikit_optimize_does():
    spec = load_spec()
    bounds = spec.region_bounds("wide")
    space = ThetaSpace(spec, bounds)
    rng = np.random.default_rng(4)
    thetas = space.sample(200, rng)
    ours = space.encode(thetas)
    theirs = np.asarray(space.space.transform([[t[n] for n in space.free] for t in thetas]))
    assert np.allclose(ours, theirs)
    points = rng.uniform(-0.1, 1.1, (200, space.dims))
    clipped = np.clip(points, 0.0, 1.0)
    expected = [space.theta(r) for r in space.space.inverse_transform(clipped)]
    assert space.decode(points) == expected
    assert space.decode(space.encode(thetas)) == thetas
    assert np.array_equal(space.snap(points), space.encode(space.decode(points)))


def test_theta_space_samples_points_as_it_samples_theta():
    """sample_points gives the encoded grid points of the draws sample gives, from the same
    generator state: the refit's pools skip building a θ dict per point, nothing else."""
    spec = load_spec()
    space = ThetaSpace(spec, spec.region_bounds("production"))
    points = space.sample_points(500, np.random.default_rng(5))
    assert np.array_equal(points, space.encode(space.sample(500, np.random.default_rng(5))))
    assert np.array_equal(space.snap(points), points)


def test_observations_in_numpy_are_the_sums_utility_and_shrunk_noise_one_at_a_time():
    """The vectorised observations equal FlowSums.utility and shrunk_noise computed per trial,
    buckets added, with each context's pooled spread; θ outside the region are left out."""
    from gemini_booster.policy.history import _pooled_flow_var, observations

    spec = load_spec()
    bounds = spec.region_bounds("production")
    space = ThetaSpace(spec, bounds)
    rng = np.random.default_rng(9)
    when = datetime(2026, 3, 1, tzinfo=UTC)
    outside = spec.default() | {"mult_decrease": bounds["mult_decrease"][1] + 1}
    thetas = [*space.sample(6, rng), outside]
    trials = []
    for c in (1, 2):
        for th in thetas:
            for _ in range(int(rng.integers(1, 4))):  # buckets
                n = int(rng.integers(1, 5))
                x, d = rng.gamma(4, 5, n), rng.gamma(2, 3, n)
                sums = FlowSums(n, x.sum(), (x * x).sum(), d.sum(), (d * d).sum(), (x * d).sum())
                trials.append(Trial(c, spec.key(th), sums, 0, 1, when, when))
    got = {(o.context_id, o.theta_key): o for o in observations(trials, 0.7, spec, bounds)}
    merged = {}
    for t in trials:
        k = (t.context_id, t.theta_key)
        merged[k] = merged.get(k, FlowSums()) + t.sums
    inside = {k: s for k, s in merged.items() if not spec.violations(spec.from_key(k[1]), bounds)}
    assert set(got) == set(inside) and len(inside) == 12
    pooled = _pooled_flow_var([(k[0], s.utility(0.7)) for k, s in inside.items()])
    for k, s in inside.items():
        u = s.utility(0.7)
        assert got[k].utility == pytest.approx(u.mean)
        assert got[k].noise_var == pytest.approx(shrunk_noise(u, pooled.get(k[0])))
        assert got[k].flows == u.flows and got[k].theta == spec.from_key(k[1])
