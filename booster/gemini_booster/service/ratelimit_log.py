"""Logging that cannot flood: one line per interval for a recurring problem.

During a database outage every request and every background round fails the same way. One
line per interval (with how many were suppressed) says what is wrong; a line per call would
bury everything else and cost more than the calls themselves.
"""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """``warning``/``error`` at most once per ``interval_s`` per message template."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0):
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def _due(self, template: str) -> int | None:
        """Suppressed count since the last line if a line is due now, else None."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(template)
            if last is not None and now - last < self.interval_s:
                self._suppressed[template] = self._suppressed.get(template, 0) + 1
                return None
            self._last[template] = now
            return self._suppressed.pop(template, 0)

    def log(self, level: int, template: str, *args: object) -> bool:
        """Log now if due; True when a line was written."""
        suppressed = self._due(template)
        if suppressed is None:
            return False
        if suppressed:
            template += f" ({suppressed} more like this suppressed)"
        self.logger.log(level, template, *args)
        return True

    def warning(self, template: str, *args: object) -> bool:
        return self.log(logging.WARNING, template, *args)

    def error(self, template: str, *args: object) -> bool:
        return self.log(logging.ERROR, template, *args)
