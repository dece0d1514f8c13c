"""The cache core: which models are resident, pinned, loading, and what to evict. Sans-IO.

Used unchanged by the worker's async :class:`~compass.cache.models.ModelCache` and by the
discrete-event simulator: no asyncio, no torch, no clock. Time enters only as the seconds a
caller reports for a finished load.

Eviction follows the Compass paper's look-ahead rule, generalised (see :meth:`CacheCore.plan_load`):

1. models no queued task on this worker needs, least recently used first;
2. then models the queue needs, the one needed furthest ahead first (Belady over the queue);
3. ties, and anything the queue cannot tell apart, by least recent use.

Pinned and loading models are never victims. When the model has a tensor larger than a slab,
the victims must also open a contiguous run; a plan that evicts more than a plain slab count
would have needed is counted in :attr:`CacheStats.over_evictions`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from compass.cache.pool import SlabPool
from compass.cache.slab import SlabHandle, SlabLayout
from compass.errors import CacheError, ModelTooLarge

__all__ = ["JOIN", "READY", "WAIT", "CacheCore", "CacheStats", "LoadPlan"]

#: :meth:`CacheCore.acquire`: the model is resident, and now pinned: run the task
READY = "ready"
#: :meth:`CacheCore.acquire`: the model is being loaded, and now pinned: wait for that load
JOIN = "join"
#: :meth:`CacheCore.acquire`: pinned or loading models hold the slabs: wait for a change
WAIT = "wait"


@dataclass(slots=True)
class CacheStats:
    """Counters of one cache. ``hits``/``misses`` count requests (:meth:`CacheCore.record_request`);
    ``loads`` counts loads begun, ``prefetches`` those of them begun by prefetch."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    prefetches: int = 0
    aborted_loads: int = 0
    bytes_loaded: int = 0
    load_seconds: float = 0.0
    evictions: int = 0
    bytes_evicted: int = 0
    #: loads that evicted more than their size needed because no contiguous run was free
    over_evictions: int = 0
    #: requests that had to wait because pinned or loading models held the slabs
    waits: int = 0

    @property
    def h2d_bandwidth(self) -> float:
        """Measured load bandwidth in bytes per second (0.0 before any timed load)."""
        return self.bytes_loaded / self.load_seconds if self.load_seconds > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        """Hits over requests (0.0 before any request)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def copy(self) -> CacheStats:
        """An independent snapshot."""
        return replace(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain, msgpack-able form, derived rates included."""
        out = asdict(self)
        out["h2d_bandwidth"] = self.h2d_bandwidth
        out["hit_rate"] = self.hit_rate
        return out


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What :meth:`CacheCore.begin_load` will do: evict ``evict`` (in order), then allocate.

    ``over_eviction`` is True when the victims free more slabs than a plain count would have
    needed, because the model needs a contiguous run that no cheaper choice opens.
    """

    name: str
    evict: tuple[str, ...] = ()
    slabs: int = 0
    evict_slabs: int = 0
    over_eviction: bool = False


@dataclass(slots=True)
class _Entry:
    handle: SlabHandle
    loading: bool
    prefetch: bool = False


@dataclass(slots=True)
class _Residency:
    entries: dict[str, _Entry] = field(default_factory=dict)
    # resident (not loading) models, least recently used first
    lru: OrderedDict[str, None] = field(default_factory=OrderedDict)
    pins: dict[str, int] = field(default_factory=dict)


class CacheCore:
    """Residency, pins, recency and eviction decisions over a :class:`SlabPool`.

    ``models`` maps each model name to its size in bytes (packed as whole single slabs, as for
    emulated models) or to its :class:`SlabLayout`. More can be added with :meth:`add_model`.
    """

    def __init__(
        self, pool: SlabPool, models: Mapping[str, int | SlabLayout] | None = None
    ) -> None:
        self._pool = pool
        self._layouts: dict[str, SlabLayout] = {}
        self._sizes: dict[str, int] = {}
        self._state = _Residency()
        self._stats = CacheStats()
        #: (resident, loading) until the next change of either (:meth:`residency`)
        self._residency: tuple[frozenset[str], frozenset[str]] | None = None
        #: slabs held for suspended tasks' states (:meth:`hold_state`), by generation
        self._states: dict[int, SlabHandle] = {}
        for name, model in (models or {}).items():
            self.add_model(name, model)

    # -- registry ---------------------------------------------------------------------------

    def add_model(self, name: str, model: int | SlabLayout) -> None:
        """Register a model by size in bytes or by layout. Re-registering a name is an error."""
        if name in self._layouts:
            raise CacheError(f"model {name!r} is already registered with the cache")
        if isinstance(model, SlabLayout):
            if model.slab_bytes != self._pool.slab_bytes:
                raise CacheError(
                    f"layout of model {name!r} was packed for {model.slab_bytes} B slabs, "
                    f"the pool has {self._pool.slab_bytes} B slabs"
                )
            layout, size = model, model.payload_bytes or model.footprint_bytes
        else:
            layout, size = SlabLayout.uniform(model, self._pool.slab_bytes), model
        self._layouts[name] = layout
        self._sizes[name] = size

    def models(self) -> frozenset[str]:
        """Every registered model name."""
        return frozenset(self._layouts)

    def layout(self, name: str) -> SlabLayout:
        """The registered layout of ``name``."""
        try:
            return self._layouts[name]
        except KeyError:
            raise CacheError(f"model {name!r} is not registered with this cache") from None

    def size_bytes(self, name: str) -> int:
        """Bytes a load of ``name`` copies (its declared size for a size-only model)."""
        self.layout(name)
        return self._sizes[name]

    # -- views ------------------------------------------------------------------------------

    @property
    def pool(self) -> SlabPool:
        """The slab pool underneath."""
        return self._pool

    @property
    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        return self._stats.copy()

    def resident(self) -> frozenset[str]:
        """Models loaded and usable (not those still loading)."""
        return frozenset(self._state.lru)

    def loading(self) -> frozenset[str]:
        """Models whose load has begun and not finished."""
        return frozenset(name for name, entry in self._state.entries.items() if entry.loading)

    def residency(self) -> tuple[frozenset[str], frozenset[str]]:
        """:meth:`resident` and :meth:`loading` together, built once per change of either
        (a load begun, ended or aborted, an eviction): read after every event by a simulated
        worker, which changes its cache far less often."""
        if self._residency is None:
            self._residency = self.resident(), self.loading()
        return self._residency

    def is_resident(self, name: str) -> bool:
        """Whether ``name`` is loaded and usable."""
        return name in self._state.lru

    def is_loading(self, name: str) -> bool:
        """Whether a load of ``name`` is under way."""
        entry = self._state.entries.get(name)
        return entry is not None and entry.loading

    def is_prefetch(self, name: str) -> bool:
        """Whether the load of ``name`` under way was begun speculatively (no task waited)."""
        entry = self._state.entries.get(name)
        return entry is not None and entry.loading and entry.prefetch

    def handle(self, name: str) -> SlabHandle | None:
        """The slabs of a resident or loading model."""
        entry = self._state.entries.get(name)
        return entry.handle if entry is not None else None

    def free_bytes(self) -> int:
        """Bytes in free slabs."""
        return self._pool.free_bytes

    def capacity_bytes(self) -> int:
        """Bytes the cache can hold (whole slabs)."""
        return self._pool.capacity_bytes

    def lru_order(self) -> list[str]:
        """Resident models, least recently used first."""
        return list(self._state.lru)

    # -- use --------------------------------------------------------------------------------

    def record_request(self, name: str) -> bool:
        """A task wants ``name``: count a hit (resident) or a miss, mark it used; return hit."""
        self.layout(name)
        hit = name in self._state.lru
        if hit:
            self._stats.hits += 1
            self._state.lru.move_to_end(name)
        else:
            self._stats.misses += 1
        return hit

    def record_wait(self) -> None:
        """Count a request that had to wait for pinned or loading slabs."""
        self._stats.waits += 1

    def touch(self, name: str) -> None:
        """Mark a resident model most recently used."""
        if name in self._state.lru:
            self._state.lru.move_to_end(name)

    def pins(self, name: str) -> int:
        """How many users hold ``name`` pinned."""
        return self._state.pins.get(name, 0)

    def pin(self, name: str) -> int:
        """Pin a resident or loading model (counted); it cannot be evicted until unpinned."""
        entry = self._state.entries.get(name)
        if entry is None:
            raise CacheError(f"cannot pin model {name!r}: it is neither resident nor loading")
        count = self._state.pins.get(name, 0) + 1
        self._state.pins[name] = count
        if count == 1:
            self._pool.pin(entry.handle)
        self.touch(name)
        return count

    def unpin(self, name: str) -> int:
        """Drop one pin; returns the pins left. A model whose load was aborted may be unpinned."""
        count = self._state.pins.get(name, 0)
        if count == 0:
            raise CacheError(f"cannot unpin model {name!r}: it is not pinned")
        if count == 1:
            del self._state.pins[name]
            entry = self._state.entries.get(name)
            if entry is not None:
                self._pool.unpin(entry.handle)
        else:
            self._state.pins[name] = count - 1
        return count - 1

    def acquire(self, name: str, upcoming: Sequence[str] = ()) -> str | LoadPlan:
        """The next step in making ``name`` resident for a task about to run, the one rule
        the worker core's lanes (:class:`~compass.core.lanes.Lanes`, on a worker and in the
        simulator) follow: :data:`READY` or :data:`JOIN` (pinned: run now, or once the load
        under way ends), :data:`WAIT` (nothing changed: ask again when a pin or a load is
        released), or a :class:`LoadPlan` (nothing changed: begin that load, then pin ``name``
        so that nothing evicts it before the task runs). Raises :class:`ModelTooLarge` when it
        can never fit."""
        if name in self._state.entries:
            self.pin(name)
            return READY if name in self._state.lru else JOIN
        plan = self._plan(name, upcoming, None)
        return WAIT if plan is None else plan

    # -- planning ---------------------------------------------------------------------------

    def plan_load(
        self, name: str, upcoming: Sequence[str] = (), *, allow_evict_needed: bool = True
    ) -> LoadPlan | None:
        """Decide what to evict so ``name`` fits; change nothing.

        ``upcoming`` lists the models the local queue needs, in queue order. Returns None when
        the model cannot fit now because pinned or loading models (or, with
        ``allow_evict_needed=False``, models the queue needs) hold the slabs: the caller waits.
        Raises :class:`ModelTooLarge` when it can never fit, :class:`CacheError` when it is
        already resident or loading.
        """
        protect_before = None if allow_evict_needed else len(upcoming)
        return self._plan(name, upcoming, protect_before)

    def prefetch_candidate(
        self, upcoming: Sequence[str], depth: int, *, evict: bool = True
    ) -> tuple[str, LoadPlan] | None:
        """The model to prefetch, and its plan, or None.

        Scans the first ``depth`` entries of ``upcoming`` for the first model neither resident
        nor loading. It is the candidate if it fits by evicting only models needed later than
        it or not at all (``evict=False``, the paper's rule: only into free slabs); otherwise
        None (as in the paper, the scan stops there: loading a later model would take slabs
        the earlier one needs).
        """
        for position, name in enumerate(upcoming[: max(depth, 0)]):
            if name in self._state.entries:
                continue
            if not evict:
                layout = self.layout(name)
                if not self._pool.can_alloc(layout):
                    return None
                return name, LoadPlan(name, (), layout.total_slabs, 0, False)
            try:
                plan = self._plan(name, upcoming, position)
            except ModelTooLarge:
                return None
            return (name, plan) if plan is not None else None
        return None

    def warm_candidate(self, wanted: Sequence[str]) -> tuple[str, LoadPlan] | None:
        """The first model of ``wanted`` that is neither resident nor loading and fits in the
        free slabs as they are, with its plan (which evicts nothing); None if there is none.

        For warming an idle cache (:func:`compass.sched.replicas.warm_order`): unlike
        :meth:`prefetch_candidate`, it never takes slabs another model holds.
        """
        pool = self._pool
        for name in wanted:
            layout = self._layouts.get(name)
            if layout is None or name in self._state.entries:
                continue
            if pool.can_alloc(layout):
                return name, LoadPlan(name, (), layout.total_slabs, 0, False)
        return None

    def _eviction_order(self, upcoming: Sequence[str], protect_before: int | None) -> list[str]:
        first_use: dict[str, int] = {}
        for position, model in enumerate(upcoming):
            first_use.setdefault(model, position)
        unneeded: list[str] = []
        needed: list[str] = []
        for model in self._state.lru:  # least recently used first
            if self._state.pins.get(model):
                continue
            used_at = first_use.get(model)
            if used_at is None:
                unneeded.append(model)
            elif protect_before is None or used_at > protect_before:
                needed.append(model)
        # sort is stable, so equal positions keep LRU order
        needed.sort(key=lambda model: -first_use[model])
        return unneeded + needed

    def _plan(
        self, name: str, upcoming: Sequence[str], protect_before: int | None
    ) -> LoadPlan | None:
        layout = self.layout(name)
        if name in self._state.entries:
            state = "loading" if self._state.entries[name].loading else "resident"
            raise CacheError(f"model {name!r} is already {state}; nothing to load")
        pool = self._pool
        need = layout.total_slabs
        if not pool.fits_when_empty(layout):
            raise ModelTooLarge(
                f"model {name!r} needs {self._sizes[name]} B ({need} slabs of "
                f"{pool.slab_bytes} B) but the whole cache holds {pool.capacity_bytes} B "
                f"({pool.num_slabs} slabs): give the worker a larger cache",
                detail={
                    "model": name,
                    "size_bytes": self._sizes[name],
                    "capacity_bytes": pool.capacity_bytes,
                },
            )
        if pool.can_alloc(layout):
            return LoadPlan(name, (), need, 0, False)
        order = self._eviction_order(upcoming, protect_before)
        slabs = {model: self._state.entries[model].handle.num_slabs for model in order}

        # the plan a pure slab count would make: the shortest prefix of the order that frees
        # enough slabs, then drop any victim the rest already covers
        short = need - pool.free_slabs
        victims: list[str] = []
        freed = 0
        for model in order:
            if freed >= short:
                break
            victims.append(model)
            freed += slabs[model]
        if freed < short:
            return None
        count_plan = self._prune(victims, lambda kept: sum(slabs[m] for m in kept) >= short)
        if not layout.needs_runs:
            return self._make_plan(name, count_plan, need, slabs, over=False)

        # runs: keep evicting in priority order until a run opens, then prune
        free_map = pool.free_map()

        def release(model: str) -> None:
            for slab in self._state.entries[model].handle.slabs:
                free_map[slab] = 1

        for model in victims:
            release(model)
        rest = iter(order[len(victims) :])
        while not pool.runs_fit(layout, free_map):
            extra = next(rest, None)
            if extra is None:
                return None
            victims.append(extra)
            release(extra)

        def opens_room(kept: list[str]) -> bool:
            trial = pool.free_map()
            for model in kept:
                for slab in self._state.entries[model].handle.slabs:
                    trial[slab] = 1
            return pool.runs_fit(layout, trial)

        run_plan = self._prune(victims, opens_room)
        over = sum(slabs[m] for m in run_plan) > sum(slabs[m] for m in count_plan)
        return self._make_plan(name, run_plan, need, slabs, over=over)

    @staticmethod
    def _prune(victims: list[str], enough: Callable[[list[str]], bool]) -> list[str]:
        """Spare victims, most valuable (last in eviction order) first, while ``enough`` holds."""
        kept = list(victims)
        for model in reversed(victims):
            trial = [m for m in kept if m != model]
            if enough(trial):
                kept = trial
        return kept

    @staticmethod
    def _make_plan(
        name: str, victims: list[str], need: int, slabs: Mapping[str, int], *, over: bool
    ) -> LoadPlan:
        return LoadPlan(name, tuple(victims), need, sum(slabs[m] for m in victims), over)

    # -- state changes ----------------------------------------------------------------------

    def begin_load(self, name: str, plan: LoadPlan, *, prefetch: bool = False) -> SlabHandle:
        """Evict ``plan.evict`` (freeing their slabs), allocate ``name``'s slabs, mark it loading.

        Checks first: a plan made stale by changes since :meth:`plan_load` raises CacheError
        and changes nothing.
        """
        layout = self.layout(name)
        if plan.name != name:
            raise CacheError(f"plan is for model {plan.name!r}, not {name!r}")
        if name in self._state.entries:
            raise CacheError(f"model {name!r} is already resident or loading")
        victims: list[SlabHandle] = []
        for model in plan.evict:
            if model not in self._state.lru:
                raise CacheError(f"stale plan for {name!r}: victim {model!r} is not resident")
            if self._state.pins.get(model):
                raise CacheError(f"stale plan for {name!r}: victim {model!r} is pinned")
            victims.append(self._state.entries[model].handle)
        if not self._pool.can_alloc(layout, victims):
            raise CacheError(f"stale plan for {name!r}: its victims no longer free enough slabs")
        for model in plan.evict:
            self._evict(model)
        handle = self._pool.alloc(layout)
        if handle is None:  # can_alloc said yes over the same state
            raise AssertionError(f"pool refused {name!r} after can_alloc accepted it")
        self._state.entries[name] = _Entry(handle, loading=True, prefetch=prefetch)
        self._residency = None
        if self._state.pins.get(name):
            self._pool.pin(handle)
        self._stats.loads += 1
        self._stats.prefetches += prefetch
        self._stats.over_evictions += plan.over_eviction
        return handle

    def finish_load(self, name: str, seconds: float = 0.0) -> None:
        """The load of ``name`` completed in ``seconds``: it becomes resident (most recent)."""
        entry = self._state.entries.get(name)
        if entry is None or not entry.loading:
            raise CacheError(f"model {name!r} has no load under way")
        entry.loading = False
        self._residency = None
        self._state.lru[name] = None
        self._state.lru.move_to_end(name)
        self._stats.bytes_loaded += self._sizes[name]
        self._stats.load_seconds += max(seconds, 0.0)

    def abort_load(self, name: str) -> None:
        """The load of ``name`` failed: free its slabs. Pins taken on it stay to be unpinned."""
        entry = self._state.entries.get(name)
        if entry is None or not entry.loading:
            raise CacheError(f"model {name!r} has no load under way")
        if self._state.pins.get(name):
            self._pool.unpin(entry.handle)
        del self._state.entries[name]
        self._residency = None
        self._pool.free(entry.handle)
        self._stats.aborted_loads += 1

    def evict(self, name: str) -> None:
        """Evict a resident, unpinned model now (an operator's or simulator's explicit choice)."""
        if name not in self._state.lru:
            raise CacheError(f"cannot evict model {name!r}: it is not resident")
        if self._state.pins.get(name):
            raise CacheError(f"cannot evict model {name!r}: it is pinned")
        self._evict(name)

    def _evict(self, name: str) -> None:
        entry = self._state.entries.pop(name)
        del self._state.lru[name]
        self._residency = None
        self._pool.free(entry.handle)
        self._stats.evictions += 1
        self._stats.bytes_evicted += self._sizes[name]

    # -- checking ---------------------------------------------------------------------------

    # -- suspended tasks' states ---------------------------------------------------------------

    def hold_state(self, nbytes: int) -> SlabHandle | None:
        """Take free slabs for ``nbytes`` of a suspended task's state (a KV cache), as a model's
        weights take theirs, but never evicted: None (and nothing taken) when they are not free.
        Loads and prefetches see them taken until :meth:`release_state`."""
        slab = self._pool.slab_bytes
        handle = self._pool.alloc(-(-nbytes // slab))
        if handle is not None:
            self._states[handle.generation] = handle
        return handle

    def release_state(self, handle: SlabHandle) -> None:
        """The task resumed or ended: its state's slabs are free again."""
        del self._states[handle.generation]
        self._pool.free(handle)

    @property
    def state_bytes(self) -> int:
        """Bytes held for suspended tasks' states."""
        return sum(h.num_slabs for h in self._states.values()) * self._pool.slab_bytes

    def validate(self) -> None:
        """Check the pool's invariants and that residency, pins and slabs agree."""
        self._pool.validate()
        state = self._state
        live = {handle.generation for handle in self._pool.allocations()}
        mine = {entry.handle.generation for entry in state.entries.values()} | set(self._states)
        if live != mine:
            raise AssertionError(f"pool allocations {live} do not match cached models {mine}")
        resident = {name for name, entry in state.entries.items() if not entry.loading}
        if resident != set(state.lru):
            raise AssertionError(f"LRU {list(state.lru)} does not match resident {resident}")
        for name, entry in state.entries.items():
            pinned = self._pool.pins(entry.handle)
            if pinned != (1 if state.pins.get(name) else 0):
                raise AssertionError(f"model {name!r}: pool pins {pinned}, cache pins {state.pins}")
            if entry.handle.num_slabs != self._layouts[name].total_slabs:
                raise AssertionError(f"model {name!r} holds the wrong number of slabs")
        if any(count <= 0 for count in state.pins.values()):
            raise AssertionError(f"non-positive pin counts: {state.pins}")
