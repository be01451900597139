"""``settle_heap``: startup's garbage collected, what remains frozen out of the collector's way."""

from __future__ import annotations

import gc
import weakref

from runyard.platform.heap import settle_heap


class Node:
    """A cycle's link: only the collector frees it."""

    def __init__(self) -> None:
        self.other: Node | None = None


def test_settle_heap__collects_startups_garbage_then_freezes_the_rest():
    garbage, kept = Node(), Node()
    garbage.other = Node()
    garbage.other.other = garbage  # a cycle nothing refers to once dropped
    gone = weakref.ref(garbage)
    del garbage
    try:
        frozen = settle_heap()
        assert gone() is None  # collected before the freeze, not frozen for the process's life
        assert frozen == gc.get_freeze_count() > 0
        assert not any(obj is kept for obj in gc.get_objects())  # out of the collector's sight
    finally:
        gc.unfreeze()
    assert any(obj is kept for obj in gc.get_objects())
