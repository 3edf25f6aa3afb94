"""FlashPass tuned by Booster's planner (issue #36): the round's plan, the trial's eq. 9 sums
from the flow records, and the held-out comparison's plan. Unit tier: no boot (the UML run is
``python -m gemini_lab.flashpass.tune``, recorded in benchmarks/results/flashpass.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemini_api.sums import FlowSums
from gemini_lab.flashpass import compare, evaluate, fctmix, tune
from gemini_lab.flashpass.switch import DATA_QDISC, EMULATION_QDISC
from gemini_lab.plannertune import RoundKind, TuneConfig

PAPER = dict(evaluate.THETA)
OTHER = {"min_target_loss": 20, "max_target_loss": 200, "t_wait": 800}


def _record(flow: int, theta: dict[str, int], **kw: int) -> dict:
    rec = {"flow": flow, "bytes_delivered": 1_000_000, "duration_us": 4_000_000,
           "rtt_avg_us": 35_000, "rtt_min_us": 30_000, "retransmits": 0,
           "theta": theta}  # fmt: skip
    return rec | kw


def test_flashpass_is_its_own_round_kind() -> None:
    cfg = tune.config()
    assert cfg.round_kind() == RoundKind.FLASHPASS
    assert TuneConfig(scenarios=("x",), datapath="flashpass").round_kind() == RoundKind.FLASHPASS
    assert cfg.start() == PAPER  # the planner starts from the paper's θ


def test_round_plan_runs_each_host_at_its_theta_on_one_dev_draw() -> None:
    runs = {"h0": PAPER, "h1": OTHER}
    plan = tune.round_plan(1, runs)["runs"]
    (base,) = [x for x in evaluate.seed_runs(tune.DEV_SEEDS[1]) if x["transport"] == "flashpass"]
    assert [r["theta"] for r in plan] == [PAPER, OTHER]
    assert all(r["flows"] == base["flows"] for r in plan)
    assert all(r["sender_delays_ms"] == base["sender_delays_ms"] for r in plan)
    assert {tune.dev_seed(r) for r in range(9)} == set(tune.DEV_SEEDS)


def test_flow_sums_are_eq_9_over_the_records() -> None:
    recs = [_record(1, PAPER), _record(2, PAPER, duration_us=8_000_000, rtt_avg_us=40_000)]
    sums = tune.flow_sums(recs, PAPER)
    assert sums.flow_count == 2
    assert sums.mean_throughput == pytest.approx((2.0 + 1.0) / 2)  # 8 Mbit over 4 s and 8 s
    assert sums.mean_delay == pytest.approx((5.0 + 10.0) / 2)  # RTT mean − min
    assert sums.utility(0.1).mean == pytest.approx(1.5 - 0.1 * 7.5)


def test_an_unfinished_flow_counts_as_zero_throughput() -> None:
    sums = tune.flow_sums([_record(1, PAPER, bytes_delivered=0)], PAPER)
    assert sums.mean_throughput == 0.0


def test_a_flow_at_another_theta_stops_the_run() -> None:
    with pytest.raises(RuntimeError, match="flow 1 ran"):
        tune.flow_sums([_record(1, OTHER)], PAPER)


def test_hosts_at_one_theta_make_one_trial(tmp_path: Path) -> None:
    tuner = tune.Tuner(tune.config())
    runs = {"h0": PAPER, "h1": OTHER, "h2": PAPER}
    for i, theta in enumerate(runs.values()):
        (tmp_path / f"run{i}").mkdir()
        lines = [json.dumps(_record(f, theta)) for f in (1, 2)]
        (tmp_path / f"run{i}" / "flashpass.flows").write_text("\n".join(lines) + "\n")
    rows = tune.observe(tuner, 0, runs, tmp_path)
    assert len(rows) == 3 and rows[0]["mbps"] == pytest.approx(2.0)
    counts = {t.theta_key: t.sums.flow_count for t in tuner.trials}
    assert counts == {tuner.spec.key(PAPER): 4, tuner.spec.key(OTHER): 2}
    assert all(isinstance(t.sums, FlowSums) for t in tuner.trials)


def test_comparison_runs_both_thetas_on_every_held_out_seed() -> None:
    runs = compare.plan([4, 5], {"paper": PAPER, "tuned": OTHER}, 2)
    assert [(r["seed"], r["label"]) for r in runs] == [
        (4, "paper"), (4, "paper"), (4, "tuned"), (4, "tuned"),
        (5, "paper"), (5, "paper"), (5, "tuned"), (5, "tuned"),
    ]  # fmt: skip
    assert not {r["seed"] for r in runs} & set(tune.DEV_SEEDS)


def test_the_mix_workload_tunes_flashpass_alone_on_the_dev_seeds_mix() -> None:
    cfg = tune.config(workload="fctmix")
    assert cfg.scenarios == ("flashpass-fctmix",) and cfg.start() == PAPER
    plan = tune.round_plan(2, {"h0": PAPER, "h1": OTHER}, "fctmix")["runs"]
    (base,) = fctmix.mix_runs(tune.DEV_SEEDS[2], transports=("flashpass",))
    assert [r["theta"] for r in plan] == [PAPER, OTHER]
    assert all(r["transport"] == "flashpass" and r["flows"] == base["flows"] for r in plan)
    assert len(base["flows"]) == fctmix.FLOWS and len(base["sender_delays_ms"]) == fctmix.SENDERS
    runs = compare.plan([4, 5], {"paper": PAPER}, 3, "fctmix")
    assert [r["seed"] for r in runs] == [4, 4, 4, 5, 5, 5]
    assert runs[3]["flows"] == fctmix.mix_runs(5, transports=("flashpass",))[0]["flows"]


def test_the_wan_mix_workload_is_the_headline_s_path_and_buffer() -> None:
    cfg = tune.config(workload="fctmix-wan")
    assert cfg.scenarios == ("flashpass-fctmix-wan",) and cfg.start() == PAPER
    plan = tune.round_plan(1, {"h0": PAPER}, "fctmix-wan")["runs"]
    (wan,) = fctmix.mix_runs(
        tune.DEV_SEEDS[1], transports=("flashpass",), wan_rtts=True, buffer_packets=4
    )
    (short,) = fctmix.mix_runs(tune.DEV_SEEDS[1], transports=("flashpass",))
    assert plan[0]["sender_delays_ms"] == wan["sender_delays_ms"] != short["sender_delays_ms"]
    assert plan[0]["data_buffer_packets"] == 4 and plan[0]["flows"] == short["flows"]
    (held,) = compare.plan([4], {"paper": PAPER}, 1, "fctmix-wan")
    assert held["sender_delays_ms"] == fctmix.wan_delays(4)


def test_a_mix_runs_figures_carry_the_classes_and_eq_9(tmp_path: Path) -> None:
    flows = [
        {"flow": 1, "bytes": 5_000, "start_ms": 0.0},
        {"flow": 2, "bytes": 1_500_000, "start_ms": 100.0},
    ]
    result = {
        "transport": "flashpass", "flow_ids": [1, 2], "fct_s": [0.1, 1.5],
        "sender_rc": [0, 0], "makespan_s": 2.0,
        "senders": [{"flow": 1, "finished": True}, {"flow": 2, "finished": True}],
        "qdiscs": [{"handle": DATA_QDISC, "packets": 100, "drops": 0},
                   {"handle": EMULATION_QDISC, "packets": 90, "drops": 10}],
    }  # fmt: skip
    lines = [json.dumps(_record(f, PAPER, duration_us=1_000_000)) for f in (1, 2)]
    (tmp_path / "flashpass.flows").write_text("\n".join(lines) + "\n")
    run = {"seed": 4, "label": "paper", "theta": PAPER, "flows": flows}
    row = compare.mix_figures(run, result, tmp_path)
    assert row["small_mean_ms"] == pytest.approx(100.0)
    assert row["large_mean_ms"] == pytest.approx(1500.0)
    assert row["emulation_loss"] == pytest.approx(0.1) and row["data_loss"] == 0.0
    assert row["utility"] == pytest.approx(8.0 - 0.1 * 5.0)  # 1 MB in 1 s, 5 ms of queueing
    other = row | {"utility": 6.5, "small_mean_ms": 300.0}
    (span,) = compare.mix_spans([row, other])[2:]
    assert span.startswith("| 4 | paper | 2 | 100–300 |") and span.endswith("| 7.000 |")
