"""The incumbent history on real PostgreSQL: a refit that publishes another incumbent θ for a
context writes one row in the plan's transaction, an unchanged incumbent none, whichever replica
publishes (two Boosters on one database, reports through real gRPC), and two publishes that
overlap record a change once; the history is read back over REST; migration 0009 carries the
plans in force over as the history's first rows."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime

from alembic import command
from sqlalchemy import create_engine, text

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.theta import load_spec
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import database
from gemini_booster.storage import plans as plan_store
from gemini_booster.storage import policies as policy_store

from .conftest import OPERATOR, agent_md, at_revision, auth, insert_old_policy_and_context, serve

POLICY = "history"
SPEC = load_spec()
FIRST = SPEC.default()
BETTER = SPEC.default() | {"mult_decrease": 70}
FLOWS = 60


def aggregate(theta: dict[str, int], mbps: float, rng: random.Random) -> object:
    """``FLOWS`` flows of 1 s at about ``mbps`` Mbit/s, 5 ms of queueing delay, under θ."""
    b = AggregateBuilder()
    for _ in range(FLOWS):
        tpt = mbps * rng.uniform(0.95, 1.05)
        b.add(FlowStats(int(tpt * 1e6 / 8), 1_000_000, 45_000, 40_000))
    return b.to_proto(theta, 1, sim.ETHERNET.message())


def send(svc, host: str, aggs: list) -> None:
    req = sim.make_report(host, POLICY, aggs)
    assert svc.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == len(aggs)


def history_rows(engine) -> list[tuple]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT theta_key, plan_generation, refit_owner FROM incumbent_history"
                    " ORDER BY id"
                )
            )
        ]


def only_label(svc) -> str:
    r = svc.http.get(f"/v1/policies/{POLICY}/parameters", headers=auth(OPERATOR))
    [plan] = r.json()
    return plan["label"]


def test_each_change_of_incumbent_is_one_row_whichever_replica_publishes(db_url):
    rng = random.Random(9)
    with serve(db_url, replica_name="replica-a") as a:
        policy_store.create_policy(a.engine, PolicyCreate(name=POLICY), actor="test")
        a.booster.reload_policies()
        for host in ("h-1", "h-2", "h-3"):
            send(a, host, [aggregate(FIRST, 20, rng)])
        a.booster.refit(a.booster.policies[POLICY])
        assert history_rows(a.engine) == [(SPEC.key(FIRST), 1, "replica-a")]
        a.booster.refit(a.booster.policies[POLICY])  # the same data: the same incumbent
        assert len(history_rows(a.engine)) == 1
    with serve(db_url, replica_name="replica-b") as b:  # a's lease went with it
        b.booster.refit(b.booster.policies[POLICY])  # a new owner, the incumbent unchanged
        assert len(history_rows(b.engine)) == 1
        for host in ("h-1", "h-2", "h-3"):
            send(b, host, [aggregate(BETTER, 60, rng)])
        b.booster.refit(b.booster.policies[POLICY])
        plans = {
            k.label: p for k, p in b.booster.plan_snapshot(b.booster.policies[POLICY].id).items()
        }
        [plan] = plans.values()
        assert plan.incumbent_key == SPEC.key(BETTER)
        generation = policy_store.policy_generations(b.engine)[b.booster.policies[POLICY].id][1]
        assert history_rows(b.engine) == [
            (SPEC.key(FIRST), 1, "replica-a"),
            (SPEC.key(BETTER), generation, "replica-b"),
        ]

        label = only_label(b)
        r = b.http.get(
            f"/v1/policies/{POLICY}/charts/incumbents?context={label}", headers=auth(OPERATOR)
        )
        assert r.status_code == 200, r.text
        changes = r.json()["changes"]
        assert [c["theta"] for c in changes] == [FIRST, BETTER]
        assert [c["refit_owner"] for c in changes] == ["replica-a", "replica-b"]
        assert changes[1]["natural"]["mult_decrease"] == 0.7
        assert changes[1]["predicted_utility"] == plan.incumbent_utility
        assert all(c["datapath"] == "fusion" and c["sigma"] == 1.0 for c in changes)
        assert changes[0]["published_at"] < changes[1]["published_at"]
        assert (
            b.http.get(f"/v1/policies/{POLICY}/charts/incumbents?context={label}").status_code
            == 401
        )


def _waiting_on_a_lock(engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_overlapping_publishes_of_one_change_record_it_once(booster):
    """Two replicas that both believe they publish a new incumbent (a fenced lease makes this
    rare, a lost notification possible) are ordered by the policy row: the second sees the
    first's row and adds none."""
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY), actor="test")
    policy = policy_store.get_policy(booster.engine, POLICY)
    with booster.engine.begin() as conn:
        context_id = conn.execute(
            text(
                "INSERT INTO contexts (src_region, src_isp, dst_region, dst_isp, hour)"
                " VALUES ('a', 'b', 'c', 'd', 1) RETURNING id"
            )
        ).scalar_one()
    record = plan_store.PlanRecord(policy.id, context_id, 1, SPEC.key(BETTER), 1.5, ())

    def publish(conn, owner: str) -> int:
        return plan_store.publish_plans(
            conn, policy.id, [record], owner, datetime.now(UTC), 1, sigma=1.0, datapath="fusion"
        )

    first = booster.engine.connect()
    tx = first.begin()
    publish(first, "one")
    done: list[int] = []
    with booster.engine.begin() as conn:  # the second waits for the first's row lock
        other = threading.Thread(target=lambda: done.append(publish(conn, "two")))
        other.start()
        while not _waiting_on_a_lock(booster.engine):
            assert other.is_alive()
            time.sleep(0.05)
        tx.commit()
        other.join()
    first.close()
    assert done == [2]
    assert history_rows(booster.engine) == [(SPEC.key(BETTER), 1, "one")]


def test_migration_carries_the_plans_in_force_over(db_url):
    engine = create_engine(db_url)
    at_revision(engine, "0008")
    at = datetime(2026, 11, 1, 12, tzinfo=UTC)
    with engine.begin() as conn:
        insert_old_policy_and_context(conn)
        conn.execute(
            text(
                "INSERT INTO plans (policy_id, context_id, plan_version, incumbent_key,"
                " incumbent_utility, candidate_keys, updated_at)"
                " SELECT p.id, c.id, 3, 'k', 2.5, '[]', :at FROM policies p, contexts c"
            ),
            {"at": at},
        )
    database.migrate(engine)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT datapath, theta_key, predicted_utility, sigma, published_at,"
                " plan_generation, refit_owner FROM incumbent_history"
            )
        ).all()
    assert [tuple(r) for r in rows] == [("fusion", "k", 2.5, 1.0, at, None, None)]
    cfg = database.alembic_config(db_url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0008")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('incumbent_history')")).scalar() is None
    engine.dispose()
