"""A round of background work every few seconds, on a daemon thread of its own.

The fold and the guardrail each run one. ``stop`` sets the event the thread waits on, so a
waiting thread ends at once, and gives a round under way up to ``join_s`` to finish: the
process exits cleanly rather than cutting a transaction short.
"""

from __future__ import annotations

import threading
from enum import Enum


class FirstRound(Enum):
    """When the first round runs: at start (upkeep that should not wait an interval) or one
    interval after it (work that only has something to do once data has come in)."""

    AT_START = "at start"
    AFTER_INTERVAL = "after one interval"


class Periodic:
    """Calls ``round`` every ``interval_s`` seconds from ``start`` until ``stop``."""

    def __init__(self, name: str, interval_s: float, first: FirstRound, join_s: float) -> None:
        self.interval_s = interval_s
        self._first = first
        self._join_s = join_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def running(self) -> bool:
        """Whether rounds run on their own (started and not stopped)."""
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(self._join_s)

    def round(self) -> None:
        """One round of the work; must not raise (the thread would end)."""
        raise NotImplementedError

    def _loop(self) -> None:
        if self._first is FirstRound.AT_START:
            self.round()
        while not self._stopping.wait(self.interval_s):
            self.round()
