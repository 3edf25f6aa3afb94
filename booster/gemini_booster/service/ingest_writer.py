"""Group commit for reports: request threads hand over validated reports and wait; one writer
thread stores whatever has queued up in a single transaction.

Under load the queue fills while a transaction runs, so batches grow by themselves; when idle a
report waits at most ``linger`` for company. A failed transaction fails every report in it with
the error, and agents retry with the same idempotency key.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future

from sqlalchemy import Engine

from ..storage.ingest import ContextIds, IngestOutcome, ReportRow, store_reports
from .metrics import Metrics

log = logging.getLogger(__name__)


class IngestWriter:
    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        on_stored,
        batch_max: int = 256,
        linger_s: float = 0.002,
    ):
        self.engine = engine
        self.metrics = metrics
        self.on_stored = on_stored  # called with the policy ids that got new data
        self.batch_max = batch_max
        self.linger_s = linger_s
        self.context_ids = ContextIds()
        self._queue: queue.Queue[tuple[ReportRow, Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def submit(self, report: ReportRow) -> Future:
        fut: Future = Future()
        self._queue.put((report, fut))
        return fut

    def _collect(self, first) -> tuple[list, bool]:
        batch, stopping = [first], False
        deadline = time.monotonic() + self.linger_s
        while len(batch) < self.batch_max:
            try:
                item = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            if item is None:
                stopping = True
                break
            batch.append(item)
        return batch, stopping

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stopping = self._collect(first)
            self._store(batch)
            if stopping:
                return

    def _store(self, batch: list[tuple[ReportRow, Future]]) -> None:
        reports = [r for r, _ in batch]
        try:
            outcomes = store_reports(self.engine, reports, self.context_ids)
        except Exception as e:  # the database is down or failed: every report may retry
            log.warning("ingest batch of %d failed: %s", len(batch), type(e).__name__)
            self.context_ids.ids.clear()
            for _, fut in batch:
                fut.set_result(IngestOutcome(error=e))
            return
        self.metrics.ingest_batch.observe(len(batch))
        self.on_stored({r.policy_id for r, o in zip(reports, outcomes, strict=True) if o.stored})
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            fut.set_result(outcome)
