"""The agent port's contract at its edges: only agent tokens, exactly one request message per
call, a half-sent message cut off within the configured bounds, and status codes that say what
to do (NOT_FOUND for an unknown policy, UNAVAILABLE with our words when anything fails inside).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest

from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.service import grpc_server
from gemini_booster.service.auth import TokenAuthority
from gemini_booster.service.grpc_server import (
    CANNOT_ANSWER,
    ONE_MESSAGE,
    STORAGE_UNAVAILABLE,
    AgentServer,
    GrpcLimits,
)
from gemini_booster.service.ratelimit_log import RateLimitedLog
from gemini_booster.storage import policies as policy_store

from .conftest import AGENT, OPERATOR, Running, agent_md, make_settings, new_database, serve
from .http2 import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    literal,
)

POLICY = "p1"
SERVICE = "/gemini.booster.v1.Booster"
DRIVER_TEXT = 'connection failed: host=db.example port=5432 "/run/pg/.s.PGSQL.5432"'


@pytest.fixture(scope="module")
def svc(pg_admin_url: str) -> Iterator[Running]:
    """One Booster for the module (each test leaves it as it found it)."""
    with serve(new_database(pg_admin_url)) as running:
        assert running.server.engine is not None and running.booster is not None
        policy_store.create_policy(running.server.engine, PolicyCreate(name=POLICY), actor="test")
        running.booster.reload_policies()
        yield running


@pytest.fixture
def channel(svc: Running) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(svc.grpc_target)
    yield ch
    ch.close()


def report(policy: str = POLICY) -> pb.ReportRequest:
    rng = np.random.default_rng(0)
    aggs = [
        sim.make_aggregate(c, load_spec().default(), 1.0, 20, rng) for c in sim.DEFAULT_CONTEXTS
    ]
    return sim.make_report("host-1", policy, aggs)


def params_request(policy: str = POLICY) -> pb.GetParametersRequest:
    return pb.GetParametersRequest(
        host_id="host-1", policy=policy, contexts=[c.message() for c in sim.DEFAULT_CONTEXTS]
    )


def stored(svc: Running, report_id: str) -> int:
    from sqlalchemy import text

    with svc.engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM reports WHERE report_id = :r"), {"r": report_id}
        ).scalar_one()


def call(
    channel: grpc.Channel, method: str, request: Any, metadata: tuple = agent_md()
) -> grpc.RpcError:
    """The error a call ends with (it must end with one)."""
    stub = channel.unary_unary(f"{SERVICE}/{method}")
    with pytest.raises(grpc.RpcError) as e:
        stub(request.SerializeToString(), metadata=metadata, timeout=30)
    return e.value


# -- credentials -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "request_fn"),
    [("ReportAggregates", report), ("GetParameters", params_request)],
)
def test_operator_and_viewer_tokens_are_refused_on_the_agent_port(
    svc: Running, channel: grpc.Channel, method: str, request_fn: Callable[[], Any]
) -> None:
    # Made through REST, as an operator does, so this replica knows it at once (a token written
    # to the database behind Booster's back is seen within its token cache's reload bounds).
    created = svc.http.post(
        "/v1/tokens",
        json={"name": f"viewer-{method.lower()}", "role": "viewer"},
        headers={"authorization": f"Bearer {OPERATOR}"},
    )
    assert created.status_code == 201, created.text
    viewer = created.json()["token"]
    for token in (OPERATOR, viewer):
        req = request_fn()
        err = call(channel, method, req, agent_md(token))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, token
        assert "may not agent" in err.details()
        if method == "ReportAggregates":
            assert stored(svc, req.report_id) == 0


# -- one message per call ----------------------------------------------------------------------


def test_two_messages_in_one_unary_call_are_refused_and_nothing_is_stored(
    svc: Running, channel: grpc.Channel
) -> None:
    first, second = report(), report()
    send = channel.stream_unary(f"{SERVICE}/ReportAggregates")
    with pytest.raises(grpc.RpcError) as e:
        send(
            iter([first.SerializeToString(), second.SerializeToString()]),
            metadata=agent_md(),
            timeout=30,
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == ONE_MESSAGE
    assert stored(svc, first.report_id) == 0 and stored(svc, second.report_id) == 0

    ask = channel.stream_unary(f"{SERVICE}/GetParameters")
    for messages in ([], [params_request()] * 2):
        with pytest.raises(grpc.RpcError) as e:
            ask(iter(m.SerializeToString() for m in messages), metadata=agent_md(), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == ONE_MESSAGE

    # One message, as every unary client sends it, is served.
    resp = pb.ReportResponse.FromString(
        send(iter([first.SerializeToString()]), metadata=agent_md(), timeout=30)
    )
    assert resp.aggregates_stored == len(first.aggregates) and stored(svc, first.report_id) == 1


# -- status codes ------------------------------------------------------------------------------


def test_unknown_policy_is_not_found(svc: Running, channel: grpc.Channel) -> None:
    req = report("no-such-policy")
    err = call(channel, "ReportAggregates", req)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details() == "unknown policy 'no-such-policy'"
    assert stored(svc, req.report_id) == 0
    err = call(channel, "GetParameters", params_request("no-such-policy"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details() == "unknown policy 'no-such-policy'"


@pytest.fixture
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module's rate limit starts afresh, so this test sees its own first line."""
    monkeypatch.setattr(grpc_server, "limited", RateLimitedLog(grpc_server.log, 30.0))


def test_exception_inside_the_core_is_unavailable_without_its_text(
    svc: Running,
    channel: grpc.Channel,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fresh_log: None,
) -> None:
    def fail(*_: object) -> None:
        raise RuntimeError(DRIVER_TEXT)

    monkeypatch.setattr(svc.booster, "parameters", fail)
    monkeypatch.setattr(svc.booster, "validate_report", fail)
    caplog.set_level(logging.INFO)
    for _ in range(5):
        for method, req in (("GetParameters", params_request()), ("ReportAggregates", report())):
            err = call(channel, method, req)
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert err.details() == CANNOT_ANSWER
            assert "db.example" not in str(err.debug_error_string())
    lines = [r for r in caplog.records if r.name == grpc_server.log.name]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # once per interval, not per call
    assert "RuntimeError" in lines[0].getMessage() and "db.example" not in lines[0].getMessage()
    assert lines[0].exc_info is None and "Traceback" not in caplog.text


def _outcome(**kw: Any) -> Callable[[object], asyncio.Future[Any]]:
    """A writer ``submit`` that settles at once with the given outcome."""
    outcome = SimpleNamespace(**({"duplicate": False, "stored": 0, "error": None} | kw))

    def submit(_row: object) -> asyncio.Future[Any]:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(outcome)
        return fut

    return submit


@pytest.mark.parametrize(
    ("outcome", "code", "details", "rejection_md"),
    [
        (
            {"rejection": SimpleNamespace(code="quota", message="host-1: 256 new contexts today")},
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "host-1: 256 new contexts today",
            "quota",
        ),
        (
            {"rejection": SimpleNamespace(code="invalid", message="rejected by storage")},
            grpc.StatusCode.INVALID_ARGUMENT,
            "rejected by storage",
            None,
        ),
        (
            {"error": RuntimeError(DRIVER_TEXT)},
            grpc.StatusCode.UNAVAILABLE,
            STORAGE_UNAVAILABLE,
            None,
        ),
        ({}, grpc.StatusCode.OK, "", None),  # an outcome from before rejections existed
    ],
    ids=["quota", "invalid", "storage-error", "no-rejection-field"],
)
def test_ingest_outcomes_map_to_codes(
    svc: Running,
    channel: grpc.Channel,
    monkeypatch: pytest.MonkeyPatch,
    outcome: dict[str, Any],
    code: grpc.StatusCode,
    details: str,
    rejection_md: str | None,
) -> None:
    monkeypatch.setattr(svc.booster.writer, "submit", _outcome(**outcome))
    stub = channel.unary_unary(f"{SERVICE}/ReportAggregates")
    if code == grpc.StatusCode.OK:
        stub(report().SerializeToString(), metadata=agent_md(), timeout=30)
        return
    err = call(channel, "ReportAggregates", report())
    assert err.code() == code and err.details() == details
    trailing = dict(err.trailing_metadata() or ())
    assert trailing.get("gemini-rejection") == rejection_md


def test_metadata_is_limited_to_16_kib_exactly(channel: grpc.Channel) -> None:
    """Soft and hard limit alike: gRPC's default would refuse a random share between 8 and
    16 KiB, so the same call could pass or fail."""
    stub = channel.unary_unary(f"{SERVICE}/GetParameters")
    for _ in range(5):
        md = (*agent_md(), ("x-pad", "a" * 12_000))
        stub(params_request().SerializeToString(), metadata=md, timeout=30)
    err = call(channel, "GetParameters", params_request(), (*agent_md(), ("x-pad", "a" * 40_000)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- a half-sent message is cut off --------------------------------------------------------------


class HalfSender:
    """A raw HTTP/2 client that announces a gRPC message of ``announced`` bytes, sends only
    ``sent`` of them on stream 1 and then stalls, keeping the connection open. What the
    server does about it (frames, or closing the connection) is recorded."""

    def __init__(self, port: int, path: str, token: str, announced: int, sent: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.frames: list[tuple[int, int, int]] = []  # (kind, flags, stream) from the server
        self.closed = threading.Event()
        self._cv = threading.Condition()
        self._windows = {0: 65535, 1: 65535}
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        threading.Thread(target=self._read, daemon=True).start()
        headers = b"".join(
            literal(k, v)
            for k, v in (
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", path.encode()),
                (b":authority", b"127.0.0.1"),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                (b"authorization", f"Bearer {token}".encode()),
            )
        )
        self.sock.sendall(frame(HEADERS, END_HEADERS, 1, headers))
        body = b"\x00" + struct.pack(">I", announced) + b"\x00" * sent
        self.sent = 0
        while self.sent < len(body):
            with self._cv:
                if not self._cv.wait_for(
                    lambda: self.closed.is_set() or min(self._windows.values()) > 0, 30
                ):
                    break
                if self.closed.is_set():
                    break
                n = min(16384, *self._windows.values(), len(body) - self.sent)
                for k in self._windows:
                    self._windows[k] -= n
            self.sock.sendall(frame(DATA, 0, 1, body[self.sent : self.sent + n]))
            self.sent += n

    def _read(self) -> None:
        buf = b""
        try:
            while chunk := self.sock.recv(65536):
                buf += chunk
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    n = int.from_bytes(buf[:3], "big")
                    kind, flags = buf[3], buf[4]
                    stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    self._on_frame(kind, flags, stream, buf[9 : 9 + n])
                    buf = buf[9 + n :]
        except OSError:
            pass
        with self._cv:
            self.closed.set()
            self._cv.notify_all()

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        with self._cv:
            self.frames.append((kind, flags, stream))
            if kind == WINDOW_UPDATE and stream in self._windows:
                self._windows[stream] += int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            elif kind == SETTINGS and not flags & ACK:
                for i in range(0, len(payload), 6):
                    ident, value = struct.unpack(">HI", payload[i : i + 6])
                    if ident == 4:  # SETTINGS_INITIAL_WINDOW_SIZE
                        self._windows[1] += value - 65535
            self._cv.notify_all()
        if kind == SETTINGS and not flags & ACK:
            self.sock.sendall(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.sock.sendall(frame(PING, ACK, 0, payload))

    def stream_ended(self) -> bool:
        """The server ended stream 1 (trailers or reset) though its message never came."""
        return any(
            s == 1 and (k == RST_STREAM or (k == HEADERS and f & END_STREAM))
            for k, f, s in self.frames
        )

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(predicate, timeout)

    def close(self) -> None:
        # Shut down first: close() alone leaves the connection up while our reader thread is
        # still blocked in recv() on it.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@pytest.fixture
def limited_server(svc: Running) -> Iterator[Callable[[GrpcLimits], int]]:
    """A second agent port on the same core, with the limits a test asks for."""
    servers: list[AgentServer] = []

    def start(limits: GrpcLimits) -> int:
        assert svc.engine is not None
        server = AgentServer(
            svc.booster,
            TokenAuthority(svc.engine, allow_unbound_agents=True),
            "127.0.0.1:0",
            limits=limits,
        )
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop(grace=0)


def _still_serves(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = ch.unary_unary(f"{SERVICE}/GetParameters")
        resp = pb.GetParametersResponse.FromString(
            stub(params_request().SerializeToString(), metadata=agent_md(), timeout=30)
        )
        assert len(resp.parameters) == len(sim.DEFAULT_CONTEXTS)


def test_half_sent_message_is_cut_off_by_the_receive_deadline(
    limited_server: Callable[[GrpcLimits], int],
) -> None:
    port = limited_server(GrpcLimits(receive_timeout_s=1.0))
    half = HalfSender(port, f"{SERVICE}/ReportAggregates", AGENT, 900_000, 400_000)
    try:
        assert half.sent > 100_000  # the server did take a good part of it first
        assert half.wait(half.stream_ended, 60), half.frames
        assert not half.closed.is_set()  # only the call ends; the connection stays
        _still_serves(port)
    finally:
        half.close()


def test_half_sent_message_is_cut_off_with_its_connection_at_max_age(
    limited_server: Callable[[GrpcLimits], int],
) -> None:
    # The receive deadline far away: here the connection's age and grace must end it.
    port = limited_server(
        GrpcLimits(receive_timeout_s=3600, connection_age_s=2.0, connection_age_grace_s=1.0)
    )
    half = HalfSender(port, f"{SERVICE}/ReportAggregates", AGENT, 900_000, 400_000)
    try:
        assert half.wait(half.closed.is_set, 60), half.frames
        assert any(k == GOAWAY for k, _, _ in half.frames)
        _still_serves(port)
    finally:
        half.close()


def test_a_call_whose_message_never_comes_ends_at_the_receive_deadline(
    limited_server: Callable[[GrpcLimits], int],
) -> None:
    """A real client that opens a call and sends nothing gets DEADLINE_EXCEEDED, in words."""
    port = limited_server(GrpcLimits(receive_timeout_s=1.0))
    never = threading.Event()

    def nothing() -> Iterator[bytes]:
        never.wait(60)
        yield from ()

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        send = ch.stream_unary(f"{SERVICE}/ReportAggregates")
        with pytest.raises(grpc.RpcError) as e:
            send(nothing(), metadata=agent_md(), timeout=60)
        never.set()
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # the server's deadline (1 s), not the client's (60 s): the details say which one fired
    assert "not received within 1 s" in e.value.details()


def test_a_call_over_the_concurrency_limit_is_refused_at_once_and_may_retry(
    limited_server: Callable[[GrpcLimits], int],
) -> None:
    port = limited_server(GrpcLimits(max_concurrent_rpcs=2, receive_timeout_s=3600))
    stalled = [
        HalfSender(port, f"{SERVICE}/GetParameters", AGENT, 900_000, 100_000) for _ in range(2)
    ]
    try:
        with (
            grpc.insecure_channel(f"127.0.0.1:{port}") as ch,
            pytest.raises(grpc.RpcError) as e,
        ):
            ch.unary_unary(f"{SERVICE}/GetParameters")(
                params_request().SerializeToString(), metadata=agent_md(), timeout=30
            )
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "gemini-rejection" not in dict(e.value.trailing_metadata() or ())  # not a quota
    finally:
        for half in stalled:
            half.close()
    deadline = time.monotonic() + 30  # the closed connections' calls end, freeing their slots
    while True:
        try:
            _still_serves(port)
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
            time.sleep(0.2)


def test_limits_follow_settings(svc: Running) -> None:
    s = make_settings(
        "postgresql+psycopg://unused/x",
        max_report_bytes=4096,
        grpc_max_concurrent_rpcs=7,
        grpc_max_connection_age_s=12.5,
        grpc_max_connection_idle_s=3.0,
    )
    options = dict(grpc_server.grpc_limits(s).options())
    assert options["grpc.max_receive_message_length"] == 4096
    assert options["grpc.max_connection_age_ms"] == 12_500
    assert options["grpc.max_connection_idle_ms"] == 3_000
    assert grpc_server.grpc_limits(s).max_concurrent_rpcs == 7
    # The constructor app.py and fronts.py use still works, and its size wins.
    server = AgentServer(
        svc.booster, TokenAuthority(svc.engine, allow_unbound_agents=True), "127.0.0.1:0", 2048
    )
    assert dict(server._options)["grpc.max_receive_message_length"] == 2048
