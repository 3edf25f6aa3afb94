"""``benchmarks.grpc_floor`` and its grpc-go twin ``benchmarks/grpc_floor_go``: the processes the
fleet benchmark measures as gRPC's own per-call cost (``benchmarks.replicas --floor``,
``--floor-go``) serve Booster's two methods at their real paths, the way
Booster's agent service does (one message read, then the end of the stream), and nothing more.
If it stopped answering, or answered other paths, the floor rows of the records would measure
refusals instead of calls. The Python floor also serves ``ReportStream`` (``--floor-stream``):
a host's reports as messages on one stream, each answered before the next."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from benchmarks.common import STREAM_METHOD
from benchmarks.replicas import PYTHON_FLOOR, build_go_floor, free_port
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster.service.grpc_server import SERVICE

ROOT = Path(__file__).resolve().parents[1]


def _command(kind: str, work: Path) -> tuple[str, ...]:
    if kind == "go":  # built as the benchmark builds it, with Booster's limits as flags
        return build_go_floor(work)
    return PYTHON_FLOOR


@contextmanager
def _serving(command: tuple[str, ...]) -> Iterator[str]:
    """A floor process listening on a free port, stopped afterwards."""
    target = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([*command, "--listen", target], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"serving"
        yield target
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(params=["python", pytest.param("go", marks=pytest.mark.tools)])
def floor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with _serving(_command(request.param, tmp_path)) as target:
        yield target


def _call(channel: grpc.Channel, method: str, body: bytes) -> bytes:
    stub = channel.unary_unary(f"/{SERVICE}/{method}")
    return stub(body, metadata=(("authorization", "Bearer any"),), timeout=10)


def test_the_floor_answers_both_methods_with_an_empty_message(floor: str) -> None:
    report = pb.ReportRequest(report_id="h:1", host_id="h").SerializeToString()
    get = pb.GetParametersRequest(host_id="h", policy="p").SerializeToString()
    with grpc.insecure_channel(floor) as channel:
        assert _call(channel, "ReportAggregates", report) == b""
        assert _call(channel, "GetParameters", get) == b""


def test_the_floor_serves_only_boosters_methods(floor: str) -> None:
    with grpc.insecure_channel(floor) as channel, pytest.raises(grpc.RpcError) as e:
        _call(channel, "Other", b"")
    assert e.value.code() is grpc.StatusCode.UNIMPLEMENTED


@pytest.fixture
def python_floor() -> Iterator[str]:
    with _serving(PYTHON_FLOOR) as target:
        yield target


def test_the_stream_floor_answers_each_message_on_one_stream(python_floor: str) -> None:
    reports = [
        pb.ReportRequest(report_id=f"h:{i}", host_id="h").SerializeToString() for i in range(5)
    ]
    with grpc.insecure_channel(python_floor) as channel:
        stream = channel.stream_stream(f"/{SERVICE}/{STREAM_METHOD}")
        answers = list(
            stream(iter(reports), metadata=(("authorization", "Bearer any"),), timeout=10)
        )
    assert answers == [b""] * len(reports)
