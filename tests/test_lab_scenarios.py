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
    with pytest.raises(scenario.ScenarioError, match=re.escape("shipped: " + ", ".join(SHIPPED))):
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


# Issue #31, item 4: ECN marking, receivers' CC and multi-hop paths.
ECN_PATHS = {"datacenter", "cross-dc", "dc-incast"}


def test_the_ecn_capable_paths_are_shipped() -> None:
    assert set(SHIPPED) >= ECN_PATHS
    for name in ECN_PATHS:
        s = scenario.load(name)
        assert s.receiver_cc == "dctcp", name
        assert any(link.ecn_threshold_packets for link in s.links()), name


@pytest.mark.parametrize("name", sorted(ECN_PATHS))
def test_an_ecn_path_says_where_it_marks(name: str) -> None:
    s = scenario.load(name)
    for link in s.links():
        if link.ecn_threshold_packets:
            assert f"ECN at {link.ecn_threshold_packets} packets" in s.description
        assert f"{link.queue_limit} packets" in s.description
        assert f"{link.rate_kbit / 1000:g} Mbit/s" in s.description
        assert link.burst_packets is None or link.burst_packets <= link.queue_limit


def test_the_datacenter_path_is_the_scaled_rack() -> None:
    """Rates / 10, times x 10 (DATAPATHS-SPEC.md 0.3): 100 Mbit/s, 2 ms, a shallow buffer of
    a few BDPs, K above DCTCP's C x RTT / 7 and the shaper's burst well below the RTT."""
    s = scenario.load("datacenter")
    (link,) = s.links()
    assert link.rate_kbit == 100_000 and s.rtt_ms == 2
    k = link.ecn_threshold_packets
    assert k is not None and s.bdp_packets() / 7 < k < link.queue_limit <= 10 * s.bdp_packets()
    assert link.burst_packets == 2


def test_the_cross_dc_path_is_a_marking_dc_hop_then_a_deep_wan_hop() -> None:
    s = scenario.load("cross-dc")
    dc, wan = s.hops
    assert dc.ecn_threshold_packets and wan.ecn_threshold_packets is None
    assert s.rtt_ms == 2 * (dc.delay_ms + wan.delay_ms) == 100
    assert wan.queue_packets and dc.queue_packets and wan.queue_packets > 10 * dc.queue_packets
    # the WAN is the slower hop: the path's rate and queue are its
    assert s.bottleneck() is wan and s.queue_limit() == wan.queue_packets
    assert s.schedule() == [(0.0, int(wan.rate_mbit * 1000))]


def test_a_multi_hop_path_survives_a_plan_round_trip() -> None:
    """The host writes a path into the plan as JSON; the guest builds it from the dict."""
    import json

    s = scenario.load("cross-dc")
    again = scenario.Scenario(**json.loads(json.dumps(s.to_dict())))
    assert again == s and again.links() == s.links()


def test_a_queue_in_bdps_on_a_hop_counts_the_hops_rate_and_the_paths_rtt() -> None:
    s = scenario.Scenario(
        name="two",
        description="",
        rtt_ms=20,
        hops=(
            scenario.Hop(rate_mbit=12, delay_ms=4, queue_bdp=1.0),
            scenario.Hop(rate_mbit=24, delay_ms=6, queue_bdp=2.0),
        ),
    )
    # 12 Mbit/s x 20 ms = 20 packets; 24 Mbit/s x 20 ms = 40, twice over
    assert [link.queue_limit for link in s.links()] == [20, 80]
    assert s.queue_limit() == 20 and s.bottleneck() is s.hops[0]


HOP = {"rate_mbit": 100, "delay_ms": 1, "queue_packets": 50}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"rate_mbit": 10, "queue_packets": 20, "ecn_threshold_packets": 20}, "must be below"),
        ({"rate_mbit": 10, "queue_bdp": 0.5, "ecn_threshold_packets": 40}, "must be below"),
        ({"rate_mbit": 10, "queue_packets": 20, "ecn_threshold_packets": 0}, "ecn_threshold_pa"),
        (
            {"rate_mbit": 10, "queue_packets": 20, "ecn_threshold_packets": 5, "loss_percent": 1},
            "put the random loss on another hop",
        ),
        ({"rate_mbit": 10, "queue_packets": 0}, "queue_packets must be >= 1"),
        ({"rate_mbit": 10, "queue_packets": 20, "burst_packets": 0}, "burst_packets"),
        ({"rate_mbit": 10, "queue_packets": 20, "receiver_cc": "DCTCP; rm"}, "receiver_cc"),
        ({"hops": [HOP], "rtt_ms": 3}, re.escape("rtt_ms (3) must be twice")),
        ({"hops": [HOP], "rtt_ms": 2, "rate_mbit": 10}, "rate_mbit belong to each hop"),
        ({"hops": [{**HOP, "rate": 5}], "rtt_ms": 2}, re.escape("hops[0]: unknown field(s) rate")),
        ({"hops": [HOP, {**HOP, "rate_mbit": 0}], "rtt_ms": 4}, re.escape("hops[1]: rate_mbit")),
        ({"hops": [{**HOP, "delay_ms": -1}, HOP], "rtt_ms": 0.1}, "delay_ms must be >= 0"),
        ({"hops": [{"rate_mbit": 10, "delay_ms": 1}], "rtt_ms": 2}, "hops.0.: give exactly"),
        (
            {"hops": [{**HOP, "ecn_threshold_packets": 50}], "rtt_ms": 2},
            re.escape("hops[0]: ecn_threshold_packets (50) must be below"),
        ),
        ({"hops": [{"delay_ms": 1, "queue_packets": 5}], "rtt_ms": 2}, "hops.0.: .*rate_mbit"),
        ({"hops": ["wan"], "rtt_ms": 2}, "a hop is a table"),
    ],
)
def test_a_bad_ecn_or_hop_field_is_refused_naming_it(fields: dict, named: str) -> None:
    with pytest.raises(scenario.ScenarioError, match=named):
        scenario.Scenario(**{"name": "bad", "description": "", "rtt_ms": 10, **fields})


def test_a_file_with_a_mistyped_hop_field_is_refused_naming_the_hop(tmp_path) -> None:
    path = tmp_path / "hops.toml"
    path.write_text(
        'name = "hops"\ndescription = ""\nrtt_ms = 2\n'
        "[[hops]]\nrate_mbit = 10\ndelay_ms = 1\nqueue_packts = 5\n"
    )
    with pytest.raises(scenario.ScenarioError, match=re.escape("hops[0]: unknown field(s)")):
        scenario.load(str(path))
