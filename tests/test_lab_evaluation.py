"""The long-flow evaluation's plan and arithmetic (gemini_lab.evaluation): which flows run where,
how runs differ, how a tuned θ is judged against the best baseline, and that a flow the kernel
ran at another θ than asked is refused. No guest boots here; the figures themselves are a
measurement (benchmarks/results/evaluation.md)."""

from __future__ import annotations

import json

import pytest

from gemini_api.theta import load_spec
from gemini_lab import evaluation
from gemini_lab.cli import main

TUNED = evaluation.Tuned(
    {"ethernet": {"rtt_threshold": 7}, "cellular": {"init_cwnd": 11, "mult_decrease": 61}},
    "test",
)
CFG = evaluation.EvalConfig(scenarios=("ethernet", "cellular"), tuned=TUNED, runs=3)


def test_each_path_runs_its_own_tuned_theta_the_others_and_every_baseline():
    names = [c.name for c in CFG.contenders("ethernet")]
    assert names == [
        "fusion-default",
        "fusion-tuned",
        "fusion-tuned@cellular",
        *evaluation.BASELINES,
    ]
    by_name = {c.name: c for c in CFG.contenders("ethernet")}
    assert by_name["fusion-tuned"].theta == {"rtt_threshold": 7}
    assert by_name["fusion-tuned@cellular"].theta == TUNED.theta["cellular"]
    # a path nobody tuned runs the default, the others' θ and the baselines
    sat = evaluation.EvalConfig(scenarios=("satellite",), tuned=TUNED)
    assert "fusion-tuned" not in [c.name for c in sat.contenders("satellite")]


def test_runs_are_run_major_and_only_a_traced_path_moves_its_start():
    plan = evaluation.build_plan(CFG)
    labels = [e["label"] for e in plan["experiments"]]
    per_run = len(labels) // CFG.runs
    assert all(label.endswith("/0") for label in labels[:per_run])
    assert all(label.endswith("/2") for label in labels[-per_run:])
    offsets = {(e["label"].split("/")[0], e["offset_s"]) for e in plan["experiments"]}
    step = evaluation.TRACE_STEP_S
    assert offsets == {
        ("ethernet", 0.0),
        ("cellular", 0.0),
        ("cellular", step),
        ("cellular", 2 * step),
    }


def _flow(tput: float, queue: float, theta: dict | None = None) -> dict:
    records = [{"theta": theta}] if theta is not None else []
    return {"throughput_mbps": tput, "queue_delay_ms": queue, "retransmits": 0, "records": records}


def _results(tuned: tuple[float, float], baselines: dict[str, tuple[float, float]]) -> dict:
    exps = {}
    theta = {**load_spec().default(), "rtt_threshold": 7}
    for run in range(2):
        exps[f"ethernet/fusion-tuned/{run}"] = _flow(*tuned, theta)
        for name, (t, q) in baselines.items():
            exps[f"ethernet/{name}/{run}"] = _flow(t, q)
    return {"experiments": exps}


def test_the_tuned_theta_is_judged_against_the_best_baseline_at_each_sigma():
    # vegas is best at sigma 0.1 (13.0 - 1.0 = 12.0); tuned 12.5 - 0.2 = 12.3 is above it
    base = {
        "cubic": (14.0, 100.0),
        "bbr": (13.5, 20.0),
        "vegas": (13.0, 10.0),
        "reno": (14.0, 40.0),
    }
    lines = evaluation.verdicts(_results((12.5, 2.0), base), "ethernet", CFG)
    assert "vegas" in lines[0] and "at or above" in lines[0]
    # at sigma 10 tuned 12.5 - 20 = -7.5 against vegas 13 - 100 = -87: above
    assert "at or above" in lines[2]
    # a tuned θ 3 % under the best baseline is "within 5 %", 10 % under is "below"
    near = evaluation.verdicts(
        _results((11.64, 0.0), {"vegas": (12.0, 0.0)} | _rest()), "ethernet", CFG
    )
    far = evaluation.verdicts(
        _results((10.8, 0.0), {"vegas": (12.0, 0.0)} | _rest()), "ethernet", CFG
    )
    assert "within 5 % of" in near[0] and "below" in far[0]


def _rest() -> dict[str, tuple[float, float]]:
    return {"cubic": (1.0, 0.0), "bbr": (1.0, 0.0), "reno": (1.0, 0.0)}


def test_a_fusion_flow_at_another_theta_than_asked_is_refused():
    cfg = evaluation.EvalConfig(scenarios=("ethernet",), tuned=TUNED, runs=2, cross=False)
    base = {"cubic": (1.0, 0.0), "bbr": (1.0, 0.0), "vegas": (1.0, 0.0), "reno": (1.0, 0.0)}
    results = _results((12.0, 1.0), base)
    for run in range(2):
        results["experiments"][f"ethernet/fusion-default/{run}"] = _flow(
            10.0, 1.0, load_spec().default()
        )
    assert evaluation.wrong_theta(results, cfg) == []
    results["experiments"]["ethernet/fusion-tuned/1"]["records"] = [
        {"theta": load_spec().default()}
    ]
    assert [w.split(":")[0] for w in evaluation.wrong_theta(results, cfg)] == [
        "ethernet/fusion-tuned/1"
    ]
    results["experiments"]["ethernet/fusion-tuned/1"]["records"] = []
    assert len(evaluation.wrong_theta(results, cfg)) == 1


def test_a_failed_run_is_listed_and_left_out_of_the_means():
    base = {"cubic": (1.0, 0.0), "bbr": (2.0, 0.0), "vegas": (12.0, 0.0), "reno": (1.0, 0.0)}
    results = _results((12.5, 0.0), base)
    results["experiments"]["ethernet/vegas/1"] = {"error": "Traceback ...\nRuntimeError: stuck\n"}
    assert len(evaluation.flows_of(results, "ethernet", "vegas")) == 1
    assert evaluation.failures_of(results, "ethernet", "vegas") == [
        "ethernet/vegas/1: RuntimeError: stuck"
    ]
    text = evaluation.render(
        results,
        evaluation.EvalConfig(scenarios=("ethernet",), tuned=TUNED, runs=2, cross=False),
        "cmd",
    )
    assert "| vegas | 1 of 2 |" in text
    assert "Failed run (not in the means): ethernet/vegas/1: RuntimeError: stuck" in text
    # a failed run of the tuned θ: no verdict on that path
    results["experiments"]["ethernet/fusion-tuned/1"] = {"error": "x\nOSError: boom\n"}
    assert evaluation.verdicts(results, "ethernet", CFG) == [
        "A run of the tuned θ failed: no verdict."
    ]


def test_a_tuned_file_with_a_theta_outside_its_range_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "tuned.json"
    bad.write_text(json.dumps({"theta": {"ethernet": {"rtt_threshold": 1000}}}))
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--tuned", str(bad), "--no-record", "--out", str(tmp_path)])
    assert "rtt_threshold" in str(exc.value) and "gemini-lab evaluate" in str(exc.value)
    bad.write_text(json.dumps({"satellite": {}}))
    with pytest.raises(SystemExit, match='no "theta" object'):
        main(["evaluate", "--tuned", str(bad), "--no-record", "--out", str(tmp_path)])


def test_the_recorded_tuned_thetas_are_valid():
    tuned = evaluation.Tuned.load(evaluation.TUNED_PATH)
    assert set(tuned.theta) == set(evaluation.DEFAULT_SCENARIOS)
