"""The start-up heap of a token-path process is frozen: the collector's full scans (a pause of
hundreds of ms in a worker, bench/gc_pause.py) no longer walk it; what comes later is collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from services.common.gc_heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of this test process is collected as before


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_what_start_up_made_is_frozen_and_later_garbage_is_still_collected(unfrozen):
    kept, dropped = Node(), Node()
    dropped_ref = weakref.ref(dropped)
    del dropped  # start-up garbage: collected before the freeze, not frozen forever
    assert freeze_startup_heap("test") == gc.get_freeze_count() > 0
    assert dropped_ref() is None
    assert id(kept) not in {id(o) for o in gc.get_objects()}  # frozen: out of every scan
    later = Node()
    assert id(later) in {id(o) for o in gc.get_objects()}
    del later
    assert gc.collect() >= 1  # the cycle made after start-up is still freed
