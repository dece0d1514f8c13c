"""SlabPool: allocation, runs, pins, stale handles, and every invariant after random steps."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from compass.cache.pool import SlabPool
from compass.cache.slab import SlabHandle, SlabLayout
from compass.errors import CacheError, ConfigError, StaleHandle

SLAB = 1024


def _state(pool: SlabPool) -> tuple[object, ...]:
    return (
        pool.free_slabs,
        pool.free_order(),
        sorted(h.generation for h in pool.allocations()),
        bytes(pool.free_map()),
    )


def test_sizes():
    pool = SlabPool(10 * SLAB + 100, SLAB)
    assert pool.num_slabs == 10
    assert pool.capacity_bytes == 10 * SLAB
    assert pool.free_bytes == 10 * SLAB
    handle = pool.alloc(3)
    assert handle is not None
    assert handle.num_slabs == 3
    assert pool.free_bytes == 7 * SLAB
    with pytest.raises(ConfigError):
        SlabPool(SLAB - 1, SLAB)
    with pytest.raises(ConfigError):
        SlabPool(SLAB, 0)


def test_alloc_that_cannot_succeed_changes_nothing():
    pool = SlabPool(6 * SLAB, SLAB)
    handles = [pool.alloc(1) for _ in range(6)]
    assert all(h is not None for h in handles)
    # free slabs 0, 2, 4: three free, but no two adjacent
    for index in (0, 2, 4):
        handle = handles[index]
        assert handle is not None
        pool.free(handle)
    before = _state(pool)
    assert pool.alloc(4) is None  # too few slabs
    assert pool.alloc([2]) is None  # enough slabs, no run
    assert pool.alloc([1, 2]) is None
    assert not pool.can_alloc([2])
    assert _state(pool) == before
    pool.validate()
    assert pool.alloc(3) is not None  # singles need no run


def test_stale_handle_detected_after_free_and_realloc():
    pool = SlabPool(4 * SLAB, SLAB)
    old = pool.alloc(4)
    assert old is not None
    pool.free(old)
    new = pool.alloc(4)
    assert new is not None
    assert set(new.slabs) == set(old.slabs)  # same slabs, new owner
    assert new.generation != old.generation
    assert not pool.is_live(old)
    assert pool.is_live(new)
    for misuse in (pool.free, pool.pin, pool.unpin, pool.pins):
        with pytest.raises(StaleHandle, match="stale"):
            misuse(old)
    with pytest.raises(StaleHandle):
        pool.can_alloc(1, also_free=[old])
    pool.validate()
    assert pool.pins(new) == 0


def test_tensor_larger_than_a_slab_gets_contiguous_run():
    pool = SlabPool(8 * SLAB, SLAB)
    layout = SlabLayout.pack([("big", 3 * SLAB - 10), ("small", 100), ("other", 900)], SLAB)
    assert layout.groups == (3, 1, 1)
    handle = pool.alloc(layout)
    assert handle is not None
    first, length = handle.runs[0]
    assert length == 3
    assert handle.slabs[:3] == (first, first + 1, first + 2)
    pool.validate()


def test_runs_placed_best_fit():
    pool = SlabPool(10 * SLAB, SLAB)
    ones = [pool.alloc(1) for _ in range(10)]
    # free intervals: [1..4] (4 slabs) and [7..8] (2 slabs)
    for index in (1, 2, 3, 4, 7, 8):
        handle = ones[index]
        assert handle is not None
        pool.free(handle)
    assert pool.largest_free_run() == 4
    handle = pool.alloc([2])
    assert handle is not None
    assert handle.runs == ((7, 2),)  # the tighter interval, keeping the long one whole
    assert pool.largest_free_run() == 4


def test_free_list_is_least_recently_freed_first():
    pool = SlabPool(4 * SLAB, SLAB)
    a, b = pool.alloc(2), pool.alloc(2)
    assert a is not None
    assert b is not None
    pool.free(b)
    pool.free(a)
    assert pool.free_order() == [*b.slabs, *a.slabs]
    again = pool.alloc(2)
    assert again is not None
    assert again.slabs == b.slabs


def test_pinned_allocation_cannot_be_freed():
    pool = SlabPool(4 * SLAB, SLAB)
    handle = pool.alloc(2)
    assert handle is not None
    assert pool.pin(handle) == 1
    assert pool.pin(handle) == 2
    assert pool.pinned_slabs == 2
    with pytest.raises(CacheError, match="pinned"):
        pool.free(handle)
    assert pool.is_live(handle)
    assert pool.unpin(handle) == 1
    assert pool.unpin(handle) == 0
    with pytest.raises(CacheError, match="not pinned"):
        pool.unpin(handle)
    pool.free(handle)
    pool.validate()


def test_can_alloc_counts_hypothetical_frees():
    pool = SlabPool(4 * SLAB, SLAB)
    a, b = pool.alloc(2), pool.alloc(2)
    assert a is not None
    assert b is not None
    assert not pool.can_alloc([3])
    assert pool.can_alloc([2], also_free=[a])
    assert pool.can_alloc([4], also_free=[a, b])
    assert pool.fits_when_empty([4])
    assert not pool.fits_when_empty([5])
    assert _state(pool)[0] == 0  # nothing changed


def test_validate_catches_corruption():
    pool = SlabPool(4 * SLAB, SLAB)
    handle = pool.alloc(1)
    assert handle is not None
    pool._free_map[handle.slabs[0]] = 1  # simulate a bug: slab marked free while owned
    with pytest.raises(AssertionError, match="invariant"):
        pool.validate()


class PoolMachine(RuleBasedStateMachine):
    """Random alloc/free/pin/unpin/evict against a reference model of the free list."""

    SLABS = 16

    def __init__(self) -> None:
        super().__init__()
        self.pool = SlabPool(self.SLABS * SLAB, SLAB)
        self.pins: dict[SlabHandle, int] = {}
        self.freed: list[SlabHandle] = []
        self.order = list(range(self.SLABS))  # reference free list, least recently freed first

    @initialize(groups=st.lists(st.integers(1, 3), min_size=1, max_size=3))
    def first_alloc(self, groups):
        # start with something allocated, so every rule is enabled from the first step
        self.alloc(groups)

    def _pick(self, data: st.DataObject) -> SlabHandle:
        return data.draw(st.sampled_from(sorted(self.pins, key=lambda h: h.generation)))

    @rule(groups=st.lists(st.integers(1, 5), max_size=4))
    def alloc(self, groups):
        before = _state(self.pool)
        predicted = self.pool.can_alloc(groups)
        handle = self.pool.alloc(groups)
        assert (handle is not None) == predicted
        if handle is None:
            assert _state(self.pool) == before
            return
        assert [length for _, length in handle.runs] == list(groups)
        run_slabs = [s for (first, n) in handle.runs if n > 1 for s in range(first, first + n)]
        assert all(s in self.order for s in handle.slabs), "allocated a slab that was not free"
        # single slabs come from the head of the free list (after the runs are taken out)
        remaining = [s for s in self.order if s not in run_slabs]
        singles = [first for (first, n) in handle.runs if n == 1]
        assert singles == remaining[: len(singles)]
        self.order = [s for s in self.order if s not in handle.slabs]
        self.pins[handle] = 0

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def pin(self, data):
        handle = self._pick(data)
        self.pins[handle] += 1
        assert self.pool.pin(handle) == self.pins[handle]

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def unpin(self, data):
        handle = self._pick(data)
        if self.pins[handle] == 0:
            with pytest.raises(CacheError):
                self.pool.unpin(handle)
            return
        self.pins[handle] -= 1
        assert self.pool.unpin(handle) == self.pins[handle]

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def free(self, data):
        handle = self._pick(data)
        if self.pins[handle]:
            before = _state(self.pool)
            with pytest.raises(CacheError, match="pinned"):
                self.pool.free(handle)
            assert _state(self.pool) == before
            return
        self._release(handle)

    @precondition(lambda self: any(n == 0 for n in self.pins.values()))
    @rule()
    def evict_oldest_unpinned(self):
        # what the policy does: free an unpinned allocation; pinned ones must survive
        victim = min((h for h, n in self.pins.items() if n == 0), key=lambda h: h.generation)
        pinned = [h for h, n in self.pins.items() if n]
        self._release(victim)
        assert all(self.pool.is_live(h) for h in pinned)

    def _release(self, handle: SlabHandle) -> None:
        free_before = self.pool.free_slabs
        self.pool.free(handle)
        assert self.pool.free_slabs == free_before + handle.num_slabs
        del self.pins[handle]
        self.freed.append(handle)
        self.order.extend(handle.slabs)

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def stale_handles_are_refused(self, data):
        handle = data.draw(st.sampled_from(self.freed))
        before = _state(self.pool)
        with pytest.raises(StaleHandle):
            self.pool.free(handle)
        with pytest.raises(StaleHandle):
            self.pool.pin(handle)
        assert not self.pool.is_live(handle)
        assert _state(self.pool) == before

    @invariant()
    def consistent(self):
        self.pool.validate()
        assert self.pool.free_order() == self.order
        assert self.pool.free_slabs == self.SLABS - sum(h.num_slabs for h in self.pins)
        assert self.pool.pinned_slabs == sum(h.num_slabs for h, n in self.pins.items() if n)


PoolMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
test_pool_state_machine = PoolMachine.TestCase
