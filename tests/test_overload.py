"""Overload is explicit: beyond ``ingest_queue_max`` reports waiting to be stored, a replica
refuses more at once (RESOURCE_EXHAUSTED, no quota mark, a retry hint), stores none of them,
and loses none it acknowledged. Real gRPC into real PostgreSQL; the writer is held inside its
transaction by a lock the test takes on ``reports``, so the backlog is exact."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import psycopg
from sqlalchemy import make_url, text

from gemini_booster.models import PolicyCreate
from gemini_booster.service.grpc_server import RETRY_AFTER_KEY
from gemini_booster.storage import repository as repo

from .conftest import agent_md, serve
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
        repo.create_policy(svc.engine, PolicyCreate(name=POLICY), actor="test")
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
