"""Booster through a PostgreSQL outage.

First the token cache alone (a fake database and a fake clock, so nothing depends on timing):
it serves the last set it loaded while the database is unreachable, for ``max_stale_s`` at
most, then refuses with AuthUnavailable; it never reloads per request, and logs a failing
reload once per interval with the exception's class only.

Then a whole Booster on a PostgreSQL of the test's own, stopped for 30 s while agents keep
asking: parameters keep coming from memory, reports are refused UNAVAILABLE in our words, the
log stays quiet, and once PostgreSQL is back the same reports are stored exactly once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import grpc
import httpx
import numpy as np
import pytest
from sqlalchemy import Engine, make_url, text

from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.service import auth as auth_module
from gemini_booster.service.app import BoosterServer
from gemini_booster.service.auth import (
    CACHE_SECONDS,
    MISS_RELOAD_SECONDS,
    RETRY_SECONDS,
    AuthError,
    AuthUnavailable,
    TokenAuthority,
)
from gemini_booster.storage import credentials as token_store
from gemini_booster.storage import database
from gemini_booster.storage import policies as policy_store

from .conftest import AGENT, agent_md, make_settings

DRIVER_TEXT = 'connection to server on socket "/run/pg/.s.PGSQL.5432" failed: host=db port=5432'

# -- the token cache, alone ------------------------------------------------------------------


class DatabaseDown(Exception):
    pass


@dataclass
class FakeTokens:
    """The token table, reachable or not; counts how often it is read."""

    tokens: dict[str, token_store.TokenRecord] = field(default_factory=dict)
    up: bool = True
    loads: int = 0
    gate: threading.Event | None = None  # when set, a load waits for it

    def add(self, token: str, name: str, role: str) -> None:
        self.tokens[token_store.hash_token(token)] = token_store.TokenRecord(name, role)

    def load(self) -> dict[str, token_store.TokenRecord]:
        self.loads += 1
        if self.gate is not None:
            self.gate.wait(10)
        if not self.up:
            raise DatabaseDown(DRIVER_TEXT)
        return dict(self.tokens)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:  # wall clock, for token expiry
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(auth_module, "time", fake)
    return fake


@pytest.fixture
def db() -> FakeTokens:
    table = FakeTokens()
    table.add("agent-1", "agent-1", "agent")
    table.add("op-1", "op-1", "operator")
    return table


def authority(
    db: FakeTokens, monkeypatch: pytest.MonkeyPatch, max_stale_s: float = 60.0
) -> TokenAuthority:
    auth = TokenAuthority(cast(Engine, None), max_stale_s, allow_unbound_agents=True)
    monkeypatch.setattr(auth, "_load", db.load)
    return auth


def bearer(token: str) -> str:
    return f"Bearer {token}"


def test_operator_tokens_are_not_agent_tokens(
    db: FakeTokens, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = authority(db, monkeypatch)
    assert auth.require(bearer("op-1"), "write").role == "operator"
    with pytest.raises(AuthError) as e:
        auth.require(bearer("op-1"), "agent")
    assert e.value.reason == "forbidden"
    assert auth.require(bearer("agent-1"), "agent").name == "agent-1"


def test_the_last_set_serves_through_an_outage_for_max_stale_then_refuses(
    db: FakeTokens, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = authority(db, monkeypatch, max_stale_s=60.0)
    auth.require(bearer("agent-1"), "agent")
    db.up = False
    for _ in range(59):  # a minute of calls, every reload failing
        clock.advance(1.0)
        assert auth.require(bearer("agent-1"), "agent").name == "agent-1"
    clock.advance(2.0)  # 61 s after the last successful load
    with pytest.raises(AuthUnavailable) as e:
        auth.require(bearer("agent-1"), "agent")
    assert e.value.reason == "unavailable"
    assert str(e.value) == "credentials cannot be checked now; retry"
    db.up = True
    clock.advance(RETRY_SECONDS)
    assert auth.require(bearer("agent-1"), "agent").name == "agent-1"


def test_a_token_the_set_does_not_know_is_unavailable_not_invalid_during_an_outage(
    db: FakeTokens, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may have been created since the last load: only the database can tell."""
    auth = authority(db, monkeypatch)
    auth.require(bearer("agent-1"), "agent")
    db.up = False
    clock.advance(CACHE_SECONDS + 1)
    with pytest.raises(AuthUnavailable):
        auth.require(bearer("new-token"), "agent")
    db.up = True
    clock.advance(RETRY_SECONDS)
    with pytest.raises(AuthError) as e:
        auth.require(bearer("new-token"), "agent")
    assert e.value.reason == "invalid"


def test_no_reload_per_request_for_unknown_tokens_or_while_the_database_is_down(
    db: FakeTokens, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = authority(db, monkeypatch)
    auth.require(bearer("agent-1"), "agent")
    assert db.loads == 1
    for i in range(1000):  # a flood of forged tokens over one second
        clock.advance(0.001)
        with pytest.raises(AuthError):
            auth.require(bearer(f"forged-{i}"), "agent")
    assert db.loads <= 1 + 1 / MISS_RELOAD_SECONDS + 1
    db.up = False
    before = db.loads
    for _ in range(1000):  # ten seconds of calls while the database is down
        clock.advance(0.01)
        auth.require(bearer("agent-1"), "agent")
    assert db.loads - before <= 10 / RETRY_SECONDS + 1


def test_a_failing_reload_is_logged_once_per_interval_with_the_class_only(
    db: FakeTokens,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=auth_module.log.name)
    auth = authority(db, monkeypatch)
    auth.require(bearer("agent-1"), "agent")
    db.up = False
    for _ in range(300):
        clock.advance(0.1)
        auth.require(bearer("agent-1"), "agent")
    lines = [r for r in caplog.records if r.name == auth_module.log.name]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    message = lines[0].getMessage()
    assert "DatabaseDown" in message and "PGSQL" not in message and "port" not in message
    assert lines[0].exc_info is None


def test_invalidate_reloads_at_the_next_check_and_keeps_the_set_through_an_outage(
    db: FakeTokens, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = authority(db, monkeypatch)
    auth.require(bearer("agent-1"), "agent")
    db.tokens.pop(token_store.hash_token("agent-1"))  # revoked
    auth.invalidate()
    with pytest.raises(AuthError) as e:
        auth.require(bearer("agent-1"), "agent")
    assert e.value.reason == "invalid"

    db.add("agent-2", "agent-2", "agent")
    auth.invalidate()
    assert auth.require(bearer("agent-2"), "agent").name == "agent-2"
    db.up = False
    auth.invalidate()  # e.g. the change listener, as the connection dropped
    loads = db.loads
    assert auth.require(bearer("agent-2"), "agent").name == "agent-2"
    assert db.loads == loads + 1


def test_require_nowait_answers_from_the_set_and_never_reads_the_database(
    db: FakeTokens, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = authority(db, monkeypatch)
    assert auth.require_nowait(bearer("agent-1"), "agent") is None  # nothing loaded yet
    assert db.loads == 0
    auth.require(bearer("agent-1"), "agent")
    principal = auth.require_nowait(bearer("agent-1"), "agent")
    assert principal is not None and principal.name == "agent-1"
    with pytest.raises(AuthError):
        auth.require_nowait(bearer("op-1"), "agent")
    clock.advance(CACHE_SECONDS + 1)
    assert auth.require_nowait(bearer("agent-1"), "agent") is None  # a reload is due
    assert db.loads == 1


def test_one_reload_at_a_time_and_known_tokens_do_not_wait_for_it_within_max_stale(
    db: FakeTokens, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = authority(db, monkeypatch)
    auth.require(bearer("agent-1"), "agent")
    clock.advance(CACHE_SECONDS + 1)
    db.gate = threading.Event()
    reloading = threading.Thread(target=auth.require, args=(bearer("agent-1"), "agent"))
    reloading.start()
    deadline = time.monotonic() + 10
    while db.loads < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert db.loads == 2  # the thread is inside its reload, holding no lock
    for _ in range(20):
        assert auth.require(bearer("agent-1"), "agent").name == "agent-1"
    assert db.loads == 2
    clock.advance(60.0)  # the reload hangs: the set in hand still ages out
    with pytest.raises(AuthUnavailable):
        auth.require(bearer("agent-1"), "agent")
    db.gate.set()
    reloading.join(10)
    assert not reloading.is_alive()


# -- a whole Booster, PostgreSQL stopped for 30 s ------------------------------------------------

POLICY = "cdn"
HOSTS = 8
OUTAGE_S = 30.0


@dataclass
class OwnPostgres:
    """A PostgreSQL for this test alone (the shared one serves other tests): stopped and
    started again on the same data directory and socket."""

    pgdata: Path
    url: str

    @property
    def socket_dir(self) -> str:
        host = make_url(self.url).query["host"]
        return host if isinstance(host, str) else host[0]

    def _pg_ctl(self, *args: str) -> None:
        import pgserver

        pg_ctl = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_ctl"
        user = "pgserver" if os.geteuid() == 0 else None  # as pgserver runs it under root
        subprocess.run(
            [str(pg_ctl), "-D", str(self.pgdata), "-w", *args],
            check=True,
            user=user,
            timeout=60,
            stdout=subprocess.DEVNULL,  # the postmaster inherits these: never pipes
            stderr=subprocess.DEVNULL,
        )

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def start(self) -> None:
        self._pg_ctl(
            "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.pgdata / "log"), "start"
        )


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[OwnPostgres]:
    os.environ.setdefault("XDG_RUNTIME_DIR", str(tmp_path))
    pgdata = tmp_path / "pg"
    pg = OwnPostgres(pgdata, database.start_embedded(pgdata))
    try:
        yield pg
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # unless already stopped
            pg.stop("immediate")


@dataclass
class Tally:
    """What the agents saw during the outage."""

    params_same: int = 0
    params_other: Counter[str] = field(default_factory=Counter)
    reports: Counter[str] = field(default_factory=Counter)
    leaks: list[str] = field(default_factory=list)
    refused: list[bytes] = field(default_factory=list)  # reports to send again afterwards
    lock: threading.Lock = field(default_factory=threading.Lock)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _request(host: int) -> pb.GetParametersRequest:
    return pb.GetParametersRequest(
        host_id=f"host-{host}", policy=POLICY, contexts=[c.message() for c in sim.DEFAULT_CONTEXTS]
    )


def _answer(resp: pb.GetParametersResponse) -> tuple[tuple[bytes, int], ...]:
    return tuple((p.theta.SerializeToString(), p.plan_version) for p in resp.parameters)


def _report(rng: np.random.Generator, host: int) -> pb.ReportRequest:
    theta = load_spec().default()
    aggs = [sim.make_aggregate(c, theta, 1.0, 20, rng) for c in sim.DEFAULT_CONTEXTS]
    return sim.make_report(f"host-{host}", POLICY, aggs)


def _leaks(details: str, pg: OwnPostgres) -> bool:
    text = details.lower()
    return any(s in text for s in (pg.socket_dir.lower(), "host=", "port", "pgsql", "psycopg"))


def _agent(
    host: int,
    target: str,
    before: tuple[tuple[bytes, int], ...],
    until: float,
    tally: Tally,
    pg: OwnPostgres,
) -> None:
    rng = np.random.default_rng(host)
    with grpc.insecure_channel(target) as channel:
        ask = channel.unary_unary("/gemini.booster.v1.Booster/GetParameters")
        send = channel.unary_unary("/gemini.booster.v1.Booster/ReportAggregates")
        i = 0
        while time.monotonic() < until:
            i += 1
            try:
                resp = pb.GetParametersResponse.FromString(
                    ask(_request(host).SerializeToString(), metadata=agent_md(), timeout=10)
                )
                same = _answer(resp) == before
                with tally.lock:
                    if same:
                        tally.params_same += 1
                    else:
                        tally.params_other["other answer"] += 1
            except grpc.RpcError as e:
                with tally.lock:
                    tally.params_other[e.code().name] += 1
                    if _leaks(e.details() or "", pg):
                        tally.leaks.append(e.details())
            if i % 20 == 0:
                raw = _report(rng, host).SerializeToString()
                try:
                    send(raw, metadata=agent_md(), timeout=10)
                    code, details = "OK", ""
                except grpc.RpcError as e:
                    code, details = e.code().name, e.details() or ""
                with tally.lock:
                    tally.reports[code] += 1
                    if code == "UNAVAILABLE":
                        tally.refused.append(raw)
                    if _leaks(details, pg):
                        tally.leaks.append(details)
            time.sleep(0.02)  # a bounded load: the machine is shared


def _status(http: httpx.Client, path: str) -> int:
    return http.get(path, timeout=10).status_code


def _send_until_stored(target: str, raws: list[bytes], deadline: float) -> list[pb.ReportResponse]:
    """Each report sent again (same bytes, same id) until Booster answers; the answers."""
    out = []
    with grpc.insecure_channel(target) as channel:
        send = channel.unary_unary("/gemini.booster.v1.Booster/ReportAggregates")
        for raw in raws:
            while True:
                try:
                    out.append(
                        pb.ReportResponse.FromString(send(raw, metadata=agent_md(), timeout=10))
                    )
                    break
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
                    assert time.monotonic() < deadline, "Booster did not recover"
                    time.sleep(0.5)
    return out


@pytest.mark.slow
def test_postgres_stopped_for_30_s_under_load(own_postgres: OwnPostgres) -> None:
    pg = own_postgres
    server = BoosterServer(make_settings(pg.url), migrate=True).start()
    assert server.engine is not None and server.booster is not None
    target = f"127.0.0.1:{server.grpc_port}"
    http = httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}")
    handler = Records()
    try:
        policy_store.create_policy(
            server.engine, PolicyCreate(name=POLICY, exploration_share=0.5), actor="test"
        )
        server.booster.reload_policies()
        rng = np.random.default_rng(0)
        with grpc.insecure_channel(target) as channel:
            send = channel.unary_unary("/gemini.booster.v1.Booster/ReportAggregates")
            for i in range(4):
                send(_report(rng, i).SerializeToString(), metadata=agent_md(AGENT), timeout=30)
        server.booster.refit(server.booster.policies[POLICY])
        with grpc.insecure_channel(target) as channel:
            ask = channel.unary_unary("/gemini.booster.v1.Booster/GetParameters")
            before = {
                h: _answer(
                    pb.GetParametersResponse.FromString(
                        ask(_request(h).SerializeToString(), metadata=agent_md(), timeout=30)
                    )
                )
                for h in range(HOSTS)
            }
        assert all(v >= 1 for a in before.values() for _, v in a), "no plans before the outage"

        logging.getLogger().addHandler(handler)
        pg.stop()
        t0 = time.monotonic()
        tally = Tally()
        agents = [
            threading.Thread(
                target=_agent, args=(h, target, before[h], t0 + OUTAGE_S, tally, pg), daemon=True
            )
            for h in range(HOSTS)
        ]
        for a in agents:
            a.start()
        # Readiness turns false once the follower has missed the database for 10 s: polled
        # until it does, within the outage; liveness holds meanwhile.
        ready = _status(http, "/readyz")
        while ready == 200 and time.monotonic() < t0 + OUTAGE_S:
            ready = _status(http, "/readyz")
            time.sleep(0.2)  # a poll interval, not a wait for something to happen
        live = _status(http, "/livez")
        for a in agents:
            a.join(OUTAGE_S + 30)
        logging.getLogger().removeHandler(handler)
        during = list(handler.records)
        pg.start()

        answered = tally.params_same + sum(tally.params_other.values())
        summary = (
            f"GetParameters {tally.params_same}/{answered} same, others {dict(tally.params_other)};"
            f" reports {dict(tally.reports)}; {len(during)} log records"
        )
        print(summary)
        for r in during:
            print(f"  {r.levelname} {r.name}: {r.getMessage()[:160]}")
        # GetParameters kept answering through the outage: many answers per host (a count with
        # a wide margin on any machine: each host asks every 20 ms for 30 s)
        assert answered >= 20 * HOSTS, summary
        assert tally.params_same >= 0.99 * answered, summary
        assert set(tally.reports) == {"UNAVAILABLE"} and tally.reports["UNAVAILABLE"] >= HOSTS, (
            summary
        )
        assert not tally.leaks, tally.leaks[:3]
        assert live == 200
        if ready != 404:  # readiness on REST is someone else's route; skip if absent
            assert ready == 503

        tracebacks = sum(1 for r in during if r.exc_info)
        repeats = Counter((r.name, str(r.msg)) for r in during if r.levelno >= logging.WARNING)
        noisiest = repeats.most_common(3)
        assert tracebacks <= 3, f"{tracebacks} tracebacks in the outage log"
        assert not noisiest or noisiest[0][1] <= 5, noisiest
        assert not any(_leaks(r.getMessage(), pg) for r in during if r.name.endswith("grpc_server"))

        # PostgreSQL is back: the same reports (same ids) are stored, each exactly once.
        raws = tally.refused
        first = _send_until_stored(target, raws, time.monotonic() + 90)
        assert all(not r.duplicate and r.aggregates_stored > 0 for r in first)
        again = _send_until_stored(target, raws, time.monotonic() + 30)
        assert all(r.duplicate for r in again)
        ids = [pb.ReportRequest.FromString(raw).report_id for raw in raws]
        with server.engine.connect() as conn:
            counts: dict[str, int] = dict(
                conn.execute(
                    text(
                        "SELECT report_id, count(*) FROM reports WHERE report_id = ANY(:ids) "
                        "GROUP BY report_id"
                    ),
                    {"ids": ids},
                ).all()
            )
        assert len(ids) == len(set(ids)) and counts == dict.fromkeys(ids, 1)
    finally:
        logging.getLogger().removeHandler(handler)
        http.close()
        server.stop()
