"""Append-only ingest and the refit owner's fold (storage/fold.py), on the real test PostgreSQL.

Exactly once is checked where it can break: the fold owner killed (SIGKILL) while its fold
transaction is half done, and a replica killed while agents send to it; in both, every
acknowledged report is in the trial sums once, and only once, after the survivor folds. The
trial sums are compared with the raw aggregates they fold, column by column.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest
from sqlalchemy import create_engine, make_url, text

from gemini_booster import simulation as sim
from gemini_booster.config import Settings
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import fold as storage_fold
from gemini_booster.storage import policies as policy_store

from .conftest import Running, agent_md, at_revision, serve
from .test_replicas import (
    CALL_S,
    DEADLINE_S,
    POLICY,
    Replica,
    create_policy,
    policy_on,
    report,
    reporting,
    start_replica,
    until,
)

SUMS = ("flow_count", "tpt_sum", "delay_sum", "slow_flows")
DEFAULT_FOLD_S = Settings.model_fields["fold_interval_s"].default


def totals(engine, table: str) -> tuple[float, ...]:
    """Σ of the flow sums and the number of aggregates, in ``trial_sums`` or the view
    ``trials`` (report_count) or in the raw aggregates (rows)."""
    count = "count(*)" if table == "report_aggregates" else "sum(report_count)"
    cols = ", ".join(f"coalesce(sum({c}), 0)" for c in SUMS)
    with engine.connect() as conn:
        row = conn.execute(text(f"SELECT {cols}, coalesce({count}, 0) FROM {table}")).one()
    return tuple(float(v) for v in row)


def reports(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM reports")).scalar_one())


def same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) for x, y in zip(a, b, strict=True))


def folded_up(engine) -> bool:
    return same(totals(engine, "trial_sums"), totals(engine, "report_aggregates"))


@pytest.fixture
def owner(db_url) -> Iterator[Running]:
    with serve(db_url, fold_interval_s=60) as running:  # folds here only when a test asks
        policy_store.create_policy(running.engine, PolicyCreate(name=POLICY), actor="test")
        running.booster.reload_policies()
        running.booster.refit(running.booster.policies[POLICY])  # takes the policy's lease
        yield running


def send(svc: Running, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    stub = svc.stub()
    for i in range(n):
        resp = stub.ReportAggregates(report(f"host-{seed}-{i}", rng), metadata=agent_md())
        assert resp.aggregates_stored == len(sim.DEFAULT_CONTEXTS)


def test_ingest_appends_and_the_fold_adds_each_aggregate_once(owner: Running) -> None:
    send(owner, 5)
    assert totals(owner.engine, "trial_sums")[-1] == 0, "ingest wrote the trial sums"
    live = totals(owner.engine, "trials")  # the view: folded + pending
    assert same(live, totals(owner.engine, "report_aggregates"))
    assert owner.booster.fold_owned() == {owner.booster.policies[POLICY].id}
    assert folded_up(owner.engine)
    assert same(totals(owner.engine, "trials"), live), "the view counted twice"
    send(owner, 3, seed=1)
    owner.booster.fold_owned()
    owner.booster.fold_owned()  # nothing new: adds nothing
    assert folded_up(owner.engine)
    with owner.engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM trial_sums")).scalar_one()
    assert rows == len(sim.DEFAULT_CONTEXTS), "one row per trial key"


def test_a_report_reaches_the_trial_sums_within_the_fold_interval(db_url) -> None:
    """With the default fold interval, a stored report is in ``trial_sums`` within twice that
    (a fold round, plus the round under way when it was stored)."""
    with serve(db_url) as svc:
        policy_store.create_policy(svc.engine, PolicyCreate(name=POLICY), actor="test")
        svc.booster.reload_policies()
        svc.booster.refit(svc.booster.policies[POLICY])  # owned, so its fold thread folds it
        send(svc, 2)
        t0 = time.monotonic()
        until(lambda: folded_up(svc.engine), "folded", deadline_s=2 * DEFAULT_FOLD_S)
        print(f"\nfolded {time.monotonic() - t0:.2f} s after the acknowledgement")


def test_retention_drops_folded_partitions_and_keeps_the_trials(owner: Running) -> None:
    send(owner, 4)
    engine = owner.engine
    today = datetime.now(UTC).date()
    day = storage_fold.partition_name(today)
    later = datetime.now(UTC) + timedelta(days=Settings().raw_retention_days + 2)
    fold = owner.booster.fold
    assert fold is not None

    created, dropped = fold.upkeep(later) or ([], [])
    assert day not in dropped, "a partition with rows not folded yet was dropped"
    assert storage_fold.partition_name(later.date()) in created
    assert totals(engine, "report_aggregates")[-1] == 4 * len(sim.DEFAULT_CONTEXTS)
    assert reports(engine) == 4, "reports whose aggregates are kept were deleted"

    owner.booster.fold_owned()
    kept = totals(engine, "trial_sums")
    soon = datetime.now(UTC) + timedelta(days=3)  # past a 1-day raw retention
    _, dropped = storage_fold.maintain_partitions(engine, soon, 1, key_days=8) or ([], [])
    assert day in dropped
    assert reports(engine) == 4, "keys a retry could still use went with a short retention"
    fold.upkeep(later)
    with engine.connect() as conn:
        assert day not in storage_fold.daily_partitions(conn)
    assert totals(engine, "report_aggregates")[-1] == 0
    assert reports(engine) == 0, "reports past retention were kept"
    assert totals(engine, "trial_sums") == kept, "retention touched the trial sums"
    assert same(totals(engine, "trials"), kept)
    send(owner, 1, seed=7)  # today's rows now go to the default partition: still stored
    assert totals(engine, "report_aggregates")[-1] == len(sim.DEFAULT_CONTEXTS)
    fold.upkeep(later)  # not folded yet: kept
    assert totals(engine, "report_aggregates")[-1] == len(sim.DEFAULT_CONTEXTS)
    assert reports(engine) == 1
    owner.booster.fold_owned()
    kept = totals(engine, "trial_sums")
    fold.upkeep(datetime.now(UTC))  # folded but within retention: the report is kept
    assert reports(engine) == 1
    fold.upkeep(later)  # folded and past retention: deleted from the default partition
    assert totals(engine, "report_aggregates")[-1] == 0
    assert reports(engine) == 0
    assert totals(engine, "trial_sums") == kept


def _fold_waiting_on(conn: psycopg.Connection) -> int | None:
    """The backend of a fold statement that waits for a lock, if any."""
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE '%INSERT INTO trial_sums%'"
    ).fetchone()
    return None if row is None else row[0]


def test_exactly_once_when_the_fold_owner_is_killed_mid_fold(db_url, tmp_path) -> None:
    """The owner's fold is held inside its transaction (the test locks ``trial_sums``), the
    owner is killed with SIGKILL there, and a second replica takes the policy over and folds:
    the sums hold every acknowledged report once."""
    url = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    engine = create_engine(db_url)
    a = start_replica("fold-a", db_url, tmp_path, fold_interval_s="1")
    b: Replica | None = None
    try:
        create_policy(a)
        until(lambda: policy_on(a) is not None, "A serves the policy")
        acknowledged = set()
        rng = np.random.default_rng(1)
        with psycopg.connect(url) as blocker, psycopg.connect(url, autocommit=True) as watch:
            blocker.execute("LOCK TABLE trial_sums IN SHARE ROW EXCLUSIVE MODE")
            for i in range(20):
                req = report(f"host-{i}", rng)
                a.stub().ReportAggregates(req, metadata=agent_md(), timeout=CALL_S)
                acknowledged.add(req.report_id)
            until(lambda: _fold_waiting_on(watch) is not None, "A's fold waits mid-way")
            a.kill()
            blocker.rollback()
        assert totals(engine, "trial_sums")[-1] == 0, "the killed fold committed"
        b = start_replica("fold-b", db_url, tmp_path, fold_interval_s="1")
        until(lambda: folded_up(engine), "B folds what A's fold left")
        _after_another_fold(engine)
        assert folded_up(engine), "a second fold added rows again"
        _all_acknowledged_once(engine, acknowledged)
    finally:
        a.kill()
        if b is not None:
            b.kill()
        engine.dispose()


def test_exactly_once_when_a_replica_is_killed_during_ingest(db_url, tmp_path) -> None:
    """Agents send to two replicas and retry elsewhere; one replica is killed mid-stream; the
    survivor folds: every acknowledged report is in the sums once."""
    engine = create_engine(db_url)
    a = start_replica("ingest-a", db_url, tmp_path, fold_interval_s="1")
    b = start_replica("ingest-b", db_url, tmp_path, fold_interval_s="1")
    try:
        stop = threading.Event()
        agents = reporting(a, b, stop)
        b.kill()
        flowed = [len(x.acknowledged) for x in agents]
        until(
            lambda: all(len(x.acknowledged) > n for x, n in zip(agents, flowed, strict=True)),
            "every agent acknowledged by the survivor",
        )
        stop.set()
        for agent in agents:
            agent.join(timeout=DEADLINE_S)
        until(lambda: folded_up(engine), "the survivor folds everything")
        _after_another_fold(engine)
        assert folded_up(engine)
        _all_acknowledged_once(engine, set().union(*(x.acknowledged for x in agents)))
    finally:
        a.kill()
        b.kill()
        engine.dispose()


def _after_another_fold(engine) -> None:
    """Wait until the policy's watermark moves again (a later fold ran over the same rows)."""
    q = text("SELECT folded_at FROM fold_watermarks")
    with engine.connect() as conn:
        first = conn.execute(q).scalar_one()
    until(lambda: _scalar(engine, q) > first, "another fold")


def _scalar(engine, q):
    with engine.connect() as conn:
        return conn.execute(q).scalar_one()


def _all_acknowledged_once(engine, acknowledged: set[str]) -> None:
    with engine.connect() as conn:
        ids = list(conn.execute(text("SELECT report_id FROM reports")).scalars())
    assert acknowledged <= set(ids), f"{len(acknowledged - set(ids))} acknowledged reports lost"
    n = totals(engine, "trial_sums")[-1]
    assert n == len(ids) * len(sim.DEFAULT_CONTEXTS), "a report counted twice or not at all"


def _raw_aggregate(conn, flows: int, bucket: bool) -> None:
    """One report of the 'old' policy with one aggregate of ``flows`` flows (with its trial
    bucket from migration 0014 on)."""
    n = conn.execute(text("SELECT count(*) FROM reports")).scalar_one()
    pk = conn.execute(
        text(
            "INSERT INTO reports (report_id, digest, host_id, policy_id, interval_start,"
            " interval_end, aggregate_count) SELECT :r, '\\x00', 'h', id, now(), now(), 1"
            " FROM policies RETURNING id"
        ),
        {"r": f"r{n}"},
    ).scalar_one()
    cols = "report_pk, policy_id, context_id, theta_key, theta_version, flow_count, tpt_sum,"
    cols += " tpt_sq_sum, delay_sum, delay_sq_sum, tpt_delay_sum, slow_flows, size_buckets,"
    cols += " sketch" + (", bucket" if bucket else "")
    values = ":pk, p.id, c.id, 'k', 1, :n, 1, 1, 1, 1, 1, 0, '{}', ''"
    values += ", date_trunc('hour', now())" if bucket else ""
    conn.execute(
        text(f"INSERT INTO report_aggregates ({cols}) SELECT {values} FROM policies p, contexts c"),
        {"pk": pk, "n": flows},
    )


def _flows(engine, table: str) -> tuple[int, int]:
    with engine.connect() as conn:
        row = conn.execute(text(f"SELECT sum(flow_count), sum(report_count) FROM {table}")).one()
    return int(row[0]), int(row[1])


def test_migration_keeps_old_sums_folds_only_new_reports_and_downgrades_with_all(db_url):
    from alembic import command

    from gemini_booster.storage import database

    from .conftest import insert_old_policy_and_context

    engine = create_engine(db_url)
    at_revision(engine, "0010")  # the helper's policy columns, before 0011 renamed one
    with engine.begin() as conn:
        insert_old_policy_and_context(conn)
        _raw_aggregate(conn, 3, bucket=False)
        conn.execute(  # what the old ingest added for it
            text(
                "INSERT INTO trials (policy_id, context_id, theta_key, bucket, flow_count,"
                " tpt_sum, tpt_sq_sum, delay_sum, delay_sq_sum, tpt_delay_sum, slow_flows,"
                " report_count) SELECT p.id, c.id, 'k', date_trunc('hour', now()), 3, 1, 1,"
                " 1, 1, 1, 0, 1 FROM policies p, contexts c"
            )
        )
    database.migrate(engine)
    assert _flows(engine, "trials") == (3, 1), "an aggregate of the old ingest counted again"
    with engine.begin() as conn:
        _raw_aggregate(conn, 5, bucket=True)
    assert _flows(engine, "trials") == (8, 2)
    assert _flows(engine, "trial_sums") == (3, 1)
    with engine.begin() as conn:
        storage_fold.fold_policy(conn, conn.execute(text("SELECT id FROM policies")).scalar())
    with engine.begin() as conn:
        storage_fold.fold_policy(conn, conn.execute(text("SELECT id FROM policies")).scalar())
    assert _flows(engine, "trial_sums") == (8, 2)
    with engine.begin() as conn:
        _raw_aggregate(conn, 2, bucket=True)  # pending at the downgrade
    cfg = database.alembic_config(db_url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0013")
    assert _flows(engine, "trials") == (10, 3)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM report_aggregates")).scalar_one() == 3
    engine.dispose()
