"""The running sums of eq. 9 over flows, shared by agents (which build them, one flow at a time)
and Booster (which adds them up per trial, per arm, per day and evaluates eq. 9 from them).

Eq. 9 is f = mean over flows of (throughput − σ·queueing delay). It is linear in per-flow values,
so five running sums (Σx, Σx², Σd, Σd², Σx·d) and the flow count give, for any σ, the exact mean
utility and the sample variance of per-flow utility; a sum of such sums is again one.
``FlowSums.utility(σ)`` is the only place eq. 9 is computed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from gemini_api.v1 import booster_pb2 as pb

# A trial of one flow has no sample variance; assume a per-flow spread this large (in utility
# units, Mbit/s) rather than pretending the single value is exact.
SINGLE_FLOW_STD = 5.0
# Variance of per-flow utility is never taken as smaller than this (a floor for the GP's noise).
MIN_FLOW_VARIANCE = 1e-6


@dataclass(frozen=True)
class Utility:
    """Eq. 9 for one set of flows: the mean, the variance of that mean, and how many flows."""

    mean: float
    var_of_mean: float
    flows: int

    @property
    def stderr(self) -> float:
        return self.var_of_mean**0.5


@dataclass(frozen=True)
class FlowSums:
    """Running sums over flows of throughput x (Mbit/s) and queueing delay d (ms)."""

    flow_count: int = 0
    tpt_sum: float = 0.0
    tpt_sq_sum: float = 0.0
    delay_sum: float = 0.0
    delay_sq_sum: float = 0.0
    tpt_delay_sum: float = 0.0

    def __add__(self, other: FlowSums) -> FlowSums:
        return FlowSums(
            self.flow_count + other.flow_count,
            self.tpt_sum + other.tpt_sum,
            self.tpt_sq_sum + other.tpt_sq_sum,
            self.delay_sum + other.delay_sum,
            self.delay_sq_sum + other.delay_sq_sum,
            self.tpt_delay_sum + other.tpt_delay_sum,
        )

    def __sub__(self, other: FlowSums) -> FlowSums:
        """The flows of ``self`` that are not in ``other`` (a part taken out of a total)."""
        return FlowSums(
            self.flow_count - other.flow_count,
            self.tpt_sum - other.tpt_sum,
            self.tpt_sq_sum - other.tpt_sq_sum,
            self.delay_sum - other.delay_sum,
            self.delay_sq_sum - other.delay_sq_sum,
            self.tpt_delay_sum - other.tpt_delay_sum,
        )

    @classmethod
    def of_flow(cls, throughput_mbps: float, queue_delay_ms: float) -> FlowSums:
        x, d = throughput_mbps, queue_delay_ms
        return cls(1, x, x * x, d, d * d, x * d)

    @classmethod
    def of_message(cls, a: pb.Aggregate) -> FlowSums:
        """The sums an Aggregate message carries."""
        return cls(
            a.flow_count,
            a.throughput_mbps_sum,
            a.throughput_mbps_sq_sum,
            a.queue_delay_ms_sum,
            a.queue_delay_ms_sq_sum,
            a.throughput_queue_delay_sum,
        )

    def fill(self, a: pb.Aggregate) -> pb.Aggregate:
        """Set these sums on an Aggregate message (the inverse of ``of_message``)."""
        a.flow_count = self.flow_count
        a.throughput_mbps_sum = self.tpt_sum
        a.throughput_mbps_sq_sum = self.tpt_sq_sum
        a.queue_delay_ms_sum = self.delay_sum
        a.queue_delay_ms_sq_sum = self.delay_sq_sum
        a.throughput_queue_delay_sum = self.tpt_delay_sum
        return a

    @classmethod
    def total(cls, parts: Iterable[FlowSums]) -> FlowSums:
        out = cls()
        for p in parts:
            out = out + p
        return out

    def astuple(self) -> tuple[int, float, float, float, float, float]:
        return (
            self.flow_count,
            self.tpt_sum,
            self.tpt_sq_sum,
            self.delay_sum,
            self.delay_sq_sum,
            self.tpt_delay_sum,
        )

    @property
    def mean_throughput(self) -> float:
        return self.tpt_sum / self.flow_count if self.flow_count else 0.0

    @property
    def mean_delay(self) -> float:
        return self.delay_sum / self.flow_count if self.flow_count else 0.0

    def utility(self, sigma: float) -> Utility:
        """Eq. 9 at ``sigma``: mean of x − σ·d, and var/N as the noise of that mean."""
        n = self.flow_count
        if n == 0:
            return Utility(0.0, SINGLE_FLOW_STD**2, 0)
        mean = (self.tpt_sum - sigma * self.delay_sum) / n
        if n < 2:
            return Utility(mean, SINGLE_FLOW_STD**2, n)
        second = (
            self.tpt_sq_sum - 2 * sigma * self.tpt_delay_sum + sigma * sigma * self.delay_sq_sum
        ) / n
        sample_var = max(second - mean * mean, 0.0) * n / (n - 1)
        return Utility(mean, max(sample_var, MIN_FLOW_VARIANCE) / n, n)


SUM_FIELDS = tuple(f.name for f in fields(FlowSums))
