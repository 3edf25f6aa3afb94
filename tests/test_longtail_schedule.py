"""Refit at fleet scale: a refit plans at most ``max_contexts_per_refit`` (B) contexts, in the
order ``service.refit.plan_order`` gives; every context with new data is then replanned within
ceil(N / B) refits of N contexts, however many of them keep getting data. With B = 200 and a
measured refit of 200 contexts at 100,000 trials (``benchmarks/results/longtail.md``), that is
the bound the service gives a 1,000-context policy in place of one 1,000-context refit."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from gemini_booster.domain import FlowSums, Trial
from gemini_booster.service.refit import plan_order

T0 = datetime(2026, 3, 2, tzinfo=UTC)
CONTEXTS = 1_000
PER_REFIT = 200
REFITS = 25


def test_every_context_with_new_data_is_replanned_within_n_over_b_refits():
    """Every context gets new data before every refit (the worst case: all stale at once);
    a context planned at refit i is planned again by refit i + ceil(N / B)."""
    planned_at: dict[int, datetime] = {}
    last: dict[int, int] = {}
    gaps: list[int] = []
    sums = FlowSums(1, 10.0, 100.0, 1.0, 1.0, 10.0)
    for i in range(REFITS):
        now = T0 + timedelta(minutes=i)
        trials = [Trial(c, "k", sums, 0, 1, now, now) for c in range(CONTEXTS)]
        targets = plan_order(set(range(CONTEXTS)), trials, planned_at)[:PER_REFIT]
        for c in targets:
            if c in last:
                gaps.append(i - last[c])
            last[c] = i
            planned_at[c] = now + timedelta(seconds=30)
    assert len(last) == CONTEXTS  # every context planned
    assert max(gaps) <= math.ceil(CONTEXTS / PER_REFIT)


def test_a_context_whose_data_arrives_late_waits_no_longer_than_the_bound():
    """Only one context gets new data after everything was planned: it is the first target."""
    planned_at = {c: T0 for c in range(CONTEXTS)}
    sums = FlowSums(1, 10.0, 100.0, 1.0, 1.0, 10.0)
    later = T0 + timedelta(minutes=5)
    trials = [Trial(c, "k", sums, 0, 1, T0, T0) for c in range(CONTEXTS)]
    trials.append(Trial(737, "k", sums, 0, 1, later, later))
    assert plan_order(set(range(CONTEXTS)), trials, planned_at)[0] == 737
