"""The completion-time objective (``Objective.COMPLETION``): its running sums, its variance by
the delta method, what agents send of it, and how the planner's history ranks θ by it."""

from __future__ import annotations

from dataclasses import astuple
from datetime import UTC, datetime

import numpy as np
import pytest

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.datapaths import load_datapath
from gemini_api.sums import CompletionSums, FlowSums, Objective, completion_errors
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster.domain import Trial
from gemini_booster.policy import history

SIGMA = 0.1
NOW = datetime(2026, 11, 28, tzinfo=UTC)
RTO_US = 200_000  # the minimum RTO a timed-out incast flow waits
SHORT_BYTES = 100_000


def _records(rng: np.random.Generator, n: int) -> list[tuple[int, int, float]]:
    sizes = rng.integers(10_000, 2_000_000, n)
    durations = (sizes * 8 / rng.uniform(1, 50, n)).astype(int) + 1000  # µs
    delays = rng.uniform(0, 5, n)
    return [(int(b), int(t), float(d)) for b, t, d in zip(sizes, durations, delays, strict=True)]


def _sums(records: list[tuple[int, int, float]]) -> FlowSums:
    return FlowSums.total(FlowSums.of_record(b, t, d) for b, t, d in records)


def _columns(records: list[tuple[int, int, float]]) -> tuple[np.ndarray, ...]:
    """Each flow's bits (Mbit), duration (s) and queueing delay (ms)."""
    b, t, d = (np.asarray(c, dtype=float) for c in zip(*records, strict=True))
    return b * 8 / 1e6, t / 1e6, d


def _completion_at_once(records: list[tuple[int, int, float]]) -> CompletionSums:
    """The same sums as ``_sums(records).completion``, in numpy (for many samples)."""
    b, t, d = _columns(records)
    sizes, durations = (sum(int(r[i]) for r in records) for i in (0, 1))
    products = (b * b, t * t, b * t, d, d * d)
    return CompletionSums(len(b), sizes, durations, *(float(p.sum()) for p in products))


def test_sums_add_associatively_and_a_total_equals_the_flows_summed_at_once():
    rng = np.random.default_rng(1)
    recs = _records(rng, 30)
    a, b, c = _sums(recs[:7]), _sums(recs[7:19]), _sums(recs[19:])
    left, right = (a + b) + c, a + (b + c)
    assert astuple(left.completion) == pytest.approx(astuple(_completion_at_once(recs)))
    for x, y in ((left, right), (left, _sums(recs))):
        assert x.flow_count == y.flow_count == 30
        assert x.completion.flow_count == 30
        assert np.allclose(
            [*x.astuple(), *x.completion.__dict__.values()],
            [*y.astuple(), *y.completion.__dict__.values()],
            rtol=1e-12,
        )
    assert (left - c).completion.mbit_sum == pytest.approx((a + b).completion.mbit_sum)


def test_utility_is_all_bits_over_all_durations_and_its_variance_the_delta_methods():
    rng = np.random.default_rng(2)
    recs = _records(rng, 25)
    b, t, d = _columns(recs)
    u = _sums(recs).utility(SIGMA, Objective.COMPLETION)
    rate = b.sum() / t.sum()
    assert u.mean == pytest.approx(rate - SIGMA * d.mean(), rel=1e-12)
    # The direct computation: the ratio's linearised per-flow terms, the delay's, and their
    # covariance at its Cauchy–Schwarz bound (the sums leave Σb·d, Σt·d out).
    ratio_sd = ((b - rate * t) / t.mean()).std(ddof=1)
    assert u.var_of_mean == pytest.approx(
        (ratio_sd + SIGMA * d.std(ddof=1)) ** 2 / len(b), rel=1e-9
    )
    assert u.var_of_mean >= np.var((b - rate * t) / t.mean() - SIGMA * d, ddof=1) / len(b)
    assert u.flows == 25


def test_the_delta_method_variance_is_the_estimates_spread_over_repeated_samples():
    """Not only self-consistent: the variance it gives is how much Σb/Σt − σ·d̄ moves from one
    sample of flows to the next (within 10 % over 1000 samples of 200 flows). It is a large-
    sample variance: with these heavy-tailed durations it reads about 25 % low at 40 flows
    (docs/datapaths.md, "Objectives")."""
    rng = np.random.default_rng(3)
    estimates, predicted = [], []
    for _ in range(1000):
        u = _completion_at_once(_records(rng, 200)).utility(SIGMA)
        estimates.append(u.mean)
        predicted.append(u.var_of_mean)
    assert np.mean(predicted) == pytest.approx(np.var(estimates), rel=0.1)


def test_a_timeout_lowers_completion_utility_while_it_raises_the_mean_of_rates():
    fast, even = 50_000, 90_000  # µs: 4 × 90 ms < 3 × 50 ms + 50 ms + an RTO
    spread = [(SHORT_BYTES, fast, 1.0)] * 3 + [(SHORT_BYTES, fast + RTO_US, 1.0)]
    same = [(SHORT_BYTES, even, 1.0)] * 4
    late, level = _sums(spread), _sums(same)
    assert late.utility(SIGMA).mean > level.utility(SIGMA).mean  # eq. 9's blind spot
    completion = Objective.COMPLETION
    assert late.utility(SIGMA, completion).mean < level.utility(SIGMA, completion).mean


def _trial(key: str, sums: FlowSums) -> Trial:
    return Trial(1, key, sums, 0, 1, NOW, NOW)


def test_a_completion_policy_ranks_the_theta_with_timeouts_below_the_one_without():
    """The planner's history at each objective, over the same stored trials: 40 short flows per
    θ; under θ "timeouts" 4 of them wait an RTO and the rest finish sooner."""
    spec = load_datapath("dcvegas")
    bounds = spec.region_bounds("production")
    with_to = {**spec.default(), "queue_threshold": 19}
    without = spec.default()
    late = [(SHORT_BYTES, 80_000, 2.0)] * 36 + [(SHORT_BYTES, 80_000 + RTO_US, 2.0)] * 4
    level = [(SHORT_BYTES, 90_000, 1.0)] * 40
    trials = [_trial(spec.key(with_to), _sums(late)), _trial(spec.key(without), _sums(level))]

    def best(objective: Objective) -> dict[str, int]:
        obs = history.observations(trials, SIGMA, spec, bounds, objective)
        return max(obs, key=lambda o: o.utility).theta

    assert best(Objective.FLOW_MEAN) == with_to
    assert best(Objective.COMPLETION) == without


def test_an_aggregate_with_flows_lacking_a_duration_sends_no_completion_sums():
    """The completion sums share the aggregate's delay sums, so they are sent only when they
    cover the same flows (an agent skips such flows before aggregating; a builder given one
    does not claim them)."""
    builder = AggregateBuilder()
    builder.add(FlowStats(250_000, 40_000, 1_500, 500))
    builder.add(FlowStats(0, 0, 0, 0))  # a handshake only: no completion time to add
    msg = builder.to_proto({}, 1, pb.Context(), cc="dcvegas")
    assert msg.flow_count == 2 and not msg.HasField("completion")


def test_old_agents_flows_count_for_eq9_and_train_no_completion_policy():
    spec = load_datapath("dcvegas")
    bounds = spec.region_bounds("production")
    key = spec.key(spec.default())
    old = FlowSums.of_message(FlowSums.of_flow(10.0, 1.0).fill(pb.Aggregate()))
    assert old.completion == CompletionSums()
    trials = [_trial(key, old)]
    assert len(history.observations(trials, SIGMA, spec, bounds)) == 1
    assert history.observations(trials, SIGMA, spec, bounds, Objective.COMPLETION) == []
    new = _sums([(SHORT_BYTES, 80_000, 1.0)] * 3)
    (obs,) = history.observations(
        [*trials, _trial(key, new)], SIGMA, spec, bounds, Objective.COMPLETION
    )
    assert obs.flows == 3  # the new agent's flows only


def test_the_agents_aggregate_carries_the_completion_sums_of_its_flows():
    builder = AggregateBuilder()
    flows = [FlowStats(250_000, 40_000, 1_500, 500), FlowStats(1_000_000, 900_000, 2_000, 500)]
    for f in flows:
        builder.add(f)
    msg = builder.to_proto({}, 1, pb.Context(), cc="dcvegas")
    assert msg.HasField("completion")
    got = FlowSums.of_message(msg)
    assert got.flow_count == 2 and got.completion.flow_count == 2
    expected = _sums([(f.bytes_acked, f.duration_us, f.queue_delay_ms) for f in flows])
    assert got.completion == expected.completion
    assert msg.completion.bytes_sum == 1_250_000 and msg.completion.duration_us_sum == 940_000
    assert got.utility(SIGMA, Objective.COMPLETION).mean == pytest.approx(
        (2.0 + 8.0) / (0.04 + 0.9) - SIGMA * (1.0 + 1.5) / 2
    )


def _message(**completion: float) -> pb.Aggregate:
    builder = AggregateBuilder()
    for f in (FlowStats(250_000, 40_000, 1_500, 500), FlowStats(1_000_000, 900_000, 2_000, 500)):
        builder.add(f)
    msg = builder.to_proto({}, 1, pb.Context(), cc="dcvegas")
    for name, value in completion.items():
        setattr(msg.completion, name, value)
    return msg


def test_an_agents_completion_sums_pass_and_bad_ones_are_named():
    """For Booster's report validation: each bad sum named, a sound one silent, none for an old
    agent's aggregate."""
    assert completion_errors(_message()) == []
    assert completion_errors(pb.Aggregate(flow_count=3)) == []
    cases = {
        "mbit_sq_sum": {"mbit_sq_sum": float("nan")},
        "seconds_sq_sum": {"seconds_sq_sum": -1.0},
        "flow_count": {"flow_count": 5},
        "duration_us_sum": {"duration_us_sum": 0},
        "bytes_sum": {"bytes_sum": 2**64 - 1},
        "Cauchy–Schwarz": {"mbit_seconds_sum": 100.0},
    }
    for named, change in cases.items():
        (error,) = completion_errors(_message(**change))
        assert named in error, (named, error)
