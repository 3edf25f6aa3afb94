"""Waiting for something that happens on another thread or process: poll it against a
deadline (never sleep a fixed time and hope). The deadline is generous, a bound on "it
happens" rather than a timing assertion: the verdict must not depend on the machine's speed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE_S = 60.0  # for what takes milliseconds to a second on an idle machine
POLL_S = 0.05


def until(
    check: Callable[[], T], what: str, deadline_s: float = DEADLINE_S, poll_s: float = POLL_S
) -> T:
    """``check()``'s value once it is truthy; the test fails naming ``what`` after
    ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not within {deadline_s:.0f} s"
        time.sleep(poll_s)
    return got
