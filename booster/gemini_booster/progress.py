"""Progress lines for long commands (``booster demo``): timestamped, with a heartbeat while a
slow step runs, so a terminal is never silent for long. Standard library only: the demo shows
it while it is still importing the service."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

HEARTBEAT_S = 5.0  # a slow step says it is still going this often


class Progress:
    """Timestamped progress lines, and a heartbeat while a slow step runs, so the terminal is
    never silent for long during start-up."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        self.say(f"{text} …")
        began, done = time.monotonic(), threading.Event()

        def beat() -> None:
            while not done.wait(HEARTBEAT_S):
                self.say(f"  … {text} ({time.monotonic() - began:.0f} s so far)")

        ticker = threading.Thread(target=beat, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
        self.say(f"{text}: done in {time.monotonic() - began:.1f} s")
