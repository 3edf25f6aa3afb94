"""Report ids are the sending host's own (issue #35, hardening defect 1), over real gRPC into
real PostgreSQL with per-host tokens.

Agents derive a report's id from host, policy and interval start, so anyone can compute a host's
next id. Keyed across hosts, host B (with its own valid token) could send a report under host
A's next id first; A's report then met ALREADY_EXISTS and A's agent set it aside for good.
Booster now keys reports by (authenticated host, report id): B's report is B's, A's is stored,
and each host's retries and reused ids behave as before."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from sqlalchemy import text

from benchmarks import report_size as mix
from gemini_agent.context import ContextResolver
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import credentials as token_store
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage.ingest import Admissions, ContextIds, store_reports

from .conftest import Running, agent_md, make_settings
from .test_identity import token_file_reporter

POLICY = mix.POLICY
HOSTS = ("host-a", "host-b")


@pytest.fixture
def strict(db_url: str) -> Iterator[tuple[Running, dict[str, str]]]:
    """Booster as a new install runs it (no fleet-wide agent token), a token per host."""
    settings = make_settings(db_url, bootstrap_agent_token=None, allow_unbound_agent_tokens=False)
    server = BoosterServer(settings).start()
    http = httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30)
    running = Running(server, f"127.0.0.1:{server.grpc_port}", http)
    try:
        policy_store.create_policy(server.engine, PolicyCreate(name=POLICY), actor="test")
        server.booster.reload_policies()
        tokens = {
            h: token_store.create_token(server.engine, f"{h}-1", "agent", "test", host_id=h)
            for h in HOSTS
        }
        server.booster.tokens_changed()  # as REST does: written behind the replica's back
        yield running, tokens
    finally:
        http.close()
        server.stop()


@pytest.fixture(scope="module")
def resolver(tmp_path_factory) -> ContextResolver:
    return ContextResolver(mix.SOURCE, mix.prefix_table(Path(tmp_path_factory.mktemp("table"))))


def agent_report(
    resolver: ContextResolver, host: str, seed: int, ended: dt.datetime | None = None
) -> pb.ReportRequest:
    """What ``host``'s agent reports for the minute of ``ended`` (by default the last one), from
    a realistic mix of flows, with the id its Aggregator derives (host, policy, interval
    start)."""
    ended = ended or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    minute = mix.host_minute(np.random.default_rng(seed), host, load_spec().default(), ended)
    return minute.report(resolver)


def stored(running: Running) -> dict[tuple[str, str], int]:
    with running.engine.connect() as conn:
        rows = conn.execute(text("SELECT host_id, report_id, aggregate_count FROM reports"))
        return {(h, r): n for h, r, n in rows}


def trial_flows(running: Running) -> int:
    with running.engine.connect() as conn:
        q = text("SELECT coalesce(sum(flow_count), 0) FROM trials")
        return conn.execute(q).scalar_one()


def flows(req: pb.ReportRequest) -> int:
    return sum(a.flow_count for a in req.aggregates)


def test_another_host_cannot_take_a_hosts_report_id(
    strict: tuple[Running, dict[str, str]], resolver: ContextResolver, tmp_path: Path
) -> None:
    running, tokens = strict
    victim = agent_report(resolver, "host-a", seed=1)
    # Host B, with its own valid token, sends first under A's next id (B's own content).
    forged = agent_report(resolver, "host-b", seed=2)
    forged.report_id = victim.report_id
    resp = running.stub().ReportAggregates(forged, metadata=agent_md(tokens["host-b"]))
    assert not resp.duplicate and resp.aggregates_stored == len(forged.aggregates)

    # A's agent sends its report as it always does: through its spool and reporter.
    reporter, _ = token_file_reporter(running.grpc_target, POLICY, tokens["host-a"], tmp_path)
    reporter.submit(victim)
    assert reporter.drain() == 1
    assert len(reporter.spool) == 0
    assert not list((tmp_path / "spool" / "rejected").iterdir())  # nothing set aside

    assert stored(running) == {
        ("host-a", victim.report_id): len(victim.aggregates),
        ("host-b", victim.report_id): len(forged.aggregates),
    }
    assert trial_flows(running) == flows(victim) + flows(forged)


def test_a_hosts_own_retries_and_reused_ids_are_unchanged(
    strict: tuple[Running, dict[str, str]], resolver: ContextResolver
) -> None:
    running, tokens = strict
    stub, md = running.stub(), agent_md(tokens["host-a"])
    ended = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    req = agent_report(resolver, "host-a", seed=3, ended=ended)
    assert not stub.ReportAggregates(req, metadata=md).duplicate
    again = stub.ReportAggregates(req, metadata=md)
    assert again.duplicate and again.aggregates_stored == 0
    other = agent_report(resolver, "host-a", seed=4, ended=ended)  # other flows, same id
    assert other.report_id == req.report_id
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportAggregates(other, metadata=md)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert stored(running) == {("host-a", req.report_id): len(req.aggregates)}
    assert trial_flows(running) == flows(req)


def test_one_id_from_two_hosts_in_one_batch_is_two_reports(
    strict: tuple[Running, dict[str, str]], resolver: ContextResolver
) -> None:
    """The writer's group commit dedupes a batch by (host, id), not by id."""
    running, _ = strict
    a = agent_report(resolver, "host-a", seed=5)
    b = agent_report(resolver, "host-b", seed=6)
    b.report_id = a.report_id
    rows = [running.booster.validate_report(r.SerializeToString()) for r in (a, b, a)]
    outcomes = store_reports(running.engine, rows, ContextIds(), Admissions(), 1000)
    assert [(o.duplicate, o.stored, o.error) for o in outcomes] == [
        (False, len(a.aggregates), None),
        (False, len(b.aggregates), None),
        (True, 0, None),
    ]
    assert set(stored(running)) == {("host-a", a.report_id), ("host-b", a.report_id)}
    assert trial_flows(running) == flows(a) + flows(b)
