"""A policy's refit worker: each dirty mark is refitted once, whether by the worker or by a caller
that wants it done now (``run_now``, behind ``Booster.refit_dirty``); ``run_now`` returns only
when no refit it could see is pending or running; and the worker's minimum interval counts from
the policy's last refit of any kind, so an explicit refit is not followed by a background one."""

from __future__ import annotations

import threading
import time

from gemini_booster.service.refit import _Worker

HOUR = 3600.0


class Recorder:
    """The refit a worker runs: records which thread ran it, optionally held at a gate."""

    def __init__(self, gate: threading.Event | None = None):
        self.threads: list[str] = []
        self.entered = threading.Event()
        self.gate = gate

    def __call__(self, policy_id: int) -> None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        self.threads.append(threading.current_thread().name)


def worker(run: Recorder, last: float | None = None) -> _Worker:
    w = _Worker(7, run, HOUR, lambda _pid: last)
    w.start()
    return w


def test_a_dirty_mark_is_refitted_once_by_worker_or_caller() -> None:
    for _ in range(50):  # the worker and the caller race for the mark each time
        run = Recorder()
        w = worker(run)
        w.dirty.set()
        w.run_now()
        assert len(run.threads) == 1
        w.stop()
        w.join(5)
        assert len(run.threads) == 1


def test_run_now_waits_for_the_refit_the_worker_began() -> None:
    gate = threading.Event()
    run = Recorder(gate)
    w = worker(run)
    w.dirty.set()
    assert run.entered.wait(30)  # the worker holds the mark and is refitting
    caller = threading.Thread(target=w.run_now)
    caller.start()
    caller.join(0.2)
    assert caller.is_alive()  # cannot return: the gate is closed
    gate.set()
    caller.join(30)
    assert not caller.is_alive()
    assert run.threads == ["refit-7"]
    w.stop()
    w.join(5)


def test_the_interval_counts_from_the_last_refit_of_any_kind() -> None:
    run = Recorder()
    began = time.monotonic()  # a refit began just now, outside the worker
    asked = threading.Event()  # the worker, woken by the mark, asked when the last refit began

    def last_started(_pid: int) -> float:
        asked.set()
        return began

    w = _Worker(7, run, HOUR, last_started)
    w.start()
    w.dirty.set()
    assert asked.wait(30)
    # told a refit began just now, the worker waits an hour from it, leaving the mark
    assert run.threads == []
    assert w.dirty.is_set()
    w.run_now()  # a caller that wants it now gets it now, in its own thread
    assert run.threads == [threading.current_thread().name]
    w.stop()
    w.join(5)
    assert not w._thread.is_alive()
