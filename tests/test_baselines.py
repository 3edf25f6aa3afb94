"""Flows of other congestion controls (A/B baselines) through real gRPC into real PostgreSQL:
stored apart from Fusion's trials, never a point of the model, compared per context over REST;
bad baseline aggregates are named and store nothing. Also the schema migration that added them,
on a database that already held Fusion data."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import create_engine, text

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import database
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage import trials as trial_store

from .conftest import OPERATOR, agent_md, at_revision, auth, insert_old_policy_and_context

POLICY = "ab"
SPEC = load_spec()
CTX = sim.ETHERNET.message()


@pytest.fixture
def svc(booster):
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY, sigma=0.5), actor="test")
    booster.booster.reload_policies()
    return booster


def aggregate(tpts: list[float], delay_ms: float, cc: str = "", theta=None) -> pb.Aggregate:
    """Flows of 1 s each, ``tpts`` in Mbit/s, all with the same queueing delay."""
    b = AggregateBuilder()
    for t in tpts:
        b.add(FlowStats(int(t * 1e6 / 8), 1_000_000, int(40_000 + delay_ms * 1000), 40_000))
    return b.to_proto(theta or SPEC.default(), 1, CTX, cc)


def send(svc, aggs: list[pb.Aggregate], start_ms: int | None = None):
    req = sim.make_report("host-1", POLICY, aggs, start_ms)
    return svc.stub().ReportAggregates(req, metadata=agent_md())


def rows(engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def test_baseline_flows_are_stored_apart_and_never_train_the_model(svc):
    tuned = SPEC.default() | {"mult_decrease": 70}
    resp = send(
        svc,
        [
            aggregate([20, 30], 10, theta=tuned),
            aggregate([10, 10, 16], 30, "cubic"),
            aggregate([12], 20, "bbr"),
        ],
    )
    assert resp.aggregates_stored == 3
    assert sorted(rows(svc.engine, "SELECT cc, theta_key, flow_count FROM trials")) == [
        ("", SPEC.key(tuned), 2),
        ("bbr", "", 1),
        ("cubic", "", 3),
    ]
    assert sorted(rows(svc.engine, "SELECT cc FROM report_aggregates")) == [
        ("",),
        ("bbr",),
        ("cubic",),
    ]
    policy = svc.booster.policies[POLICY]
    trials = trial_store.load_trials(svc.engine, policy.id)
    assert [t.theta_key for t in trials] == [SPEC.key(tuned)]
    assert set(trial_store.load_baselines(svc.engine, policy.id)) == {"bbr", "cubic"}


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda a: setattr(a, "cc", "fusion"), "aggregates[1].cc: 'fusion' flows leave cc empty"),
        (lambda a: setattr(a, "cc", "Cubic!"), "aggregates[1].cc: 'Cubic!' is not a kernel"),
        (
            lambda a: a.theta.CopyFrom(pb.Theta(**SPEC.default())),
            "aggregates[1].theta: a baseline (cubic) aggregate carries no theta",
        ),
    ],
)
def test_bad_baseline_aggregates_are_named_and_store_nothing(svc, mutate, problem):
    bad = aggregate([10], 5, "cubic")
    mutate(bad)
    with pytest.raises(grpc.RpcError) as err:
        send(svc, [aggregate([20], 10), bad])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in err.value.details()
    assert rows(svc.engine, "SELECT count(*) FROM reports") == [(0,)]
    assert rows(svc.engine, "SELECT count(*) FROM trials") == [(0,)]


def test_comparison_per_context_against_each_baseline(svc):
    tuned = SPEC.default() | {"mult_decrease": 70}
    send(
        svc,
        [
            aggregate([20, 30], 10, theta=tuned),
            aggregate([10, 14], 5),
            aggregate([10, 10, 16], 30, "cubic"),
        ],
    )
    send(svc, [aggregate([24, 26], 10, theta=tuned)])
    svc.booster.refit(svc.booster.policies[POLICY])
    r = svc.http.get(f"/v1/policies/{POLICY}/comparison", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    (ctx,) = r.json()
    assert ctx["context"]["dst_region"] == sim.ETHERNET.message().dst_region
    arms = {a["arm"]: a for a in ctx["arms"]}
    assert set(arms) == {"fusion", "incumbent", "cubic"}
    # σ = 0.5: fusion = mean(20, 30, 24, 26, 10, 14) − 0.5 · mean(10, 10, 10, 10, 5, 5)
    assert arms["fusion"]["flows"] == 6
    assert arms["fusion"]["mean_throughput_mbps"] == pytest.approx(124 / 6)
    assert arms["fusion"]["utility"] == pytest.approx(124 / 6 - 0.5 * 50 / 6)
    assert arms["incumbent"]["flows"] == 4  # the tuned θ is the incumbent
    assert arms["incumbent"]["utility"] == pytest.approx(25 - 0.5 * 10)
    assert arms["cubic"]["utility"] == pytest.approx(12 - 0.5 * 30)
    assert arms["cubic"]["utility_stderr"] == pytest.approx((12 / 3) ** 0.5)  # var 12, 3 flows
    vs = {(v["arm"], v["baseline"]): v for v in ctx["versus"]}
    inc = vs[("incumbent", "cubic")]
    assert inc["utility_difference"] == pytest.approx(20 - (-3))
    assert inc["throughput_ratio"] == pytest.approx(25 / 12)
    assert inc["utility_difference_stderr"] == pytest.approx(
        (arms["incumbent"]["utility_stderr"] ** 2 + 4) ** 0.5
    )
    # σ can be changed for the view; nothing needs a write credential to read it
    r = svc.http.get(f"/v1/policies/{POLICY}/comparison?sigma=0", headers=auth(OPERATOR))
    assert {a["arm"]: a["utility"] for a in r.json()[0]["arms"]}["cubic"] == pytest.approx(12)
    assert svc.http.get(f"/v1/policies/{POLICY}/comparison").status_code == 401


def test_migration_keeps_fusion_data_as_fusion(pg_admin_url, db_url):
    """0001 → head on a database holding a trial: it becomes a Fusion trial (cc '')."""
    engine = create_engine(db_url)
    at_revision(engine, "0001")
    with engine.begin() as conn:
        insert_old_policy_and_context(conn)
        conn.execute(
            text(
                "INSERT INTO trials (policy_id, context_id, theta_key, flow_count, tpt_sum,"
                " tpt_sq_sum, delay_sum, delay_sq_sum, tpt_delay_sum, slow_flows, report_count)"
                " SELECT p.id, c.id, 'k', 3, 1, 1, 1, 1, 1, 0, 1 FROM policies p, contexts c"
            )
        )
    database.migrate(engine)
    assert rows(engine, "SELECT cc, theta_key, flow_count FROM trials") == [("", "k", 3)]
    engine.dispose()
