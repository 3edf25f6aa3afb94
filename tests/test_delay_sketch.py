"""Queueing-delay percentiles end to end: aggregates built as the agent builds them carry a
delay sketch through real gRPC into real PostgreSQL, and the percentiles endpoint merges it per
arm; a report from an agent that sends no delay sketch is stored and its flows counted as not
sketched; a bad delay sketch refuses only the report that carries it, naming the field, while
another host's report sent at the same time is stored."""

from __future__ import annotations

import math
import random

import grpc
import pytest

from gemini_api import sketch as sketches
from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store

from .conftest import OPERATOR, agent_md, auth

POLICY = "delays"
SPEC = load_spec()
RTT_MIN_US = 40_000
# The agent's compact sketch as Booster reads it back (gemini_api.sketch), and a rounding of
# the bucket's value.
SKETCH_REL = sketches.COMPACT_READ_ERROR + 1e-6


def aggregate(delays_ms: list[float], cc: str = "") -> pb.Aggregate:
    """One flow of 1 s at 20 Mbit/s per queueing delay in ``delays_ms`` (0: no queue)."""
    b = AggregateBuilder()
    for d in delays_ms:
        b.add(FlowStats(2_500_000, 1_000_000, RTT_MIN_US + round(d * 1000), RTT_MIN_US))
    return b.to_proto(SPEC.default(), 1, sim.ETHERNET.message(), cc)


def send(svc, host: str, aggs: list[pb.Aggregate]):
    return svc.stub().ReportAggregates(sim.make_report(host, POLICY, aggs), metadata=agent_md())


def at_rank(values: list[float], q: float) -> float:
    """The value the sketch answers for quantile ``q`` (its rank rule), before its error."""
    return sorted(values)[math.floor(q * (len(values) - 1))]


@pytest.fixture
def svc(booster):
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY), actor="test")
    booster.booster.reload_policies()
    return booster


def context_label(c: pb.Context) -> str:
    return f"{c.src_region}/{c.src_isp}->{c.dst_region}/{c.dst_isp}@{c.hour}"


def percentiles(svc) -> dict:
    """The percentiles of the one context every aggregate here reports."""
    r = svc.http.get(
        f"/v1/policies/{POLICY}/charts/percentiles",
        params={"context": context_label(sim.ETHERNET.message())},
        headers=auth(OPERATOR),
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_delay_percentiles_from_the_sketches_and_an_old_agent_counted(svc):
    rng = random.Random(3)
    new = [0.0] * 20 + [rng.uniform(0.5, 80) for _ in range(380)]  # 20 flows without a queue
    assert send(svc, "new-agent", [aggregate(new)]).aggregates_stored == 1
    cubic = [rng.uniform(20, 60) for _ in range(100)]
    assert send(svc, "new-agent-2", [aggregate(cubic, "cubic")]).aggregates_stored == 1
    old = aggregate([500.0] * 50)  # what an agent before the delay sketch sends
    old.ClearField("queue_delay_sketch")
    assert send(svc, "old-agent", [old]).aggregates_stored == 1

    pct = percentiles(svc)
    arms = {a["arm"]: a for a in pct["arms"]}
    fusion = arms["fusion"]
    assert fusion["flows"] == fusion["sketched_flows"] == len(new) + 50
    assert fusion["delay_sketched_flows"] == len(new)  # the old agent's 50 are not sketched
    for q, got in zip(pct["quantiles"], fusion["queue_delay_ms"], strict=True):
        want = at_rank(new, q)  # none of the old agent's 500 ms flows
        assert got == pytest.approx(want, rel=SKETCH_REL, abs=1e-9), q
    assert fusion["queue_delay_ms"][0] == 0.0  # p5: the flows without a queue
    # the mean covers every flow, from the sums: the old agent's too
    assert fusion["mean_queue_delay_ms"] == pytest.approx(
        (sum(round(d * 1000) / 1000 for d in new) + 500 * 50) / (len(new) + 50)
    )
    assert arms["cubic"]["delay_sketched_flows"] == 100
    p50 = pct["quantiles"].index(0.5)
    assert arms["cubic"]["queue_delay_ms"][p50] == pytest.approx(
        at_rank(cubic, 0.5), rel=SKETCH_REL
    )


def test_a_bad_delay_sketch_refuses_its_own_report_only(svc):
    bad = aggregate([5.0] * 10)
    bad.queue_delay_sketch.zero_count += 3  # weights no longer one per flow
    good = aggregate([7.0] * 10)
    bad_call = svc.stub().ReportAggregates.future(
        sim.make_report("bad-host", POLICY, [bad]), metadata=agent_md()
    )
    good_call = svc.stub().ReportAggregates.future(
        sim.make_report("good-host", POLICY, [good]), metadata=agent_md()
    )
    assert good_call.result().aggregates_stored == 1
    with pytest.raises(grpc.RpcError) as e:
        bad_call.result()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "aggregates[0].queue_delay_sketch: total weight 13 != flow_count 10" in e.value.details()
    [fusion] = percentiles(svc)["arms"][:1]
    assert fusion["flows"] == fusion["delay_sketched_flows"] == 10
    assert fusion["queue_delay_ms"][0] == pytest.approx(7.0, rel=SKETCH_REL)
