"""The shipped link scenarios load, say what they are, and a bad one is refused by name.

Table IV's three paths and the team's own (item 4 of the outcome issue): each file's
description must agree with its fields (the reports print the description), and a trace
scenario's schedule must be the trace it names, repeating from its first bin."""

from __future__ import annotations

import re

import pytest

from gemini_lab import scenario

SHIPPED = sorted(p.stem for p in scenario.SCENARIO_DIR.glob("*.toml"))
TABLE_IV = {"ethernet", "satellite", "cellular"}
OWN_PATHS = {"long-lossy", "deep-buffer", "shallow-buffer", "cellular-verizon"}


def test_table_iv_and_the_teams_own_paths_are_shipped() -> None:
    assert set(SHIPPED) >= TABLE_IV | OWN_PATHS


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_scenario_loads_and_its_description_matches_its_fields(name: str) -> None:
    s = scenario.load(name)
    assert s.name == name
    assert f"{s.rtt_ms:g} ms" in s.description
    if s.rate_mbit is not None:
        assert f"{s.rate_mbit:g} Mbit/s" in s.description
    if s.loss_percent:
        assert f"{s.loss_percent:g} %" in s.description
    if s.queue_packets is not None:
        assert f"{s.queue_packets} packets" in s.description
    assert s.queue_limit() >= 1


@pytest.mark.parametrize("name", [n for n in SHIPPED if scenario.load(n).rate_trace])
def test_a_trace_scenario_replays_a_cellular_rate_schedule(name: str) -> None:
    rows = scenario.load(name).schedule()
    starts = [t for t, _ in rows]
    assert starts == sorted(starts) and starts[0] == 0
    assert len(rows) > 100  # a minute or more of the recording, not a stub
    rates = {r for _, r in rows}
    assert len(rates) > 10 and min(rates) >= scenario.MIN_RATE_KBIT


def test_the_two_cellular_traces_are_different_recordings() -> None:
    tmobile, verizon = scenario.load("cellular"), scenario.load("cellular-verizon")
    assert tmobile.schedule() != verizon.schedule()
    assert verizon.mean_rate_kbit < tmobile.mean_rate_kbit / 2


def test_an_unknown_scenario_is_refused_with_the_shipped_names() -> None:
    with pytest.raises(scenario.ScenarioError, match=re.escape("shipped: cellular,")):
        scenario.load("no-such-path")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"rate_mbit": 10, "rate_trace": "x.csv", "queue_bdp": 1}, "rate_mbit and rate_trace"),
        ({"rate_mbit": 10}, "queue_bdp and queue_packets"),
        ({"rate_mbit": 10, "queue_bdp": 1, "loss_percent": 100}, "loss_percent"),
        ({"rate_mbit": 10, "queue_bdp": 1, "rtt_ms": 0}, "rtt_ms"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_field(fields: dict, named: str) -> None:
    with pytest.raises(scenario.ScenarioError, match=named):
        scenario.Scenario(**{"name": "bad", "description": "", "rtt_ms": 10, **fields})


def test_a_file_with_an_unknown_field_is_refused_naming_the_file(tmp_path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text('name = "typo"\ndescription = ""\nrtt_ms = 10\nrate_mbt = 5\n')
    with pytest.raises(scenario.ScenarioError, match=re.escape("typo.toml")):
        scenario.load(str(path))
