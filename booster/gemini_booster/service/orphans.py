"""Child processes that never outlive Booster: front processes and refit workers.

A child of a process killed with SIGKILL is not told anything; it is re-parented and would go on
serving the port (a front) or holding memory (a refit worker), and pile up across restarts.
Each child therefore watches its parent's process sentinel (a pipe the parent holds open; it
reads as ready the moment the parent is gone, however it died) and leaves.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import wait


def exit_with_parent(first: Callable[[], None] | None = None, grace_s: float = 0.0) -> None:
    """In a child started by multiprocessing: when the parent dies, call ``first`` (an orderly
    stop), then exit after ``grace_s`` whatever ``first`` is doing."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        if first is not None:
            first()
        threading.Timer(grace_s, os._exit, args=(0,)).start()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
