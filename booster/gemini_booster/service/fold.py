"""The refit owner's fold: new raw aggregates into the trial sums, and the raw partitions' upkeep.

Every replica that refits runs one fold thread. Every ``fold_interval_s`` it folds, for each
policy whose refit lease this replica holds, the aggregates stored since the policy's watermark
(``storage/fold.py``: one transaction per policy, exactly once whatever dies when), and marks
the policies that got data dirty, so their refit follows. This is how the refit owner learns of
new data: ingest sends no notification.

Every ``PARTITION_CHECK_S`` (and at start) it also creates the coming days' partitions of raw
aggregates and drops those past ``raw_retention_days`` (one replica at a time fleet-wide, under
an advisory lock; a partition with rows not folded yet is kept).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Engine

from ..models import Policy
from ..storage.fold import Folded, fold_lag_s, fold_policy, maintain_partitions
from .metrics import Metrics
from .periodic import FirstRound, Periodic
from .ratelimit_log import RateLimitedLog
from .validation import MAX_REPORT_AGE_MS

# A report's idempotency key is kept while a retry of it could still be accepted (validation
# refuses reports older than MAX_REPORT_AGE_MS), plus a day for clocks that disagree: a short
# raw retention must not let a late retry be stored twice.
REPORT_KEY_DAYS = MAX_REPORT_AGE_MS // 86_400_000 + 1

log = logging.getLogger(__name__)

PARTITION_CHECK_S = 3600.0  # partitions are a day wide: hourly upkeep has a day of margin
STOP_JOIN_S = 30.0


class FoldService(Periodic):
    """Folds the owned policies' new aggregates on a schedule (``start``), or now
    (``fold_owned``). ``owned`` names the policies this replica holds the lease of;
    ``folded`` is called with those that got new data."""

    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        owned: Callable[[], set[int]],
        policies: Callable[[], dict[int, Policy]],
        folded: Callable[[set[int]], object],
        interval_s: float,
        retention_days: int,
    ):
        super().__init__("fold", interval_s, FirstRound.AT_START, STOP_JOIN_S)
        self.engine = engine
        self.metrics = metrics
        self.owned = owned
        self.policies = policies
        self.folded = folded
        self.retention_days = retention_days
        self._lock = threading.Lock()  # one fold round at a time in this process
        self._errors = RateLimitedLog(log, 30.0)
        self._next_upkeep = 0.0

    def round(self) -> None:
        """The partitions' upkeep when due, then a fold of every owned policy."""
        if time.monotonic() >= self._next_upkeep:
            self.upkeep()
        self.fold_owned()

    def upkeep(self, now: datetime | None = None) -> tuple[list[str], list[str]] | None:
        """Create coming partitions, drop expired ones; (created, dropped), or None when
        another replica did it or it failed (logged; tried again at the next check)."""
        self._next_upkeep = time.monotonic() + PARTITION_CHECK_S
        try:
            done = maintain_partitions(
                self.engine, now or datetime.now(UTC), self.retention_days, REPORT_KEY_DAYS
            )
        except Exception as e:
            self._errors.warning("partition upkeep failed: %s: %s", type(e).__name__, e)
            self._next_upkeep = time.monotonic() + self.interval_s
            return None
        if done and (done[0] or done[1]):
            log.info("raw aggregate partitions created %s, dropped %s", *done)
        return done

    def fold_owned(self) -> dict[int, Folded]:
        """Fold every owned policy now; the folds that committed, by policy id. Never raises:
        a failed fold committed nothing, and the next round takes the same rows."""
        done: dict[int, Folded] = {}
        with self._lock:
            for pid in sorted(self.owned()):
                if self._stopping.is_set():
                    break
                f = self._fold(pid)
                if f is not None:
                    done[pid] = f
        got = {pid for pid, f in done.items() if f.aggregates}
        if got:
            self.folded(got)
        return done

    def fold_one(self, policy_id: int) -> Folded | None:
        """Fold one policy now (before an explicit refit, so that it reads folded sums); None
        if it failed (logged, counted)."""
        with self._lock:
            return self._fold(policy_id)

    def _fold(self, policy_id: int) -> Folded | None:
        policy = self.policies().get(policy_id)
        name = policy.name if policy is not None else str(policy_id)
        try:
            with self.engine.begin() as conn:
                f = fold_policy(conn, policy_id)
            with self.engine.connect() as conn:
                self.metrics.fold_lag.labels(name).set(fold_lag_s(conn, policy_id))
        except Exception as e:
            self.metrics.fold_failures.labels(name).inc()
            self._errors.warning("fold of policy %s failed: %s", name, type(e).__name__)
            return None
        self.metrics.folded.labels(name).inc(f.aggregates)
        return f
