"""The hardening defects of issue #35 (item 6), each reproduced: an expired token over REST, a
silent partition between a replica and PostgreSQL, a rotation with a non-printable host id,
long identifiers echoed in refusals, readiness while the database cannot write, and a raw
HTTP/2 client's oversized header.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator

import grpc
import psycopg
import pytest
from sqlalchemy import create_engine, make_url, text

from gemini_api.v1 import booster_pb2 as pb
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import credentials as token_store
from gemini_booster.storage import database
from gemini_booster.storage import policies as policy_store

from .conftest import OPERATOR, Running, agent_md, auth, end_other_sessions
from .http2 import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    frame,
    literal,
)
from .polling import until

SERVICE = "gemini.booster.v1.Booster"
GENEROUS_S = 60.0  # a bound on "returns rather than hangs", never a timing assertion


# -- (2) an expired token is a 401, not a 500 ----------------------------------------------------


def test_expired_token_is_401_over_rest(booster: Running) -> None:
    old = token_store.create_token(booster.engine, "old-viewer", "viewer", "test")
    with booster.engine.begin() as conn:
        conn.execute(
            text("UPDATE api_tokens SET expires_at = now() - interval '1 hour' WHERE name = :n"),
            {"n": "old-viewer"},
        )
    booster.server.booster.tokens_changed()
    r = booster.http.get("/v1/policies", headers=auth(old))
    assert r.status_code == 401, r.text
    assert "expired" in r.json()["detail"]
    # The same through the body-limit guard (a route with a body), and the connection still
    # answers the next request.
    r = booster.http.post("/v1/policies", headers=auth(old), json={"name": "x"})
    assert r.status_code == 401, r.text
    assert booster.http.get("/livez").status_code == 200


def test_rotated_token_after_grace_is_401(booster: Running) -> None:
    token = token_store.create_token(booster.engine, "h1", "agent", "test", host_id="host-1")
    r = booster.http.post(
        "/v1/tokens/rotate", headers=auth(OPERATOR), json={"host_id": "host-1", "grace_s": 0}
    )
    assert r.status_code == 201, r.text
    r = booster.http.get("/v1/policies", headers=auth(token))
    assert r.status_code == 401, r.text


# -- (4) a rotation with a non-printable host id is a 422 ----------------------------------------


@pytest.mark.parametrize("host_id", ["host\x00a", "host\x07", "host\u200ba", "\x7f"])
def test_rotate_with_non_printable_host_is_422(booster: Running, host_id: str) -> None:
    r = booster.http.post("/v1/tokens/rotate", headers=auth(OPERATOR), json={"host_id": host_id})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "host_id"]
    r = booster.http.post(
        "/v1/tokens",
        headers=auth(OPERATOR),
        json={"name": "t1", "role": "agent", "host_id": host_id},
    )
    assert r.status_code == 422, r.text


# -- (3) database connections fail fast on a silent partition -----------------------------------

LIBPQ_TIMEOUTS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


def test_engines_carry_connect_keepalive_and_user_timeouts() -> None:
    url = "postgresql+psycopg://u@192.0.2.1:5432/db"
    main = database.make_engine(url)
    writer = database.writer_engine(main)
    try:
        for engine in (main, writer):
            args = database.connect_args(engine)
            for name in LIBPQ_TIMEOUTS:
                assert name in args, f"{name} missing from {args}"
            assert 0 < int(args["connect_timeout"]) <= 10
            assert int(args["tcp_user_timeout"]) > 0
    finally:
        writer.dispose()
        main.dispose()


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A port whose connections the kernel completes but nobody ever answers: a peer gone
    silent behind a partition, as the client sees it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def _returns(fn, deadline_s: float) -> BaseException | None:
    """What ``fn`` raised, or AssertionError when it was still running after ``deadline_s``."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(deadline_s)
    assert outcome, f"still waiting after {deadline_s:.0f} s: no timeout applied"
    return outcome[0]


@pytest.mark.parametrize("which", ["main", "writer"])
def test_connect_to_a_silent_peer_fails_instead_of_hanging(which: str) -> None:
    with silent_listener() as port:
        main = database.make_engine(f"postgresql+psycopg://u@127.0.0.1:{port}/db")
        engine = main if which == "main" else database.writer_engine(main)
        try:

            def connect() -> None:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))

            error = _returns(connect, GENEROUS_S)
            assert error is not None and "timeout" in str(error).lower(), error
        finally:
            engine.dispose()
            main.dispose()


def test_follower_connection_has_the_same_timeouts() -> None:
    from gemini_booster.service.sync import connect_kwargs

    args = connect_kwargs()
    for name in LIBPQ_TIMEOUTS:
        assert name in args


def test_psycopg_connect_with_the_timeouts_to_a_silent_peer_fails() -> None:
    with silent_listener() as port:
        error = _returns(
            lambda: psycopg.connect(
                f"postgresql://u@127.0.0.1:{port}/db", **database.LIBPQ_TIMEOUTS
            ),
            GENEROUS_S,
        )
        assert isinstance(error, psycopg.OperationalError)


# -- (5) long identifiers are never echoed whole -------------------------------------------------


def _policy(booster: Running, name: str = "cdn") -> None:
    policy_store.create_policy(booster.engine, PolicyCreate(name=name), "test")
    booster.server.booster.reload_policies()


def test_long_host_id_is_not_echoed_whole_in_permission_denied(booster: Running) -> None:
    _policy(booster)
    token = token_store.create_token(booster.engine, "h1", "agent", "test", host_id="host-a")
    booster.server.booster.tokens_changed()
    long_host = "h" * 10_000
    stub = grpc.insecure_channel(booster.grpc_target).unary_unary(f"/{SERVICE}/GetParameters")
    req = pb.GetParametersRequest(policy="cdn", host_id=long_host)
    with pytest.raises(grpc.RpcError) as e:
        stub(req.SerializeToString(), metadata=agent_md(token), timeout=30)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value
    details = e.value.details()
    assert len(details) < 400 and "…" in details and "host-a" in details


def test_long_policy_name_is_not_echoed_whole(booster: Running) -> None:
    stub = grpc.insecure_channel(booster.grpc_target).unary_unary(f"/{SERVICE}/GetParameters")
    req = pb.GetParametersRequest(policy="p" * 10_000, host_id="h1")
    with pytest.raises(grpc.RpcError) as e:
        stub(req.SerializeToString(), metadata=agent_md(), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value
    assert len(e.value.details()) < 400 and "…" in e.value.details()


def test_shorten() -> None:
    from gemini_booster.service.auth import shorten

    assert shorten("abc") == "'abc'"
    s = shorten("x" * 10_000)
    assert len(s) < 80 and s.endswith("…'") is False and "…" in s and "10000 characters" in s


# -- (5) /readyz is false while the database cannot write ---------------------------------------


def test_readyz_false_while_the_database_cannot_write(booster: Running, db_url: str) -> None:
    assert booster.http.get("/readyz").status_code == 200
    name = make_url(db_url).database
    admin = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'))
            # Sessions take the setting when they start: end every other one, as a restart of
            # the server into a state where it cannot write would.
            end_other_sessions(conn)
        until(lambda: booster.http.get("/readyz").status_code == 503, "not ready")
        r = booster.http.get("/readyz")
        assert "write" in r.json()["detail"]
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" RESET default_transaction_read_only'))
            end_other_sessions(conn)
        until(lambda: booster.http.get("/readyz").status_code == 200, "ready again")
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" RESET default_transaction_read_only'))
        admin.dispose()


# -- (5) the metadata limit holds for a raw HTTP/2 client ---------------------------------------


def test_raw_http2_client_cannot_pass_a_200_kb_header(booster: Running) -> None:
    """A client that ignores the server's SETTINGS_MAX_HEADER_LIST_SIZE and sends 200 kB of
    headers in HEADERS + CONTINUATION frames: its call must never reach the service."""
    _policy(booster)
    port = int(booster.grpc_target.rsplit(":", 1)[1])
    body = pb.GetParametersRequest(policy="cdn", host_id="h1").SerializeToString()
    headers = b"".join(
        literal(k, v)
        for k, v in (
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", f"/{SERVICE}/GetParameters".encode()),
            (b":authority", b"127.0.0.1"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"authorization", b"Bearer test-agent-token"),
            (b"x-pad", b"a" * 200_000),
        )
    )
    frames: list[tuple[int, int, int, bytes]] = []
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        chunks = [headers[i : i + 16_000] for i in range(0, len(headers), 16_000)]
        out = b""
        for i, chunk in enumerate(chunks):
            kind = HEADERS if i == 0 else CONTINUATION
            flags = END_HEADERS if i == len(chunks) - 1 else 0
            out += frame(kind, flags, 1, chunk)
        out += frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(body)) + body)
        with contextlib.suppress(OSError):
            sock.sendall(out)
        buf = b""
        deadline = time.monotonic() + GENEROUS_S
        ended = False
        while not ended and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                n = int.from_bytes(buf[:3], "big")
                kind, flags = buf[3], buf[4]
                stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                frames.append((kind, flags, stream, buf[9 : 9 + n]))
                buf = buf[9 + n :]
                if kind == SETTINGS and not flags & ACK:
                    with contextlib.suppress(OSError):
                        sock.sendall(frame(SETTINGS, ACK, 0))
                if kind == GOAWAY or (stream == 1 and (kind == RST_STREAM or flags & END_STREAM)):
                    ended = True
    finally:
        sock.close()
    answered = [f for f in frames if f[2] == 1 and f[0] == DATA]
    assert not answered, "the call with a 200 kB header was answered"
    assert any(
        f[0] == GOAWAY or (f[2] == 1 and (f[0] == RST_STREAM or f[1] & END_STREAM)) for f in frames
    ), f"no refusal seen: {[(k, fl, s) for k, fl, s, _ in frames]}"


def test_grpc_channel_with_a_200_kb_header_is_refused(booster: Running) -> None:
    _policy(booster)
    channel = grpc.insecure_channel(
        booster.grpc_target,
        options=[("grpc.max_metadata_size", 1 << 20), ("grpc.absolute_max_metadata_size", 1 << 20)],
    )
    stub = channel.unary_unary(f"/{SERVICE}/GetParameters")
    req = pb.GetParametersRequest(policy="cdn", host_id="h1")
    with pytest.raises(grpc.RpcError) as e:
        stub(req.SerializeToString(), metadata=(*agent_md(), ("x-pad", "a" * 200_000)), timeout=30)
    assert e.value.code() != grpc.StatusCode.OK
    channel.close()
