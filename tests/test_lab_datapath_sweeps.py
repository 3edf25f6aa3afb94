"""gemini_lab.datapath_sweeps without a guest: what the planner is given for an incast, and
the plans the sweeps boot (the boots themselves are benchmarks, datapaths-eval.md)."""

from __future__ import annotations

import pytest

from gemini_api.sums import FlowSums
from gemini_api.sums import Objective as PolicyObjective
from gemini_lab import datapath_sweeps as sw
from gemini_lab.datapath_signals import scaled_theta

THETA = {"queue_threshold": 6, "ewma_shift": 4}
BYTES_EACH = 100_000  # 0.8 Mbit


def _incast(fcts_ms: list[float], ran: dict[str, int] | None = None) -> dict:
    """An incast's result as the guest returns it: one late flow (a timeout) among fast ones."""
    flows = [{"fct_ms": t, "rtt_us": 1500, "min_rtt_us": 500} for t in fcts_ms]
    return {"bytes_each": BYTES_EACH, "per_flow": flows, "params_ran": ran or THETA}


def test_per_flow_objective_is_the_mean_of_each_flows_rate():
    sums = sw.incast_sums(_incast([100.0, 400.0]), THETA, sw.Objective.PER_FLOW)
    assert sums is not None and sums.flow_count == 2
    assert sums.tpt_sum == pytest.approx(0.8 / 0.1 + 0.8 / 0.4)
    assert sums.delay_sum == pytest.approx(2.0)


def test_query_objective_is_all_bytes_over_the_slowest_completion():
    sums = sw.incast_sums(_incast([100.0, 400.0]), THETA, sw.Objective.QUERY)
    assert sums is not None and sums.flow_count == 1
    assert sums.tpt_sum == pytest.approx(1.6 / 0.4)
    assert sums.delay_sum == pytest.approx(1.0)


def test_the_two_objectives_rank_a_late_flow_oppositely():
    """Why the query objective exists: spreading completions (one flow late, the rest early)
    raises the mean of rates while the query finishes later."""
    even, spread = _incast([250.0] * 4), _incast([50.0, 50.0, 50.0, 400.0])
    per = [sw.incast_sums(r, THETA, sw.Objective.PER_FLOW) for r in (even, spread)]
    query = [sw.incast_sums(r, THETA, sw.Objective.QUERY) for r in (even, spread)]
    assert per[1].tpt_sum / 4 > per[0].tpt_sum / 4  # type: ignore[union-attr]
    assert query[1].tpt_sum < query[0].tpt_sum  # type: ignore[union-attr]


def _completion(sums: FlowSums | None, sigma: float = 0.0) -> float:
    assert sums is not None
    return sums.utility(sigma, PolicyObjective.COMPLETION).mean


def test_completion_objective_is_all_bits_over_all_completion_times_as_an_agent_sums_them():
    sums = sw.incast_sums(_incast([100.0, 400.0]), THETA, sw.Objective.COMPLETION)
    assert sums is not None and sums.flow_count == sums.completion.flow_count == 2
    assert _completion(sums) == pytest.approx(1.6 / 0.5)
    assert _completion(sums, sigma=1.0) == pytest.approx(1.6 / 0.5 - 1.0)
    assert sw.Objective.COMPLETION.policy_objective == PolicyObjective.COMPLETION
    assert sw.Objective.QUERY.policy_objective == PolicyObjective.FLOW_MEAN


def test_completion_objective_ranks_a_late_flow_below_even_completions():
    """A timeout's RTO adds to ΣFCT whole, so the spread incast whose one late flow lifts the
    mean of rates scores lower, as the query does."""
    even, spread = _incast([100.0] * 4), _incast([50.0, 50.0, 50.0, 400.0])
    done = [sw.incast_sums(r, THETA, sw.Objective.COMPLETION) for r in (even, spread)]
    assert _completion(done[1]) < _completion(done[0])
    assert done[1].utility(0.0).mean > done[0].utility(0.0).mean  # type: ignore[union-attr]


def test_an_incast_run_at_another_theta_is_refused():
    with pytest.raises(RuntimeError, match="not the planned"):
        sw.incast_sums(_incast([100.0], {**THETA, "queue_threshold": 7}), THETA, sw.Objective.QUERY)


def test_a_failed_incast_gives_the_planner_nothing():
    assert sw.incast_sums({"error": "boom"}, THETA, sw.Objective.QUERY) is None
    none_done = {**_incast([]), "per_flow": [{"failed": "reset"}]}
    assert sw.incast_sums(none_done, THETA, sw.Objective.PER_FLOW) is None


def test_the_k_sweep_tells_gemini_the_switchs_k_and_runs_dctcp_at_each():
    ex = [e for e in sw.k_sweep_plan()["experiments"] if e["kind"] == "datapath_pair"]
    assert sorted({e["ecn_k"] for e in ex}) == sorted(sw.K_SWEEP)
    for e in ex:
        if e.get("datapath") == "gemini":
            assert e["theta"] == {**scaled_theta("gemini"), "ecn_k": e["ecn_k"]}
        else:
            assert e["cc"] == "dctcp"
    assert len(ex) == 2 * len(sw.K_SWEEP)


def test_gemini_dc_tuning_pins_the_scaled_defaults_and_searches_k_and_h():
    bounds = sw.gemini_dc_config().search_bounds()
    assert bounds is not None
    assert bounds["delay_threshold_us"] == (50_000, 50_000)
    assert (
        bounds["ecn_k"][0] < bounds["ecn_k"][1]
        and bounds["increase_h"][0] < bounds["increase_h"][1]
    )
