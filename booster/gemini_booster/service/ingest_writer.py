"""Group commit for reports: request handlers hand over validated reports and wait; one writer
thread stores whatever has queued up in a single transaction.

Under load the queue fills while a transaction runs, so batches grow by themselves; otherwise a
report waits for company. A transaction costs Booster and PostgreSQL about as much CPU for one
report as for dozens, so below capacity the wait is what keeps the cost per report near its
cost at capacity (benchmarks/results/replicas.md): at 250 reports/s, a 2 ms linger stored one
or two reports per transaction, and at 100 reports/s a 20 ms one stored two or three, at
0.65 ms of the writer's CPU per report.

How long to wait. A batch is stored as soon as one of these holds:

* a batch big enough to be worth its transaction is waiting: ``LINGER_BATCH`` reports, or
  ``batch_max`` if smaller. A transaction's fixed cost is about 1.5 ms of the writer's CPU
  (0.65 ms per report at two or three reports a batch), so 32 reports bring it under 0.05 ms
  each; waiting for more would only delay the answers (under load the writer takes up to
  ``batch_max`` of what has queued meanwhile);
* the arrivals pause: no report for ``QUIET_GAPS`` mean gaps between arrivals (a moving
  average kept by ``submit``, at least ``QUIET_MIN_S``). An open-loop fleet's reports keep
  coming and fill the batch; senders that wait for their answers before sending again (a
  closed loop, a burst of retries) stop, and waiting longer would only delay them;
* ``linger`` has passed since the writer took the batch's first report (the bound on the
  delay any report gets).

This is interrupt moderation's rule (wait for more work while it keeps arriving, not longer)
applied to group commit. The writer sleeps until the earliest of those moments and checks
again, rather than waking per report: a wake-up per report is a thread switch and a hand-over
of the interpreter lock, which cost more than storing the report.

One report never fails another. When a batch's transaction fails because the database refused
the data written (a value out of range, a constraint: ``is_refusal``), each report of the batch
is stored alone, in a transaction of its own, so only the culprit fails, with a permanent
rejection. When it fails for any other reason (connection lost, server shutting down, lock or
statement timeouts, or anything unforeseen, which is no report's fault), every report in it gets
the error and agents retry with the same idempotency key. Failures are logged at most once per
interval each, never a traceback per report.

Overload is explicit: at most ``queue_max`` reports wait to be stored (queued or in the batch
being written); beyond that ``admit`` refuses at once, with how long to wait before retrying
(the backlog at the recent storing rate), so that an agent learns of the overload in
microseconds and retries later, instead of waiting in a queue until its deadline passes. A
refused report was never stored, so nothing acknowledged is lost.

Handlers on the gRPC event loop wait on asyncio futures. The writer settles a whole batch with a
single call into the loop, rather than one thread-safe wake-up per report: at thousands of
reports a second those wake-ups were a visible share of the loop's time.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from sqlalchemy import Engine

from ..config import Settings
from ..storage.database import writer_engine
from ..storage.ingest import (
    Admissions,
    ContextIds,
    IngestOutcome,
    Rejection,
    ReportRow,
    is_refusal,
    is_transient,
    store_reports,
)
from .metrics import Metrics
from .ratelimit_log import RateLimitedLog

log = logging.getLogger(__name__)
limited = RateLimitedLog(log, interval_s=10.0)

Pending = tuple[ReportRow, asyncio.Future[IngestOutcome]]
RETRY_MIN_S, RETRY_MAX_S = 1.0, 60.0  # bounds of the retry hint an overloaded writer gives
RATE_SMOOTHING = 0.2  # weight of the newest batch in the storing rate's moving average
LINGER_BATCH = 32  # reports that make a transaction worth its fixed cost: no lingering beyond
QUIET_GAPS = 3.0  # a batch closes when no report came for this many mean inter-arrival gaps
QUIET_MIN_S = 0.001  # ...and never sooner than this after the last arrival
ARRIVAL_SMOOTHING = 0.05  # weight of the newest gap in the inter-arrival moving average
DEFAULT_HOST_DAY_QUOTA: int = Settings.model_fields["max_new_contexts_per_host_day"].default


def _settle(pairs: list[tuple[asyncio.Future[IngestOutcome], IngestOutcome]]) -> None:
    for fut, outcome in pairs:
        if not fut.done():  # the caller may have given up (deadline, cancelled RPC)
            fut.set_result(outcome)


class IngestWriter:
    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        on_stored: Callable[[set[int]], object],
        batch_max: int = 256,
        linger_s: float = 0.1,
        max_new_contexts_per_host_day: int = DEFAULT_HOST_DAY_QUOTA,
        queue_max: int = 2048,
    ):
        self.engine = writer_engine(engine)
        self.metrics = metrics
        self.on_stored = on_stored  # called with the policy ids that got new data
        self.batch_max = batch_max
        # Queued reports that, with the one the writer holds, make a batch worth storing.
        self._enough_queued = min(batch_max, LINGER_BATCH) - 1
        self.linger_s = linger_s
        self.max_new_contexts_per_host_day = max_new_contexts_per_host_day
        self.queue_max = queue_max
        self._backlog = 0  # reports submitted and not yet settled
        self._rate = 0.0  # reports stored per second of transaction, smoothed
        self._count = threading.Lock()
        self.context_ids = ContextIds()
        self.admissions = Admissions()
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._full = threading.Event()  # set by submit once a batch worth storing waits
        self._last_arrival = time.monotonic()  # written by _note_arrival only
        self._mean_gap = linger_s  # seconds between arrivals, smoothed; by _note_arrival only
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        self._full.set()  # end a linger now: what is queued is stored before the writer ends
        self._thread.join(timeout=10)
        self.engine.dispose()

    def admit(self) -> float | None:
        """None if one more report may be submitted; else the seconds after which a retry is
        likely to be admitted (the backlog at the recent storing rate, within bounds)."""
        with self._count:
            if self._backlog < self.queue_max:
                return None
            backlog, rate = self._backlog, self._rate
        wait = backlog / rate if rate > 0 else RETRY_MAX_S
        return min(max(wait, RETRY_MIN_S), RETRY_MAX_S)

    def submit(self, report: ReportRow) -> asyncio.Future[IngestOutcome]:
        """Queue ``report``; the future (of the running loop) resolves to its IngestOutcome."""
        fut = asyncio.get_running_loop().create_future()
        with self._count:
            self._backlog += 1
        self._note_arrival()
        self._queue.put((report, fut))
        if self._queue.qsize() >= self._enough_queued and not self._full.is_set():
            self._full.set()
        return fut

    def _note_arrival(self) -> None:
        """Keep the moving average of the gaps between arrivals (a gap counts at most
        ``linger``, so a quiet night does not make the next burst's pause look short)."""
        now = time.monotonic()
        gap = min(now - self._last_arrival, self.linger_s)
        self._last_arrival = now
        self._mean_gap += ARRIVAL_SMOOTHING * (gap - self._mean_gap)

    def _quiet_s(self) -> float:
        """How long without an arrival closes a batch: QUIET_GAPS mean gaps, at least
        QUIET_MIN_S."""
        return max(QUIET_GAPS * self._mean_gap, QUIET_MIN_S)

    def _linger(self) -> None:
        """Wait until a batch worth storing waits, the arrivals pause, or ``linger`` is up (module
        docstring). Clearing the event before checking the queue means a batch that fills in
        between still ends the wait at once."""
        if self.linger_s <= 0:
            return
        self._full.clear()
        deadline = time.monotonic() + self.linger_s
        while self._queue.qsize() < self._enough_queued:
            timeout = min(self._last_arrival + self._quiet_s(), deadline) - time.monotonic()
            if timeout <= 0 or self._full.wait(timeout):  # set: a full batch, or stopping
                return

    def _collect(self, first: Pending) -> tuple[list[Pending], bool]:
        """``first`` and what queues up behind it while the writer lingers, at most
        ``batch_max``. It does not linger when a batch worth storing is already waiting (under
        overload the writer never idles)."""
        self._linger()
        batch = [first]
        while len(batch) < self.batch_max:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stopping = self._collect(first)
            self._store(batch)
            if stopping:
                return

    def _commit(self, reports: list[ReportRow]) -> list[IngestOutcome]:
        return store_reports(
            self.engine,
            reports,
            self.context_ids,
            self.admissions,
            self.max_new_contexts_per_host_day,
        )

    def _unavailable(self, e: Exception, reports: list[ReportRow]) -> list[IngestOutcome]:
        """Every report of ``reports`` is to be retried: the database is away, or something
        failed that is no report's fault (then an error, for the operator)."""
        self.metrics.ingest_failures.labels("transient").inc()
        if is_transient(e):
            limited.warning(
                "storing reports failed, agents will retry: %s (%d reports)",
                type(e).__name__,
                len(reports),
            )
        else:
            cause = getattr(e, "orig", None) or e
            limited.error(
                "storing reports failed unexpectedly, agents will retry: %s (SQLSTATE %s)",
                type(cause).__name__,
                getattr(cause, "sqlstate", None),
            )
        return [IngestOutcome(error=e) for _ in reports]

    def _refused(self, e: Exception, report: ReportRow) -> IngestOutcome:
        self.metrics.ingest_failures.labels("refused").inc()
        cause = getattr(e, "orig", None) or e
        limited.error(
            "storage refused report %r from host %r: %s (SQLSTATE %s)",
            report.report_id,
            report.host_id,
            type(cause).__name__,
            getattr(cause, "sqlstate", None),
        )
        return IngestOutcome(
            rejection=Rejection(
                "invalid", f"report {report.report_id!r}: rejected by storage; do not resend"
            )
        )

    def _outcomes(self, reports: list[ReportRow]) -> list[IngestOutcome]:
        """One transaction for the batch; if storage refuses some report's data, one per
        report, so that only the culprit is refused."""
        try:
            return self._commit(reports)
        except Exception as e:
            if not is_refusal(e):
                return self._unavailable(e, reports)
            if len(reports) == 1:
                return [self._refused(e, reports[0])]
        outcomes: list[IngestOutcome] = []
        for i, report in enumerate(reports):
            try:
                outcomes += self._commit([report])
            except Exception as e:
                if not is_refusal(e):  # the database went away meanwhile: the rest retry
                    return outcomes + self._unavailable(e, reports[i:])
                outcomes.append(self._refused(e, report))
        return outcomes

    def _store(self, batch: list[Pending]) -> None:
        reports = [r for r, _ in batch]
        t0 = time.monotonic()
        outcomes = self._outcomes(reports)
        rate = len(batch) / max(time.monotonic() - t0, 1e-3)
        with self._count:
            self._backlog -= len(batch)
            self._rate = (
                rate
                if self._rate == 0
                else (RATE_SMOOTHING * rate + (1 - RATE_SMOOTHING) * self._rate)
            )
        self.metrics.ingest_batch.observe(len(batch))
        stored = {r.policy_id for r, o in zip(reports, outcomes, strict=True) if o.stored}
        if stored:
            self.on_stored(stored)
        by_loop: dict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Future[IngestOutcome], IngestOutcome]]
        ] = defaultdict(list)
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            by_loop[fut.get_loop()].append((fut, outcome))
        for loop, pairs in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_settle, pairs)
