"""Booster's planner driving the UML lab (gemini_lab.plannertune), without a guest: the hosts
explore as many as planned under the service's own assignment, every θ planned lies in the
policy's region, the planner's trials are the flows' sums, a flow the kernel ran at another θ
stops the run, and the tuned θ is the last incumbent. The tuning itself is a measurement
(benchmarks/results/planner-tune.md)."""

from __future__ import annotations

import pytest

from gemini_api.theta import load_spec
from gemini_booster.policy.assignment import exploration_position
from gemini_lab import evaluation, plannertune

CFG = plannertune.TuneConfig(scenarios=("ethernet", "cellular"), rounds=3, hosts=5, explorers=4)


def test_each_context_has_exactly_the_planned_explorers():
    tuner = plannertune.Tuner(CFG)
    share = tuner.policy.exploration_share
    for c, hosts in tuner.hosts.items():
        key = tuner.contexts[c]
        below = [h for h in hosts if exploration_position(h, key) < share]
        assert len(hosts) == 5 and len(set(hosts)) == 5 and len(below) == 4


def _synthetic_flow(theta: dict[str, int]) -> dict:
    """A flow whose throughput rises with ω, so the planner has something to follow."""
    full = {**load_spec().default(), **theta}
    return {
        "throughput_mbps": 5.0 + theta["init_cwnd"] / 10,
        "queue_delay_ms": 10.0,
        "retransmits": 0,
        "records": [{"theta": full}],
    }


def test_rounds_plan_inside_the_region_and_feed_the_planner_the_flows_sums():
    tuner = plannertune.Tuner(CFG)
    bounds = tuner.policy.resolved_bounds()
    for r in range(CFG.rounds):
        plans = tuner.plan(r)
        assert set(plans) == {1, 2}
        for c, (_, runs) in plans.items():
            for theta in runs.values():
                assert all(bounds[n][0] <= v <= bounds[n][1] for n, v in theta.items())
                tuner.observe(r, c, theta, plannertune.measured(_synthetic_flow(theta), theta))
    assert len(tuner.trials) >= CFG.rounds * 2
    # the sums are the flow's: one flow, its throughput and queueing
    t = tuner.trials[0]
    assert t.sums.flow_count == 1 and t.sums.delay_sum == 10.0


def test_a_flow_at_another_theta_than_planned_stops_the_run():
    theta = load_spec().default() | {"init_cwnd": 30}
    flow = _synthetic_flow(theta)
    flow["records"] = [{"theta": load_spec().default()}]
    with pytest.raises(RuntimeError, match="not the planned"):
        plannertune.measured(flow, theta)


def test_a_failed_flow_gives_the_planner_nothing_and_is_shown_as_failed():
    tuner = plannertune.Tuner(CFG)
    _, runs = tuner.plan(0)[1]
    hosts = list(runs)
    flows = {h: _synthetic_flow(runs[h]) for h in hosts}
    flows[hosts[0]] = {"error": "Traceback ...\nRuntimeError: flow still running\n"}
    rows = plannertune.observe_round(tuner, 0, 1, runs, flows)
    assert rows[0] == {
        "host": hosts[0],
        "theta": runs[hosts[0]],
        "error": "RuntimeError: flow still running",
    }
    # the others' flows reached the planner, summed per θ: one flow per host
    assert sum(t.sums.flow_count for t in tuner.trials) == len(hosts) - 1
    line = plannertune.progress_line("ethernet", 0, runs[hosts[-1]], rows, 0.1)
    assert line.split("utilities ")[1].startswith("failed ")
    history = {
        "ethernet": [
            {"round": 0, "incumbent": runs[hosts[-1]], "runs": rows},
            {"round": 1, "incumbent": runs[hosts[-1]]},
        ]
    }
    assert "| 0 |" in plannertune.render(history, CFG, "cmd") and "failed" in plannertune.render(
        history, CFG, "cmd"
    )


def test_a_round_runs_every_hosts_theta_on_its_contexts_path():
    tuner = plannertune.Tuner(CFG)
    plans = tuner.plan(0)
    boot = plannertune.round_plan(CFG, 2, {c: runs for c, (_, runs) in plans.items()})
    assert len(boot["experiments"]) == 10
    cellular = [e for e in boot["experiments"] if e["label"].startswith("cellular/")]
    assert {e["path"] for e in cellular} == {1}
    assert {e["offset_s"] for e in cellular} == {2 * evaluation.TRACE_STEP_S}
    assert [e["theta"] for e in cellular] == list(plans[2][1].values())


def test_the_tuned_theta_is_the_last_incumbent():
    last = load_spec().default() | {"init_cwnd": 40}
    history = {
        "ethernet": [
            {"round": 0, "incumbent": load_spec().default()},
            {"round": 1, "incumbent": last},
        ]
    }
    assert plannertune.tuned_theta(history) == {"ethernet": last}


def test_the_wide_region_plans_inside_theta_prime_and_the_record_says_so():
    wide = plannertune.TuneConfig(scenarios=("ethernet",), rounds=2, region="wide")
    tuner = plannertune.Tuner(wide)
    spec = load_spec()
    bounds = tuner.policy.resolved_bounds()
    assert bounds["mult_decrease"] == spec.param("mult_decrease").bounds("wide")
    assert bounds["mult_decrease"] != spec.param("mult_decrease").bounds("production")
    for r in range(wide.rounds):
        for c, (_, runs) in tuner.plan(r).items():
            for theta in runs.values():
                assert all(bounds[n][0] <= v <= bounds[n][1] for n, v in theta.items())
                tuner.observe(r, c, theta, plannertune.measured(_synthetic_flow(theta), theta))
    assert "all seven parameters in Θ′" in plannertune.render({}, wide, "cmd")
    assert "all seven parameters in Θ." in plannertune.render({}, CFG, "cmd")
