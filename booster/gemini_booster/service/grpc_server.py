"""The gRPC front door for agents.

Handlers take the request as raw bytes and parse it themselves, so a garbled payload gets a
clear INVALID_ARGUMENT (rather than a generic deserialisation failure) and the exact bytes are
what the idempotency digest covers. Oversized messages are refused by gRPC itself
(RESOURCE_EXHAUSTED) before any handler runs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import grpc
import uvloop
from google.protobuf.message import DecodeError

from gemini_api.v1 import booster_pb2 as pb

from ..config import Settings
from .auth import AuthError, TokenAuthority
from .core import Booster
from .validation import InvalidReport

log = logging.getLogger(__name__)
SERVICE = "gemini.booster.v1.Booster"

_AUTH_CODES = {
    "missing": grpc.StatusCode.UNAUTHENTICATED,
    "invalid": grpc.StatusCode.UNAUTHENTICATED,
    "forbidden": grpc.StatusCode.PERMISSION_DENIED,
}
INVALID = grpc.StatusCode.INVALID_ARGUMENT


class AgentService:
    def __init__(self, booster: Booster, auth: TokenAuthority):
        self.booster = booster
        self.auth = auth
        self.metrics = booster.metrics

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        credential = next(
            (v for k, v in context.invocation_metadata() or () if k == "authorization"), None
        )
        try:
            self.auth.require(credential, "agent")
        except AuthError as e:
            self.metrics.auth_failures.labels("grpc", e.reason).inc()
            await context.abort(_AUTH_CODES[e.reason], str(e))

    async def _timed(self, method: str, fn, raw: bytes, context) -> bytes:
        t0 = time.perf_counter()
        code = "OK"
        try:
            await self._authorize(context)
            return await fn(raw, context)
        except BaseException:
            code = context.code().name if context.code() else "UNKNOWN"
            raise
        finally:
            self.metrics.grpc_latency.labels(method, code).observe(time.perf_counter() - t0)

    async def _reject(self, context, code: grpc.StatusCode, reason: str, message: str) -> None:
        self.metrics.reports.labels("rejected", reason).inc()
        await context.abort(code, message)

    async def report(self, raw: bytes, context) -> bytes:
        try:
            row = self.booster.validate_report(raw)
        except DecodeError:
            await self._reject(context, INVALID, "garbled", "request is not a ReportRequest")
        except InvalidReport as e:
            await self._reject(context, INVALID, e.reason, str(e))
        # The writer thread stores it with whatever else has queued up (group commit); this
        # coroutine only waits, so thousands of reports can be in flight at no thread's cost.
        outcome = await self.booster.writer.submit(row)
        if outcome.error is not None:
            if outcome.duplicate:  # same key, other content
                await self._reject(
                    context, grpc.StatusCode.ALREADY_EXISTS, "key_reused", str(outcome.error)
                )
            await self._reject(
                context,
                grpc.StatusCode.UNAVAILABLE,
                "storage",
                "storage unavailable; retry with the same id",
            )
        self.metrics.reports.labels("duplicate" if outcome.duplicate else "accepted", "").inc()
        self.metrics.aggregates.inc(outcome.stored)
        return pb.ReportResponse(
            duplicate=outcome.duplicate, aggregates_stored=outcome.stored
        ).SerializeToString()

    async def get_parameters(self, raw: bytes, context) -> bytes:
        try:
            req = pb.GetParametersRequest.FromString(raw)
            return self.booster.parameters(req).SerializeToString()
        except DecodeError:
            await context.abort(INVALID, "request is not a GetParametersRequest")
        except InvalidReport as e:
            await context.abort(INVALID, str(e))

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(method: str, fn):
            async def call(raw: bytes, ctx) -> bytes:
                return await self._timed(method, fn, raw, ctx)

            return grpc.unary_unary_rpc_method_handler(call)

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ReportAggregates": unary("ReportAggregates", self.report),
                "GetParameters": unary("GetParameters", self.get_parameters),
            },
        )


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
        max_message_bytes: int,
        share_port: bool = False,
        tls: grpc.ServerCredentials | None = None,
    ):
        self._service = AgentService(booster, auth)
        self._listen = listen
        self._tls = tls
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", 16 << 20),
            # Only Booster's own front processes may share the port: a second Booster started
            # on it by mistake must fail to bind, not silently take half the agents.
            ("grpc.so_reuseport", int(share_port)),
            # Agents send small messages on long-lived connections: probing the bandwidth-delay
            # product (a ping per burst of data, to grow flow-control windows for bulk
            # transfers) cost a quarter of ingestion throughput and buys nothing here.
            ("grpc.http2.bdp_probe", 0),
        ]
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc", daemon=True)
        self._server: grpc.aio.Server | None = None
        self.port = 0

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _start(self) -> int:
        self._server = grpc.aio.server(options=self._options)
        self._server.add_generic_rpc_handlers((self._service.handler(),))
        if self._tls is not None:
            port = self._server.add_secure_port(self._listen, self._tls)
        else:
            port = self._server.add_insecure_port(self._listen)
        if port == 0:
            raise RuntimeError(f"cannot listen on {self._listen}")
        await self._server.start()
        return port

    def start(self) -> int:
        self._thread.start()
        self.port = self._run(self._start())
        return self.port

    def stop(self, grace: float = 2.0) -> None:
        if self._server is not None:
            self._run(self._server.stop(grace))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=grace + 5)


def tls_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS for the agent port when both files are configured; plaintext (loopback) otherwise."""
    cert, key = settings.grpc_tls_cert_file, settings.grpc_tls_key_file
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both grpc_tls_cert_file and grpc_tls_key_file")
    return grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
