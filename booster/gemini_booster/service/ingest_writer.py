"""Group commit for reports: request handlers hand over validated reports and wait; one writer
thread stores whatever has queued up in a single transaction.

Under load the queue fills while a transaction runs, so batches grow by themselves; when idle a
report waits at most ``linger`` for company. A failed transaction fails every report in it with
the error, and agents retry with the same idempotency key.

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

from sqlalchemy import Engine

from ..storage.database import writer_engine
from ..storage.ingest import ContextIds, IngestOutcome, ReportRow, store_reports
from .metrics import Metrics

log = logging.getLogger(__name__)

Pending = tuple[ReportRow, asyncio.Future]


def _settle(pairs: list[tuple[asyncio.Future, IngestOutcome]]) -> None:
    for fut, outcome in pairs:
        if not fut.done():  # the caller may have given up (deadline, cancelled RPC)
            fut.set_result(outcome)


class IngestWriter:
    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        on_stored,
        batch_max: int = 256,
        linger_s: float = 0.002,
    ):
        self.engine = writer_engine(engine)
        self.metrics = metrics
        self.on_stored = on_stored  # called with the policy ids that got new data
        self.batch_max = batch_max
        self.linger_s = linger_s
        self.context_ids = ContextIds()
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        self.engine.dispose()

    def submit(self, report: ReportRow) -> asyncio.Future:
        """Queue ``report``; the future (of the running loop) resolves to its IngestOutcome."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.put((report, fut))
        return fut

    def _collect(self, first: Pending) -> tuple[list[Pending], bool]:
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

    def _store(self, batch: list[Pending]) -> None:
        reports = [r for r, _ in batch]
        try:
            outcomes = store_reports(self.engine, reports, self.context_ids)
        except Exception as e:  # the database is down or failed: every report may retry
            log.warning("ingest batch of %d failed: %s", len(batch), type(e).__name__)
            self.context_ids.ids.clear()
            outcomes = [IngestOutcome(error=e)] * len(batch)
        else:
            self.metrics.ingest_batch.observe(len(batch))
            self.on_stored(
                {r.policy_id for r, o in zip(reports, outcomes, strict=True) if o.stored}
            )
        by_loop: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            by_loop[fut.get_loop()].append((fut, outcome))
        for loop, pairs in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_settle, pairs)
