"""`gemini-lab tune` for real, briefly: Booster here on real PostgreSQL, the agent and tcp_fusion
in the guest kernel, fusion flows over the ethernet scenario, all seven parameters of θ searched
in Θ. What the run shows about how good the tuned θ is, is a figure (benchmarks/results/tune.md),
not asserted here; asserted is that the loop searched what it says and recorded it."""

from __future__ import annotations

import json

import pytest

from gemini_agent.table import CATCH_ALL
from gemini_api.theta import load_spec
from gemini_lab.loop import LoopConfig
from gemini_lab.tune import RECORD_MD, format_theta, run_tune
from tests.conftest import AGENT, free_port, make_settings, new_database
from tests.labkit import guest_kernel

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SCENARIO = "ethernet"
REGION = "production"
PATH_PREFIX = "10.1.0.0/16"  # the ethernet scenario's receiver network
SEARCH_ROUNDS = 8
EVAL_ROUNDS = 2
DEFAULT_ROUNDS = 2


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, pg_admin_url):
    guest_kernel()
    db_url = new_database(pg_admin_url)
    cfg = LoopConfig(
        search_reports=SEARCH_ROUNDS,
        eval_reports=EVAL_ROUNDS,
        n_initial_points=5,
        default_reports=DEFAULT_ROUNDS,
        staleness_s=12,
        duration_s=1800,  # a stall guard only: the host ends the run; a busy host takes longer
    )
    out = tmp_path_factory.mktemp("tune")
    result = run_tune(
        lambda listen: make_settings(db_url, grpc_listen=listen, refit_interval_s=2),
        free_port(),
        AGENT,
        out,
        [SCENARIO],
        REGION,
        cfg,
        command="pytest tests/test_lab_tune.py",
    )
    return result, out


def _proposals(result) -> list[dict[str, int]]:
    """Every θ Booster published for the context: candidates and incumbents."""
    plans = [p for p in result.plans if p["region"] == SCENARIO]
    return [t for p in plans for t in (*p["candidates"], p["incumbent"])]


def test_the_agent_and_its_flows_ran(tuned):
    result, _ = tuned
    agent = result.guest["experiments"]["tune"]
    assert "error" not in agent, agent.get("error")
    assert result.guest["kernel_problems"] == []
    assert result.duplicate_ids == 0


def test_proposals_cover_all_seven_parameters(tuned):
    """Each parameter takes more than one value across Booster's proposals: none is held."""
    result, _ = tuned
    proposals = _proposals(result)
    for name in load_spec().names:
        assert len({t[name] for t in proposals}) > 1, (name, proposals)


def test_proposals_stay_inside_the_region(tuned):
    result, _ = tuned
    bounds = load_spec().region_bounds(REGION)
    proposals = _proposals(result)
    assert proposals
    for theta in proposals:
        for name, (low, high) in bounds.items():
            assert low <= theta[name] <= high, (name, theta)


def test_flows_ran_with_the_proposed_theta(tuned):
    """The θ of the kernel's flow records, as the agent reported them, are Booster's proposals
    (or the default, before the first plan reached the host), and several of them ran; at the
    end the kernel's profile for the path (its prefix's rule, or the catch-all's when its θ is
    the table's default) is an incumbent Booster published."""
    result, _ = tuned
    spec = load_spec()
    proposed = {spec.key(t) for t in _proposals(result)}
    ran = {spec.key({n: t[n] for n in spec.names}) for t in result.trials[SCENARIO]}
    assert ran - proposed <= {spec.key(spec.default())}, ran - proposed
    assert len(ran & proposed) >= 3, (ran, proposed)
    table = result.guest["experiments"]["tune"]["table"]
    rules = dict(table["rules"])
    # a context whose θ is the table's default runs on the catch-all and has no rule of its own
    profile = rules.get(PATH_PREFIX, rules[CATCH_ALL[4]])
    installed = table["profiles"][str(profile)]
    incumbents = {spec.key(p["incumbent"]) for p in result.plans if p["region"] == SCENARIO}
    assert spec.key(installed) in incumbents, installed


def test_the_record_has_every_round_and_the_tuned_theta(tuned):
    result, out = tuned
    record = json.loads((out / "tune.json").read_text())
    rounds = record["round_log"][SCENARIO]
    assert [r["round"] for r in rounds] == list(range(1, len(rounds) + 1))
    # a round is a report with flows of the context: all but perhaps the first (flows start
    # a few seconds after the agent) and the last (the agent stops mid-interval)
    assert record["reports"] - 2 <= len(rounds) <= record["reports"], record["reports"]
    assert len(rounds) >= SEARCH_ROUNDS + EVAL_ROUNDS + DEFAULT_ROUNDS
    assert all(isinstance(r["utility"], float) for r in rounds)
    assert rounds[-1]["incumbent"] is not None
    assert {r["phase"] for r in rounds} >= {"search", "evaluation", "default"}
    tuned_theta = record["tuned"][SCENARIO]
    assert set(tuned_theta) == set(load_spec().names)
    assert set(record["incumbents"][SCENARIO]) == set(load_spec().names)
    assert len(record["evaluation"][SCENARIO]) >= 1
    assert len(record["default"][SCENARIO]) >= 1
    text = (out / RECORD_MD).read_text()
    assert format_theta(tuned_theta) in text
    assert text.count("\n| ") >= len(rounds) + 2, text
    assert result.plot is not None and result.plot.stat().st_size > 10_000
