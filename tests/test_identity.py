"""Per-host identity on the agent port, over real gRPC and real PostgreSQL: a host's token
speaks for that host only, tokens rotate without a refused call, expired and revoked tokens are
refused, and unbound (fleet-wide) agent tokens only work where a setting allows them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, make_url, text

from gemini_agent.config import AgentSettings
from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter
from gemini_agent.spool import Spool
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import credentials as token_store
from gemini_booster.storage import database
from gemini_booster.storage import errors as storage_errors
from gemini_booster.storage import policies as policy_store

from .conftest import OPERATOR, Running, agent_md, auth, make_settings
from .polling import until

POLICY = "p1"
DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def strict_settings(db_url: str, **overrides):
    """Settings as a new install has them: no fleet-wide agent token, none allowed."""
    return make_settings(
        db_url, bootstrap_agent_token=None, allow_unbound_agent_tokens=False, **overrides
    )


def serve(db_url: str, **overrides) -> Running:
    server = BoosterServer(strict_settings(db_url, **overrides)).start()
    http = httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30)
    return Running(server, f"127.0.0.1:{server.grpc_port}", http)


def close(running: Running) -> None:
    running.http.close()
    running.server.stop()


@pytest.fixture
def strict(db_url) -> Iterator[Running]:
    running = serve(db_url)
    policy_store.create_policy(running.engine, PolicyCreate(name=POLICY), actor="test")
    running.booster.reload_policies()
    try:
        yield running
    finally:
        close(running)


def report(host: str, seed: int = 0) -> pb.ReportRequest:
    rng = np.random.default_rng(seed)
    theta = load_spec().default()
    aggs = [sim.make_aggregate(c, theta, 1.0, 20, rng) for c in sim.DEFAULT_CONTEXTS]
    return sim.make_report(host, POLICY, aggs)


def parameters(host: str) -> pb.GetParametersRequest:
    return pb.GetParametersRequest(
        host_id=host, policy=POLICY, contexts=[c.message() for c in sim.DEFAULT_CONTEXTS]
    )


def refused(call, request, token: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(request, metadata=agent_md(token), timeout=10)
    return e.value


def stored(engine, host: str) -> int:
    with engine.connect() as conn:
        q = text("SELECT count(*) FROM reports WHERE host_id = :h")
        return conn.execute(q, {"h": host}).scalar_one()


def metric(running: Running | BoosterServer, name: str, **labels: str) -> float:
    for family in running.booster.metrics.families():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_a_hosts_token_cannot_report_or_read_as_another_host(strict: Running) -> None:
    token_a = token_store.create_token(strict.engine, "a-1", "agent", "test", host_id="host-a")
    token_store.create_token(strict.engine, "b-1", "agent", "test", host_id="host-b")
    strict.booster.tokens_changed()  # as REST does: written behind the replica's back
    stub = strict.stub()

    e = refused(stub.ReportAggregates, report("host-b"), token_a)
    assert e.code() == DENIED
    assert e.details() == "token 'a-1' speaks for host 'host-a', not 'host-b'"
    assert token_a not in e.details()
    assert stored(strict.engine, "host-b") == 0

    e = refused(stub.GetParameters, parameters("host-b"), token_a)
    assert e.code() == DENIED
    assert "not 'host-b'" in e.details()

    # Its own host it may speak for.
    reply = stub.ReportAggregates(report("host-a"), metadata=agent_md(token_a), timeout=10)
    assert reply.aggregates_stored == len(sim.DEFAULT_CONTEXTS)
    assert stub.GetParameters(parameters("host-a"), metadata=agent_md(token_a), timeout=10)
    assert stored(strict.engine, "host-a") == 1

    tag = "gemini_booster_auth_failures_total"
    assert metric(strict, tag, api="grpc", reason="host_mismatch") == 2
    rejected = "gemini_booster_reports_total"
    assert metric(strict, rejected, outcome="rejected", reason="host_mismatch") == 1


def test_an_unbound_agent_token_is_refused_unless_allowed(strict: Running, db_url) -> None:
    fleet = token_store.create_token(strict.engine, "fleet", "agent", "test")
    strict.booster.tokens_changed()
    e = refused(strict.stub().ReportAggregates, report("host-a"), fleet)
    assert e.code() == DENIED
    assert "bound to no host" in e.details() and fleet not in e.details()
    assert stored(strict.engine, "host-a") == 0

    # The same token where the setting allows unbound agent tokens: any host.
    lenient = BoosterServer(make_settings(db_url, allow_unbound_agent_tokens=True)).start()
    try:
        stub = pb_grpc.BoosterStub(grpc.insecure_channel(f"127.0.0.1:{lenient.grpc_port}"))
        for host in ("host-a", "host-b"):
            stub.ReportAggregates(report(host), metadata=agent_md(fleet), timeout=10)
            assert stored(strict.engine, host) == 1
        # Counted, so that an operator sees when the fleet has moved off it.
        assert metric(lenient, "gemini_booster_unbound_agent_calls_total") == 2
    finally:
        lenient.stop()


def test_the_fleet_wide_bootstrap_token_needs_the_setting(db_url) -> None:
    with pytest.raises(ValueError, match="allow_unbound_agent_tokens"):
        make_settings(db_url, allow_unbound_agent_tokens=False)


def test_rotation_refuses_no_report_and_expiry_is_enforced(strict: Running) -> None:
    first = token_store.create_token(strict.engine, "a-1", "agent", "test", host_id="host-a")
    strict.booster.tokens_changed()
    stub = strict.stub()

    def send(token: str, seed: int) -> None:
        stub.ReportAggregates(report("host-a", seed), metadata=agent_md(token), timeout=10)

    send(first, 0)
    r = strict.http.post(
        "/v1/tokens/rotate", json={"host_id": "host-a", "grace_s": 3600}, headers=auth(OPERATOR)
    )
    assert r.status_code == 201, r.text
    rotation = r.json()
    second = rotation["token"]
    assert rotation["expiring"] == ["a-1"]
    # Through the grace period both are good: the agent switches whenever it likes.
    send(first, 1)
    send(second, 2)
    send(first, 3)
    assert stored(strict.engine, "host-a") == 4

    # A rotation without grace ends every older token of the host at once.
    r = strict.http.post(
        "/v1/tokens/rotate", json={"host_id": "host-a", "grace_s": 0}, headers=auth(OPERATOR)
    )
    assert sorted(r.json()["expiring"]) == sorted(["a-1", rotation["name"]])
    third = r.json()["token"]
    for old in (first, second):
        e = refused(stub.ReportAggregates, report("host-a", 4), old)
        assert e.code() == UNAUTHENTICATED
        assert "has expired" in e.details() and old not in e.details()
    send(third, 5)
    assert stored(strict.engine, "host-a") == 5
    assert metric(strict, "gemini_booster_auth_failures_total", reason="expired") == 2


def token_file_reporter(
    target: str, policy: str, token: str, tmp_path: Path, **retry: float
) -> tuple[Reporter, AgentMetrics]:
    """host-a's real agent reporter, reading its token from ``tmp_path/token`` (written here
    with ``token``) and spooling under ``tmp_path/spool``; ``retry``: its backoff settings."""
    token_file = tmp_path / "token"
    token_file.write_text(token)
    settings = AgentSettings(
        host_id="host-a",
        policy=policy,
        booster_address=target,
        token_file=token_file,
        spool_dir=tmp_path / "spool",
        **retry,
    )
    metrics = AgentMetrics()
    return Reporter(settings, Spool(settings.spool_dir, settings.spool_max_bytes), metrics), metrics


def test_an_agent_picks_up_its_rotated_token_file_without_a_restart(
    strict: Running, tmp_path
) -> None:
    """The real agent reporter: after a rotation without grace its old token is refused and
    the report stays spooled; once the new token is in the file, the same reporter sends it."""
    first = token_store.create_token(strict.engine, "a-1", "agent", "test", host_id="host-a")
    strict.booster.tokens_changed()
    reporter, metrics = token_file_reporter(
        strict.grpc_target, POLICY, first, tmp_path, retry_initial_s=0.001, retry_max_s=0.001
    )
    token_file = tmp_path / "token"

    def send_one(seed: int) -> int:
        reporter.submit(report("host-a", seed))
        reporter.next_attempt = 0.0  # the backoff after a refusal is not what this test checks
        return reporter.drain()

    assert send_one(0) == 1
    r = strict.http.post(
        "/v1/tokens/rotate", json={"host_id": "host-a", "grace_s": 0}, headers=auth(OPERATOR)
    )
    second = r.json()["token"]
    assert send_one(1) == 0  # the old token has expired: kept in the spool, not lost
    assert len(reporter.spool) == 1
    tmp = tmp_path / "token.new"
    tmp.write_text(second)
    tmp.replace(token_file)
    reporter.next_attempt = 0.0
    assert reporter.drain() == 1
    assert len(reporter.spool) == 0 and stored(strict.engine, "host-a") == 2
    assert metrics.token_reloads.labels("reloaded")._value.get() == 1


def test_a_revoked_token_is_refused(strict: Running) -> None:
    token = token_store.create_token(strict.engine, "a-1", "agent", "test", host_id="host-a")
    strict.booster.tokens_changed()
    stub = strict.stub()
    stub.GetParameters(parameters("host-a"), metadata=agent_md(token), timeout=10)
    assert strict.http.delete("/v1/tokens/a-1", headers=auth(OPERATOR)).status_code == 204
    e = refused(stub.GetParameters, parameters("host-a"), token)
    assert e.code() == UNAUTHENTICATED
    assert e.details() == "unknown or revoked token"


def test_a_rotation_is_not_refused_for_a_host_without_tokens(strict: Running) -> None:
    with pytest.raises(storage_errors.NotFound, match="no live token for host 'ghost'"):
        token_store.rotate_token(strict.engine, "ghost", "test", timedelta(hours=1))
    r = strict.http.post("/v1/tokens/rotate", json={"host_id": "ghost"}, headers=auth(OPERATOR))
    assert r.status_code == 404


def test_only_agent_tokens_are_bound_to_a_host(strict: Running) -> None:
    with pytest.raises(ValueError, match="only agent tokens"):
        token_store.create_token(strict.engine, "v", "viewer", "test", host_id="host-a")
    r = strict.http.post(
        "/v1/tokens",
        json={"name": "v", "role": "viewer", "host_id": "host-a"},
        headers=auth(OPERATOR),
    )
    assert r.status_code == 422
    assert "host_id binds agent tokens only" in r.text


def test_another_replica_learns_a_rotation_through_the_database(strict: Running, db_url) -> None:
    first = token_store.create_token(strict.engine, "a-1", "agent", "test", host_id="host-a")
    other = serve(db_url)
    try:
        until(lambda: POLICY in other.booster.policies, "the other replica loads the policy")
        stub = other.stub()
        stub.GetParameters(parameters("host-a"), metadata=agent_md(first), timeout=10)
        r = strict.http.post(
            "/v1/tokens/rotate", json={"host_id": "host-a", "grace_s": 0}, headers=auth(OPERATOR)
        )
        second = r.json()["token"]

        def answers(token: str) -> grpc.StatusCode:
            try:
                stub.GetParameters(parameters("host-a"), metadata=agent_md(token), timeout=10)
            except grpc.RpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        # The other replica was told by the `tokens` notification, not by this test.
        until(
            lambda: answers(second) == grpc.StatusCode.OK, "the other replica takes the new token"
        )
        assert answers(first) == UNAUTHENTICATED
    finally:
        close(other)


def test_migration_keeps_the_tokens_of_an_older_schema(pg_admin_url) -> None:
    """A database at revision 0003 with an operator and a fleet-wide agent token: after the
    upgrade both exist unchanged, the agent token as unbound."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    engine = database.make_engine(url)
    try:
        database.migrate(engine, "0003")
        with engine.begin() as conn:
            for token, role in (("old-op", "operator"), ("old-fleet", "agent")):
                conn.execute(
                    text(
                        "INSERT INTO api_tokens (name, role, token_sha256, revoked) "
                        "VALUES (:n, :r, :h, false)"
                    ),
                    {"n": token, "r": role, "h": token_store.hash_token(token)},
                )
        database.migrate(engine)
        found = token_store.lookup_tokens(engine)
        assert found[token_store.hash_token("old-op")] == token_store.TokenRecord(
            "old-op", "operator"
        )
        assert found[token_store.hash_token("old-fleet")] == token_store.TokenRecord(
            "old-fleet", "agent"
        )
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
