"""The agent port freezes the heap it starts with, once per process, so the collector's full
passes (which stop every call) walk only what was made since (grpc_server.freeze_heap)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gemini_booster.service.grpc_server import freeze_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """A process with nothing frozen, and none left frozen after the test."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_live_objects_leave_the_collectors_generations(unfrozen: None) -> None:
    kept = [[]]  # a container the collector tracks
    assert any(o is kept for o in gc.get_objects())
    assert freeze_heap()
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())


class Node:
    """A weakly referable object to put in a cycle."""

    other: object = None


def test_cycles_made_later_are_still_collected(unfrozen: None) -> None:
    freeze_heap()
    node = Node()
    node.other = node  # a cycle only the collector can free
    alive = weakref.ref(node)
    del node
    gc.collect()
    assert alive() is None


def test_a_second_server_in_the_same_process_freezes_nothing_more(unfrozen: None) -> None:
    assert freeze_heap()
    frozen = gc.get_freeze_count()
    later = [[]]
    assert not freeze_heap()
    assert gc.get_freeze_count() == frozen
    assert any(o is later for o in gc.get_objects())
