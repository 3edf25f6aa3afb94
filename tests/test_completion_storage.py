"""The completion-time objective in Booster's storage (real PostgreSQL): an agent's completion
sums reach the trials (pending and folded), an older agent's aggregate adds none, a policy names
its objective (REST, validated), and migration 0015 up and down."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import astuple

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.datapaths import load_datapath
from gemini_api.sums import FlowSums, Objective
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.domain import ContextKey
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage.trials import load_trials

from .conftest import OPERATOR, Running, agent_md, at_revision, auth, serve
from .test_fold import _raw_aggregate

POLICY = "incast"
FLOWS = [FlowStats(100_000, 80_000, 1_500, 500), FlowStats(100_000, 280_000, 3_000, 500)]


@pytest.fixture
def owner(db_url) -> Iterator[Running]:
    with serve(db_url, fold_interval_s=60) as running:  # folds only when the test asks
        spec = PolicyCreate(name=POLICY, objective=Objective.COMPLETION)
        policy_store.create_policy(running.engine, spec, actor="test")
        running.booster.reload_policies()
        running.booster.refit(running.booster.policies[POLICY])  # takes the policy's lease
        yield running


def _aggregate(ctx: sim.SyntheticContext, theta: dict[str, int]):
    builder = AggregateBuilder()
    for f in FLOWS:
        builder.add(f)
    return builder.to_proto(theta, 1, ctx.message())


def test_an_agents_completion_sums_reach_the_trials_and_an_old_agents_add_none(owner) -> None:
    ctx = sim.DEFAULT_CONTEXTS[0]
    theta = load_datapath("fusion").default()
    old = sim.make_aggregate(ctx, theta, 1.0, 5, np.random.default_rng(0))  # no completion
    stub = owner.stub()
    for host, aggs in (("new", [_aggregate(ctx, theta)]), ("old", [old])):
        resp = stub.ReportAggregates(sim.make_report(host, POLICY, aggs), metadata=agent_md())
        assert resp.aggregates_stored == 1
    expected = FlowSums.total(FlowSums.of_record(f.bytes_acked, f.duration_us, f.queue_delay_ms)
                              for f in FLOWS)  # fmt: skip
    policy_id = owner.booster.policies[POLICY].id
    for stage in ("pending", "folded"):
        (trial,) = load_trials(owner.engine, policy_id)
        assert trial.flow_count == 2 + 5, stage
        assert astuple(trial.sums.completion) == pytest.approx(astuple(expected.completion)), stage
        u = trial.sums.utility(1.0, Objective.COMPLETION)
        assert u.flows == 2 and u.mean == pytest.approx(1.6 / 0.36 - 1.0 * (1.0 + 2.5) / 2), stage
        owner.booster.fold_owned()


def test_the_operators_views_show_a_completion_policys_utility(owner) -> None:
    """/trials and the rounds chart rank by the policy's objective, not by eq. 9 regardless."""
    ctx = sim.DEFAULT_CONTEXTS[0]
    theta = load_datapath("fusion").default()
    report = sim.make_report("new", POLICY, [_aggregate(ctx, theta)])
    assert owner.stub().ReportAggregates(report, metadata=agent_md()).aggregates_stored == 1
    sums = FlowSums.total(FlowSums.of_record(f.bytes_acked, f.duration_us, f.queue_delay_ms)
                          for f in FLOWS)  # fmt: skip
    sigma = owner.booster.policies[POLICY].sigma
    want = sums.utility(sigma, Objective.COMPLETION).mean
    assert want != pytest.approx(sums.utility(sigma).mean)  # the two objectives differ here
    (row,) = owner.http.get(f"/v1/policies/{POLICY}/trials", headers=auth(OPERATOR)).json()
    assert row["utility"] == pytest.approx(want)
    label = ContextKey(**row["context"]).label
    chart = owner.http.get(
        f"/v1/policies/{POLICY}/charts/rounds", params={"context": label}, headers=auth(OPERATOR)
    ).json()
    (bucket,) = chart["rounds"]
    assert bucket["utility"] == pytest.approx(want)


def test_getparameters_asks_for_the_completion_sums_only_under_that_objective(owner) -> None:
    req = pb.GetParametersRequest(host_id="h", policy=POLICY, contexts=[])
    assert owner.stub().GetParameters(req, metadata=agent_md()).completion_sums
    body = {"objective": "flow-mean"}
    r = owner.http.patch(f"/v1/policies/{POLICY}", json=body, headers=auth(OPERATOR))
    assert r.status_code == 200
    owner.booster.reload_policies()
    assert not owner.stub().GetParameters(req, metadata=agent_md()).completion_sums


def test_a_policy_names_its_objective_and_an_unknown_one_is_refused(owner) -> None:
    http = owner.http
    got = http.get(f"/v1/policies/{POLICY}", headers=auth(OPERATOR)).json()
    assert got["objective"] == "completion"
    r = http.patch(f"/v1/policies/{POLICY}", json={"objective": "fct"}, headers=auth(OPERATOR))
    assert r.status_code == 422 and "objective" in r.text and "flow-mean" in r.text
    body = {"objective": "flow-mean"}
    r = http.patch(f"/v1/policies/{POLICY}", json=body, headers=auth(OPERATOR))
    assert r.status_code == 200 and r.json()["objective"] == "flow-mean"
    owner.booster.reload_policies()
    assert owner.booster.policies[POLICY].objective == Objective.FLOW_MEAN


def _sums_of(engine, table: str) -> tuple[int, int]:
    with engine.connect() as conn:
        q = f"SELECT sum(flow_count), coalesce(sum(completion_flow_count), 0) FROM {table}"
        n, done = conn.execute(text(q)).one()
    return int(n), int(done)


def test_migration_0015_keeps_every_sum_and_policy_and_downgrades(db_url) -> None:
    from alembic import command

    from gemini_booster.storage import database

    from .conftest import insert_old_policy_and_context

    engine = create_engine(db_url)
    at_revision(engine, "0010")
    with engine.begin() as conn:
        insert_old_policy_and_context(conn)
    database.migrate(engine, "0014")
    with engine.begin() as conn:
        _raw_aggregate(conn, 3, bucket=True)
    database.migrate(engine)
    assert _sums_of(engine, "trials") == (3, 0), "an old aggregate counted for completion"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT objective FROM policies")).scalar_one() == "flow-mean"
    with pytest.raises(IntegrityError, match="policies_objective_known"), engine.begin() as conn:
        conn.execute(text("UPDATE policies SET objective = 'fct'"))
    cfg = database.alembic_config(db_url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0014")
    with engine.connect() as conn:
        n = conn.execute(text("SELECT sum(flow_count) FROM trials")).scalar_one()
        cols = conn.execute(
            text("SELECT column_name FROM information_schema.columns WHERE table_name = 'trials'")
        ).scalars()
        assert n == 3 and not [c for c in cols if c.startswith("completion_")]
    engine.dispose()
