"""Reports over real gRPC into real PostgreSQL: stored exactly once, bad input stores nothing."""

from __future__ import annotations

import datetime as dt
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import psycopg
import pytest
from sqlalchemy import make_url, text

from benchmarks import report_size as mix
from gemini_agent.context import ContextResolver
from gemini_api import sketch as sketches
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.policy import history
from gemini_booster.storage import changes
from gemini_booster.storage import credentials as token_store
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage import trials as trial_store

from .conftest import OPERATOR, Running, agent_md

POLICY = "p1"


@pytest.fixture
def svc(booster):
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY), actor="test")
    booster.booster.reload_policies()
    return booster


def recent_ms() -> int:
    """The start of an interval that ended just now (Booster refuses intervals far from its
    clock)."""
    return int(time.time() * 1000) - 300_000


def report(seed: int = 0, flows: int = 20, theta=None) -> pb.ReportRequest:
    rng = np.random.default_rng(seed)
    theta = theta or load_spec().default()
    aggs = [sim.make_aggregate(c, theta, 1.0, flows, rng) for c in sim.DEFAULT_CONTEXTS]
    return sim.make_report("host-1", POLICY, aggs, recent_ms())


def counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("reports", "report_aggregates", "trials")
        }


def flow_total(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT coalesce(sum(flow_count), 0) FROM trials")).scalar_one()


def test_report_is_stored_and_folded_into_trials(svc):
    req = report(flows=30)
    resp = svc.stub().ReportAggregates(req, metadata=agent_md())
    assert not resp.duplicate and resp.aggregates_stored == 2
    assert counts(svc.engine) == {"reports": 1, "report_aggregates": 2, "trials": 2}
    assert flow_total(svc.engine) == 60
    with svc.engine.connect() as conn:
        tpt = conn.execute(text("SELECT sum(tpt_sum) FROM trials")).scalar_one()
    assert math.isclose(tpt, sum(a.throughput_mbps_sum for a in req.aggregates))


def test_storing_announces_nothing_the_refit_follows(svc: Running, db_url: str) -> None:
    """Ingest is append-only: a stored report sends no notification (the refit owner learns of
    it by folding, storage/fold.py). Here the receiving replica owns the policy, so its refit
    follows and publishes: notifications arrive in commit order, so a ``data:`` sent by the
    report's transaction would arrive before that ``plans:``."""
    url = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    pid = svc.booster.policies[POLICY].id
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {changes.CHANNEL}")
        svc.stub().ReportAggregates(report(), metadata=agent_md())
        got = []
        for n in listener.notifies(timeout=30):
            got.append(n.payload)
            if n.payload == f"plans:{pid}":
                break
    assert got[-1:] == [f"plans:{pid}"], got
    assert not [p for p in got if p.startswith("data")], got


def test_second_report_on_same_trial_adds_up(svc):
    stub = svc.stub()
    stub.ReportAggregates(report(seed=1, flows=10), metadata=agent_md())
    stub.ReportAggregates(report(seed=2, flows=15), metadata=agent_md())
    assert counts(svc.engine) == {"reports": 2, "report_aggregates": 4, "trials": 2}
    assert flow_total(svc.engine) == 50


def test_sequential_duplicate_is_stored_once(svc):
    req = report()
    stub = svc.stub()
    first = stub.ReportAggregates(req, metadata=agent_md())
    again = stub.ReportAggregates(req, metadata=agent_md())
    assert not first.duplicate and again.duplicate and again.aggregates_stored == 0
    assert counts(svc.engine)["reports"] == 1
    assert flow_total(svc.engine) == 40


def test_concurrent_duplicates_are_stored_once(svc):
    req = report(flows=7)
    stub = svc.stub()
    with ThreadPoolExecutor(16) as pool:
        results = list(
            pool.map(lambda _: stub.ReportAggregates(req, metadata=agent_md()), range(32))
        )
    assert sum(not r.duplicate for r in results) == 1
    assert counts(svc.engine) == {"reports": 1, "report_aggregates": 2, "trials": 2}
    assert flow_total(svc.engine) == 14


def test_concurrent_duplicates_across_two_boosters_are_stored_once(svc, db_url):
    """Two replicas on one database: the unique key, not process memory, dedupes."""
    from gemini_booster.service.app import BoosterServer

    from .conftest import make_settings

    other = BoosterServer(make_settings(db_url)).start()
    try:
        stubs = [svc.stub(), pb_stub(f"127.0.0.1:{other.grpc_port}")]
        req = report(flows=3)
        with ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda i: stubs[i % 2].ReportAggregates(req, metadata=agent_md()), range(16)
                )
            )
    finally:
        other.stop()
    assert sum(not r.duplicate for r in results) == 1
    assert flow_total(svc.engine) == 6


def pb_stub(target):
    from gemini_api.v1 import booster_pb2_grpc as pb_grpc

    return pb_grpc.BoosterStub(grpc.insecure_channel(target))


def test_reused_key_with_other_content_is_refused(svc):
    req = report(seed=1)
    stub = svc.stub()
    stub.ReportAggregates(req, metadata=agent_md())
    changed = pb.ReportRequest()
    changed.CopyFrom(req)
    changed.aggregates[0].theta_version += 1
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportAggregates(changed, metadata=agent_md())
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert flow_total(svc.engine) == 40


def _mutate(fn):
    req = report(seed=5)
    fn(req)
    return req


def _set_stat(name, value):
    return lambda r: setattr(r.aggregates[1], name, value)


def _theta(name, value):
    return lambda r: setattr(r.aggregates[0].theta, name, value)


BAD_REPORTS = {
    "nan throughput": (_set_stat("throughput_mbps_sum", float("nan")), "throughput_mbps_sum"),
    "infinite delay": (_set_stat("queue_delay_ms_sum", float("inf")), "queue_delay_ms_sum"),
    "negative delay": (_set_stat("queue_delay_ms_sum", -1.0), "is negative"),
    "impossible moments": (_set_stat("throughput_mbps_sq_sum", 1.0), "throughput_mbps_sq_sum"),
    "zero flows": (_set_stat("flow_count", 0), "flow_count"),
    "more slow than flows": (_set_stat("slow_flow_count", 10**6), "slow_flow_count"),
    "λ outside Θ'": (_theta("mult_decrease", 100), "theta.mult_decrease: 100 outside"),
    "ω outside Θ'": (_theta("init_cwnd", 500), "theta.init_cwnd: 500 outside"),
    "missing θ": (lambda r: r.aggregates[0].ClearField("theta"), "aggregates[0].theta: missing"),
    "hour 25": (lambda r: setattr(r.aggregates[0].context, "hour", 25), "context.hour"),
    "empty region": (
        lambda r: setattr(r.aggregates[0].context, "dst_region", ""),
        "context.dst_region: empty",
    ),
    "empty report id": (lambda r: setattr(r, "report_id", ""), "report_id"),
    "backwards interval": (lambda r: setattr(r, "interval_end_unix_ms", 1), "interval"),
    "no aggregates": (lambda r: r.ClearField("aggregates"), "aggregates: empty"),
    "bad sketch": (
        lambda r: r.aggregates[0].throughput_sketch.counts.append(-3.0),
        "throughput_sketch",
    ),
    "bad size buckets": (
        lambda r: r.aggregates[0].size_bucket_counts.append(1),
        "size_bucket_counts",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REPORTS))
def test_bad_report_is_rejected_whole_and_named(svc, case):
    """One bad aggregate (the second of two, or a field of the report) rejects everything."""
    mutate, expected = BAD_REPORTS[case]
    with pytest.raises(grpc.RpcError) as e:
        svc.stub().ReportAggregates(_mutate(mutate), metadata=agent_md())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in e.value.details()
    assert counts(svc.engine) == {"reports": 0, "report_aggregates": 0, "trials": 0}


def test_a_theta_from_before_the_region_narrowed_is_stored_and_left_out_of_the_model(svc):
    """λ 0.95 lies inside Θ' but outside the policy's region (production, λ ≤ 0.90): what a
    host ran under a θ handed out before the operator narrowed the region. The report is
    stored whole, its in-region aggregate with it, and the model leaves that θ out."""
    spec = load_spec()
    earlier = spec.default() | {"mult_decrease": 95}
    req = report(theta=earlier)
    req.aggregates[1].theta.mult_decrease = spec.default()["mult_decrease"]
    resp = svc.stub().ReportAggregates(req, metadata=agent_md())
    assert resp.aggregates_stored == 2
    assert counts(svc.engine) == {"reports": 1, "report_aggregates": 2, "trials": 2}
    policy = svc.booster.policies[POLICY]
    trials = trial_store.load_trials(svc.engine, policy.id)
    assert {t.theta_key for t in trials} == {spec.key(earlier), spec.key(spec.default())}
    modelled = history.observations(trials, policy.sigma, spec, policy.resolved_bounds())
    assert [o.theta for o in modelled] == [spec.default()]


def test_unknown_policy_is_not_found_and_stores_nothing(svc: Running) -> None:
    """NOT_FOUND, not INVALID_ARGUMENT: the policy may be created a moment later, so the agent
    keeps the report and retries."""
    with pytest.raises(grpc.RpcError) as e:
        svc.stub().ReportAggregates(
            _mutate(lambda r: setattr(r, "policy", "nope")), metadata=agent_md()
        )
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown policy 'nope'" in e.value.details()
    assert counts(svc.engine) == {"reports": 0, "report_aggregates": 0, "trials": 0}


def _raw_call(target: str, payload: bytes, metadata=None):
    channel = grpc.insecure_channel(target)
    call = channel.unary_unary("/gemini.booster.v1.Booster/ReportAggregates")
    return call(payload, metadata=metadata or agent_md(), timeout=10)


def test_unknown_field_is_rejected(svc):
    payload = report().SerializeToString() + bytes([0xF8, 0x07, 0x01])  # field 127, varint
    with pytest.raises(grpc.RpcError) as e:
        _raw_call(svc.grpc_target, payload)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown field number 127" in e.value.details()
    assert counts(svc.engine)["reports"] == 0


def test_garbled_payload_is_rejected(svc):
    with pytest.raises(grpc.RpcError) as e:
        _raw_call(svc.grpc_target, b"\xff\xff\xff\xff garbage")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a ReportRequest" in e.value.details()
    assert counts(svc.engine)["reports"] == 0


def test_oversized_payload_is_rejected(svc):
    req = report()
    req.host_id = "h" * 100
    req.aggregates[0].throughput_sketch.counts.extend([1.0] * 200_000)  # ~1.6 MB > 1 MiB limit
    with pytest.raises(grpc.RpcError) as e:
        svc.stub().ReportAggregates(req, metadata=agent_md())
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert counts(svc.engine)["reports"] == 0


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer forged-token"),), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Basic abc"),), grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_missing_or_forged_credentials_are_refused(svc, metadata, code):
    with pytest.raises(grpc.RpcError) as e:
        svc.stub().ReportAggregates(report(), metadata=metadata)
    assert e.value.code() == code
    assert counts(svc.engine)["reports"] == 0


def test_viewer_token_may_not_report(svc):
    token = token_store.create_token(svc.engine, "viewer-1", "viewer", actor="test")
    svc.booster.tokens_changed()  # as REST does: written behind the replica's back
    with pytest.raises(grpc.RpcError) as e:
        svc.stub().ReportAggregates(report(), metadata=agent_md(token))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert counts(svc.engine)["reports"] == 0


def test_get_parameters_for_unseen_context_is_default_until_data_arrives(svc: Running) -> None:
    """Asking creates no state; a context is planned once reports bring flows from it."""
    req = pb.GetParametersRequest(
        host_id="h1", policy=POLICY, contexts=[c.message() for c in sim.DEFAULT_CONTEXTS]
    )
    resp = svc.stub().GetParameters(req, metadata=agent_md())
    default = pb.Theta(**load_spec().default())
    assert [p.theta for p in resp.parameters] == [default, default]
    assert resp.target_cc == "fusion" and resp.default_theta == default
    svc.booster.refit_dirty()
    resp = svc.stub().GetParameters(req, metadata=agent_md())
    assert all(p.plan_version == 0 for p in resp.parameters)
    svc.stub().ReportAggregates(report(), metadata=agent_md())
    svc.booster.refit(svc.booster.policies[POLICY])
    resp = svc.stub().GetParameters(req, metadata=agent_md())
    assert all(p.plan_version >= 1 for p in resp.parameters)


def test_get_parameters_rejects_bad_context(svc):
    req = pb.GetParametersRequest(host_id="h1", policy=POLICY, contexts=[pb.Context(hour=30)])
    with pytest.raises(grpc.RpcError) as e:
        svc.stub().GetParameters(req, metadata=agent_md())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contexts[0].src_region: empty" in e.value.details()


def test_operator_token_may_not_report(svc: Running) -> None:
    """Roles do not nest: the agent port takes agent tokens only."""
    with pytest.raises(grpc.RpcError) as e:
        svc.stub().ReportAggregates(report(), metadata=agent_md(OPERATOR))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert counts(svc.engine)["reports"] == 0


def test_old_agents_dense_sketches_are_stored_beside_compact_ones(svc, tmp_path: Path) -> None:
    """A rollout: an agent before the compact sketch sends dense ones, an upgraded agent compact
    ones (both from the agent's own builder, over realistic flows). Both reports are stored with
    every flow, and every stored sketch reads back with one weight per flow."""
    policy_store.create_policy(svc.engine, PolicyCreate(name=mix.POLICY), actor="test")
    svc.booster.reload_policies()
    resolver = ContextResolver(mix.SOURCE, mix.prefix_table(tmp_path))
    ended = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    theta = load_spec().default()
    minutes = [
        mix.host_minute(np.random.default_rng(seed), host, theta, ended)
        for seed, host in ((1, "host-old"), (2, "host-new"))
    ]
    old, new = minutes[0].report(resolver, dense=True), minutes[1].report(resolver)
    assert all(a.throughput_sketch.counts for a in old.aggregates)
    assert all(a.throughput_sketch.key_stride for a in new.aggregates)
    for req in (old, new):
        resp = svc.stub().ReportAggregates(req, metadata=agent_md())
        assert not resp.duplicate and resp.aggregates_stored == len(req.aggregates)
    flows = sum(a.flow_count for r in (old, new) for a in r.aggregates)
    assert counts(svc.engine)["reports"] == 2 and flow_total(svc.engine) == flows
    with svc.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT flow_count, sketch, delay_sketch FROM report_aggregates")
        ).all()
    assert len(rows) == len(old.aggregates) + len(new.aggregates)
    for n, *raw in rows:
        for sketch in raw:
            assert sketches.from_proto(pb.QuantileSketch.FromString(sketch)).count == n
