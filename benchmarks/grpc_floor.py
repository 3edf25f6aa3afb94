"""What gRPC alone costs per call, served as Booster serves: the floor under its CPU per report.

A process that answers ``ReportAggregates`` and ``GetParameters`` with an empty message after
doing only the transport part of Booster's agent service (``gemini_booster.service.grpc_server``):
the same gRPC core experiments, channel arguments and concurrency limit (``GrpcLimits``'s
defaults), an asyncio server on a uvloop of its own thread, each call stream-unary with its
metadata read and its one message read (and the end of the stream) under the receive deadline.
It authenticates, parses, validates and stores nothing. ``benchmarks.replicas --floor`` runs it
under the same load as a replica, so the record can say how much of Booster's CPU per report is
gRPC's own per-call cost, which no change inside Booster can remove.

It also serves ``ReportStream``, which Booster does not: each host's reports as messages on one
bidirectional stream that stays open, each answered before the next
(``benchmarks.replicas --floor-stream``), to measure what that pattern would save.

    python -m benchmarks.grpc_floor --listen 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from typing import Any

from gemini_booster.config import GRPC_CORE_EXPERIMENTS, apply_grpc_core_experiments

apply_grpc_core_experiments(GRPC_CORE_EXPERIMENTS)  # before gRPC initialises, as `serve` does

import grpc  # noqa: E402 (after the experiments are set)
import uvloop  # noqa: E402

from gemini_booster.service.grpc_server import SERVICE, GrpcLimits  # noqa: E402

from .common import STREAM_METHOD  # noqa: E402

METHODS = ("ReportAggregates", "GetParameters")


def handler(limits: GrpcLimits) -> grpc.GenericRpcHandler:
    """Both methods as Booster registers them (stream-unary, bytes in and out), doing only
    what its ``_call`` does before and after the work: read the credential from the metadata,
    read the one message and the end of the stream within the deadline, answer."""

    async def call(_requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        next((v for k, v in context.invocation_metadata() or () if k == "authorization"), None)
        async with asyncio.timeout(limits.receive_timeout_s):
            first = await context.read()
            if first is not grpc.aio.EOF:
                await context.read()
        return b""

    async def stream(_requests: Any, context: grpc.aio.ServicerContext) -> None:
        next((v for k, v in context.invocation_metadata() or () if k == "authorization"), None)
        while (message := await context.read()) is not grpc.aio.EOF:
            assert isinstance(message, bytes)
            await context.write(b"")

    handlers = {m: grpc.stream_unary_rpc_method_handler(call) for m in METHODS}
    handlers[STREAM_METHOD] = grpc.stream_stream_rpc_method_handler(stream)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


async def serve(listen: str) -> None:
    limits = GrpcLimits()
    server = grpc.aio.server(
        options=[
            *limits.options(),
            ("grpc.max_send_message_length", 16 << 20),
            ("grpc.http2.bdp_probe", 0),
        ],
        maximum_concurrent_rpcs=limits.max_concurrent_rpcs,
    )
    server.add_generic_rpc_handlers((handler(limits),))
    if server.add_insecure_port(listen) == 0:
        raise SystemExit(f"grpc_floor: cannot listen on {listen}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="host:port")
    args = ap.parse_args()
    # Booster's server runs its loop on a thread of its own, beside the main thread.
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(args.listen),))
    thread.start()
    thread.join()


if __name__ == "__main__":
    main()
