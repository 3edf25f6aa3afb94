"""The running sums of a policy's objective over flows, shared by agents (which build them, one
flow at a time) and Booster (which adds them up per trial, per arm, per day and evaluates the
objective from them).

Eq. 9 (``Objective.FLOW_MEAN``) is f = mean over flows of (throughput − σ·queueing delay). It is
linear in per-flow values, so five running sums (Σx, Σx², Σd, Σd², Σx·d) and the flow count give,
for any σ, the exact mean utility and the sample variance of per-flow utility; a sum of such sums
is again one.

The mean of per-flow rates rewards a θ whose timeouts leave a few short flows late while the rest
finish early (datapaths-eval.md, "DC-Vegas tuned for incast"). ``Objective.COMPLETION`` is all
the flows' bits over all their durations, Σb / Σt (the inverse of the mean completion time per
bit, the short-flow metric of datacenter transport papers), minus σ · mean queueing delay: a
timeout adds its whole RTO to Σt. A ratio is not linear in per-flow values, but its sums are:
Σb, Σt, their squares and their cross sum give its variance by the delta method.

``FlowSums.utility(σ, objective)`` is the only place a utility is computed.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from enum import StrEnum

from gemini_api.v1 import booster_pb2 as pb

# A trial of one flow has no sample variance; assume a per-flow spread this large (in utility
# units, Mbit/s) rather than pretending the single value is exact.
SINGLE_FLOW_STD = 5.0
# Variance of per-flow utility is never taken as smaller than this (a floor for the GP's noise).
MIN_FLOW_VARIANCE = 1e-6
BITS_PER_BYTE = 8
BITS_PER_MBIT = 1e6
US_PER_S = 1e6
CAUCHY_SCHWARZ_SLACK = 1e-6  # relative room for rounding in sums of products


class Objective(StrEnum):
    """What a policy's utility is over a set of flows (it names one; ``FLOW_MEAN`` unless told)."""

    FLOW_MEAN = "flow-mean"  # eq. 9: mean over flows of (bytes/duration − σ·delay)
    COMPLETION = "completion"  # Σbits/Σduration − σ·mean delay: short flows, incast


@dataclass(frozen=True)
class Utility:
    """Eq. 9 for one set of flows: the mean, the variance of that mean, and how many flows."""

    mean: float
    var_of_mean: float
    flows: int

    @property
    def stderr(self) -> float:
        return self.var_of_mean**0.5


def _no_flows() -> Utility:
    return Utility(0.0, SINGLE_FLOW_STD**2, 0)


@dataclass(frozen=True)
class CompletionSums:
    """Running sums over flows for ``Objective.COMPLETION``: bytes acked and durations (exact
    integers), the squares and cross sum of bits b (Mbit) and duration t (s), and the queueing
    delay d (ms) sums over the same flows. Its own flow count, because aggregates from agents
    older than it carry none and still count for eq. 9."""

    flow_count: int = 0
    bytes_sum: int = 0
    duration_us_sum: int = 0
    mbit_sq_sum: float = 0.0
    seconds_sq_sum: float = 0.0
    mbit_seconds_sum: float = 0.0
    delay_sum: float = 0.0
    delay_sq_sum: float = 0.0

    def __add__(self, other: CompletionSums) -> CompletionSums:
        return CompletionSums(*map(operator.add, self.values(), other.values()))

    def __sub__(self, other: CompletionSums) -> CompletionSums:
        return CompletionSums(*map(operator.sub, self.values(), other.values()))

    def values(self) -> tuple[int, int, int, float, float, float, float, float]:
        """The sums in field order (``dataclasses.astuple`` deep-copies: too slow for the
        hundred thousand additions of a fleet's refit)."""
        return (
            self.flow_count,
            self.bytes_sum,
            self.duration_us_sum,
            self.mbit_sq_sum,
            self.seconds_sq_sum,
            self.mbit_seconds_sum,
            self.delay_sum,
            self.delay_sq_sum,
        )

    @classmethod
    def of_flow(cls, bytes_acked: int, duration_us: int, queue_delay_ms: float) -> CompletionSums:
        b = bytes_acked * BITS_PER_BYTE / BITS_PER_MBIT
        t, d = duration_us / US_PER_S, queue_delay_ms
        return cls(1, bytes_acked, duration_us, b * b, t * t, b * t, d, d * d)

    @property
    def mbit_sum(self) -> float:
        return self.bytes_sum * BITS_PER_BYTE / BITS_PER_MBIT

    @property
    def seconds_sum(self) -> float:
        return self.duration_us_sum / US_PER_S

    def utility(self, sigma: float) -> Utility:
        """Σb/Σt − σ·d̄. Its noise: the ratio's variance by the delta method (the mean of
        (b_i − R·t_i)/t̄, R = Σb/Σt, whose sample variance the sums give), plus σ² times the
        delay's, plus their covariance at its Cauchy–Schwarz bound (Σb·d and Σt·d are not sent,
        to keep reports small): an upper bound, never an understatement from that term."""
        n = self.flow_count
        if n == 0 or self.duration_us_sum <= 0:
            return _no_flows()
        rate = self.mbit_sum / self.seconds_sum
        t_mean = self.seconds_sum / n
        d_mean = self.delay_sum / n
        mean = rate - sigma * d_mean
        if n < 2:
            return Utility(mean, SINGLE_FLOW_STD**2, n)
        spread = self.mbit_sq_sum - 2 * rate * self.mbit_seconds_sum
        spread += rate * rate * self.seconds_sq_sum  # Σ(b − R·t)², whose mean is 0
        ratio_var = max(spread, 0.0) / t_mean**2 / (n - 1)
        delay_var = max(self.delay_sq_sum - n * d_mean * d_mean, 0.0) / (n - 1)
        per_flow = (ratio_var**0.5 + sigma * delay_var**0.5) ** 2
        return Utility(mean, max(per_flow, MIN_FLOW_VARIANCE) / n, n)

    @classmethod
    def of_message(cls, a: pb.Aggregate) -> CompletionSums:
        """The aggregate's completion sums (its delay sums are over the same flows); none from
        an agent older than them."""
        if not a.HasField("completion"):
            return cls()
        m = a.completion
        return cls(m.flow_count, m.bytes_sum, m.duration_us_sum, m.mbit_sq_sum, m.seconds_sq_sum,
                   m.mbit_seconds_sum, a.queue_delay_ms_sum, a.queue_delay_ms_sq_sum)  # fmt: skip

    def fill(self, m: pb.CompletionSums) -> pb.CompletionSums:
        for f in WIRE_FIELDS:
            setattr(m, f, getattr(self, f))
        return m


MAX_SUM_INTEGER = 2**63 - 1  # what the bigint columns hold


def completion_errors(a: pb.Aggregate) -> list[str]:
    """What is wrong with an aggregate's completion sums (none: nothing to say), each naming its
    field: counts and integer sums that storage cannot hold, values that are not finite or are
    negative, a flow count other than the aggregate's (the delay sums are shared), no duration
    for flows, and Σb·t beyond √(Σb²·Σt²) (Cauchy–Schwarz)."""
    if not a.HasField("completion"):
        return []
    m = a.completion
    found = [f"{f}: {getattr(m, f)} > {MAX_SUM_INTEGER}" for f in WIRE_FIELDS[:3]
             if getattr(m, f) > MAX_SUM_INTEGER]  # fmt: skip
    for f in WIRE_FIELDS[3:]:
        v = getattr(m, f)
        if not math.isfinite(v) or v < 0:
            found.append(f"{f}: {v} is not a finite non-negative sum")
    if m.flow_count != a.flow_count:
        found.append(f"flow_count: {m.flow_count}, not the aggregate's {a.flow_count}")
    if m.flow_count and not m.duration_us_sum:
        found.append("duration_us_sum: 0 for flows that have a completion time")
    if not found:
        bound = math.sqrt(m.mbit_sq_sum * m.seconds_sq_sum)
        if m.mbit_seconds_sum > bound * (1 + CAUCHY_SCHWARZ_SLACK) + 1e-12:
            found.append(f"mbit_seconds_sum: {m.mbit_seconds_sum:g} > √(mbit_sq_sum × "
                         f"seconds_sq_sum) = {bound:g} (Cauchy–Schwarz)")  # fmt: skip
    return found


COMPLETION_FIELDS = tuple(f.name for f in fields(CompletionSums))
WIRE_FIELDS = COMPLETION_FIELDS[:6]  # the delay sums travel as the Aggregate's eq. 9 ones
# Their columns where Booster stores them beside eq. 9's (report aggregates, trials).
COMPLETION_COLUMNS = tuple(f"completion_{f}" for f in COMPLETION_FIELDS)


@dataclass(frozen=True)
class FlowSums:
    """Running sums over flows of throughput x (Mbit/s) and queueing delay d (ms) (eq. 9), and
    the completion-time objective's (``completion``; empty for flows of agents older than it)."""

    flow_count: int = 0
    tpt_sum: float = 0.0
    tpt_sq_sum: float = 0.0
    delay_sum: float = 0.0
    delay_sq_sum: float = 0.0
    tpt_delay_sum: float = 0.0
    completion: CompletionSums = field(default=CompletionSums(), kw_only=True)

    def __add__(self, other: FlowSums) -> FlowSums:
        return FlowSums(
            self.flow_count + other.flow_count,
            self.tpt_sum + other.tpt_sum,
            self.tpt_sq_sum + other.tpt_sq_sum,
            self.delay_sum + other.delay_sum,
            self.delay_sq_sum + other.delay_sq_sum,
            self.tpt_delay_sum + other.tpt_delay_sum,
            completion=self.completion + other.completion,
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
            completion=self.completion - other.completion,
        )

    @classmethod
    def of_flow(cls, throughput_mbps: float, queue_delay_ms: float) -> FlowSums:
        """Eq. 9's sums of one flow known only by its rate (no completion-time sums)."""
        x, d = throughput_mbps, queue_delay_ms
        return cls(1, x, x * x, d, d * d, x * d)

    @classmethod
    def of_record(cls, bytes_acked: int, duration_us: int, queue_delay_ms: float) -> FlowSums:
        """Both objectives' sums of one flow from its record (what an agent has)."""
        rate = bytes_acked * BITS_PER_BYTE / duration_us  # bits/µs = Mbit/s
        done = CompletionSums.of_flow(bytes_acked, duration_us, queue_delay_ms)
        return cls.of_flow(rate, queue_delay_ms).with_completion(done)

    def with_completion(self, completion: CompletionSums) -> FlowSums:
        return FlowSums(*self.astuple(), completion=completion)

    @classmethod
    def of_message(cls, a: pb.Aggregate) -> FlowSums:
        """The sums an Aggregate message carries (no completion sums from an older agent)."""
        return cls(
            a.flow_count,
            a.throughput_mbps_sum,
            a.throughput_mbps_sq_sum,
            a.queue_delay_ms_sum,
            a.queue_delay_ms_sq_sum,
            a.throughput_queue_delay_sum,
            completion=CompletionSums.of_message(a),
        )

    def fill(self, a: pb.Aggregate) -> pb.Aggregate:
        """Set these sums on an Aggregate message (the inverse of ``of_message``)."""
        a.flow_count = self.flow_count
        a.throughput_mbps_sum = self.tpt_sum
        a.throughput_mbps_sq_sum = self.tpt_sq_sum
        a.queue_delay_ms_sum = self.delay_sum
        a.queue_delay_ms_sq_sum = self.delay_sq_sum
        a.throughput_queue_delay_sum = self.tpt_delay_sum
        if self.completion.flow_count == self.flow_count > 0:  # the same flows: see the proto
            self.completion.fill(a.completion)
        return a

    @classmethod
    def total(cls, parts: Iterable[FlowSums]) -> FlowSums:
        out = cls()
        for p in parts:
            out = out + p
        return out

    def astuple(self) -> tuple[int, float, float, float, float, float]:
        """Eq. 9's sums (``SUM_FIELDS``), the completion sums left out."""
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

    def utility(self, sigma: float, objective: Objective = Objective.FLOW_MEAN) -> Utility:
        """The ``objective`` at ``sigma`` over these flows. Eq. 9: mean of x − σ·d, and var/N
        as the noise of that mean. Completion: over the flows that carry its sums only (an
        older agent's flows have none and count zero flows here)."""
        if objective == Objective.COMPLETION:
            return self.completion.utility(sigma)
        n = self.flow_count
        if n == 0:
            return _no_flows()
        mean = (self.tpt_sum - sigma * self.delay_sum) / n
        if n < 2:
            return Utility(mean, SINGLE_FLOW_STD**2, n)
        second = (
            self.tpt_sq_sum - 2 * sigma * self.tpt_delay_sum + sigma * sigma * self.delay_sq_sum
        ) / n
        sample_var = max(second - mean * mean, 0.0) * n / (n - 1)
        return Utility(mean, max(sample_var, MIN_FLOW_VARIANCE) / n, n)

    def flows_for(self, objective: Objective) -> int:
        """How many flows the objective is computed over (those carrying its sums)."""
        return self.completion.flow_count if objective == Objective.COMPLETION else self.flow_count


# Eq. 9's sums, in ``astuple``'s order: the columns every table of flow sums has.
SUM_FIELDS = tuple(f.name for f in fields(FlowSums) if f.name != "completion")
