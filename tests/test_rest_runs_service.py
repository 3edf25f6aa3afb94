"""``service/runs.py``, the service functions a lab study or benchmark calls instead of
Booster's schema: a host's reports read back per interval, CC and θ hold exactly the flows
sent through real gRPC into real PostgreSQL, and the counts and report list agree with them."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.service import runs

from .conftest import agent_md

SPEC = load_spec()
HOST = "lab-host"
INTERVAL_MS = 60_000


def aggregate(flows: int, mbps: float, cc: str = "") -> pb.Aggregate:
    b = AggregateBuilder()
    for _ in range(flows):
        b.add(FlowStats(int(mbps * 1e6 / 8), 1_000_000, 50_000, 40_000))
    return b.to_proto(SPEC.default(), 1, sim.ETHERNET.message(), cc)


def test_a_hosts_reports_read_back_per_interval_cc_and_theta(booster) -> None:
    policy = runs.create_policy(booster.engine, PolicyCreate(name="lab"), actor="test")
    booster.booster.reload_policies()
    start = int(time.time() * 1000) - 3 * INTERVAL_MS
    sent = [(3, 2), (5, 0)]  # (Fusion flows, cubic flows) per interval
    for i, (fusion, cubic) in enumerate(sent):
        aggs = [aggregate(fusion, 20)] + ([aggregate(cubic, 10, "cubic")] if cubic else [])
        req = sim.make_report(HOST, policy.name, aggs, start + i * INTERVAL_MS, INTERVAL_MS)
        stored = booster.stub().ReportAggregates(req, metadata=agent_md())
        assert stored.aggregates_stored == len(aggs)
    got = [
        (r.cc, r.theta_key == "", r.sums.flow_count)
        for r in runs.interval_sums(booster.engine, HOST)
    ]
    assert sorted(got[:2]) == [("", False, 3), ("cubic", True, 2)] and got[2:] == [("", False, 5)]
    since = datetime.fromtimestamp(start / 1000, UTC)
    assert runs.count_reports(booster.engine, HOST, since) == len(sent)
    assert [r[1] for r in runs.host_reports(booster.engine, HOST)] == [
        datetime.fromtimestamp((start + i * INTERVAL_MS) / 1000, UTC) for i in range(len(sent))
    ]
