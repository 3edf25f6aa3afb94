"""The evaluation's figures for issue #34 (gemini_lab.evaluation, gemini_lab.plannertune): a
trace path's "% of capacity" divides by the stretch each run's flow met, the default θ is held
to its bar on every path (half the best baseline's throughput, cubic's utility at σ = 0.1), and
a "tuned" θ the planner left at the default says so. No guest boots here."""

from __future__ import annotations

import json

import pytest

from gemini_api.theta import load_spec
from gemini_lab import evaluation, plannertune, scenario


def _flow(tput: float, queue: float = 0.0) -> dict:
    return {"throughput_mbps": tput, "queue_delay_ms": queue, "retransmits": 0, "records": []}


def _results(path: str, flows: dict[str, list[dict]]) -> dict:
    return {
        "experiments": {
            f"{path}/{name}/{run}": f for name, runs in flows.items() for run, f in enumerate(runs)
        }
    }


def test_each_run_on_a_trace_path_is_measured_against_its_own_stretch() -> None:
    p = scenario.load("cellular")
    dur = evaluation.duration_s(p)
    own = [p.capacity_kbit(evaluation.offset_s(p, k), dur) / 1000 for k in range(3)]
    assert len(set(own)) == 3  # the three stretches differ
    results = _results("cellular", {"cubic": [_flow(c) for c in own]})
    assert evaluation.capacities_mbit(results, p, "cubic") == pytest.approx(own)
    # a flow that carried exactly its stretch's capacity reads 100 % in every run
    cfg = evaluation.EvalConfig(scenarios=("cellular",), runs=3, cross=False)
    text = evaluation.render(results, cfg, "cmd")
    (row,) = [line for line in text.splitlines() if line.startswith("| cubic |")]
    assert row.split(" | ")[3] == "100"


def test_the_default_bar_holds_and_fails_on_the_figures_it_names() -> None:
    base = {b: [_flow(10.0, 0.0)] * 2 for b in evaluation.BASELINES}
    base["bbr"] = [_flow(28.0, 10.0)] * 2  # best throughput; cubic's utility 10 at σ = 0.1
    holds = evaluation.default_bar(
        _results("wifi-jitter", {**base, "fusion-default": [_flow(27.0, 5.0)] * 2}),
        "wifi-jitter",
    )
    assert "throughput 96 % of the best baseline's (bbr, 28.00 Mbit/s): **holds**" in holds[0]
    assert "utility at σ = 0.1 26.50 against cubic's 10.00: **holds**" in holds[0]
    fails = evaluation.default_bar(
        _results("wifi-jitter", {**base, "fusion-default": [_flow(4.5, 60.0)] * 2}),
        "wifi-jitter",
    )
    assert "throughput 16 %" in fails[0] and fails[0].count("**fails**") == 2


def test_a_tuned_theta_left_at_the_default_is_labelled(tmp_path) -> None:
    default = load_spec().default()
    tuned = {"ethernet": {**default, "rtt_threshold": 70}, "cellular": dict(default)}
    # the planner's record and tuned file say which incumbent stayed at the default
    assert plannertune.stayed_at_default(tuned["cellular"], load_spec())
    assert not plannertune.stayed_at_default(tuned["ethernet"], load_spec())
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"theta": tuned, "stayed_at_default": ["cellular"]}))
    loaded = evaluation.Tuned.load(path)
    assert loaded.stayed_at_default == {"cellular"}
    text = evaluation.render(
        {"experiments": {}},
        evaluation.EvalConfig(scenarios=(), tuned=loaded, cross=False),
        "cmd",
    )
    (cell,) = [line for line in text.splitlines() if "θ tuned on cellular" in line]
    assert "untuned Fusion" in cell
    (eth,) = [line for line in text.splitlines() if "θ tuned on ethernet" in line]
    assert "untuned" not in eth
    path.write_text(json.dumps({"theta": tuned, "stayed_at_default": ["satellite"]}))
    with pytest.raises(ValueError, match="stayed_at_default"):
        evaluation.Tuned.load(path)


def test_only_runs_the_named_contenders() -> None:
    tuned = evaluation.Tuned({"ethernet": {"rtt_threshold": 70}}, "test")
    cfg = evaluation.EvalConfig(
        scenarios=("ethernet",), tuned=tuned, runs=3, only=("fusion-default", "fusion-tuned")
    )
    assert [c.name for c in cfg.contenders("ethernet")] == ["fusion-default", "fusion-tuned"]
    labels = [e["label"] for e in evaluation.build_plan(cfg)["experiments"]]
    assert len(labels) == 6 and not any("cubic" in label for label in labels)


def test_a_render_without_baselines_gives_no_verdict_instead_of_failing() -> None:
    tuned = evaluation.Tuned({"ethernet": {"rtt_threshold": 70}}, "test")
    cfg = evaluation.EvalConfig(
        scenarios=("ethernet",), tuned=tuned, runs=1, only=("fusion-default", "fusion-tuned")
    )
    results = _results("ethernet", {"fusion-default": [_flow(13.0)], "fusion-tuned": [_flow(13.5)]})
    text = evaluation.render(results, cfg, "cmd")
    assert "No baseline measured in these runs: no verdict." in text
    assert "| fusion-tuned | 1 | 13.50 |" in text
