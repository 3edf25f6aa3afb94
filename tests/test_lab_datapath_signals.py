"""GEMINI and DC-Vegas react to their signals as their papers say (issue #31), in the UML lab.

One boot of the UML guest (gemini_lab.uml: simulated clock, so no figure here moves with host
load) runs gemini_lab.datapath_signals' plan: each flow reads its module's own state through
sock_diag every few (guest) milliseconds. Asserted:

  - GEMINI's α tracks a known marking fraction within ±10 %: netem marks a fixed random 1 %,
    10 % or 30 % of the ECN-capable packets CE whatever the queue, and the mean α the module
    reports matches the fraction of the flow's packets delivered CE-marked (and that fraction
    is the one asked for). At 1 % (below 16/1024) α in DCTCP's 1/1024 read a sixteenth of it;
  - GEMINI's delay branch fires on the WAN hop and not on the datacenter hop: on the cross-dc
    path (deep WAN buffer, no ECN there) it cuts on delay; on the datacenter path (ECN at K)
    every cut is an ECN cut and the queue stays below K with the link full;
  - DC-Vegas's cut follows its α with no ECN at all: nothing on its paths is ECN-capable or
    marked, and each window reduction it makes is w·α/2 of the α it reports (to a packet);
    its queue stands near K_dcv and follows K_dcv when K_dcv changes.
"""

from __future__ import annotations

import pytest

from gemini_lab import datapath_signals as ds
from tests.labkit import healthy_uml_run

pytestmark = [pytest.mark.lab, pytest.mark.slow]

TCPI_OPT_ECN = 8
ALPHA_SKIP_S = 5.0  # α starts at 1 (as DCTCP's) and needs tens of rounds to forget it
GOODPUT = 1448 / 1514


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    plan = ds.signals_plan()
    return healthy_uml_run(plan, tmp_path_factory.mktemp("dp-signals"))


def _flow(lab: dict, label: str) -> dict:
    r = lab["experiments"][label]
    assert "error" not in r, r["error"]
    assert r["insmod"]["rc"] == 0, r["insmod"]
    assert len(r["samples"]) > 20, r["samples"]
    return r


@pytest.mark.parametrize("percent", ds.CE_PERCENTS)
def test_gemini_alpha_tracks_a_known_marking_fraction_within_ten_percent(lab, percent):
    r = _flow(lab, f"gemini/ce-{percent}")
    assert r["samples"][-1]["tcpi_options"] & TCPI_OPT_ECN
    alpha, fraction, n = ds.alpha_and_fraction(r, ALPHA_SKIP_S)
    assert n >= 100
    # the marker marks what it is told to (the receiver's CE count agrees)
    got = r["netstat"]["receiver"]
    assert got["InCEPkts"] / (got["InCEPkts"] + got["InECT0Pkts"]) == pytest.approx(
        percent / 100, rel=0.15
    )
    assert fraction == pytest.approx(percent / 100, rel=0.15), fraction
    assert alpha == pytest.approx(fraction, rel=0.10), (alpha, fraction)


def test_gemini_cuts_on_delay_on_the_wan_hop(lab):
    r = _flow(lab, "gemini/cross-dc")
    delay_cuts, _ = ds.cuts(r)
    assert delay_cuts >= 1, r["samples"][-1]
    # the WAN hop is where the queue stood; the delay threshold (T = 50 ms scaled) was passed
    q_dc, q_wan = r["queues"]["0"], r["queues"]["1"]
    assert q_wan["mean_qlen"] > 10 * q_dc["mean_qlen"], (q_wan["mean_qlen"], q_dc["mean_qlen"])
    assert q_wan["marked"] == 0


def test_gemini_cuts_only_on_ecn_on_the_datacenter_hop(lab):
    r = _flow(lab, "gemini/datacenter")
    delay_cuts, ecn_cuts = ds.cuts(r)
    assert delay_cuts == 0 and ecn_cuts >= 10, (delay_cuts, ecn_cuts)
    k = 20  # datacenter.toml's ecn_threshold_packets
    q = r["queues"]["0"]
    assert q["marked"] > 0 and q["drops"] == 0
    assert q["mean_qlen"] < k, q
    assert r["throughput_mbps"] >= 0.9 * 100 * GOODPUT, r["throughput_mbps"]


def test_dcvegas_runs_with_no_ecn_anywhere(lab):
    for label in ("dcvegas/cut", "dcvegas/datacenter"):
        r = _flow(lab, label)
        assert not r["samples"][-1]["tcpi_options"] & TCPI_OPT_ECN, label
        got = r["netstat"]["receiver"]
        assert got["InECT0Pkts"] == got["InCEPkts"] == 0, (label, got)
        assert r["samples"][-1]["tcpi_delivered_ce"] == 0
    assert _flow(lab, "dcvegas/datacenter")["queues"]["0"]["marked"] == 0


def test_dcvegas_cuts_its_window_by_its_alpha_over_two(lab):
    r = _flow(lab, "dcvegas/cut")
    events = ds.cut_events(r)
    assert len(events) >= 10, events
    exact = [e for e in events if abs(ds.predicted_cut(e["before"], e["alpha"]) - e["after"]) <= 1]
    assert len(exact) >= 0.9 * len(events), events
    # α moved: cuts of different sizes, each as the α of its round says
    assert len({e["alpha"] for e in exact}) >= 3


def test_dcvegas_holds_its_queue_near_k_dcv_and_follows_it(lab):
    """One flow's own queue is what DC-Vegas estimates: it cuts once that passes K_dcv, so the
    queue peaks just above K_dcv and stands below it, and moves with K_dcv; the link stays
    full (the paper's > 90 % utilisation from K_dcv of 5 packets at 1 Gbit/s)."""
    k = ds.datapath(ds.DCVEGAS).spec.param("queue_threshold").default
    small = _flow(lab, "dcvegas/datacenter")
    wide = _flow(lab, f"dcvegas/datacenter-k{ds.DCV_K_WIDE}")
    for r, kk in ((small, k), (wide, ds.DCV_K_WIDE)):
        q = r["queues"]["0"]
        assert kk <= q["max_qlen"] <= 2 * kk, (kk, q["max_qlen"])
        assert q["mean_qlen"] <= kk and q["drops"] == 0, (kk, q["mean_qlen"])
        assert r["throughput_mbps"] >= 0.9 * 100 * GOODPUT, r["throughput_mbps"]
    assert wide["queues"]["0"]["mean_qlen"] >= 3 * small["queues"]["0"]["mean_qlen"]
