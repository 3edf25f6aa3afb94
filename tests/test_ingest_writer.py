"""The ingest writer's batching: it lingers until a full batch waits, the arrivals pause, or the
linger is up, and then drains the queue (one wake-up per wait, not one per report); it never
lingers when a full batch is already waiting, and hands on the stop sentinel with the reports
queued before it.

No database is touched: ``_collect`` only reads the queue (the engine is never connected).
The reports are stand-ins (plain strings): the collector does not look inside them. The
writer's clock and its wait are replaced by a simulated clock (``Clock``), so what is asserted
is which moment the writer chose, not how long anything took.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine

from gemini_booster.config import (
    GRPC_CORE_EXPERIMENTS,
    GRPC_EXPERIMENTS_ENV,
    Settings,
    apply_grpc_core_experiments,
)
from gemini_booster.service import ingest_writer
from gemini_booster.service.ingest_writer import (
    LINGER_BATCH,
    QUIET_GAPS,
    QUIET_MIN_S,
    IngestWriter,
)
from gemini_booster.service.metrics import Metrics


def writer(batch_max: int = 4, linger_s: float = 0.1) -> IngestWriter:
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    return IngestWriter(engine, Metrics(), lambda _: None, batch_max=batch_max, linger_s=linger_s)


def pending(name: str) -> Any:
    return (name, None)


class Clock:
    """Simulated time for the writer: ``wait`` advances it and records the timeout, running
    ``during`` first (what arrives while the writer waits)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, w: IngestWriter) -> None:
        self.now = 1000.0
        self.waits: list[float] = []
        self.during: Callable[[float], None] = lambda _: None
        monkeypatch.setattr(ingest_writer.time, "monotonic", lambda: self.now)
        w._last_arrival = self.now
        self.writer = w
        monkeypatch.setattr(w._full, "wait", self.wait)

    def wait(self, timeout: float) -> bool:
        self.waits.append(round(timeout, 6))
        self.during(timeout)
        self.now += timeout
        return self.writer._full.is_set()


def arrive(w: IngestWriter, clock: Clock, name: str, after_s: float) -> None:
    """``name`` arrives ``after_s`` after the clock's present, as ``submit`` records it."""
    clock.now += after_s
    w._note_arrival()
    w._queue.put(pending(name))


def test_reports_keep_joining_while_they_keep_arriving(monkeypatch: pytest.MonkeyPatch) -> None:
    w = writer(batch_max=64, linger_s=0.1)
    clock = Clock(monkeypatch, w)
    w._mean_gap = 0.01  # reports every 10 ms: the batch closes after 30 ms without one
    sent = iter(range(1, 100))

    def every_10_ms(timeout: float) -> None:
        for _ in range(int(timeout / 0.01 + 1e-9)):
            arrive(w, clock, f"r{next(sent)}", 0.01)
        clock.now -= int(timeout / 0.01 + 1e-9) * 0.01  # wait() advances the clock itself

    clock.during = every_10_ms
    batch, stopping = w._collect(pending("r0"))
    assert not stopping
    # Arrivals never pause for 30 ms, so the linger's 100 ms bound closes the batch.
    assert round(sum(clock.waits), 6) == 0.1
    assert len(batch) == 1 + 10


def test_a_pause_in_the_arrivals_closes_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    w = writer(batch_max=64, linger_s=0.1)
    clock = Clock(monkeypatch, w)
    w._mean_gap = 0.001  # a burst: reports a millisecond apart
    for i in range(1, 4):
        arrive(w, clock, f"r{i}", 0.001)
    batch, _ = w._collect(pending("r0"))
    quiet = QUIET_GAPS * w._mean_gap
    assert clock.waits == [round(quiet, 6)]  # one wait, until the quiet gap after r3
    assert [name for name, _ in batch] == ["r0", "r1", "r2", "r3"]


def test_the_quiet_gap_has_a_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    w = writer(batch_max=64, linger_s=0.1)
    clock = Clock(monkeypatch, w)
    w._mean_gap = 0.0
    w._collect(pending("r0"))
    assert clock.waits == [QUIET_MIN_S]


def test_slow_arrivals_wait_out_the_linger_and_no_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    w = writer(batch_max=64, linger_s=0.1)
    clock = Clock(monkeypatch, w)  # _mean_gap starts at the linger: a quiet fleet
    batch, _ = w._collect(pending("r0"))
    assert clock.waits == [0.1]
    assert len(batch) == 1


def test_a_full_batch_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    w = writer(batch_max=4, linger_s=0.5)
    clock = Clock(monkeypatch, w)

    def fill(_: float) -> None:
        for i in range(1, 4):
            w._queue.put(pending(f"r{i}"))
        clock.now -= 0.5  # the event would have ended the wait at once

    clock.during = fill
    batch, _ = w._collect(pending("r0"))
    assert len(clock.waits) == 1  # woken once, and the full queue ends the linger
    assert [name for name, _ in batch] == ["r0", "r1", "r2", "r3"]


def test_a_batch_worth_its_transaction_ends_the_linger_and_takes_what_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = writer(batch_max=256, linger_s=0.5)
    clock = Clock(monkeypatch, w)
    for i in range(1, LINGER_BATCH - 1):
        w._queue.put(pending(f"r{i}"))
    w._queue.put(pending("r_last"))  # with r0, LINGER_BATCH reports
    for i in range(10):  # queued before the writer drains: taken too, up to batch_max
        w._queue.put(pending(f"more{i}"))
    batch, _ = w._collect(pending("r0"))
    assert clock.waits == []
    assert len(batch) == LINGER_BATCH + 10


def test_submit_signals_a_full_batch_once() -> None:
    w = writer(batch_max=4)

    async def submit(n: int) -> None:
        for i in range(n):
            w.submit(f"r{i}")  # type: ignore[arg-type]

    asyncio.run(submit(2))
    assert not w._full.is_set()  # two queued: with the writer's one, not yet a batch
    asyncio.run(submit(1))
    assert w._full.is_set()


def test_a_batch_takes_at_most_batch_max_and_leaves_the_rest_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = writer(batch_max=4)
    clock = Clock(monkeypatch, w)
    for i in range(1, 7):
        w._queue.put(pending(f"r{i}"))
    batch, _ = w._collect(pending("r0"))
    assert [name for name, _ in batch] == ["r0", "r1", "r2", "r3"]
    assert w._queue.qsize() == 3  # r4..r6 start the next batch
    assert clock.waits == []


def test_a_full_batch_already_waiting_is_stored_without_lingering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = writer(batch_max=4, linger_s=0.5)
    clock = Clock(monkeypatch, w)
    for i in range(1, 4):
        w._queue.put(pending(f"r{i}"))
    w._collect(pending("r0"))
    assert clock.waits == []
    w._queue.put(pending("r4"))  # a lone report waits for company
    w._collect(w._queue.get())
    assert clock.waits == [0.5]


def test_stopping_keeps_the_reports_queued_before_the_sentinel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = writer(batch_max=8)
    Clock(monkeypatch, w)
    w._queue.put(pending("r1"))
    w._queue.put(None)
    batch, stopping = w._collect(pending("r0"))
    assert [name for name, _ in batch] == ["r0", "r1"]
    assert stopping


def test_stop_ends_a_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    w = writer(batch_max=8, linger_s=0.5)
    clock = Clock(monkeypatch, w)

    def stop(_: float) -> None:  # what stop() does while the writer lingers
        w._queue.put(pending("r1"))
        w._queue.put(None)
        w._full.set()

    clock.during = stop
    batch, stopping = w._collect(pending("r0"))
    assert len(clock.waits) == 1  # not waited again until the linger's end
    assert [name for name, _ in batch] == ["r0", "r1"]
    assert stopping


def test_the_grpc_core_experiments_setting_reaches_grpcs_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GRPC_EXPERIMENTS_ENV, raising=False)
    assert Settings().grpc_core_experiments == GRPC_CORE_EXPERIMENTS
    apply_grpc_core_experiments("-event_engine_listener,+some_other")
    assert os.environ[GRPC_EXPERIMENTS_ENV] == "-event_engine_listener,+some_other"
    monkeypatch.setenv(GRPC_EXPERIMENTS_ENV, "kept")
    apply_grpc_core_experiments("")  # '' leaves gRPC's own (and the operator's variable)
    assert os.environ[GRPC_EXPERIMENTS_ENV] == "kept"


@pytest.mark.parametrize("bad", ["event engine", "-a,,b", "x;rm -rf /", "-A"])
def test_a_malformed_experiments_setting_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="grpc_core_experiments"):
        Settings(grpc_core_experiments=bad)
