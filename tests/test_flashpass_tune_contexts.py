"""FlashPass tuned with each development seed its own context (``gemini_lab.flashpass.tune
--seed-contexts``, issue #36): the contexts, the boot's runs, which context each run's flows
land in, and the held-out context's θ in tuned.json. Unit tier: the boot is faked (a run's
flow records written at its θ), no guest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemini_lab.flashpass import evaluate, tune
from gemini_lab.plannertune import context_key

PAPER = dict(evaluate.THETA)


def fake_boot(level: dict[int, float], calls: list[dict]):
    """``run_in_uml`` that writes each run's flow records at its θ, 2 flows each, the
    throughput set by the run's seed (``level``: the seed's Mbit/s) as the label names it."""

    def run(cmd: str, out: Path, timeout_s: float) -> None:
        plan = json.loads((out / "plan.json").read_text())
        calls.append({"out": out, "timeout_s": timeout_s, "plan": plan})
        for i, r in enumerate(plan["runs"]):
            seed = int(r["host"].split("/")[0].removeprefix("seed"))
            mbps = level[seed]
            recs = [
                {"flow": f, "bytes_delivered": int(mbps * 1e6 / 8), "duration_us": 1_000_000,
                 "rtt_avg_us": 31_000, "rtt_min_us": 30_000, "retransmits": 0,
                 "theta": r["theta"]}
                for f in (1, 2)
            ]  # fmt: skip
            (out / f"run{i}").mkdir(parents=True, exist_ok=True)
            lines = "\n".join(json.dumps(x) for x in recs)
            (out / f"run{i}" / "flashpass.flows").write_text(lines + "\n")

    return run


def test_the_default_protocol_is_one_context() -> None:
    cfg = tune.config(workload="fctmix")
    assert cfg.scenarios == ("flashpass-fctmix",)
    assert tune.context_seeds(cfg) == {} and tune.held_out_context(cfg) is None


def test_each_dev_seed_is_its_own_context_beside_a_held_out_one() -> None:
    cfg = tune.config(workload="fctmix", seed_contexts=True)
    assert cfg.scenarios == (
        "flashpass-fctmix-seed1", "flashpass-fctmix-seed2", "flashpass-fctmix-seed3",
        "flashpass-fctmix-new",
    )  # fmt: skip
    assert tune.context_seeds(cfg) == {1: 1, 2: 2, 3: 3}
    assert tune.held_out_context(cfg) == 4
    regions = {context_key(n).dst_region for n in cfg.scenarios}
    assert len(regions) == 4  # each its own destination region: no seed is another's drift
    assert cfg.start() == PAPER


def test_a_round_runs_every_seed_contexts_hosts_on_its_own_seed() -> None:
    other = {"min_target_loss": 20, "max_target_loss": 200, "t_wait": 800}
    runs = {1: {"h0": PAPER, "h1": other}, 2: {"h0": other}, 3: {"h0": PAPER}}
    plan, order = tune.contexts_round_plan(runs, {1: 1, 2: 2, 3: 3})
    assert order == [(1, "h0"), (1, "h1"), (2, "h0"), (3, "h0")]
    assert [r["host"] for r in plan["runs"]] == ["seed1/h0", "seed1/h1", "seed2/h0", "seed3/h0"]
    assert [r["theta"] for r in plan["runs"]] == [PAPER, other, other, PAPER]
    for (c, _), r in zip(order, plan["runs"], strict=True):  # context c runs seed c's draw
        assert r == tune.base_run(c) | {"theta": r["theta"], "host": r["host"]}


def test_the_tuning_puts_each_seeds_flows_in_its_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict] = []
    level = {1: 8.0, 2: 4.0, 3: 2.0}
    monkeypatch.setattr(tune, "run_in_uml", fake_boot(level, calls))
    cfg = tune.config(rounds=2, hosts=3, explorers=2, seed_contexts=True)
    history = tune.tune(cfg, tmp_path)
    assert len(calls) == 2  # one boot a round, every seed context in it
    assert all(len(c["plan"]["runs"]) == 9 for c in calls)
    assert calls[0]["timeout_s"] == tune.ROUND_TIMEOUT_S * 3
    assert set(history) == set(cfg.scenarios)
    for name, seed in zip(cfg.scenarios, (1, 2, 3), strict=False):
        rows = history[name]
        assert [r["round"] for r in rows] == [0, 1, 2]
        assert all(len(r["runs"]) == 3 for r in rows[:-1])
        assert all(x["mbps"] == pytest.approx(level[seed]) for r in rows[:-1] for x in r["runs"])
    held_out = history["flashpass-dev-new"]
    assert [r["runs"] for r in held_out[:-1]] == [[], []]  # planned, never run
    assert held_out[-1]["incumbent"] == PAPER  # no fleet θ beat the paper's: it is served
    saved = json.loads((tmp_path / "history.json").read_text())
    assert saved == history


def test_trials_land_in_the_context_of_their_seed(tmp_path: Path) -> None:
    cfg = tune.config(rounds=1, seed_contexts=True)
    tuner = tune.Tuner(cfg)
    plans = tuner.plan(0)
    runs = {c: plans[c][1] for c in tune.context_seeds(cfg)}
    plan, order = tune.contexts_round_plan(runs, tune.context_seeds(cfg))
    fake_boot({1: 8.0, 2: 4.0, 3: 2.0}, [])("", _with_plan(tmp_path, plan), 1)
    rows = tune.observe_contexts(tuner, 0, runs, order, tmp_path)
    assert set(rows) == {1, 2, 3}
    by_context: dict[int, set[float]] = {}
    for t in tuner.trials:
        by_context.setdefault(t.context_id, set()).add(round(t.sums.mean_throughput, 6))
    assert by_context == {1: {8.0}, 2: {4.0}, 3: {2.0}}  # the held-out context has no trial
    assert sum(t.sums.flow_count for t in tuner.trials) == 2 * 9


def _with_plan(out: Path, plan: dict) -> Path:
    (out / "plan.json").write_text(json.dumps(plan))
    return out


def test_tuned_json_holds_the_held_out_contexts_theta_alone(tmp_path: Path) -> None:
    cfg = tune.config(rounds=1, seed_contexts=True)
    other = {"min_target_loss": 20, "max_target_loss": 200, "t_wait": 800}
    history = {n: [{"round": 1, "incumbent": other}] for n in cfg.scenarios}
    history["flashpass-dev-new"] = [{"round": 1, "incumbent": PAPER}]
    path = tmp_path / "tuned.json"
    tune.write_tuned_contexts(history, cfg, "python -m gemini_lab.flashpass.tune x", path)
    data = json.loads(path.read_text())
    (theta,) = data["theta"].values()  # as flashpass.compare --tuned reads it
    assert theta == PAPER
    assert data["seed_contexts"] == {n: other for n in cfg.scenarios[:3]}
