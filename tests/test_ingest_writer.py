"""The ingest writer's batching: it sleeps through the linger and then drains the queue (one
wake-up per batch, not one per report), never lingers when a full batch is already waiting,
and hands on the stop sentinel with the reports queued before it.

No database is touched: ``_collect`` only reads the queue (the engine is never connected).
The reports are stand-ins (plain strings): the collector does not look inside them.
"""

from __future__ import annotations

import os
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
from gemini_booster.service.ingest_writer import IngestWriter
from gemini_booster.service.metrics import Metrics


def writer(batch_max: int = 4, linger_s: float = 0.02) -> IngestWriter:
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    return IngestWriter(engine, Metrics(), lambda _: None, batch_max=batch_max, linger_s=linger_s)


def pending(name: str) -> Any:
    return (name, None)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The writer's sleeps, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(ingest_writer.time, "sleep", slept.append)
    return slept


def test_reports_arriving_during_the_linger_join_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = writer(batch_max=8)
    arrivals = [pending(f"r{i}") for i in range(1, 4)]

    def arrive_while_sleeping(_: float) -> None:
        for p in arrivals:
            w._queue.put(p)

    monkeypatch.setattr(ingest_writer.time, "sleep", arrive_while_sleeping)
    batch, stopping = w._collect(pending("r0"))
    assert [name for name, _ in batch] == ["r0", "r1", "r2", "r3"]
    assert not stopping


def test_a_batch_takes_at_most_batch_max_and_leaves_the_rest_queued(sleeps: list[float]) -> None:
    w = writer(batch_max=4)
    for i in range(1, 7):
        w._queue.put(pending(f"r{i}"))
    batch, _ = w._collect(pending("r0"))
    assert [name for name, _ in batch] == ["r0", "r1", "r2", "r3"]
    assert w._queue.qsize() == 3  # r4..r6 start the next batch


def test_a_full_batch_already_waiting_is_stored_without_lingering(sleeps: list[float]) -> None:
    w = writer(batch_max=4, linger_s=0.5)
    for i in range(1, 4):
        w._queue.put(pending(f"r{i}"))
    w._collect(pending("r0"))
    assert sleeps == []
    w._queue.put(pending("r4"))  # a lone report waits for company
    w._collect(w._queue.get())
    assert sleeps == [0.5]


def test_stopping_keeps_the_reports_queued_before_the_sentinel(sleeps: list[float]) -> None:
    w = writer(batch_max=8)
    w._queue.put(pending("r1"))
    w._queue.put(None)
    batch, stopping = w._collect(pending("r0"))
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
