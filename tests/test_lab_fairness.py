"""Two flows through one shared bottleneck in the UML lab (gemini_lab.fairness): the mechanics
that host load cannot change. Both flows cross the same queue (their sum is the link's goodput,
never more, and each gets a share), each has its own round-trip time, and the fairness and
friendliness ratios are computed from the receivers' counts of those flows' bytes. No figure
of fairness itself is asserted: those are measurements (benchmarks/results/fairness.md).

The UML part needs Debian's linux-source-6.1, flex and bison (lab/install-deps.sh); it skips
with the lab's reason when they are missing."""

from __future__ import annotations

import pytest

from gemini_lab import fairness
from tests.labkit import healthy_uml_run

RATE_MBIT = 20.0
DURATION_S = 8
OMIT_S = 2
BASE_RTT_MS, LONG_RTT_MS = 10.0, 40.0
# the flows' sum against the link's goodput: above this the link was shared and filled ...
FILLED = 0.85
# ... and never above the link (two separate bottlenecks would give up to twice it)
AT_MOST = 1.02
RTT_SLACK_MS = 2.0  # the kernel's minimum RTT over the configured delay (veth, timers)


def _pairs() -> list[dict]:
    cubic = fairness.Contender("cubic", "cubic", {})
    tuned = fairness.Contender("fusion-tuned", "fusion", {"mult_decrease": 61, "init_cwnd": 11})
    rtt = fairness.rtt_plan([cubic], (LONG_RTT_MS,), (1.0,), RATE_MBIT, DURATION_S, OMIT_S)
    setting = fairness.Setting(RATE_MBIT, 30.0, 2.0)
    friendly = fairness.friendliness_plan([tuned], [setting], DURATION_S, OMIT_S)
    return rtt + friendly


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    plan = {"paths": [], "experiments": _pairs()}
    return healthy_uml_run(plan, tmp_path_factory.mktemp("fairness"))


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.parametrize("label", [p["label"] for p in _pairs()])
def test_both_flows_share_one_bottleneck(results, label):
    pair = results["experiments"][label]
    assert "error" not in pair, pair.get("error")
    a, b = pair["flows"]
    assert a["throughput_mbps"] > 0 and b["throughput_mbps"] > 0
    assert a["ports"] != b["ports"]
    capacity = fairness.goodput_capacity_mbps(pair)
    total = a["throughput_mbps"] + b["throughput_mbps"]
    assert FILLED * capacity <= total <= AT_MOST * capacity, (total, capacity)


@pytest.mark.lab
@pytest.mark.slow
def test_each_flow_has_its_own_round_trip_time(results):
    pair = results["experiments"][f"rtt/cubic/buf1/x{LONG_RTT_MS:g}"]
    for flow, rtt in zip(pair["flows"], (BASE_RTT_MS, LONG_RTT_MS), strict=True):
        assert flow["rtt_ms"] == rtt
        assert rtt <= flow["min_rtt_ms"] <= rtt + RTT_SLACK_MS, flow


@pytest.mark.lab
@pytest.mark.slow
def test_ratios_come_from_the_flows_bytes(results):
    rtt_pair = results["experiments"][f"rtt/cubic/buf1/x{LONG_RTT_MS:g}"]
    base, long = rtt_pair["flows"]
    window_s = DURATION_S - OMIT_S
    for flow in (base, long):  # throughput is the receiver's bytes in the counted window
        assert flow["throughput_mbps"] * 1e6 / 8 * window_s <= flow["bytes_received"]
    assert fairness.fairness_ratio(rtt_pair) == base["throughput_mbps"] / long["throughput_mbps"]
    friendly = results["experiments"]["friendly/fusion-tuned/0"]
    ours, cubic = friendly["flows"]
    assert (ours["cc_in_kernel"], cubic["cc_in_kernel"]) == ("fusion", "cubic")
    ideal = RATE_MBIT * fairness.GOODPUT_SHARE / 2
    assert fairness.friendliness_ratio(friendly) == pytest.approx(ours["throughput_mbps"] / ideal)
    assert fairness.friendliness_ratios(results) == {
        "fusion-tuned": [fairness.friendliness_ratio(friendly)]
    }


@pytest.mark.lab
@pytest.mark.slow
def test_the_kernel_stayed_healthy(results):
    assert results["backend"] == "uml"
    assert results["insmod"]["rc"] == 0 and results["rmmod"]["rc"] == 0


def test_random_settings_are_seeded_and_inside_fig_8s_ranges():
    settings = fairness.random_settings(50, seed=3)
    assert settings == fairness.random_settings(50, seed=3)
    assert settings != fairness.random_settings(50, seed=4)
    for s in settings:
        assert 1 <= s.rate_mbit <= 50 and 2 <= s.rtt_ms <= 100 and 0.5 <= s.buffer_bdp <= 5


def test_rtt_buffers_are_bdps_of_the_base_rtt():
    cubic = fairness.Contender("cubic", "cubic", {})
    (pair,) = fairness.rtt_plan([cubic], (80.0,), (2.0,), 100.0, 20, 5)
    # 100 Mbit/s x 10 ms = 83.3 packets of 1500 bytes; two BDPs
    assert pair["queue_packets"] == 167
    assert [f["rtt_ms"] for f in pair["flows"]] == [10.0, 80.0]
    assert fairness.queue_packets(1.0, 2.0, 0.5) == fairness.MIN_QUEUE_PACKETS


def _ran(pair: dict, tpts: list[float]) -> dict:
    """A plan's pair as the guest returns it, with these throughputs."""
    flows = [{**f, "throughput_mbps": t} for f, t in zip(pair["flows"], tpts, strict=True)]
    return {"rate_kbit": pair["rate_kbit"], "queue_packets": pair["queue_packets"], "flows": flows}


def test_ratios_follow_the_marked_flow_in_either_position():
    cubic = fairness.Contender("cubic", "cubic", {})
    (first,) = fairness.rtt_plan([cubic], (40.0,), (1.0,), 20.0, 8, 2, "first")
    (second,) = fairness.rtt_plan([cubic], (40.0,), (1.0,), 20.0, 8, 2, "second")
    assert [f["rtt_ms"] for f in second["flows"]] == [40.0, 10.0]
    assert fairness.fairness_ratio(_ran(first, [12.0, 6.0])) == 2.0
    assert fairness.fairness_ratio(_ran(second, [6.0, 12.0])) == 2.0
    runs = {
        "experiments": {first["label"]: _ran(first, [8, 2]), second["label"]: _ran(second, [4, 4])}
    }
    both = fairness.rtt_table(runs, [cubic], (40.0,), (1.0,), "both")
    assert both.splitlines()[-1].startswith("| cubic | 1 | 2.00 |")  # √(4 · 1)
    setting = fairness.Setting(20.0, 30.0, 2.0)
    bbr = fairness.Contender("bbr", "bbr", {})
    (a,) = fairness.friendliness_plan([bbr], [setting], 8, 2, "first")
    (b,) = fairness.friendliness_plan([bbr], [setting], 8, 2, "second")
    assert [f["cc"] for f in b["flows"]] == ["cubic", "bbr"]
    ideal = 20.0 * fairness.GOODPUT_SHARE / 2
    assert fairness.friendliness_ratio(_ran(a, [ideal, 1.0])) == pytest.approx(1.0)
    assert fairness.friendliness_ratio(_ran(b, [1.0, ideal / 2])) == pytest.approx(0.5)
    results = {"experiments": {a["label"]: _ran(a, [ideal, 1.0]), b["label"]: _ran(b, [1, ideal])}}
    assert fairness.both_positions(results) == {"bbr": {0: pytest.approx(1.0)}}
