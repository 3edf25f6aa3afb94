"""The gRPC front door for agents.

Handlers take the request as raw bytes and parse it themselves, so a garbled payload gets a
clear INVALID_ARGUMENT (rather than a generic deserialisation failure) and the exact bytes are
what the idempotency digest covers.

Both methods are unary to clients but served as stream-unary: gRPC's unary handler takes the
first request message and silently drops any further one, so a client that sent two would have
the first stored and never learn that the second was not. Reading the stream ourselves refuses
anything but exactly one message (INVALID_ARGUMENT), and puts a deadline on receiving it.
The price, measured on two cores: about 80 µs of server CPU per call (the second read that
sees the end of the stream, and the timer), some 6 % of what a stored report costs.

Status codes say what the agent should do; no answer carries an exception's text:

* INVALID_ARGUMENT: the request can never succeed (garbled, invalid, refused by storage).
* NOT_FOUND: unknown policy; the agent keeps the report and retries (a policy created a moment
  ago on another replica is known here within a second).
* RESOURCE_EXHAUSTED with trailing metadata ``gemini-rejection: quota``: over a quota; without
  that metadata it is gRPC's own refusal (message or call limits), or an overloaded replica's
  (``ingest_queue_max`` reports already waiting to be stored; trailing metadata
  ``gemini-retry-after-ms`` says when to try again), which a retry may pass.
* ALREADY_EXISTS: the report id was stored with other content.
* UNAVAILABLE: storage or credentials cannot be reached, or anything unexpected happened
  (logged once per interval with the exception's class, never per call); retry, same id.
* UNAUTHENTICATED: no usable token (missing, unknown, revoked, expired).
* PERMISSION_DENIED: a token that may not do this: not an agent token, an agent token bound to
  no host while ``allow_unbound_agent_tokens`` is off and no client certificate names one, or
  a host's credential used for another host (the message names both hosts and the token's
  name, never its value). The host check comes after parsing (the host is in the message) and
  before validation or storage.

With mutual TLS (``grpc_tls_client_ca_file``) the client certificate's Common Name is a host
identity too: an unbound agent token then speaks for the certificate's host, and a bound one
only if both name the same host.

Limits, applied before a handler does any work (``GrpcLimits``, from ``Settings`` by
``grpc_limits``), and what bounds what:

* A request's lifetime: ``receive_timeout_s`` from the call's start until its one message is
  complete (DEADLINE_EXCEEDED after it, and the stream's buffers are freed; the connection
  stays). gRPC's unary serving has no such bound: a peer that sent part of a message and
  stalled held that part until its connection ended (measured: 100 calls holding 0.9 MB each
  kept 94 MB for as long as the peer liked, and each further 100 added as much; with the
  deadline, further rounds reused the memory freed).
* A connection's lifetime: ``connection_age_s`` (±10 % jitter by gRPC) plus
  ``connection_age_grace_s`` for the calls then in progress, after which it is closed whatever
  it holds; ``connection_idle_s`` without a call closes it sooner. ``handshake_timeout_s``
  bounds a connection that never completes its handshake.
* Memory held by requests: a message is refused beyond ``max_message_bytes`` (from its length
  prefix, before it is buffered); at most ``max_concurrent_rpcs`` calls run per process, and
  one more is refused at once (RESOURCE_EXHAUSTED without ``gemini-rejection``: retry later);
  at most ``max_streams_per_connection`` calls per connection. So requests hold at most about
  ``max_concurrent_rpcs × max_message_bytes`` (measured with 10 calls allowed and 40 stalled
  0.9 MB senders: 18 MB), each part no longer than ``receive_timeout_s``.
* Metadata: ``max_metadata_bytes`` per call, a hard limit (gRPC's soft limit below it would
  refuse a random share of calls instead).
* Keepalive: a client may ping every ``min_ping_interval_s`` at most, with or without a call in
  progress (agents behind NAT may keep idle connections open); ``max_ping_strikes`` pings more
  often and the connection is closed (GOAWAY "too_many_pings").

The read port (``parameters_listen``, served by processes of its own: ``fronts.py``) is the
same service with ``Serves.PARAMETERS``: GetParameters with the same credentials, limits and
answers, and ReportAggregates refused at once, before reading or authenticating anything, with
UNIMPLEMENTED and a message naming the port to report to.

Beside the agent service the port answers gRPC's standard health checking
(``grpc.health.v1.Health``) and server reflection, both without credentials:

* Health: ``""`` and ``gemini.booster.v1.Booster`` are SERVING while this process serves the
  agent port, and NOT_SERVING from the moment it starts shutting down (so clients that watch it,
  as the service config in ``gemini_api.service_config`` asks, move to another replica before
  the port closes). They do not follow ``/readyz``: while the database is away this replica
  still answers GetParameters from memory, which is what agents need most, and refuses reports
  with UNAVAILABLE, which agents retry; a NOT_SERVING replica would be skipped for both.
  ``/readyz`` (REST, operators) stays what says "serves current data".
* Reflection: the agent, health and reflection services, for ``grpcurl`` and the like.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import logging
import resource
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
import uvloop
from google.protobuf.message import DecodeError
from grpc_health.v1 import _async as health_async  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]

from gemini_api.service_config import RETRY_AFTER_KEY
from gemini_api.v1 import booster_pb2 as pb

from ..config import Settings
from .auth import AuthError, Principal, TokenAuthority
from .core import Booster
from .ratelimit_log import RateLimitedLog
from .tls import TlsFiles
from .validation import InvalidReport

log = logging.getLogger(__name__)
limited = RateLimitedLog(log, interval_s=30.0)
SERVICE = pb.DESCRIPTOR.services_by_name["Booster"].full_name
REFLECTED = (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
HEALTH_NAMES = (health.OVERALL_HEALTH, SERVICE)
CERT_HOST_PROPERTY = "x509_common_name"  # gRPC's auth context: the client certificate's CN

_AUTH_CODES = {
    "missing": grpc.StatusCode.UNAUTHENTICATED,
    "invalid": grpc.StatusCode.UNAUTHENTICATED,
    "expired": grpc.StatusCode.UNAUTHENTICATED,
    "forbidden": grpc.StatusCode.PERMISSION_DENIED,
    "unbound": grpc.StatusCode.PERMISSION_DENIED,
    "host_mismatch": grpc.StatusCode.PERMISSION_DENIED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
}
INVALID = grpc.StatusCode.INVALID_ARGUMENT
CANNOT_ANSWER = "Booster cannot answer now; retry"
STORAGE_UNAVAILABLE = "storage unavailable; retry with the same id"
ONE_MESSAGE = "one request message per call"
QUOTA_METADATA = (("gemini-rejection", "quota"),)
READ_PORT_ONLY = (
    "this is Booster's read port (parameters_listen): it answers GetParameters only; send "
    "reports to the agent port (grpc_listen)"
)


class Serves(enum.Enum):
    """Which of the agent service's calls a port answers."""

    ALL = "all"  # the agent port (grpc_listen): reports and GetParameters
    PARAMETERS = "parameters"  # the read port (parameters_listen): GetParameters only


MAX_DETAILS_CHARS = 1024  # of a refusal's message: it travels as a trailer


def bounded(message: str) -> str:
    """A refusal's message, cut with an ellipsis beyond ``MAX_DETAILS_CHARS`` (whatever part
    of a request it quotes: a client must see the refusal, not a trailer too large to read)."""
    if len(message) <= MAX_DETAILS_CHARS:
        return message
    return message[: MAX_DETAILS_CHARS - 1] + "…"


class ListenError(OSError):
    """A port could not be opened: an operator's error (address in use or malformed)."""


Handler = Callable[[bytes, Principal, grpc.aio.ServicerContext], Awaitable[bytes]]
T = TypeVar("T")


@dataclass(frozen=True)
class GrpcLimits:
    """What one agent connection and one call may hold, and for how long (module docstring)."""

    max_message_bytes: int = 1 << 20
    max_metadata_bytes: int = 16 << 10
    max_concurrent_rpcs: int = 4096
    max_streams_per_connection: int = 32
    receive_timeout_s: float = 10.0
    connection_idle_s: float = 300.0
    connection_age_s: float = 600.0
    connection_age_grace_s: float = 30.0
    handshake_timeout_s: float = 20.0
    min_ping_interval_s: float = 30.0
    max_ping_strikes: int = 2

    def options(self) -> list[tuple[str, int]]:
        """gRPC core channel arguments for the server."""

        def ms(seconds: float) -> int:
            return max(1, round(seconds * 1000))

        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_metadata_size", self.max_metadata_bytes),
            ("grpc.absolute_max_metadata_size", self.max_metadata_bytes),
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
            ("grpc.max_connection_idle_ms", ms(self.connection_idle_s)),
            ("grpc.max_connection_age_ms", ms(self.connection_age_s)),
            ("grpc.max_connection_age_grace_ms", ms(self.connection_age_grace_s)),
            ("grpc.server_handshake_timeout_ms", ms(self.handshake_timeout_s)),
            ("grpc.http2.min_ping_interval_without_data_ms", ms(self.min_ping_interval_s)),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
            ("grpc.keepalive_permit_without_calls", 1),
        ]


def grpc_limits(settings: Settings) -> GrpcLimits:
    """The limits ``settings`` ask for; the rest keep their defaults."""
    return GrpcLimits(
        max_message_bytes=settings.max_report_bytes,
        max_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
        connection_idle_s=settings.grpc_max_connection_idle_s,
        connection_age_s=settings.grpc_max_connection_age_s,
    )


class AgentService:
    def __init__(
        self, booster: Booster, auth: TokenAuthority, limits: GrpcLimits | None = None
    ) -> None:
        self.booster = booster
        self.auth = auth
        self.metrics = booster.metrics
        self.limits = limits or GrpcLimits()

    async def _authorize(self, context: grpc.aio.ServicerContext) -> Principal:
        credential = next(
            (v for k, v in context.invocation_metadata() or () if k == "authorization"), None
        )
        try:
            # From the cached set on the loop; only a reload (every few seconds, after a token
            # change, or for an unknown token) goes to a thread, so a slow database never
            # stalls the calls of every other agent.
            cert_host = certificate_host(context)
            principal = self.auth.require_nowait(credential, "agent", cert_host)
            if principal is None:
                principal = await asyncio.to_thread(
                    self.auth.require, credential, "agent", cert_host
                )
            if principal.host_id is None:  # allowed, but the fleet should move off it
                self.metrics.unbound_agent_calls.inc()
            return principal
        except AuthError as e:
            self.metrics.auth_failures.labels("grpc", e.reason).inc()
            await context.abort(_AUTH_CODES[e.reason], str(e))
            raise  # unreachable: abort raises

    async def _speak_for(
        self, principal: Principal, host_id: str, context: grpc.aio.ServicerContext, report: bool
    ) -> None:
        """PERMISSION_DENIED unless ``principal`` may act as ``host_id``; counted both as an
        auth failure and, for a report, as a rejected report."""
        try:
            principal.speak_for(host_id)
        except AuthError as e:
            self.metrics.auth_failures.labels("grpc", e.reason).inc()
            if report:
                self.metrics.reports.labels("rejected", e.reason).inc()
            await context.abort(_AUTH_CODES[e.reason], str(e))

    async def _receive(self, context: grpc.aio.ServicerContext) -> bytes:
        """The call's one request message: INVALID_ARGUMENT for none or more than one,
        DEADLINE_EXCEEDED when it is not complete within the receive timeout."""
        timeout = self.limits.receive_timeout_s
        try:
            async with asyncio.timeout(timeout):
                first = await context.read()
                # A unary client half-closes with its message: this read returns at once.
                extra = first is not grpc.aio.EOF and await context.read() is not grpc.aio.EOF
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"request message not received within {timeout:g} s",
            )
        if first is grpc.aio.EOF or extra:
            await context.abort(INVALID, ONE_MESSAGE)
        assert isinstance(first, bytes)
        return first

    async def _call(self, method: str, fn: Handler, context: grpc.aio.ServicerContext) -> bytes:
        t0 = time.perf_counter()
        code = "OK"
        try:
            await self._check_metadata(context)
            principal = await self._authorize(context)
            return await fn(await self._receive(context), principal, context)
        except grpc.aio.AbortError:
            code = _code_name(context)
            raise
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as e:
            # The core, the writer or gRPC itself failed in a way no branch above expected:
            # UNAVAILABLE with our words (the exception's text may name database hosts), and
            # one log line per interval, not a traceback per call.
            code = "UNAVAILABLE"
            limited.error("%s failed: %s; answered UNAVAILABLE", method, type(e).__name__)
            await context.abort(grpc.StatusCode.UNAVAILABLE, CANNOT_ANSWER)
            raise  # unreachable: abort raises
        finally:
            self.metrics.grpc_latency.labels(method, code).observe(time.perf_counter() - t0)

    async def _check_metadata(self, context: grpc.aio.ServicerContext) -> None:
        """RESOURCE_EXHAUSTED for a call whose metadata exceeds ``max_metadata_bytes``, counted
        as HTTP/2 counts a header list (name + value + 32 per entry). gRPC's own limit holds
        for clients that respect the server's SETTINGS_MAX_HEADER_LIST_SIZE; a raw HTTP/2
        client that ignores it got a 200 kB header through, so the service checks again."""
        size = sum(
            len(k) + (len(v) if isinstance(v, bytes) else len(v.encode())) + 32
            for k, v in context.invocation_metadata() or ()
        )
        if size > self.limits.max_metadata_bytes:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"metadata of {size} bytes exceeds the limit of {self.limits.max_metadata_bytes}",
            )

    async def _reject(
        self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, reason: str, message: str
    ) -> None:
        self.metrics.reports.labels("rejected", reason).inc()
        await context.abort(code, bounded(message))

    async def _invalid(
        self, context: grpc.aio.ServicerContext, e: InvalidReport, report: bool
    ) -> None:
        """NOT_FOUND for an unknown policy (retry later), INVALID_ARGUMENT for the rest."""
        if e.reason == "unknown_policy":
            code, message = grpc.StatusCode.NOT_FOUND, e.problems[0].removeprefix("policy: ")
        else:
            code, message = INVALID, str(e)
        if report:
            self.metrics.reports.labels("rejected", e.reason).inc()
        await context.abort(code, bounded(message))

    async def report(
        self, raw: bytes, principal: Principal, context: grpc.aio.ServicerContext
    ) -> bytes:
        retry_s = self.booster.writer.admit()
        if retry_s is not None:  # refused before any work: nothing of it is stored
            context.set_trailing_metadata(((RETRY_AFTER_KEY, str(round(retry_s * 1000))),))
            await self._reject(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "overloaded",
                f"overloaded: {self.booster.writer.queue_max} reports waiting to be stored; "
                f"retry after {retry_s:.0f} s with the same id",
            )
        try:
            req = pb.ReportRequest.FromString(raw)
        except DecodeError:
            await self._reject(context, INVALID, "garbled", "request is not a ReportRequest")
        await self._speak_for(principal, req.host_id, context, report=True)
        try:
            row = self.booster.validate_report(raw, req)
        except InvalidReport as e:
            await self._invalid(context, e, report=True)
        # The writer thread stores it with whatever else has queued up (group commit); this
        # coroutine only waits, so thousands of reports can be in flight at no thread's cost.
        outcome = await self.booster.writer.submit(row)
        rejection = getattr(outcome, "rejection", None)
        if rejection is not None:
            if rejection.code == "quota":
                context.set_trailing_metadata(QUOTA_METADATA)
                await self._reject(
                    context, grpc.StatusCode.RESOURCE_EXHAUSTED, "quota", rejection.message
                )
            await self._reject(context, INVALID, rejection.code, rejection.message)
        if outcome.error is not None:
            if outcome.duplicate:  # same key, other content
                await self._reject(
                    context, grpc.StatusCode.ALREADY_EXISTS, "key_reused", str(outcome.error)
                )
            await self._reject(context, grpc.StatusCode.UNAVAILABLE, "storage", STORAGE_UNAVAILABLE)
        self.metrics.reports.labels("duplicate" if outcome.duplicate else "accepted", "").inc()
        self.metrics.aggregates.inc(outcome.stored)
        return pb.ReportResponse(
            duplicate=outcome.duplicate, aggregates_stored=outcome.stored
        ).SerializeToString()

    async def get_parameters(
        self, raw: bytes, principal: Principal, context: grpc.aio.ServicerContext
    ) -> bytes:
        try:
            req = pb.GetParametersRequest.FromString(raw)
        except DecodeError:
            await context.abort(INVALID, "request is not a GetParametersRequest")
        await self._speak_for(principal, req.host_id, context, report=False)
        try:
            return self.booster.parameters(req).SerializeToString()
        except InvalidReport as e:
            await self._invalid(context, e, report=False)
        raise AssertionError("unreachable: abort raises")

    async def _not_here(self, _requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        """ReportAggregates on the read port: refused before any work, the refusal counted."""
        t0 = time.perf_counter()
        try:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, READ_PORT_ONLY)
        finally:
            self.metrics.grpc_latency.labels("ReportAggregates", "UNIMPLEMENTED").observe(
                time.perf_counter() - t0
            )
        raise AssertionError("unreachable: abort raises")

    def handler(self, serves: Serves = Serves.ALL) -> grpc.GenericRpcHandler:
        def one_message(method: str, fn: Handler) -> grpc.RpcMethodHandler:
            async def call(_requests: Any, context: grpc.aio.ServicerContext) -> bytes:
                return await self._call(method, fn, context)

            return grpc.stream_unary_rpc_method_handler(call)

        report = (
            one_message("ReportAggregates", self.report)
            if serves is Serves.ALL
            else grpc.stream_unary_rpc_method_handler(self._not_here)
        )
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ReportAggregates": report,
                "GetParameters": one_message("GetParameters", self.get_parameters),
            },
        )


def _code_name(context: grpc.aio.ServicerContext) -> str:
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


class AgentServer:
    """The asyncio gRPC server on an event loop of its own thread.

    asyncio rather than gRPC's thread-pool server: a report spends most of its life waiting for
    its group commit, and a coroutine waits for free where a pool thread is held (the pool
    server capped ingestion near 1,100 reports/s on two cores, its threads and its one polling
    thread contending for the interpreter).
    """

    def __init__(
        self,
        booster: Booster,
        auth: TokenAuthority,
        listen: str,
        max_message_bytes: int | None = None,
        share_port: bool = False,
        tls: grpc.ServerCredentials | None = None,
        limits: GrpcLimits | None = None,
        serves: Serves = Serves.ALL,
    ):
        """``limits`` default to those of the core's settings; ``max_message_bytes``, when
        given, overrides theirs (the older way to say it). ``serves``: the agent port's calls,
        or the read port's."""
        limits = limits or grpc_limits(booster.settings)
        if max_message_bytes is not None:
            limits = replace(limits, max_message_bytes=max_message_bytes)
        self.limits = limits
        self._service = AgentService(booster, auth, limits)
        self._listen = listen
        self._share_port = share_port
        self._serves = serves
        self._tls = tls
        self._options = [
            *limits.options(),
            ("grpc.max_send_message_length", 16 << 20),
            # Only Booster's own front processes may share the port: a second Booster started
            # on it by mistake must fail to bind, not silently take half the agents.
            ("grpc.so_reuseport", int(share_port)),
            # Agents send small messages on long-lived connections: probing the bandwidth-delay
            # product (a ping per burst of data, to grow flow-control windows for bulk
            # transfers) cost a quarter of ingestion throughput and buys nothing here.
            ("grpc.http2.bdp_probe", 0),
        ]
        self._freeze = booster.settings.gc_freeze_at_start
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc", daemon=True)
        self._server: grpc.aio.Server | None = None
        self._health = health_async.HealthServicer()
        self.port = 0

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _start(self) -> int:
        self._server = grpc.aio.server(
            options=self._options, maximum_concurrent_rpcs=self.limits.max_concurrent_rpcs
        )
        self._server.add_generic_rpc_handlers((self._service.handler(self._serves),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(REFLECTED, self._server)
        failed = ListenError(f"gRPC: cannot listen on {self._listen} (in use, or not an address)")
        if not self._share_port and not can_bind(self._listen):
            raise failed  # said here, before gRPC's core logs its own lines about it
        try:
            if self._tls is not None:
                port = self._server.add_secure_port(self._listen, self._tls)
            else:
                port = self._server.add_insecure_port(self._listen)
        except RuntimeError as e:
            raise failed from e
        if port == 0:
            raise failed
        await self._server.start()
        for name in HEALTH_NAMES:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return port

    def start(self) -> int:
        raise_open_file_limit()
        self._thread.start()
        self.port = self._run(self._start())
        if self._freeze:
            freeze_heap()
        return self.port

    def stop(self, grace: float = 2.0) -> None:
        if self._server is not None:
            # NOT_SERVING first: watching clients leave while calls in progress finish.
            self._run(self._health.enter_graceful_shutdown())
            self._run(self._server.stop(grace))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=grace + 5)


def raise_open_file_limit() -> int:
    """Raise this process's open-file limit (RLIMIT_NOFILE) from its soft value to the hard one
    and return it: every agent connection is a descriptor, and a shell's or service manager's
    default soft limit of 1,024 caps a replica near 1,000 agents. Past it the port cannot accept:
    measured (benchmarks/results/open-loop.md), 3,000 connections at 150 + 150 calls/s against a
    replica held at 1,024 got 8 % UNAVAILABLE and 59 % DEADLINE_EXCEEDED on both calls alike,
    and none with the limit raised. (Go raises it the same way at start.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open-file limit raised from %d to %d", soft, hard)
        return hard
    return soft


def freeze_heap() -> bool:
    """Take what is alive now (modules, the optimiser's libraries, caches as loaded: most of
    the heap) out of the cyclic garbage collector's passes for good (``gc.freeze``).

    Why: a full pass stops the interpreter, so every call, for as long as it takes to walk the
    whole heap. Ingest keeps reports queued long enough to reach the oldest generation, which
    triggers a full pass every second or two; measured under ingest, those passes took
    80-580 ms each, and GetParameters p99 followed them. Frozen objects are never collected
    as cycles, so this runs once per process (a later server in the same process, as in the
    tests, freezes nothing more); what is made later is collected as before. True if it
    froze."""
    if gc.get_freeze_count() > 0:
        return False
    gc.collect()
    gc.freeze()
    return True


def can_bind(listen: str) -> bool:
    """Whether a ``host:port`` address can be bound now (True for forms this does not parse,
    such as ``unix:``, which gRPC then judges itself)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        return True
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            # As gRPC binds: a port left in TIME_WAIT by a previous Booster is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError:
                return False
    return True


def tls_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS for the agent port when both files are configured; plaintext (loopback) otherwise.
    With ``grpc_tls_client_ca_file`` too, mutual TLS: a client without a certificate signed by
    that CA does not complete the handshake. The files are followed as they are renewed."""
    cert, key = settings.grpc_tls_cert_file, settings.grpc_tls_key_file
    client_ca = settings.grpc_tls_client_ca_file
    if cert is None and key is None and client_ca is None:
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both grpc_tls_cert_file and grpc_tls_key_file")
    files = TlsFiles(cert, key, client_ca)  # re-read on renewal: see service/tls.py
    return grpc.dynamic_ssl_server_credentials(
        files.configuration(), files.fetch, require_client_authentication=client_ca is not None
    )


def certificate_host(context: grpc.aio.ServicerContext) -> str | None:
    """The host id a verified client certificate names (its Common Name), or None when the
    peer presented none (plaintext, or TLS without client certificates)."""
    names = context.auth_context().get(CERT_HOST_PROPERTY) or ()
    return names[0].decode() if names else None
