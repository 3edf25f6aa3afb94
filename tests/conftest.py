"""Shared fixtures: a real PostgreSQL (embedded via pgserver, or GEMINI_TEST_DATABASE_URL), a
fresh migrated database per test, and a whole Booster (gRPC + REST) on loopback ports."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import httpx
import pytest
from sqlalchemy import create_engine, make_url, text

from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster.config import Settings
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import database

OPERATOR = "test-operator-token"
AGENT = "test-agent-token"


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory) -> str:
    url = os.environ.get("GEMINI_TEST_DATABASE_URL")
    if url:
        return url
    os.environ.setdefault("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
    return database.start_embedded(tmp_path_factory.mktemp("pg"))


def new_database(pg_admin_url: str) -> str:
    """A new database on the real server, migrated to head; returns its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    engine = database.make_engine(url)
    database.migrate(engine)
    engine.dispose()
    return url


@pytest.fixture
def db_url(pg_admin_url) -> Iterator[str]:
    """A new database for one test, dropped afterwards."""
    url = new_database(pg_admin_url)
    yield url
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{make_url(url).database}" WITH (FORCE)'))
    admin.dispose()


@dataclass
class Running:
    server: BoosterServer
    grpc_target: str
    http: httpx.Client

    @property
    def booster(self):
        return self.server.booster

    @property
    def engine(self):
        return self.server.engine

    def stub(self) -> pb_grpc.BoosterStub:
        return pb_grpc.BoosterStub(grpc.insecure_channel(self.grpc_target))


def make_settings(db_url: str, **overrides) -> Settings:
    values = dict(
        database_url=db_url,
        grpc_listen="127.0.0.1:0",
        http_port=0,
        bootstrap_operator_token=OPERATOR,
        bootstrap_agent_token=AGENT,
        # One fleet-wide agent token for the tests' many synthetic hosts; per-host tokens and
        # the refusal of unbound ones are tested in test_identity.py.
        allow_unbound_agent_tokens=True,
        refit_interval_s=3600,
        # Refits in this process: a worker pool per test costs seconds of start-up; the pool
        # itself is exercised by the tests that run `booster serve` (test_replicas.py).
        refit_processes=0,
    )
    values.update(overrides)
    return Settings(**values)


def lab_fleet_settings(db_url: str) -> Callable[[str], Settings]:
    """Booster for a lab run listening where the run says: each lab host has a token of its
    own, bound to it (no bootstrap agent token, no unbound tokens), refits every 2 s."""
    return lambda listen: make_settings(
        db_url,
        grpc_listen=listen,
        refit_interval_s=2,
        bootstrap_agent_token=None,
        allow_unbound_agent_tokens=False,
    )


@contextmanager
def serve(db_url: str, **overrides) -> Iterator[Running]:
    """A whole Booster on ``db_url`` with ``overrides`` of the test settings."""
    server = BoosterServer(make_settings(db_url, **overrides)).start()
    http = httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30)
    try:
        yield Running(server, f"127.0.0.1:{server.grpc_port}", http)
    finally:
        http.close()
        server.stop()


@pytest.fixture
def booster(db_url) -> Iterator[Running]:
    with serve(db_url) as running:
        yield running


def free_port() -> int:
    """A loopback port nobody listens on now (for servers that must be told their port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def agent_md(token: str = AGENT) -> tuple:
    return (("authorization", f"Bearer {token}"),)


def insert_old_policy_and_context(conn) -> None:
    """A policy named 'old' and one context, written with the columns every migration since
    0001 has: for tests that migrate a database holding data."""
    conn.execute(
        text(
            "INSERT INTO policies (name, sigma, region, bounds, mode, target_cc, acq_func,"
            " exploration_share, n_initial_points, min_flows, history_hours, time_buckets,"
            " max_model_points, revision) SELECT 'old', 1, 'production', '{}', 'contextual',"
            " 'fusion', 'gp_hedge', 0.1, 5, 1, 24, 1, 500, 1"
        )
    )
    conn.execute(
        text(
            "INSERT INTO contexts (src_region, src_isp, dst_region, dst_isp, hour)"
            " VALUES ('a', 'b', 'c', 'd', 1)"
        )
    )
