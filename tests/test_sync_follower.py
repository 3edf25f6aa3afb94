"""The follower routes each change notification to what the replica must reload.

A notification is the fast path between replicas (the full comparison every FULL_SYNC_S is
the safety net), so each kind must reach its handler: here an experiment's change, which
replicas need in order to answer agents with the right arm (see test_experiment_arm.py).
Real PostgreSQL LISTEN/NOTIFY; the target records what it is asked to do.
"""

from __future__ import annotations

import threading
import time

from gemini_booster.service.sync import Follower
from gemini_booster.storage import changes, database

DEADLINE_S = 30.0


class Recorder:
    """A SyncTarget that records calls (the core's reloads are tested elsewhere)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.changed = threading.Event()

    def _record(self, name: str, arg: object = None) -> None:
        self.calls.append((name, arg))
        if name == "experiments_changed":
            self.changed.set()

    def sync_all(self) -> None:
        self._record("sync_all")

    def policies_changed(self, policy_ids: set[int]) -> None:
        self._record("policies_changed", policy_ids)

    def plans_changed(self, policy_ids: set[int]) -> None:
        self._record("plans_changed", policy_ids)

    def data_arrived(self, policy_ids: set[int] | None) -> None:
        self._record("data_arrived", policy_ids)

    def tokens_changed(self) -> None:
        self._record("tokens_changed")

    def experiments_changed(self, experiment_ids: set[int] | None = None) -> None:
        self._record("experiments_changed", experiment_ids)


def test_an_experiment_notification_reloads_the_replicas_arms(db_url):
    engine = database.make_engine(db_url)
    target = Recorder()
    follower = Follower(engine, target)
    follower.start()
    try:
        t0 = time.monotonic()
        while not follower._connected:  # LISTEN issued: a notification now reaches us
            assert time.monotonic() - t0 < DEADLINE_S, "follower never connected"
            time.sleep(0.02)
        with engine.begin() as conn:
            changes.notify(conn, "experiments", [7])
        assert target.changed.wait(DEADLINE_S), target.calls
        assert ("experiments_changed", {7}) in target.calls, target.calls
    finally:
        follower.stop()
        engine.dispose()
