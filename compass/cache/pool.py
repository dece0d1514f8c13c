"""The slab pool: one arena of fixed-size slabs, allocated whole. Sans-IO.

Modelled on vLLM's block pool: slabs have stable ids; free slabs sit on an intrusive doubly
linked list (O(1) removal from the middle, which taking a contiguous run needs); a freed slab
goes to the tail and allocation takes from the head, so the free list is in least-recently-freed
order; and every allocation checks first, changing nothing when it cannot succeed.

The pool knows nothing of models: it hands out :class:`SlabHandle` objects, counts pins on
them and refuses to free a pinned one. Which allocation to free is the policy's choice
(:mod:`compass.cache.policy`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from compass.cache.slab import SlabHandle, SlabLayout
from compass.errors import CacheError, ConfigError, StaleHandle

__all__ = ["SlabPool", "SlabRequest"]

#: what :meth:`SlabPool.alloc` takes: a slab count, a layout, or group sizes (1 = single slab)
SlabRequest = int | SlabLayout | Sequence[int]


def _groups_of(request: SlabRequest) -> tuple[int, ...]:
    if isinstance(request, SlabLayout):
        return request.groups
    if isinstance(request, int):
        if request < 0:
            raise CacheError(f"cannot allocate a negative number of slabs ({request})")
        return (1,) * request
    groups = tuple(request)
    if any(count < 1 for count in groups):
        raise CacheError(f"every group needs at least one slab, got {groups}")
    return groups


class _Allocation:
    __slots__ = ("handle", "pins")

    def __init__(self, handle: SlabHandle) -> None:
        self.handle = handle
        self.pins = 0


class SlabPool:
    """``capacity_bytes // slab_bytes`` slabs, handed out whole.

    A request is a list of groups: a group of one slab can be any free slab; a longer group
    needs that many contiguous free slabs (one tensor larger than a slab). Runs are placed
    best-fit (the smallest free interval that holds them), largest first.
    """

    def __init__(self, capacity_bytes: int, slab_bytes: int) -> None:
        if slab_bytes <= 0:
            raise ConfigError(f"slab size must be > 0, got {slab_bytes}")
        if capacity_bytes < slab_bytes:
            raise ConfigError(
                f"pool capacity {capacity_bytes} B is smaller than one slab ({slab_bytes} B)"
            )
        self._slab_bytes = slab_bytes
        self._num_slabs = count = capacity_bytes // slab_bytes
        # intrusive circular list over slab ids; index ``count`` is the sentinel
        self._next = [*range(1, count + 1), 0]
        self._prev = [count, *range(count)]
        self._free_map = bytearray(b"\x01") * count
        self._free_count = count
        self._owner = [0] * count  # generation of the owning allocation, 0 when free
        self._allocs: dict[int, _Allocation] = {}
        self._generation = 0

    # -- sizes ------------------------------------------------------------------------------

    @property
    def num_slabs(self) -> int:
        """Slabs in the pool."""
        return self._num_slabs

    @property
    def slab_bytes(self) -> int:
        """Bytes per slab."""
        return self._slab_bytes

    @property
    def free_slabs(self) -> int:
        """Slabs not allocated."""
        return self._free_count

    @property
    def capacity_bytes(self) -> int:
        """Usable bytes: whole slabs only."""
        return self._num_slabs * self._slab_bytes

    @property
    def free_bytes(self) -> int:
        """Bytes in free slabs."""
        return self._free_count * self._slab_bytes

    def largest_free_run(self) -> int:
        """The longest run of contiguous free slabs."""
        return max((length for _, length in self._free_intervals(self._free_map)), default=0)

    # -- free list --------------------------------------------------------------------------

    def _unlink(self, slab: int) -> None:
        before, after = self._prev[slab], self._next[slab]
        self._next[before] = after
        self._prev[after] = before
        self._next[slab] = self._prev[slab] = -1

    def _append(self, slab: int) -> None:
        sentinel = self._num_slabs
        tail = self._prev[sentinel]
        self._next[tail] = slab
        self._prev[slab] = tail
        self._next[slab] = sentinel
        self._prev[sentinel] = slab

    def free_order(self) -> list[int]:
        """Free slab ids, least recently freed first (the order single slabs are handed out)."""
        order: list[int] = []
        sentinel = self._num_slabs
        slab = self._next[sentinel]
        while slab != sentinel and len(order) <= self._num_slabs:
            order.append(slab)
            slab = self._next[slab]
        return order

    # -- placement --------------------------------------------------------------------------

    @staticmethod
    def _free_intervals(free_map: bytearray) -> Iterator[tuple[int, int]]:
        start = free_map.find(1)
        while start >= 0:
            end = free_map.find(0, start)
            if end < 0:
                end = len(free_map)
            yield start, end - start
            start = free_map.find(1, end)

    def _place_runs(self, groups: Sequence[int], free_map: bytearray) -> dict[int, int] | None:
        """Start slab for each multi-slab group, or None when some run finds no room."""
        wanted = sorted(
            ((count, index) for index, count in enumerate(groups) if count > 1), reverse=True
        )
        if not wanted:
            return {}
        intervals = [list(interval) for interval in self._free_intervals(free_map)]
        starts: dict[int, int] = {}
        for count, index in wanted:
            best: list[int] | None = None
            for interval in intervals:
                if interval[1] >= count and (best is None or interval[1] < best[1]):
                    best = interval
            if best is None:
                return None
            starts[index] = best[0]
            best[0] += count
            best[1] -= count
        return starts

    def free_map(self) -> bytearray:
        """A copy of the free map (1 = free), for planners that try evictions hypothetically."""
        return bytearray(self._free_map)

    def runs_fit(self, request: SlabRequest, free_map: bytearray) -> bool:
        """Whether ``request`` could be placed in ``free_map`` (a map from :meth:`free_map`)."""
        groups = _groups_of(request)
        if sum(groups) > free_map.count(1):
            return False
        return self._place_runs(groups, free_map) is not None

    def fits_when_empty(self, request: SlabRequest) -> bool:
        """Whether ``request`` could ever be placed: runs are placed best-fit, largest first,
        so in an empty pool everything fits exactly when the total does."""
        return sum(_groups_of(request)) <= self._num_slabs

    def can_alloc(self, request: SlabRequest, also_free: Iterable[SlabHandle] = ()) -> bool:
        """Whether :meth:`alloc` would succeed now, or once the ``also_free`` handles were freed."""
        groups = _groups_of(request)
        extra: set[int] = set()
        for handle in also_free:
            self._live(handle)
            extra.update(handle.slabs)
        if sum(groups) > self._free_count + len(extra):
            return False
        if all(count == 1 for count in groups):
            return True
        free_map = self._free_map
        if extra:
            free_map = bytearray(free_map)
            for slab in extra:
                free_map[slab] = 1
        return self._place_runs(groups, free_map) is not None

    # -- allocation -------------------------------------------------------------------------

    def alloc(self, request: SlabRequest) -> SlabHandle | None:
        """Allocate ``request``; None (and nothing changed) when it cannot be placed now."""
        groups = _groups_of(request)
        if sum(groups) > self._free_count:
            return None
        starts = self._place_runs(groups, self._free_map)
        if starts is None:
            return None
        # from here on nothing can fail: mutate
        self._generation += 1
        generation = self._generation
        runs: list[tuple[int, int]] = []
        for index, count in enumerate(groups):
            if count > 1:
                for slab in range(starts[index], starts[index] + count):
                    self._take(slab, generation)
        sentinel = self._num_slabs
        for index, count in enumerate(groups):
            if count > 1:
                runs.append((starts[index], count))
            else:
                slab = self._next[sentinel]
                self._take(slab, generation)
                runs.append((slab, 1))
        handle = SlabHandle(generation, tuple(runs))
        self._allocs[generation] = _Allocation(handle)
        return handle

    def _take(self, slab: int, generation: int) -> None:
        self._unlink(slab)
        self._free_map[slab] = 0
        self._owner[slab] = generation
        self._free_count -= 1

    def _live(self, handle: SlabHandle) -> _Allocation:
        allocation = self._allocs.get(handle.generation)
        if allocation is None or allocation.handle != handle:
            raise StaleHandle(
                f"slab handle of generation {handle.generation} is stale: its slabs were freed "
                "(and may belong to another allocation now)",
                detail={"generation": handle.generation},
            )
        return allocation

    def is_live(self, handle: SlabHandle) -> bool:
        """Whether ``handle`` still owns its slabs."""
        allocation = self._allocs.get(handle.generation)
        return allocation is not None and allocation.handle == handle

    def free(self, handle: SlabHandle) -> None:
        """Give the slabs back. Raises StaleHandle for a freed handle, CacheError if pinned."""
        allocation = self._live(handle)
        if allocation.pins:
            raise CacheError(
                f"cannot free slabs {list(handle.slabs)}: pinned {allocation.pins} time(s)",
                detail={"generation": handle.generation, "pins": allocation.pins},
            )
        del self._allocs[handle.generation]
        for slab in handle.slabs:
            self._owner[slab] = 0
            self._free_map[slab] = 1
            self._append(slab)
        self._free_count += handle.num_slabs

    def pin(self, handle: SlabHandle) -> int:
        """Count one more pin; a pinned allocation cannot be freed. Returns the pin count."""
        allocation = self._live(handle)
        allocation.pins += 1
        return allocation.pins

    def unpin(self, handle: SlabHandle) -> int:
        """Drop one pin. Returns the remaining count."""
        allocation = self._live(handle)
        if allocation.pins == 0:
            raise CacheError(f"slab handle of generation {handle.generation} is not pinned")
        allocation.pins -= 1
        return allocation.pins

    def pins(self, handle: SlabHandle) -> int:
        """Current pin count of a live handle."""
        return self._live(handle).pins

    def allocations(self) -> list[SlabHandle]:
        """Every live handle."""
        return [allocation.handle for allocation in self._allocs.values()]

    @property
    def pinned_slabs(self) -> int:
        """Slabs held by pinned allocations."""
        return sum(a.handle.num_slabs for a in self._allocs.values() if a.pins)

    # -- checking ---------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every invariant; raise AssertionError naming the first one broken."""
        count, sentinel = self._num_slabs, self._num_slabs

        def fail(message: str) -> None:
            raise AssertionError(f"SlabPool invariant broken: {message}")

        listed: set[int] = set()
        slab = self._next[sentinel]
        previous = sentinel
        while slab != sentinel:
            if not 0 <= slab < count:
                fail(f"free list holds slab id {slab} outside 0..{count - 1}")
            if slab in listed:
                fail(f"free list visits slab {slab} twice")
            if self._prev[slab] != previous:
                fail(f"free list back link of slab {slab} is {self._prev[slab]}, not {previous}")
            if not self._free_map[slab] or self._owner[slab]:
                fail(f"slab {slab} is on the free list but marked allocated")
            listed.add(slab)
            previous, slab = slab, self._next[slab]
        if self._prev[sentinel] != previous:
            fail("free list tail link is wrong")
        if len(listed) != self._free_count or self._free_map.count(1) != self._free_count:
            fail(
                f"free count {self._free_count} != listed {len(listed)} "
                f"!= mapped {self._free_map.count(1)}"
            )
        owned: set[int] = set()
        for generation, allocation in self._allocs.items():
            handle = allocation.handle
            if handle.generation != generation or generation > self._generation:
                fail(f"allocation filed under generation {generation} is {handle.generation}")
            if allocation.pins < 0:
                fail(f"allocation {generation} has {allocation.pins} pins")
            for first, length in handle.runs:
                if length < 1 or first < 0 or first + length > count:
                    fail(f"allocation {generation} has a run ({first}, {length}) out of range")
            for slab in handle.slabs:
                if slab in owned:
                    fail(f"slab {slab} belongs to two allocations")
                if self._owner[slab] != generation or self._free_map[slab]:
                    fail(f"slab {slab} of allocation {generation} is not marked as its own")
                owned.add(slab)
        if len(owned) + self._free_count != count:
            fail(f"{len(owned)} owned + {self._free_count} free != {count} slabs")
