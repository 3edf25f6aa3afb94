"""How finished flows become one ``Aggregate`` message: the agent's side of eq. 9's statistics.

Throughput is bytes acknowledged over the flow's duration (Mbit/s); queueing delay is mean RTT
minus minimum RTT (ms). Sums, sums of squares and Σ throughput·delay let Booster compute eq. 9's
mean and variance for any σ later; the same flows' bytes and durations, summed
(``CompletionSums``), give the completion-time objective a policy may name instead; two
sketches keep the distributions of throughput and of queueing delay (the paper's Fig. 9 shows
percentiles of both), sent in the compact encoding of gemini_api.sketch (quantiles within 5 %).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddsketch import DDSketch

from gemini_api import sketch as sketches
from gemini_api.sums import FlowSums
from gemini_api.v1 import booster_pb2 as pb

SLOW_FLOW_MBPS = 0.8  # 100 KB/s, the paper's slow-flow line
SIZE_EDGES_BYTES = (100_000, 1_000_000, 10_000_000, 100_000_000)  # 5 buckets


@dataclass(frozen=True)
class FlowStats:
    bytes_acked: int
    duration_us: int
    rtt_avg_us: int
    rtt_min_us: int

    @property
    def throughput_mbps(self) -> float:
        return self.bytes_acked * 8 / self.duration_us if self.duration_us > 0 else 0.0

    @property
    def queue_delay_ms(self) -> float:
        return max(self.rtt_avg_us - self.rtt_min_us, 0) / 1000

    @property
    def usable(self) -> bool:
        """A flow that carried data for a measurable time; handshakes alone say nothing."""
        return self.bytes_acked > 0 and self.duration_us > 0


@dataclass
class AggregateBuilder:
    sums: FlowSums = field(default_factory=FlowSums)
    slow: int = 0
    sizes: list[int] = field(default_factory=lambda: [0] * (len(SIZE_EDGES_BYTES) + 1))
    sketch: DDSketch = field(default_factory=sketches.new_sketch)
    delay_sketch: DDSketch = field(default_factory=sketches.new_sketch)

    def add(self, flow: FlowStats) -> None:
        tpt, delay = flow.throughput_mbps, flow.queue_delay_ms
        if flow.usable:
            self.sums = self.sums + FlowSums.of_record(flow.bytes_acked, flow.duration_us, delay)
        else:  # no duration: no completion time to add
            self.sums = self.sums + FlowSums.of_flow(tpt, delay)
        self.slow += tpt < SLOW_FLOW_MBPS
        self.sizes[bisect.bisect_right(SIZE_EDGES_BYTES, flow.bytes_acked)] += 1
        self.sketch.add(tpt)
        self.delay_sketch.add(delay)  # 0 ms (no queue) lands in the sketch's zero count

    def to_proto(
        self,
        theta: Mapping[str, int],
        theta_version: int,
        context: pb.Context,
        cc: str = "",
        *,
        dense: bool = False,
    ) -> pb.Aggregate:
        """Fusion flows carry their θ; another CC's flows (``cc`` set) carry none. Sketches are
        compact (v2); ``dense`` writes them as agents before the compact sketch did (v1), which
        Booster still accepts (benchmarks and rollout tests compare the two)."""
        encode = sketches.to_proto if dense else sketches.to_compact_proto
        msg = pb.Aggregate(
            theta=None if cc else pb.Theta(**theta),
            theta_version=theta_version,
            cc=cc,
            context=context,
            throughput_sketch=encode(self.sketch),
            queue_delay_sketch=encode(self.delay_sketch),
            slow_flow_count=self.slow,
            size_bucket_counts=self.sizes,
        )
        return self.sums.fill(msg)
