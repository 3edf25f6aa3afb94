"""Booster's planner driving the UML lab (gemini_lab.plannertune), without a guest: the hosts
explore as many as planned under the service's own assignment, every θ planned lies in the
policy's region, the planner's trials are the flows' sums, a flow the kernel ran at another θ
stops the run, and the tuned θ is the last incumbent. The tuning itself is a measurement
(benchmarks/results/planner-tune.md)."""

from __future__ import annotations

import pytest

from gemini_api.datapaths import load_datapath
from gemini_api.theta import load_spec
from gemini_booster.policy.assignment import exploration_position
from gemini_lab import cli, evaluation, gear_tune, plannertune

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
    hosts = list(plans[2][1])
    # round 2: the context's hosts turned by two places, so a host's flow meets other losses
    assert [e["label"] for e in cellular] == [f"cellular/{h}" for h in hosts[2:] + hosts[:2]]
    assert [e["theta"] for e in cellular] == [plans[2][1][h] for h in hosts[2:] + hosts[:2]]
    first = plannertune.round_plan(CFG, 0, {c: runs for c, (_, runs) in plans.items()})
    assert [e["label"] for e in first["experiments"] if e["path"] == 1] == [
        f"cellular/{h}" for h in hosts
    ]


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


# --- the datapath's own experiment, pins and what the record says ------------------------------

GEAR_CFG = plannertune.TuneConfig(
    scenarios=(gear_tune.TUNE_PAIR.name,),
    rounds=2,
    hosts=3,
    explorers=2,
    datapath="gear",
    tuned=gear_tune.SEARCHED,
    pinned=gear_tune.PINNED,
)


def _pair_result(theta: dict[str, int], intra: float, cross: float) -> dict:
    """A gear_pair result as the guest returns it: two flows and the θ read back."""
    flows = [
        {"rtt_ms": 2, "throughput_mbps": intra, "queue_delay_ms": 1.0, "retransmits": 0},
        {"rtt_ms": 40, "throughput_mbps": cross, "queue_delay_ms": 3.0, "retransmits": 2},
    ]
    return {"cc": "gear", "flows": flows, "params_ran": {**theta, "dc_base_rtt_us": 2000}}


def test_gear_rounds_run_the_pair_behind_the_int_switch_at_the_planned_theta():
    assert GEAR_CFG.round_kind() == plannertune.RoundKind.GEAR_PAIR
    tuner = plannertune.Tuner(GEAR_CFG)
    _, runs = tuner.plan(0)[1]
    boot = plannertune.round_plan(GEAR_CFG, 0, {1: runs})
    assert [e["kind"] for e in boot["experiments"]] == ["gear_pair"] * 3
    assert [e["theta"] for e in boot["experiments"]] == list(runs.values())
    assert {e["label"] for e in boot["experiments"]} == {f"gear-pair/{h}" for h in runs}
    for e in boot["experiments"]:
        assert e["rtts_ms"] == list(gear_tune.TUNE_PAIR.rtts_ms)
        assert e["dc_base_rtt_us"] == 2000 and e["theta"]["class_rtt_ratio"] == 10
    assert boot["paths"][0]["name"] == "gear-pair"


def test_a_gear_pair_reaches_the_planner_as_its_fair_goodput():
    theta = GEAR_CFG.start()
    sums = plannertune.measured(_pair_result(theta, 60.0, 20.0), theta, GEAR_CFG.spec())
    assert sums is not None and sums.flow_count == 1
    assert sums.tpt_sum == 40.0 and sums.delay_sum == 2.0  # 2 · min, the flows' mean delay
    even = plannertune.measured(_pair_result(theta, 40.0, 40.0), theta, GEAR_CFG.spec())
    assert even is not None and even.tpt_sum == 80.0  # the same total, shared evenly: more
    with pytest.raises(RuntimeError, match="not the planned"):
        plannertune.measured(_pair_result(theta | {"ai_step_bdp": 7}, 1, 1), theta, GEAR_CFG.spec())
    failed = {"insmod": {"int": {"rc": 1, "err": "no such module"}}}
    assert plannertune.measured(failed, theta, GEAR_CFG.spec()) is None
    row = plannertune._row("h", theta, failed)
    assert row["error"].startswith("modules not loaded")


def test_the_record_lists_each_theta_run_with_its_utility_and_the_incumbent():
    start = GEAR_CFG.start()
    tried = start | {"ai_step_bdp": 2300}
    runs = [plannertune._row(h, t, _pair_result(t, a, b))
            for h, t, a, b in (("a", start, 60.0, 20.0), ("b", tried, 45.0, 40.0))]  # fmt: skip
    history = {"gear-pair": [{"round": 0, "incumbent": start, "runs": runs},
                             {"round": 1, "incumbent": tried}]}  # fmt: skip
    rows = plannertune.render(history, GEAR_CFG, "cmd").split("| θ run")[1].splitlines()
    assert rows[2] == "| 0 | η 95, W_AI 579, maxStage 5 (incumbent) | 39.8 (share 3.00) |"
    assert rows[3] == "| 0 | η 95, W_AI 2300, maxStage 5 | 79.8 (share 1.12) |"


def test_experiment_kinds_are_refused_for_a_datapath_they_cannot_run():
    with pytest.raises(ValueError, match="runs Gear only"):
        plannertune.TuneConfig(datapath="dcvegas", kind=plannertune.RoundKind.GEAR_PAIR)
    with pytest.raises(ValueError, match="cannot run datapath gear"):
        plannertune.TuneConfig(datapath="gear", kind=plannertune.RoundKind.FLOW)
    with pytest.raises(ValueError, match="no Gear pair context 'ethernet'"):
        plannertune.TuneConfig(scenarios=("ethernet",), datapath="gear")
    with pytest.raises(ValueError, match="has no parameter eta"):
        plannertune.TuneConfig(scenarios=("gear-pair",), datapath="gear", tuned=("eta",))


def _gemini(**more: object) -> plannertune.TuneConfig:
    return plannertune.TuneConfig(scenarios=("datacenter",), datapath="gemini",
                                  tuned=("ecn_k",), **more)  # type: ignore[arg-type]  # fmt: skip


def test_time_scale_pins_the_scaled_defaults_unless_a_pin_is_given():
    default = load_datapath("gemini").default()["delay_threshold_us"]
    bounds = _gemini(time_scale=10).search_bounds()
    assert bounds is not None and bounds["delay_threshold_us"] == (10 * default,) * 2
    pinned = _gemini(time_scale=10, pinned=(("delay_threshold_us", 7000),)).search_bounds()
    assert pinned is not None and pinned["delay_threshold_us"] == (7000, 7000)
    with pytest.raises(ValueError, match=r"delay_threshold_us.*not an interval inside"):
        _gemini(pinned=(("delay_threshold_us", 10**9),))


def test_the_record_names_the_pins_when_they_are_not_the_spec_defaults():
    assert "pinned at the spec's defaults" in plannertune.render({}, _gemini(), "cmd")
    scaled = plannertune.render({}, _gemini(time_scale=10), "cmd")
    assert "pinned at the spec's defaults" not in scaled
    default = load_datapath("gemini").default()["delay_threshold_us"]
    symbol = load_datapath("gemini").param("delay_threshold_us").symbol
    assert f"{symbol} {10 * default}" in scaled.split("pinned at")[1]


def test_a_kept_default_is_called_untuned_in_the_datapath_s_own_name():
    start = GEAR_CFG.start()
    history = {"gear-pair": [{"round": 0, "incumbent": start, "runs": []},
                             {"round": 1, "incumbent": start}]}  # fmt: skip
    text = plannertune.render(history, GEAR_CFG, "cmd")
    assert "untuned gear." in text and "Fusion" not in text
    last = {"round": 1, "incumbent": start | {"max_stage": 2}}
    moved = {"gear-pair": [history["gear-pair"][0], last]}
    assert "untuned" not in plannertune.render(moved, GEAR_CFG, "cmd")
    fusion = {"ethernet": [{"round": 0, "incumbent": load_spec().default(), "runs": []},
                           {"round": 1, "incumbent": load_spec().default()}]}  # fmt: skip
    assert "untuned fusion." in plannertune.render(fusion, CFG, "cmd")


def test_datapath_tune_refuses_a_malformed_pin_before_running(tmp_path):
    argv = ["datapath-tune", "--datapath", "gemini", "--scenario", "datacenter", "--out",
            str(tmp_path), "--pin", "delay_threshold_us"]  # fmt: skip
    with pytest.raises(SystemExit, match="--pin 'delay_threshold_us': expected NAME=INTEGER"):
        cli.main(argv)
    with pytest.raises(SystemExit, match="has no parameter bogus"):
        cli.main([*argv[:-1], "bogus=3"])
    assert list(tmp_path.iterdir()) == []


def test_datapath_tune_searches_the_tuned_parameters_over_theta_prime_with_region_wide(
    tmp_path, monkeypatch
):
    seen = []

    def tune(cfg, out):  # stands in for the UML boots: only the configuration is checked
        seen.append(cfg)
        raise SystemExit("stop before booting")

    monkeypatch.setattr(plannertune, "tune", tune)
    argv = ["datapath-tune", "--datapath", "gear", "--scenario", "gear-pair", "--tuned",
            "ai_step_bdp", "--pin", "class_rtt_ratio=10", "--out", str(tmp_path)]  # fmt: skip
    for region in ("production", "wide"):
        with pytest.raises(SystemExit, match="stop before booting"):
            cli.main([*argv, "--region", region])
    wide = GEAR_CFG.spec().region_bounds("wide")["ai_step_bdp"]
    assert [c.search_bounds()["ai_step_bdp"] for c in seen] == [(50, 2500), wide]
    assert seen[1].search_bounds()["class_rtt_ratio"] == (10, 10)  # a pin stays pinned


def test_gemini_and_dcvegas_are_tuned_in_datapath_flow_rounds_fusion_in_flow_rounds():
    """Their θ tables (#31) must not turn their rounds into Fusion's flow rounds, which set up
    neither ECN nor their module options."""
    for name in ("gemini", "dcvegas"):
        kind = plannertune.TuneConfig(datapath=name, scenarios=("datacenter",)).round_kind()
        assert kind == plannertune.RoundKind.DATAPATH_FLOW, name
    assert CFG.round_kind() == plannertune.RoundKind.FLOW
