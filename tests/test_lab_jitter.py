"""Paths the Table IV set leaves out (issue #34): jitter that does not reorder, jitter that
does, ACKs in bursts, low-rate random loss; and trace capacity over a flow's own stretch.

The first tests read the scenario fields and the tc arguments they become (no lab needed). The
lab test boots the UML guest on a path of each kind of jitter, reads its qdiscs back from the
kernel, and runs a flow over each: without loss on either path, segments arrive out of order
only where the jitter reorders.
"""

from __future__ import annotations

import re

import pytest

from gemini_lab import netem, scenario
from gemini_lab.host import run_plan
from gemini_lab.scenario import Scenario, ScenarioError

NEW_PATHS = {"wifi-jitter", "lowrate-lossy", "wifi-aggregation", "jitter-reorder", "lowloss-wan"}


def _path(**fields: object) -> Scenario:
    base: dict = {
        "name": "p",
        "description": "",
        "rtt_ms": 20,
        "rate_mbit": 10,
        "queue_packets": 50,
    }
    return Scenario(**{**base, **fields})


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_new_kinds_of_path_are_shipped_and_say_what_they_are() -> None:
    shipped = {p.stem for p in scenario.SCENARIO_DIR.glob("*.toml")}
    assert shipped >= NEW_PATHS
    for name in NEW_PATHS:
        s = scenario.load(name)
        if s.jitter_ms:
            kind = "with reordering" if s.jitter_reorder else "without reordering"
            assert f"±{s.jitter_ms:g} ms jitter {kind}" in s.description, name
        if s.ack_burst_ms:
            assert f"ACKs in bursts every {s.ack_burst_ms:g} ms" in s.description, name
        assert s.loss_percent > 0, name  # each carries random loss at a low rate


def test_jitter_without_reordering_is_drawn_per_ack_on_the_return_path_in_order() -> None:
    s = _path(jitter_ms=5)
    line = netem.delay_line_args(s)
    assert line[:3] == ["delay", "20ms", "5ms"]  # uniform over 15..25 ms
    assert _arg(line, "rate") == netem.NO_REORDER_RATE  # each packet after the one before
    assert netem.bottleneck_args(s) == ["limit", "50"]  # the data path is as without jitter


def test_reordering_jitter_is_drawn_per_data_packet_at_the_bottleneck() -> None:
    s = _path(jitter_ms=4, jitter_reorder=True)
    assert netem.delay_line_args(s)[:2] == ["delay", "16ms"] and "rate" not in (
        netem.delay_line_args(s)
    )
    queue = netem.bottleneck_args(s)
    assert queue[queue.index("delay") :][:3] == ["delay", "4ms", "4ms"]  # 0..8 ms, no rate
    # the delay line's packets count against netem's limit: 10 Mbit/s x 8 ms = 7 packets more
    assert int(_arg(queue, "limit")) == 50 + 7
    assert s.queue_limit() == 50


def test_ack_bursts_are_netem_slots_of_fixed_length() -> None:
    line = netem.delay_line_args(_path(ack_burst_ms=4))
    assert line[line.index("slot") :] == ["slot", "4ms", "4ms"]


def test_a_path_without_the_new_fields_keeps_its_delay_line() -> None:
    for name in ("ethernet", "satellite", "cellular", "datacenter", "cross-dc"):
        s = scenario.load(name)
        assert netem.delay_line_args(s) == ["delay", f"{s.rtt_ms:g}ms", "limit", "100000"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"jitter_ms": -1}, "jitter_ms"),
        ({"jitter_ms": 25}, re.escape("jitter_ms must be in [0, rtt_ms = 20]")),
        ({"jitter_reorder": True}, "jitter_reorder needs jitter_ms"),
        ({"jitter_ms": 2, "jitter_reorder": "yes"}, "jitter_reorder must be true or false"),
        (
            {"jitter_ms": 2, "jitter_reorder": True, "ecn_threshold_packets": 10},
            "jitter_reorder draws at a single link",
        ),
        ({"ack_burst_ms": -2}, "ack_burst_ms"),
    ],
)
def test_a_bad_jitter_or_burst_field_is_refused_naming_it(fields: dict, named: str) -> None:
    with pytest.raises(ScenarioError, match=named):
        _path(**fields)


def test_a_trace_paths_capacity_is_the_mean_over_the_flows_own_stretch() -> None:
    s = scenario.load("cellular")
    rows = s.schedule()
    step = rows[1][0] - rows[0][0]
    first_two = (rows[0][1] + rows[1][1]) / 2
    assert s.capacity_kbit(0, 2 * step) == pytest.approx(first_two)
    period = rows[-1][0] + step
    # a stretch that runs past the schedule's end continues from its first bin
    wrap = (rows[-1][1] + rows[0][1]) / 2
    assert s.capacity_kbit(period - step, 2 * step) == pytest.approx(wrap)
    assert s.capacity_kbit(0, period) == pytest.approx(s.mean_rate_kbit)
    assert scenario.load("ethernet").capacity_kbit(3, 20) == 15_000


def _netem(qdiscs: list[dict]) -> dict:
    (q,) = [q for q in qdiscs if q["kind"] == "netem"]
    return q["options"]


def test_the_guest_applies_jitter_as_asked_and_only_reordering_jitter_reorders(tmp_path) -> None:
    """UML, two loss-free paths of 10 Mbit/s and 40 ms: ±8 ms in order with ACK bursts every
    4 ms, and ±8 ms reordering; a 4 s vegas flow over each, which keeps the deep queue from
    overflowing (about 70 s of wall time on a busy host)."""
    in_order = _path(name="in-order", rtt_ms=40, jitter_ms=8, ack_burst_ms=4, queue_packets=1000)
    reorder = _path(name="reorder", rtt_ms=40, jitter_ms=8, jitter_reorder=True, queue_packets=1000)
    plan = {
        "paths": [in_order.to_dict(), reorder.to_dict()],
        "experiments": [
            {"label": p, "kind": "path_check", "path": i, "cc": "vegas", "duration_s": 4}
            for i, p in enumerate(("in-order", "reorder"))
        ],
    }
    results = run_plan(plan, tmp_path, backend="uml")["experiments"]
    for label in ("in-order", "reorder"):
        assert "error" not in results[label], results[label].get("error")

    ret = _netem(results["in-order"]["qdiscs"]["return"])
    assert ret["delay"]["delay"] == pytest.approx(0.040) and ret["delay"][
        "jitter"
    ] == pytest.approx(0.008)
    assert ret["rate"]["rate"] > 0 and ret["slot"]["min-delay"] == pytest.approx(0.004)
    assert "delay" not in _netem(results["in-order"]["qdiscs"]["data"])  # data in order

    data = _netem(results["reorder"]["qdiscs"]["data"])
    assert data["delay"]["delay"] == pytest.approx(0.008) and data["delay"][
        "jitter"
    ] == pytest.approx(0.008)
    assert data["limit"] == 1000 + 14  # 10 Mbit/s x 16 ms of delay line more
    assert _netem(results["reorder"]["qdiscs"]["return"])["delay"]["delay"] == pytest.approx(0.032)

    for label in ("in-order", "reorder"):
        flow = results[label]["flow"]
        assert flow["throughput_mbps"] > 1, label
        assert 31.9 <= flow["min_rtt_ms"] < 40, label  # the draws reach below the RTT
    # no loss on the in-order path (a hole would count as out of order too), and no segment
    # out of order; on the other, reordering (and the stack's spurious retransmits with it)
    assert results["in-order"]["flow"]["retransmits"] == 0
    assert results["in-order"]["out_of_order"] == 0
    assert results["reorder"]["out_of_order"] > 100
