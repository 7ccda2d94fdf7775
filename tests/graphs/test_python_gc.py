"""``graphs/python_gc``: no automatic collection inside the block, the collector's state
given back after it (an exception included), and a pause nested in a frozen block leaving
the collector off until the outer block ends."""

from __future__ import annotations

import gc
import weakref

import pytest

from staticattn.graphs.python_gc import frozen_gc, gc_paused


def test_a_pause_turns_the_collector_off_and_back_on():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_exception_inside_gives_the_collector_back():
    with pytest.raises(RuntimeError, match="inside"), gc_paused():
        raise RuntimeError("inside")
    assert gc.isenabled()


def test_a_pause_leaves_a_collector_that_was_off_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Node:
    """An object a cycle keeps alive until a collection."""


def test_a_frozen_block_collects_first_and_freezes_its_survivors():
    node = _Node()
    node.self = node
    alive = weakref.ref(node)
    del node  # garbage only a collection frees
    gc.disable()  # no automatic collection before the block's own
    try:
        assert alive() is not None
        with frozen_gc():
            assert alive() is None
            assert not gc.isenabled() and gc.get_freeze_count() > 0
            with gc_paused():  # a capture inside the manager's frozen block
                pass
            assert not gc.isenabled()
        assert not gc.isenabled() and gc.get_freeze_count() == 0  # as it was before
    finally:
        gc.enable()
