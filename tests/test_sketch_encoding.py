"""The compact sketch encoding (gemini_api.sketch, v2): quantiles within its stated relative
error on realistic flows, bounded in span and bytes, every malformation named, and mergeable
with the dense sketches of older agents.

Realistic inputs: host-minutes of benchmarks/report_size.py's flow mix (per-flow throughput over
several orders of magnitude, short and long flows, flows without queue), aggregated by the
agent's own Aggregator."""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest

from benchmarks import report_size as mix
from gemini_agent.config import AgentSettings
from gemini_agent.context import ContextResolver
from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter
from gemini_agent.spool import Spool
from gemini_api import sketch as sketches
from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc

QUANTILES = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
BOUND = sketches.COMPACT_READ_ERROR * (1 + 1e-9)  # and the rounding of a bucket's value


def at_rank(values: list[float], q: float) -> float:
    """The value the sketch answers for quantile ``q`` (its rank rule), before its error."""
    return sorted(values)[math.floor(q * (len(values) - 1))]


def assert_within(sketch_msg: pb.QuantileSketch, values: list[float], bound: float) -> None:
    got = sketches.from_proto(sketch_msg)
    assert got.count == len(values)
    for q in QUANTILES:
        want, est = at_rank(values, q), got.get_quantile_value(q)
        assert est is not None
        if want == 0:
            assert est == 0, q
        else:
            assert abs(est - want) <= bound * want, (q, want, est)


@pytest.fixture(scope="module")
def resolver(tmp_path_factory) -> ContextResolver:
    table = mix.prefix_table(Path(tmp_path_factory.mktemp("prefixes")))
    return ContextResolver(mix.SOURCE, table)


def minutes(seed: int, hosts: int) -> list[mix.HostMinute]:
    return list(mix.fleet(seed, hosts))


def test_stated_accuracy() -> None:
    """5 % in the compact bins (γ⁵), 5.12 % once read back into the 1 % mapping."""
    assert abs(sketches.COMPACT_RELATIVE_ACCURACY - 0.04996) < 1e-5
    assert abs(sketches.COMPACT_READ_ERROR - 0.05122) < 1e-5


def test_quantiles_of_realistic_aggregates_within_the_stated_error(resolver) -> None:
    """Every aggregate of 40 host-minutes: throughput and queueing delay at each quantile."""
    checked = 0
    for minute in minutes(seed=11, hosts=40):
        req = minute.report(resolver)
        flows: dict[tuple, tuple[list[float], list[float]]] = {}
        for f in minute.flows:
            place = resolver.place(f.dst)
            tpt, delay = flows.setdefault(
                (f.cc, place.region, place.isp, f.theta_version), ([], [])
            )
            tpt.append(f.stats.throughput_mbps)
            delay.append(f.stats.queue_delay_ms)
        for a in req.aggregates:
            tpt, delay = flows[(a.cc, a.context.dst_region, a.context.dst_isp, a.theta_version)]
            assert a.throughput_sketch.key_stride == a.queue_delay_sketch.key_stride == 5
            assert sketches.sketch_errors(a.throughput_sketch, a.flow_count) == []
            assert sketches.sketch_errors(a.queue_delay_sketch, a.flow_count) == []
            assert_within(a.throughput_sketch, tpt, BOUND)
            assert_within(a.queue_delay_sketch, delay, BOUND)
            checked += 1
    assert checked > 100


def test_merged_old_and_new_sketches_keep_the_stated_error(resolver) -> None:
    """Booster merges aggregates of old (dense, 1 %) and new (compact) agents per arm: the
    merged quantiles are within the compact sketch's error of the union's."""
    merged = sketches.new_sketch()
    values: list[float] = []
    for i, minute in enumerate(minutes(seed=12, hosts=20)):
        req = minute.report(resolver, dense=i % 2 == 0)
        for a in req.aggregates:
            merged.merge(sketches.from_proto(a.throughput_sketch))
        values += [f.stats.throughput_mbps for f in minute.flows]
    assert merged.count == len(values)
    for q in QUANTILES:
        want, est = at_rank(values, q), merged.get_quantile_value(q)
        assert est is not None and abs(est - want) <= BOUND * want, q


def test_a_seeded_fleet_fits_the_budget(resolver) -> None:
    """Bytes per host-minute on the realistic mix (benchmarks/report_size.py measures more
    seeds and hosts): mean ≤ 1 KB, none above 4 KB; the dense form is over ten times that."""
    new, old = [], []
    for minute in minutes(seed=13, hosts=60):
        new.append(minute.report(resolver).ByteSize())
        old.append(minute.report(resolver, dense=True).ByteSize())
    assert np.mean(new) <= 1024 and max(new) <= 4096, (np.mean(new), max(new))
    assert np.mean(old) > 10 * np.mean(new)


def flows_sketch(values: list[float]) -> AggregateBuilder:
    b = AggregateBuilder()
    for mbps in values:  # one second of each throughput; no queue
        b.add(FlowStats(max(round(mbps * 125_000), 1), 1_000_000, 40_000, 40_000))
    return b


def test_a_spread_beyond_the_span_folds_its_lowest_bins() -> None:
    """Twelve orders of magnitude: the span stays within 128 bins (bitmap ≤ 16 bytes), every
    flow keeps its weight, and the quantiles above the folded range keep their accuracy."""
    rng = random.Random(5)
    values = [10 ** rng.uniform(-5, 7) for _ in range(3000)]
    msg = flows_sketch(values).to_proto({}, 0, pb.Context(), cc="cubic").throughput_sketch
    exact = [FlowStats(max(round(v * 125_000), 1), 1_000_000, 1, 1).throughput_mbps for v in values]
    assert len(msg.bin_bitmap) <= 16 and len(msg.bin_counts) <= sketches.COMPACT_MAX_SPAN
    assert sketches.sketch_errors(msg, len(values)) == []
    got = sketches.from_proto(msg)
    assert got.count == len(values)
    lowest_kept = msg.first_bin * sketches.COMPACT_KEY_STRIDE
    for q in (0.6, 0.9, 0.99, 1.0):
        want, est = at_rank(exact, q), got.get_quantile_value(q)
        assert sketches._MAPPING.key(want) > lowest_kept
        assert est is not None and abs(est - want) <= BOUND * want, q


def test_compact_is_far_smaller_than_dense_and_ddsketch_own_protobuf(resolver) -> None:
    minute = minutes(seed=14, hosts=1)[0]
    new, old = minute.report(resolver), minute.report(resolver, dense=True)
    for a, d in zip(new.aggregates, old.aggregates, strict=True):
        msg = a.throughput_sketch
        assert msg.ByteSize() * 5 < d.throughput_sketch.ByteSize()
        assert msg.ByteSize() * 2 < mix.ddsketch_own_size(msg)


# -- malformed compact sketches are named ---------------------------------------------------------


def good() -> tuple[pb.QuantileSketch, int]:
    """A compact sketch of 50 flows: 10 without queue, the rest between 0.5 and 80 ms."""
    rng = random.Random(1)
    b = AggregateBuilder()
    for i in range(50):
        delay_us = 0 if i < 10 else round(10 ** rng.uniform(2.7, 4.9))
        b.add(FlowStats(1_000_000, 1_000_000, 40_000 + delay_us, 40_000))
    return b.to_proto({}, 0, pb.Context(), cc="cubic").queue_delay_sketch, 50


def _set(name: str, value: object) -> Callable[[pb.QuantileSketch], object]:
    return lambda s: setattr(s, name, value)


def _bitmap(s: pb.QuantileSketch, fn: Callable[[int], int], extra: int = 0) -> None:
    bits = fn(int.from_bytes(s.bin_bitmap, "little"))
    s.bin_bitmap = bits.to_bytes(len(s.bin_bitmap) + extra, "little")


MALFORMED = {
    "another stride": (_set("key_stride", 4), "key_stride 4 != 5"),
    "an accuracy beside the stride": (
        _set("relative_accuracy", 0.01),
        "relative_accuracy: unset in a compact sketch",
    ),
    "both encodings": (lambda s: s.counts.append(1.0), "both encodings"),
    "a bitmap longer than the span": (
        _set("bin_bitmap", b"\x01" * 17),
        "bin_bitmap: 17 bytes, bins span more than 128",
    ),
    "bins and counts disagree": (lambda s: s.bin_counts.pop(), "bins for"),
    "bit 0 unset": (
        lambda s: _bitmap(s, lambda bits: bits << 1, extra=1),
        "bin_bitmap: bit 0 is first_bin's",
    ),
    "a trailing zero byte": (
        lambda s: _bitmap(s, lambda bits: bits, extra=1),
        "no byte after the last bin's",
    ),
    "bins beyond the mapping": (_set("first_bin", 2**31 - 100), "outside the mapping's"),
    "a bin without weight": (
        lambda s: s.bin_counts.__setitem__(0, 0),
        "bin_counts: a bin without weight",
    ),
    "a bin over the flow count": (
        lambda s: s.bin_counts.__setitem__(0, 2**64 - 1),
        f"total weight {2**64 - 1 + 49:g} != flow_count 50",
    ),
    "weight other than the flow count": (
        lambda s: s.bin_counts.__setitem__(0, s.bin_counts[0] + 1),
        "total weight 51 != flow_count 50",
    ),
    "a negative zero count": (_set("zero_count", -1.0), "zero_count -1.0 is not a finite"),
    "a first bin without bins": (
        lambda s: (s.ClearField("bin_bitmap"), s.ClearField("bin_counts")),
        "first_bin: set without bins",
    ),
}


def test_a_realistic_compact_sketch_is_valid() -> None:
    msg, n = good()
    assert msg.key_stride == 5 and msg.zero_count == 10 and not msg.relative_accuracy
    assert sketches.sketch_errors(msg, n) == []


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_compact_sketches_are_named(case: str) -> None:
    fn, expected = MALFORMED[case]
    msg, n = good()
    fn(msg)
    errors = sketches.sketch_errors(msg, n)
    assert any(expected in e for e in errors), errors


def test_zero_flows_only_is_a_compact_sketch_without_bins() -> None:
    b = AggregateBuilder()
    for _ in range(7):
        b.add(FlowStats(1_000_000, 1_000_000, 40_000, 40_000))  # no queue
    msg = b.to_proto({}, 0, pb.Context(), cc="cubic").queue_delay_sketch
    assert msg.key_stride == 5 and msg.zero_count == 7 and not msg.bin_counts
    assert sketches.sketch_errors(msg, 7) == []
    assert sketches.from_proto(msg).get_quantile_value(0.5) == 0


# -- an agent upgraded before Booster -------------------------------------------------------------


class OldBooster(pb_grpc.BoosterServicer):
    """Answers as a Booster before the compact sketch: its fields are unknown there (the
    message its validation gives), dense sketches are stored."""

    def __init__(self) -> None:
        self.stored: list[pb.ReportRequest] = []

    def ReportAggregates(self, request, context):
        for i, a in enumerate(request.aggregates):
            if a.throughput_sketch.key_stride:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"aggregates[{i}].throughput_sketch: unknown field number 5; "
                    f"aggregates[{i}].throughput_sketch: relative_accuracy 0.0 != 0.01",
                )
        self.stored.append(request)
        return pb.ReportResponse(aggregates_stored=len(request.aggregates))


def test_an_older_booster_gets_the_report_with_dense_sketches(resolver, tmp_path: Path) -> None:
    old = OldBooster()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_BoosterServicer_to_server(old, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        ended = dt.datetime.now(dt.UTC)
        minute = mix.host_minute(np.random.default_rng(3), "host-a", load_spec().default(), ended)
        report = minute.report(resolver)
        settings = AgentSettings(
            host_id="host-a",
            policy=mix.POLICY,
            booster_address=f"127.0.0.1:{port}",
            token="t",
            spool_dir=tmp_path / "spool",
        )
        reporter = Reporter(settings, Spool(settings.spool_dir, 1 << 20), AgentMetrics())
        reporter.submit(report)
        assert reporter.drain() == 1 and len(reporter.spool) == 0
    finally:
        server.stop(0)
    [got] = old.stored
    assert got.report_id == report.report_id and len(got.aggregates) == len(report.aggregates)
    for a, sent in zip(got.aggregates, report.aggregates, strict=True):
        for msg, compact in (
            (a.throughput_sketch, sent.throughput_sketch),
            (a.queue_delay_sketch, sent.queue_delay_sketch),
        ):
            assert not msg.key_stride and msg.relative_accuracy == sketches.RELATIVE_ACCURACY
            assert sketches.sketch_errors(msg, a.flow_count) == []
            dense, back = sketches.from_proto(msg), sketches.from_proto(compact)
            for q in QUANTILES:
                assert dense.get_quantile_value(q) == back.get_quantile_value(q)
