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

from gemini_lab import netem, scenario
from gemini_lab.scenario import Link

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
