"""The gRPC front door for agents.

Handlers take the request as raw bytes and parse it themselves, so a garbled payload gets a
clear INVALID_ARGUMENT (rather than a generic deserialisation failure) and the exact bytes are
what the idempotency digest covers. Oversized messages are refused by gRPC itself
(RESOURCE_EXHAUSTED) before any handler runs.
"""

from __future__ import annotations

import logging
import time
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from gemini_api.v1 import booster_pb2 as pb

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


class AgentService:
    def __init__(self, booster: Booster, auth: TokenAuthority):
        self.booster = booster
        self.auth = auth
        self.metrics = booster.metrics

    def _authorize(self, context: grpc.ServicerContext) -> None:
        md = dict(context.invocation_metadata())
        try:
            self.auth.require(md.get("authorization"), "agent")
        except AuthError as e:
            self.metrics.auth_failures.labels("grpc", e.reason).inc()
            context.abort(_AUTH_CODES[e.reason], str(e))

    def _timed(self, method: str, fn, raw: bytes, context: grpc.ServicerContext) -> bytes:
        t0 = time.perf_counter()
        code = "OK"
        try:
            self._authorize(context)
            return fn(raw, context)
        except Exception:
            code = context.code().name if context.code() else "UNKNOWN"
            raise
        finally:
            self.metrics.grpc_latency.labels(method, code).observe(time.perf_counter() - t0)

    def report(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            outcome = self.booster.submit_report(raw)
        except DecodeError:
            self.metrics.reports.labels("rejected", "garbled").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request is not a ReportRequest")
        except InvalidReport as e:
            self.metrics.reports.labels("rejected", e.reason).inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if outcome.error is not None:
            if outcome.duplicate:  # same key, other content
                self.metrics.reports.labels("rejected", "key_reused").inc()
                context.abort(grpc.StatusCode.ALREADY_EXISTS, str(outcome.error))
            self.metrics.reports.labels("rejected", "storage").inc()
            context.abort(
                grpc.StatusCode.UNAVAILABLE, "storage unavailable; retry with the same id"
            )
        self.metrics.reports.labels("duplicate" if outcome.duplicate else "accepted", "").inc()
        self.metrics.aggregates.inc(outcome.stored)
        return pb.ReportResponse(
            duplicate=outcome.duplicate, aggregates_stored=outcome.stored
        ).SerializeToString()

    def get_parameters(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            req = pb.GetParametersRequest.FromString(raw)
            return self.booster.parameters(req).SerializeToString()
        except DecodeError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request is not a GetParametersRequest")
        except InvalidReport as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(method: str, fn):
            return grpc.unary_unary_rpc_method_handler(
                lambda raw, ctx: self._timed(method, fn, raw, ctx)
            )

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ReportAggregates": unary("ReportAggregates", self.report),
                "GetParameters": unary("GetParameters", self.get_parameters),
            },
        )


def build_server(
    booster: Booster, auth: TokenAuthority, listen: str, workers: int, max_message_bytes: int
) -> tuple[grpc.Server, int]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"),
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", 16 << 20),
        ],
    )
    server.add_generic_rpc_handlers((AgentService(booster, auth).handler(),))
    port = server.add_insecure_port(listen)
    if port == 0:
        raise RuntimeError(f"cannot listen on {listen}")
    return server, port
