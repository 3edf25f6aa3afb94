"""The ECN-capable lab (issue #31, item 4): a queue that marks from K packets, DCTCP on both
ends, paths of several hops.

The first tests read the tc commands a path is built with (no lab needed). The lab tests boot
the UML guest (gemini_lab.uml) on the shipped datacenter paths and check, in its kernel:
ECN is negotiated end to end for a dctcp flow; RED marks nothing while a flow's queue stays
below K and marks once it passes K; a dctcp flow holds the queue near K where cubic without
ECN fills the buffer; a cross-datacenter path of two hops carries a flow through both.
Figures come from the guest's simulated clock, not the host's.
"""

from __future__ import annotations

import pytest

from gemini_lab import ecn, netem, scenario
from gemini_lab.scenario import Link
from tests.labkit import healthy_uml_run

WIRE = netem.WIRE_PACKET_BYTES


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_a_marking_link_is_red_from_k_to_k_plus_one_packets_with_ecn_and_no_early_drops() -> None:
    link = Link(rate_kbit=100_000, queue_limit=100, ecn_threshold_packets=20, burst_packets=2)
    tbf, red = netem.link_qdisc_commands("path0", link)
    assert tbf[:9] == ["tc", "qdisc", "add", "dev", "path0", "root", "handle", "1:", "tbf"]
    assert _arg(tbf, "burst") == str(2 * WIRE) and _arg(tbf, "rate") == "100000kbit"
    assert red[:10] == [
        *("tc", "qdisc", "add", "dev", "path0", "parent", "1:1", "handle", "10:", "red")
    ]
    assert int(_arg(red, "min")) == 20 * WIRE and int(_arg(red, "max")) == 21 * WIRE
    assert int(_arg(red, "limit")) == 100 * WIRE and int(_arg(red, "avpkt")) == WIRE
    assert float(_arg(red, "probability")) == 1.0
    # burst K: the least tc takes (>= min / avpkt), the least averaging (weight 1/2)
    assert _arg(red, "burst") == "20"
    assert red[-2:] == ["ecn", "nodrop"] and "harddrop" not in red


def test_a_path_without_ecn_is_built_as_before() -> None:
    """The single-link scenarios keep their tbf + netem, argument for argument."""
    for name in ("ethernet", "satellite", "long-lossy", "cellular", "deep-buffer"):
        s = scenario.load(name)
        (link,) = s.links()
        tbf, queue = netem.link_qdisc_commands("path1", link)
        rate = s.schedule()[0][1]
        assert tbf[9:] == netem.tbf_args(rate)
        assert queue[9:] == ["netem", *netem.bottleneck_args(s)]
        assert _arg(queue, "limit") == str(s.queue_limit())


def test_the_tbf_burst_of_a_dc_path_is_its_burst_packets_and_else_two_milliseconds() -> None:
    assert _arg(netem.tbf_args(100_000, 2), "burst") == str(2 * WIRE)
    assert _arg(netem.tbf_args(100_000), "burst") == str(25_000)  # 2 ms at 100 Mbit/s
    assert _arg(netem.tbf_args(1_000), "burst") == str(netem.TBF_BURST_MIN_BYTES)


def test_each_hop_is_shaped_at_its_sending_end_and_the_receiver_keeps_its_address() -> None:
    s = scenario.load("cross-dc")
    assert len(s.links()) == 2
    assert netem.link_device(3, 0) == (netem.ROUTER_NS, "path3")
    assert netem.link_device(3, 1) == (netem.hop_ns(3, 1), "p3h1")
    # the last hop is the receiver's /24, as on a one-link path
    assert netem._link_addr(3, 1, 2, 2) == netem.receiver_addr(3)
    assert netem._link_addr(3, 0, 1, 2) == netem.receiver_addr(3)
    assert netem._link_addr(3, 0, 2, 1) == "10.4.1.1"
    dc, wan = (netem.link_qdisc_commands("x", link) for link in s.links())
    assert dc[1][9] == "red" and wan[1][9] == "netem"
    assert _arg(wan[1], "limit") == "10000"


# --- in the UML lab -------------------------------------------------------------------------

DC_RATE_MBIT = 100
GOODPUT = 1448 / 1514  # payload per wire byte of a full-sized segment with timestamps


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    plan = ecn.ecn_plan()
    return {**healthy_uml_run(plan, tmp_path_factory.mktemp("ecn")), "plan": plan}


def _flow(lab: dict, label: str) -> dict:
    res = lab["experiments"][label]
    assert "error" not in res, res["error"]
    return res


def _ss_value(text: str, name: str) -> int:
    """A ``name:value`` figure of ``ss -i`` output."""
    found = [w.split(":", 1)[1] for w in text.split() if w.startswith(f"{name}:")]
    assert found, f"no {name} in {text!r}"
    return int(found[0])


@pytest.mark.lab
@pytest.mark.slow
def test_ecn_is_negotiated_end_to_end_for_a_dctcp_flow(lab) -> None:
    r = _flow(lab, "datacenter/dctcp")
    sender, receiver = r["ss"]["sender"], r["ss"]["receiver"]
    # dctcp drops to its fallback (dctcp-reno, no ECT) on a connection without ECN: on both
    # ends it runs its own ECN state, and the sender has seen marks echoed
    for end in (sender, receiver):
        assert "dctcp:(ce_state" in end and "fallback_mode" not in end, end
    assert _ss_value(sender, "delivered_ce") > 0, sender
    # every data packet arrives ECN-capable, the marked ones CE, and their echo reaches the
    # sender's DCTCP (delivered CE counts marks acknowledged with ECE)
    got, sent = r["netstat"]["receiver"], r["netstat"]["sender"]
    assert got["InECT0Pkts"] + got["InCEPkts"] > 0 and got["InNoECTPkts"] < got["InECT0Pkts"]
    assert got["InCEPkts"] > 0 and sent["TCPDeliveredCE"] > 0
    # every mark the queue made arrived as CE and was echoed back to the sender
    assert r["queues"]["0"]["marked"] == got["InCEPkts"] == sent["TCPDeliveredCE"]
    # cubic asks for no ECN: the receiver's dctcp falls back, nothing ECN-capable arrives,
    # nothing is marked
    c = _flow(lab, "datacenter/cubic")
    assert "dctcp:fallback_mode" in c["ss"]["receiver"], c["ss"]["receiver"]
    assert "delivered_ce" not in c["ss"]["sender"], c["ss"]["sender"]
    assert c["netstat"]["receiver"]["InECT0Pkts"] == 0 and c["queues"]["0"]["marked"] == 0


@pytest.mark.lab
@pytest.mark.slow
def test_the_queue_marks_from_k_packets(lab) -> None:
    """Receive windows that stand the queue a few packets below K and a few above it: below, not
    one mark once the flow has left slow start; above, marks. (Above, dctcp holds the queue
    near K by itself before the window binds: seen max 23-24 packets, as the unclamped flow.)"""
    k = lab["plan"]["k"]
    below = _flow(lab, "datacenter/dctcp-below-k")["queues"]["0"]
    above = _flow(lab, "datacenter/dctcp-above-k")["queues"]["0"]
    assert below["samples"] > 20 and above["samples"] > 20
    assert below["mean_qlen"] > 0 and below["max_qlen"] < k, below["max_qlen"]
    # from the end of slow start (whose bursts may pass K for an instant: one mark in one run)
    assert below["steady_marked"] == 0 and below["drops"] == 0
    assert above["max_qlen"] >= k and above["steady_marked"] > 0, above
    assert above["drops"] == 0


@pytest.mark.lab
@pytest.mark.slow
def test_dctcp_holds_the_queue_near_k_where_cubic_without_ecn_fills_the_buffer(lab) -> None:
    k = lab["plan"]["k"]
    limit = scenario.load("datacenter").queue_limit()
    d = _flow(lab, "datacenter/dctcp")
    c = _flow(lab, "datacenter/cubic")
    dq, cq = d["queues"]["0"], c["queues"]["0"]
    assert dq["mean_qlen"] <= 2 * k, dq["mean_qlen"]
    assert dq["drops"] == 0
    # the queue, not the link, gives way: both flows keep the link full
    for r in (d, c):
        assert r["throughput_mbps"] >= 0.9 * DC_RATE_MBIT * GOODPUT, r["throughput_mbps"]
    # cubic's packets are not ECN-capable: no marks and no early drops (RED's nodrop), only
    # tail drops once the buffer is full
    assert cq["marked"] == 0 and cq["early"] == 0 and cq["drops"] > 0
    assert cq["max_qlen"] >= 0.9 * limit and cq["mean_qlen"] >= 3 * k, cq["mean_qlen"]


@pytest.mark.lab
@pytest.mark.slow
def test_a_cross_dc_flow_crosses_the_marking_dc_hop_and_queues_at_the_slower_wan_hop(lab) -> None:
    path = scenario.load("cross-dc")
    wan = path.hops[1]
    r = _flow(lab, "cross-dc/cubic")
    assert r["min_rtt_ms"] == pytest.approx(path.rtt_ms, rel=0.05)
    # slow start on a 100 ms path is a good part of a 12 s flow (seen: 73 of 77 Mbit/s)
    assert r["throughput_mbps"] >= 0.8 * wan.rate_mbit * GOODPUT, r["throughput_mbps"]
    q_dc, q_wan = r["queues"]["0"], r["queues"]["1"]
    # every packet went through both hops
    assert q_dc["packets"] > 0 and q_wan["packets"] >= 0.95 * q_dc["packets"]
    # the WAN hop is the bottleneck: its queue stands, where nothing marks
    assert q_wan["mean_qlen"] > q_dc["mean_qlen"]


@pytest.mark.lab
@pytest.mark.slow
def test_an_incast_of_many_short_flows_completes_through_the_marking_queue(lab) -> None:
    """40 flows of 25 KB, all writing at once into a 57-packet port: every flow completes;
    dctcp's packets are marked there, cubic's only dropped."""
    d, c = _flow(lab, "dc-incast/dctcp"), _flow(lab, "dc-incast/cubic")
    for r in (d, c):
        assert r["completed"] == r["flows"] == ecn.INCAST_FLOWS, r["failures"]
        assert r["fct_ms_max"] >= ecn.INCAST_BYTES * 8 / (DC_RATE_MBIT * 1000)  # >= 80 ms
    assert d["queue"]["marked"] > 0
    assert c["queue"]["marked"] == 0 and c["queue"]["drops"] > 0
