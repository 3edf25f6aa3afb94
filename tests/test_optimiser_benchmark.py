"""The optimiser benchmark measures what it says: its landscapes' optima are where they claim,
its metrics give known values on hand-made histories, and a tiny run completes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import optimiser as bench
from benchmarks.optimiser_landscapes import (
    DRIFT_ROUND,
    EXPLORATION_SHARE,
    FLOW_NOISE,
    HOSTS_PER_CONTEXT,
    HOUR_SPREAD,
    LANDSCAPES,
    PLATEAU_SPREAD,
    SIGMA,
    fleet_hosts,
    flow_factors,
    hour_factor,
    run_flows,
)
from gemini_api.theta import load_spec
from gemini_booster.policy.assignment import exploration_position

RANDOM_THETAS = 2000


def _random_thetas(landscape, rng):
    bounds = landscape.bounds()
    return [
        {n: int(rng.integers(lo, hi + 1)) for n, (lo, hi) in bounds.items()}
        for _ in range(RANDOM_THETAS)
    ]


@pytest.mark.parametrize("name", list(LANDSCAPES))
def test_each_optimum_beats_every_random_theta_and_utility_stays_positive(name):
    landscape = LANDSCAPES[name]()
    rng = np.random.default_rng(0)
    thetas = _random_thetas(landscape, rng)
    rounds = [0, DRIFT_ROUND] if landscape.drifted else [0]
    for c in landscape.contexts:
        for r in rounds:
            best = landscape.optimum_theta(c, r)
            assert not load_spec().violations(best, landscape.bounds())
            top = landscape.true_utility(c, r, best)
            assert top == pytest.approx(landscape.optimum_utility(c, r))
            values = [landscape.true_utility(c, r, t) for t in thetas]
            assert max(values) <= top
            assert min(values) > 0
            assert landscape.surface(c, r).floor > 0


def test_drift_moves_the_optimum_at_its_round():
    landscape = LANDSCAPES["drift"]()
    before = landscape.optimum_theta(1, DRIFT_ROUND - 1)
    after = landscape.optimum_theta(1, DRIFT_ROUND)
    assert before != after
    assert landscape.true_utility(1, DRIFT_ROUND, before) < 0.9 * landscape.optimum_utility(
        1, DRIFT_ROUND
    )


def test_every_theta_of_the_plateau_is_within_its_spread_of_the_best():
    """An incumbent change on the plateau buys at most 1 %, far below a round's noise (15 %
    per flow): what its changes count is churn."""
    landscape = LANDSCAPES["plateau"]()
    thetas = _random_thetas(landscape, np.random.default_rng(1))
    for c in landscape.contexts:
        top = landscape.optimum_utility(c, 0)
        low = min(landscape.true_utility(c, 0, t) for t in thetas)
        assert (1 - PLATEAU_SPREAD) * top <= low < top
        assert low < (1 - PLATEAU_SPREAD / 2) * top  # not flatter than it says


def test_shared_landscape_optimum_is_region_plus_isp_plus_block():
    """Differences between two ISPs' optima are the same in every region and time block."""
    landscape = LANDSCAPES["shared24"]()
    by_key = {k: np.asarray(landscape.surfaces[c].optimum) for c, k in landscape.contexts.items()}
    assert len(by_key) == 24
    diffs = [
        by_key[k] - by_key[k._replace(dst_isp="cable")] for k in by_key if k.dst_isp == "fiber"
    ]
    spec = load_spec()
    step = max(1 / (p.production[1] - p.production[0]) for p in spec.params)
    for d in diffs[1:]:  # equal up to snapping to Θ's grid (and the clip at 0.05/0.95)
        assert np.abs(d - diffs[0]).max() <= 2 * step + 1e-9


def test_flows_are_eq9_at_sigma_with_the_stated_noise():
    landscape = LANDSCAPES["lab"]()
    theta = landscape.optimum_theta(1, 0)
    x = landscape.normalise([theta])
    factors = np.concatenate([flow_factors(s, "lab", 0, 1, "host-0") for s in range(200)])
    sums, slow = run_flows(landscape.surface(1, 0), x, factors)
    u = sums.utility(SIGMA)
    assert u.mean == pytest.approx(landscape.optimum_utility(1, 0), rel=0.02)
    assert (u.var_of_mean * u.flows) ** 0.5 / u.mean == pytest.approx(FLOW_NOISE, rel=0.1)
    assert slow == 0
    # the same draw for the same (seed, round, context, host), whatever the method
    assert np.array_equal(flow_factors(3, "lab", 2, 1, "h"), flow_factors(3, "lab", 2, 1, "h"))


def test_an_hourly_landscape_gives_each_hour_one_level_with_the_stated_spread():
    """Every flow of a context in one round shares the hour's factor (the benchmark multiplies
    each host's flow factors by it); over many rounds the factors spread by HOUR_SPREAD. The
    other landscapes have none."""
    hourly, lab = LANDSCAPES["hourly"](), LANDSCAPES["lab"]()
    levels = np.asarray([hour_factor(7, hourly, r, 1) for r in range(2000)])
    assert levels.mean() == pytest.approx(1.0, abs=0.02)
    assert levels.std() == pytest.approx(HOUR_SPREAD, rel=0.1)
    assert hour_factor(7, hourly, 3, 1) != hour_factor(7, hourly, 3, 2)  # per context
    assert {hour_factor(7, lab, r, 1) for r in range(50)} == {1.0}


def test_every_context_has_half_its_hosts_exploring_by_the_services_own_rule():
    landscape = LANDSCAPES["shared24"]()
    for key in landscape.contexts.values():
        explore, exploit = fleet_hosts(key)
        assert len(explore) + len(exploit) == HOSTS_PER_CONTEXT
        assert len(explore) == HOSTS_PER_CONTEXT // 2
        assert all(exploration_position(h, key) < EXPLORATION_SHARE for h in explore)
        assert all(exploration_position(h, key) >= EXPLORATION_SHARE for h in exploit)


def test_rounds_to_is_the_first_round_after_which_it_stays_within():
    assert bench.rounds_to([10.0, 5.0, 1.5, 3.0, 1.9, 1.0], 2.0) == 4
    assert bench.rounds_to([1.0, 1.0], 2.0) == 0
    assert bench.rounds_to([1.0, 3.0], 2.0) is None
    assert bench.rounds_to([3.0, 2.0], 2.0) == 1  # "within" includes the threshold


def test_changes_count_only_the_last_window():
    keys = ["a", "b", "a", "a", "b", "b", "c"]
    assert bench.changes_in_last(keys, window=10) == 4
    assert bench.changes_in_last(keys, window=2) == 1
    assert bench.changes_in_last(["a"] * 31, window=10) == 0


def test_fleet_regret_is_flow_weighted():
    assert bench.fleet_regret([(20, 10.0), (60, 0.0)]) == pytest.approx(2.5)
    assert bench.regret_pct(50.0, 49.0) == pytest.approx(2.0)


def test_summary_of_a_hand_made_history():
    hist = bench.History()
    hist.regrets[1] = [20.0, 10.0, 1.0, 1.0]
    hist.regrets[2] = [20.0, 3.0, 3.0, 1.5]
    hist.keys[1] = ["a", "b", "c", "c"]
    hist.keys[2] = ["a", "b", "b", "d"]
    hist.runs = [(20, 4.0), (20, 0.0)]
    hist.seconds = [0.5, 1.5, 1.0]
    s = bench.summarise(hist, [1, 3], drift=False)
    assert s.at[1] == pytest.approx((6.5, 10.0))
    assert s.at[3] == pytest.approx((1.25, 1.5))
    assert s.to_2pct == (2.5, 3.0)  # context 1 from round 2, context 2 from round 3
    assert s.fleet == pytest.approx(2.0)
    assert s.changes == 2.0  # 2 and 2 over the last three plans
    assert s.seconds == pytest.approx(1.0)
    never = bench.History()
    never.regrets[1] = [5.0, 5.0]
    never.keys[1] = ["a", "a"]
    never.runs = [(20, 5.0)]
    never.seconds = [0.1]
    assert bench.summarise(never, [1], drift=False).to_2pct == (float("inf"), float("inf"))


def test_best_run_separates_a_theta_run_once_from_one_measured_well():
    """The optimum run by one host-round counts for "any θ" but not for "measured well",
    where the best is the worse θ run for WELL_MEASURED_FLOWS flows."""
    landscape = LANDSCAPES["lab"]()
    spec = load_spec()
    lowest_cwnd = landscape.bounds()["init_cwnd"][0]
    hist = bench.History()
    gaps = []
    for c in landscape.contexts:
        best = landscape.optimum_theta(c, 0)
        worse = dict(best, init_cwnd=lowest_cwnd)
        hist.ran[c] = {spec.key(best): 20, spec.key(worse): bench.WELL_MEASURED_FLOWS}
        opt = landscape.optimum_utility(c, 0)
        gaps.append(bench.regret_pct(opt, landscape.true_utility(c, 0, worse)))
    anything, measured = bench.best_run(landscape, hist, 0)
    assert anything == pytest.approx(0.0)
    assert measured == pytest.approx(float(np.mean(gaps)))
    assert measured > 1.0


@pytest.mark.parametrize("method", ["random", "booster-contextual"])
def test_a_tiny_run_completes(method):
    landscape = LANDSCAPES["lab"]()
    hist = bench.simulate(landscape, method, seed=0, rounds=2)
    for c in landscape.contexts:
        assert len(hist.regrets[c]) == 3  # before any data, after 1 and after 2 rounds
        assert all(0 <= r < 100 for r in hist.regrets[c])
    assert len(hist.runs) == 2 * len(landscape.contexts) * HOSTS_PER_CONTEXT
    assert len(hist.seconds) == 2


def test_the_command_line_writes_its_tables(tmp_path):
    out = tmp_path / "optimiser.md"
    saved = tmp_path / "run.json"
    bench.main(
        [
            *("--rounds", "2", "--seeds", "1", "--landscapes", "lab"),
            *("--methods", "random", "--output", str(out), "--save-json", str(saved)),
        ]
    )
    text = out.read_text()
    assert "### lab (2 contexts, 4 parameters)" in text
    assert "| random |" in text
    merged = tmp_path / "merged.md"
    bench.main(["--merge", str(saved), "--rounds", "2", "--output", str(merged)])
    assert "| random |" in merged.read_text()


def test_a_merge_refuses_runs_of_another_length(tmp_path):
    saved = tmp_path / "run.json"
    bench.main(
        [
            *("--rounds", "2", "--seeds", "1", "--landscapes", "lab", "--methods", "random"),
            *("--output", str(tmp_path / "run.md"), "--save-json", str(saved)),
        ]
    )
    assert json.loads(saved.read_text())["rounds"] == 2
    merged = tmp_path / "merged.md"
    with pytest.raises(SystemExit) as stop:
        bench.main(["--merge", str(saved), "--rounds", "3", "--output", str(merged)])
    assert (
        str(stop.value)
        == f"{saved}: saved over 2 rounds, this run is over 3 (pass --rounds 2 to merge it)"
    )
    assert not merged.exists()
