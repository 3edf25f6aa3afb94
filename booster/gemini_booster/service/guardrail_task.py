"""The experiments' guardrail on a schedule: a harmful arm is stopped within about
``guardrail_interval_s`` of its data showing it, without waiting for an operator to ask.

Every replica that refits runs this thread; each round reads the sums of every guarded live
experiment, so one round at a time across the fleet is enough. A round holds a transaction-scoped
PostgreSQL advisory lock (``pg_try_advisory_xact_lock``) while it runs, and a replica that does
not get it skips that round: another replica is doing the work. The lock ends with the round's
transaction, or with the session when a replica dies mid-round, so a lost replica never holds up
the others' next rounds.

The lock saves work; it is not what keeps a stop single. ``storage.experiments.stop_arm`` locks
the experiment's row and records an arm's stop once, so rounds that follow each other (or an
operator's call racing a round) stop and audit an arm once. Each stop is audited by the
``guardrail`` actor and notified to every replica by ``stop_arm``; this replica refreshes its
own arm cache at once, as the REST route does, so agents lose the arm at their next
GetParameters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Engine, text

from . import experiments as service
from .metrics import Metrics
from .periodic import FirstRound, Periodic
from .ratelimit_log import RateLimitedLog

log = logging.getLogger(__name__)

LOCK_KEY = 0x6772_6472  # advisory lock key ("grdr"): one guardrail round at a time fleet-wide
_TRY_LOCK = text("SELECT pg_try_advisory_xact_lock(:k)")
ERROR_LOG_INTERVAL_S = 60.0  # a database outage fails every round alike: one line a minute
STOP_JOIN_S = 30.0  # a round under way finishes its current experiment's stops


class GuardrailTask(Periodic):
    """Runs the guardrail of every live experiment that has one, every ``interval_s`` seconds
    (never when it is 0); ``changed`` is called after a round that stopped an arm."""

    def __init__(
        self, engine: Engine, interval_s: float, metrics: Metrics, changed: Callable[[], None]
    ):
        super().__init__("guardrail", interval_s, FirstRound.AFTER_INTERVAL, STOP_JOIN_S)
        self.engine = engine
        self.metrics = metrics
        self.changed = changed
        self._errors = RateLimitedLog(log, ERROR_LOG_INTERVAL_S)

    def start(self) -> None:
        """Rounds of its own only with an interval above 0 (else ``running`` stays false)."""
        if self.interval_s > 0:
            super().start()

    def round(self) -> None:
        self.run_once()

    def run_once(self) -> int | None:
        """One round: the arms it stopped, or None when another replica holds the round.
        Never raises: a failure is counted, logged (rate-limited) and left to the next round."""
        stopped = 0
        try:
            with self.engine.connect() as conn, conn.begin():
                if not conn.execute(_TRY_LOCK, {"k": LOCK_KEY}).scalar():
                    return None
                stopped, failed = self._check_all()
            if stopped:
                self.changed()
        except Exception as e:  # the database away, most likely: the next round tries again
            self._errors.warning("guardrail round failed: %s: %s", type(e).__name__, e)
            self.metrics.guardrail_failures.inc()
            return stopped
        if failed:
            self.metrics.guardrail_failures.inc()
        return stopped

    def _check_all(self) -> tuple[int, bool]:
        """Every guarded experiment in turn (one failing does not spare the others): the arms
        stopped, and whether some experiment's check failed."""
        stopped, failed = 0, False
        for name in service.guarded_experiments(self.engine):
            if self._stopping.is_set():
                break
            try:
                decisions = service.enforce_guardrail(self.engine, name)
            except Exception as e:
                self._errors.warning("guardrail of %r failed: %s: %s", name, type(e).__name__, e)
                failed = True
                continue
            for d in decisions:
                if d.stop:
                    log.warning("guardrail stopped arm %r of %r: %s", d.arm, name, d.reason)
                    self.metrics.guardrail_stops.inc()
                    stopped += 1
        return stopped, failed
