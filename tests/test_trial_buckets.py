"""Time in the trials, end to end: reports through real gRPC into real PostgreSQL sum into one
row per (context, θ, hour); the history window drops old buckets; operators still see one row
per θ; the migration turns old rows into one bucket each and folds buckets back on downgrade."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from gemini_api.theta import load_spec
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import database
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage import trials as trial_store

from .conftest import OPERATOR, agent_md, at_revision, auth, insert_old_policy_and_context

POLICY = "buckets"
SPEC = load_spec()
HOUR_MS = 3_600_000


def report(svc, hours_ago: int, flows: int, rng):
    agg = sim.make_aggregate(sim.ETHERNET, SPEC.default(), 1.0, flows, rng)
    end = int(time.time() * 1000) - hours_ago * HOUR_MS
    req = sim.make_report("host-1", POLICY, [agg], start_ms=end - 60_000, interval_ms=60_000)
    return svc.stub().ReportAggregates(req, metadata=agent_md())


def test_flows_sum_per_hour_and_the_window_drops_old_hours(booster):
    import numpy as np

    rng = np.random.default_rng(0)
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY), actor="test")
    booster.booster.reload_policies()
    for hours_ago, flows in ((3, 10), (3, 5), (0, 7)):
        assert report(booster, hours_ago, flows, rng).aggregates_stored == 1
    policy = policy_store.get_policy(booster.engine, POLICY)
    everything = trial_store.load_trials(booster.engine, policy.id)
    assert sorted(t.flow_count for t in everything) == [7, 15]  # two hours, two rows
    for t in everything:
        assert t.bucket is not None and t.bucket.minute == t.bucket.second == 0
    assert max(t.bucket for t in everything) - min(t.bucket for t in everything) >= timedelta(
        hours=2
    )
    recent = trial_store.load_trials(booster.engine, policy.id, timedelta(hours=2))
    assert [t.flow_count for t in recent] == [7]
    listed = booster.http.get(f"/v1/policies/{POLICY}/trials", headers=auth(OPERATOR)).json()
    assert [r["flows"] for r in listed] == [22]  # operators see one row per θ


def rows(engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def test_migration_makes_one_bucket_per_old_trial_and_folds_them_back(db_url):
    engine = create_engine(db_url)
    at_revision(engine, "0004")
    seen = datetime(2026, 3, 1, 10, 42, tzinfo=UTC)
    with engine.begin() as conn:
        insert_old_policy_and_context(conn)
        conn.execute(
            text(
                "INSERT INTO trials (policy_id, context_id, theta_key, flow_count, tpt_sum,"
                " tpt_sq_sum, delay_sum, delay_sq_sum, tpt_delay_sum, slow_flows, report_count,"
                " last_seen) SELECT p.id, c.id, 'k', 3, 1, 1, 1, 1, 1, 0, 1, :seen"
                " FROM policies p, contexts c"
            ),
            {"seen": seen},
        )
    database.migrate(engine, "0005")  # later, trials is a view over the folded sums (0014)
    assert rows(engine, "SELECT theta_key, flow_count, bucket FROM trials") == [
        ("k", 3, seen.replace(minute=0))
    ]
    assert rows(engine, "SELECT trial_bucket_hours FROM policies") == [(1,)]
    with engine.begin() as conn:  # a second hour of the same θ
        conn.execute(
            text(
                "INSERT INTO trials (policy_id, context_id, cc, theta_key, bucket, flow_count,"
                " tpt_sum, tpt_sq_sum, delay_sum, delay_sq_sum, tpt_delay_sum, slow_flows,"
                " report_count) SELECT policy_id, context_id, cc, theta_key,"
                " bucket + interval '1 hour', 4, 2, 2, 2, 2, 2, 1, 1 FROM trials"
            )
        )
    cfg = database.alembic_config(db_url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
    assert rows(engine, "SELECT theta_key, flow_count, tpt_sum, slow_flows FROM trials") == [
        ("k", 7, pytest.approx(3.0), 1)
    ]
    engine.dispose()
