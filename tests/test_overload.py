"""Overload is explicit: beyond ``ingest_queue_max`` reports waiting to be stored, a replica
refuses more at once (RESOURCE_EXHAUSTED, no quota mark, a retry hint), stores none of them,
and loses none it acknowledged. Real gRPC into real PostgreSQL; the writer is held inside its
transaction by a lock the test takes on ``reports``, so the backlog is exact."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import psycopg
from sqlalchemy import make_url, text

from gemini_agent.config import AgentSettings
from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter
from gemini_agent.spool import Spool
from gemini_api.service_config import RETRY_AFTER_KEY, RETRY_AFTER_MAX_S, retry_after_s
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store

from .conftest import AGENT, agent_md, serve
from .test_replicas import POLICY, report, until

QUEUE_MAX = 4
SENT = 16


def _send(stub, req) -> tuple[str, grpc.StatusCode | None, dict[str, str]]:
    try:
        stub.ReportAggregates(req, metadata=agent_md(), timeout=60)
        return req.report_id, None, {}
    except grpc.RpcError as e:
        return req.report_id, e.code(), dict(e.trailing_metadata() or ())


def test_beyond_the_queue_reports_are_refused_at_once_with_a_retry_hint(db_url) -> None:
    url = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with serve(db_url, ingest_queue_max=QUEUE_MAX) as svc:
        policy_store.create_policy(svc.engine, PolicyCreate(name=POLICY), actor="test")
        svc.booster.reload_policies()
        rng = np.random.default_rng(0)
        reqs = [report(f"host-{i}", rng) for i in range(SENT)]
        stub = svc.stub()
        with psycopg.connect(url) as blocker, ThreadPoolExecutor(SENT) as pool:
            blocker.execute("LOCK TABLE reports IN EXCLUSIVE MODE")  # the writer waits
            futures = [pool.submit(_send, stub, r) for r in reqs]
            until(
                lambda: sum(f.done() for f in futures) == SENT - QUEUE_MAX,
                "the reports beyond the queue answered",
            )
            blocker.rollback()  # the writer goes on
            results = [f.result() for f in futures]
        with svc.engine.connect() as conn:
            ids = set(conn.execute(text("SELECT report_id FROM reports")).scalars())
    stored_ok = {rid for rid, code, _ in results if code is None}
    over = [(rid, md) for rid, code, md in results if code == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(stored_ok) == QUEUE_MAX and len(over) == SENT - QUEUE_MAX, results
    for _, md in over:
        assert "gemini-rejection" not in md, "an overload is not a quota: the agent retries"
        assert 1000 <= int(md[RETRY_AFTER_KEY]) <= 60_000
    assert ids == stored_ok, "a refused report was stored, or an acknowledged one lost"


def test_the_agent_keeps_a_refused_report_and_waits_as_long_as_asked(db_url, tmp_path) -> None:
    """The real agent reporter against an overloaded replica: the refused report stays in its
    spool, the next attempt waits at least the replica's hint (≥ 1 s) although the agent's own
    backoff is 1 ms, and the report is stored once the replica has room."""
    url = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    token_file = tmp_path / "token"
    token_file.write_text(AGENT)
    settings = AgentSettings(
        host_id="host-1",
        policy=POLICY,
        booster_address="",
        token_file=token_file,
        spool_dir=tmp_path / "spool",
        retry_initial_s=0.001,
        retry_max_s=0.001,
    )
    rng = np.random.default_rng(1)
    with serve(db_url, ingest_queue_max=1) as svc:
        policy_store.create_policy(svc.engine, PolicyCreate(name=POLICY), actor="test")
        svc.booster.reload_policies()
        settings = settings.model_copy(update={"booster_address": svc.grpc_target})
        reporter = Reporter(
            settings, Spool(settings.spool_dir, settings.spool_max_bytes), AgentMetrics()
        )
        ours = report("host-1", rng)
        with psycopg.connect(url) as blocker, ThreadPoolExecutor(1) as pool:
            blocker.execute("LOCK TABLE reports IN EXCLUSIVE MODE")  # the writer waits
            first = pool.submit(_send, svc.stub(), report("host-0", rng))
            until(lambda: svc.booster.writer.admit() is not None, "the queue of one full")
            reporter.submit(ours)
            asked = time.monotonic()
            assert reporter.drain() == 0
            assert len(reporter.spool) == 1, "an overloaded replica's refusal is kept, not dropped"
            assert reporter.next_attempt - asked >= 1.0, "the replica's hint is the floor"
            blocker.rollback()  # the writer goes on
            assert first.result()[1] is None
        reporter.next_attempt = 0.0  # the wait itself is not what this checks
        assert reporter.drain() == 1
        with svc.engine.connect() as conn:
            stored = conn.execute(
                text("SELECT count(*) FROM reports WHERE report_id = :r"), {"r": ours.report_id}
            ).scalar_one()
    assert stored == 1


def test_a_retry_hint_is_read_within_bounds() -> None:
    assert retry_after_s(((RETRY_AFTER_KEY, "2500"),)) == 2.5
    assert retry_after_s(((RETRY_AFTER_KEY, "86400000"),)) == RETRY_AFTER_MAX_S
    assert retry_after_s(((RETRY_AFTER_KEY, "soon"),)) is None
    assert retry_after_s(((RETRY_AFTER_KEY, "-5"),)) is None
    assert retry_after_s((("other", "1"),)) is None
    assert retry_after_s(None) is None
