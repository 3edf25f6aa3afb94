"""Booster's domain values, defined once and imported by every layer above (policy, storage,
service): a context, the running sums of eq. 9, and a trial.

Eq. 9 is f = mean over flows of (throughput − σ·queueing delay). It is linear in per-flow values,
so five running sums (Σx, Σx², Σd, Σd², Σx·d) and the flow count give, for any σ, the exact mean
utility and the sample variance of per-flow utility; their sum over reports, trials or whole
arms is again such a set of sums. ``FlowSums`` is that value; ``utility(σ)`` is the only place
eq. 9 is computed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import NamedTuple

# A trial of one flow has no sample variance; assume a per-flow spread this large (in utility
# units, Mbit/s) rather than pretending the single value is exact.
SINGLE_FLOW_STD = 5.0
# Variance of per-flow utility is never taken as smaller than this (a floor for the GP's noise).
MIN_FLOW_VARIANCE = 1e-6

CONTEXT_FIELDS = ("src_region", "src_isp", "dst_region", "dst_isp", "hour")


class ContextKey(NamedTuple):
    """The hidden variables h of a flow (Gemini Table II): who talks to whom, over which ISPs,
    at what hour. A tuple, so it is hashable and orders the same everywhere."""

    src_region: str
    src_isp: str
    dst_region: str
    dst_isp: str
    hour: int

    @property
    def label(self) -> str:
        return f"{self.src_region}/{self.src_isp}->{self.dst_region}/{self.dst_isp}@{self.hour}"

    def as_dict(self) -> dict[str, str | int]:
        return self._asdict()


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


@dataclass(frozen=True)
class Trial:
    """Everything seen of one θ (or one baseline CC) in one context of one policy."""

    context_id: int
    theta_key: str
    sums: FlowSums
    slow_flows: int
    report_count: int
    last_seen: datetime

    @property
    def flow_count(self) -> int:
        return self.sums.flow_count

    @property
    def slow_flow_share(self) -> float:
        return self.slow_flows / self.sums.flow_count if self.sums.flow_count else 0.0
