"""CacheCore: look-ahead eviction, pins, waits, prefetch choice, runs, counters. No event loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from compass.cache.policy import JOIN, READY, WAIT, CacheCore, LoadPlan
from compass.cache.pool import SlabPool
from compass.cache.slab import SlabLayout
from compass.errors import CacheError, ModelTooLarge

S = 1024  # slab bytes


def make_core(slabs: int, models: Mapping[str, int | SlabLayout]) -> CacheCore:
    return CacheCore(SlabPool(slabs * S, S), models)


def load(
    core: CacheCore, name: str, upcoming: Sequence[str] = (), seconds: float = 0.0
) -> LoadPlan:
    plan = core.plan_load(name, upcoming)
    assert plan is not None, f"{name} does not fit"
    core.begin_load(name, plan)
    core.finish_load(name, seconds)
    core.validate()
    return plan


def picture(core: CacheCore) -> tuple[object, ...]:
    return (
        core.resident(),
        core.loading(),
        core.free_bytes(),
        core.lru_order(),
        core.stats,
        sorted(h.generation for h in core.pool.allocations()),
    )


@pytest.fixture
def full_abc() -> CacheCore:
    """Nine slabs holding a, b, c (three each), loaded in that order: a is least recent."""
    core = make_core(9, dict.fromkeys("abcd", 3 * S) | {"huge": 10 * S})
    for name in "abc":
        load(core, name)
    assert core.free_bytes() == 0
    return core


def test_lru_when_the_queue_says_nothing(full_abc):
    plan = full_abc.plan_load("d", [])
    assert plan is not None
    assert plan.evict == ("a",)


def test_model_not_needed_by_the_queue_goes_first(full_abc):
    # LRU would evict a; the queue needs a and b, so c (not needed) goes
    plan = full_abc.plan_load("d", ["a", "b"])
    assert plan is not None
    assert plan.evict == ("c",)


def test_look_ahead_evicts_the_model_needed_furthest_ahead(full_abc):
    # every resident model is needed; b is needed last, so b goes, though a is the LRU
    plan = full_abc.plan_load("d", ["a", "c", "d", "a", "b"])
    assert plan is not None
    assert plan.evict == ("b",)
    before = full_abc.resident()
    full_abc.begin_load("d", plan)
    full_abc.finish_load("d")
    assert full_abc.resident() == (before - {"b"}) | {"d"}
    full_abc.validate()


def test_unneeded_models_go_in_lru_order(full_abc):
    full_abc.record_request("a")  # a becomes most recent
    plan = full_abc.plan_load("d", ["c"])
    assert plan is not None
    assert plan.evict == ("b",)


def test_planning_changes_nothing(full_abc):
    before = picture(full_abc)
    full_abc.plan_load("d", ["a"])
    full_abc.prefetch_candidate(["d"], 3)
    assert picture(full_abc) == before


def test_pinned_models_are_never_evicted(full_abc):
    full_abc.pin("a")
    full_abc.pin("c")
    plan = full_abc.plan_load("d", ["b"])  # b is needed, but a and c are pinned
    assert plan is not None
    assert plan.evict == ("b",)
    full_abc.pin("b")
    before = picture(full_abc)
    assert full_abc.plan_load("d") is None  # must wait
    assert picture(full_abc) == before
    with pytest.raises(CacheError, match="pinned"):
        full_abc.evict("b")
    assert full_abc.unpin("b") == 0
    plan = full_abc.plan_load("d")
    assert plan is not None
    assert plan.evict == ("b",)


def test_pins_are_counted(full_abc):
    assert full_abc.pin("a") == 1
    assert full_abc.pin("a") == 2
    assert full_abc.unpin("a") == 1
    assert full_abc.plan_load("d", []).evict == ("b",)  # a still pinned
    assert full_abc.unpin("a") == 0
    with pytest.raises(CacheError, match="not pinned"):
        full_abc.unpin("a")
    with pytest.raises(CacheError, match="neither resident nor loading"):
        full_abc.pin("d")


def test_stale_plan_is_refused_and_changes_nothing(full_abc):
    plan = full_abc.plan_load("d", [])
    assert plan is not None
    assert plan.evict == ("a",)
    full_abc.pin("a")
    before = picture(full_abc)
    with pytest.raises(CacheError, match="stale plan"):
        full_abc.begin_load("d", plan)
    assert picture(full_abc) == before
    full_abc.validate()


def test_model_larger_than_the_whole_cache_fails_clearly(full_abc):
    with pytest.raises(ModelTooLarge) as info:
        full_abc.plan_load("huge", [])
    message = str(info.value)
    assert "'huge'" in message
    assert str(10 * S) in message
    assert str(9 * S) in message
    assert info.value.detail == {"model": "huge", "size_bytes": 10 * S, "capacity_bytes": 9 * S}


def test_misuse_is_reported(full_abc):
    with pytest.raises(CacheError, match="not registered"):
        full_abc.plan_load("nope", [])
    with pytest.raises(CacheError, match="already resident"):
        full_abc.plan_load("a", [])
    with pytest.raises(CacheError, match="no load under way"):
        full_abc.finish_load("a")
    with pytest.raises(CacheError, match="already registered"):
        full_abc.add_model("a", S)


def test_allow_evict_needed_false_spares_the_queue(full_abc):
    assert full_abc.plan_load("d", ["a", "b", "c"], allow_evict_needed=False) is None
    plan = full_abc.plan_load("d", ["a", "c"], allow_evict_needed=False)
    assert plan is not None
    assert plan.evict == ("b",)


def test_eviction_frees_the_slabs(full_abc):
    load(full_abc, "d", ["a", "b"])  # evicts c
    assert "c" not in full_abc.resident()
    assert full_abc.free_bytes() == 0
    full_abc.evict("a")
    assert full_abc.free_bytes() == 3 * S
    assert full_abc.pool.free_slabs == 3
    stats = full_abc.stats
    assert stats.evictions == 2
    assert stats.bytes_evicted == 6 * S
    full_abc.validate()


def test_counters_and_bandwidth():
    core = make_core(8, {"a": 2 * S, "b": 3 * S})
    assert core.stats.h2d_bandwidth == 0.0
    assert core.record_request("a") is False
    load(core, "a", seconds=0.5)
    assert core.record_request("a") is True
    assert core.record_request("b") is False
    load(core, "b", seconds=1.5)
    stats = core.stats
    assert (stats.hits, stats.misses, stats.loads) == (1, 2, 2)
    assert stats.bytes_loaded == 5 * S
    assert stats.load_seconds == pytest.approx(2.0)
    assert stats.h2d_bandwidth == pytest.approx(5 * S / 2.0)
    assert stats.hit_rate == pytest.approx(1 / 3)
    assert stats.to_dict()["h2d_bandwidth"] == pytest.approx(5 * S / 2.0)


def test_loading_model_holds_slabs_and_can_be_aborted():
    core = make_core(4, {"a": 3 * S, "b": 3 * S})
    plan = core.plan_load("a", [])
    assert plan is not None
    core.begin_load("a", plan)
    assert core.loading() == {"a"}
    assert core.resident() == frozenset()
    assert core.plan_load("b", []) is None  # a loading model is never a victim
    core.pin("a")  # a lane waiting on the load
    core.abort_load("a")
    assert core.free_bytes() == 4 * S
    assert core.unpin("a") == 0  # the waiter lets go after the failure
    assert core.stats.aborted_loads == 1
    core.validate()


def test_prefetch_picks_the_first_missing_model_in_depth(full_abc):
    # d is missing, position 1; a is not needed, so evicting it is allowed
    assert full_abc.prefetch_candidate(["b", "d", "c"], 3) == ("d", LoadPlan("d", ("a",), 3, 3))
    # beyond the look-ahead depth nothing is considered
    assert full_abc.prefetch_candidate(["a", "b", "c", "d"], 3) is None
    assert full_abc.prefetch_candidate(["d"], 0) is None


def test_prefetch_never_evicts_a_model_needed_sooner(full_abc):
    full_abc.pin("a")
    # victims may only be needed later than d: c is (position 2), b is not (position 0)
    candidate = full_abc.prefetch_candidate(["b", "d", "c"], 3)
    assert candidate is not None
    assert candidate[1].evict == ("c",)
    # with c needed before d too, nothing may go
    assert full_abc.prefetch_candidate(["b", "c", "d"], 3) is None
    # and the scan stops at the first missing model that does not fit
    full_abc.unpin("a")
    assert full_abc.prefetch_candidate(["a", "b", "c", "huge", "d"], 5) is None


def test_the_paper_s_prefetch_only_fills_free_slabs(full_abc):
    # the cache is full: the paper's rule prefetches nothing, the generalized one evicts a
    assert full_abc.prefetch_candidate(["b", "d", "c"], 3, evict=False) is None
    assert full_abc.prefetch_candidate(["b", "d", "c"], 3) == ("d", LoadPlan("d", ("a",), 3, 3))
    full_abc.evict("a")  # three slabs free: now d fits as it is
    assert full_abc.prefetch_candidate(["b", "d", "c"], 3, evict=False) == (
        "d",
        LoadPlan("d", (), 3, 0),
    )


def fragmented_core() -> CacheCore:
    """Four slabs, 'm2' at slab 1 and 'm4' at slab 3; slabs 0 and 2 free: no two adjacent."""
    core = make_core(4, {f"m{i}": S for i in range(1, 5)})
    core.add_model("big", SlabLayout.pack([("w", 2 * S - 100)], S))  # one 2-slab run
    for name in ("m1", "m2", "m3", "m4"):
        load(core, name)
    core.evict("m1")
    core.evict("m3")
    assert core.free_bytes() == 2 * S
    assert core.pool.largest_free_run() == 1
    return core


def test_tensor_larger_than_a_slab_makes_eviction_open_a_run():
    core = fragmented_core()
    plan = core.plan_load("big", ["m2"])
    # enough slabs are free by count, but no run: m4 (not needed) must go to open one
    assert plan is not None
    assert plan.evict == ("m4",)
    assert plan.over_eviction
    handle = core.begin_load("big", plan)
    ((first, length),) = handle.runs
    assert length == 2
    assert first in (2,)
    core.finish_load("big")
    assert core.stats.over_evictions == 1
    core.validate()


def test_run_waits_when_only_pinned_models_block_it():
    core = fragmented_core()
    core.pin("m2")
    core.pin("m4")
    assert core.plan_load("big", []) is None


def test_victims_for_a_run_are_pruned_to_what_is_needed():
    # eight single slabs, all resident; big needs a 2-slab run
    core = make_core(8, {f"m{i}": S for i in range(8)})
    core.add_model("big", SlabLayout.pack([("w", 2 * S)], S))
    for i in range(8):
        load(core, f"m{i}")
    # m0 and m2 are not needed (so evicted first by count) but are not adjacent; the queue
    # needs the rest with m7, m6 furthest ahead
    upcoming = ["m1", "m3", "m4", "m5", "m6", "m7"]
    plan = core.plan_load("big", upcoming)
    assert plan is not None
    assert sorted(plan.evict) == ["m6", "m7"]
    assert plan.evict_slabs == 2
    assert not plan.over_eviction


class CoreMachine(RuleBasedStateMachine):
    """Random requests, loads, pins and aborts: pinned models must survive every step."""

    NAMES = ("a", "b", "c", "d", "e", "big")

    def __init__(self) -> None:
        super().__init__()
        self.core = make_core(10, {"a": 2 * S, "b": 3 * S, "c": 1, "d": 4 * S, "e": 2 * S})
        self.core.add_model("big", SlabLayout.pack([("w", 3 * S), ("x", 100)], S))
        self.held: list[str] = []

    @rule(name=st.sampled_from(NAMES), upcoming=st.lists(st.sampled_from(NAMES), max_size=6))
    def request(self, name, upcoming):
        self.core.record_request(name)
        if name in self.core.resident() or name in self.core.loading():
            return
        pinned_before = {m for m in self.held if m in self.core.resident()}
        plan = self.core.plan_load(name, upcoming)
        if plan is None:
            return
        assert not set(plan.evict) & pinned_before
        self.core.begin_load(name, plan)
        assert pinned_before <= self.core.resident()

    @rule(upcoming=st.lists(st.sampled_from(NAMES), max_size=6))
    def prefetch(self, upcoming):
        candidate = self.core.prefetch_candidate(upcoming, 3)
        if candidate is None:
            return
        name, plan = candidate
        position = upcoming.index(name)
        for victim in plan.evict:
            assert victim not in upcoming[:position], "prefetch evicted a model needed sooner"
        self.core.begin_load(name, plan, prefetch=True)

    @precondition(lambda self: self.core.loading())
    @rule(data=st.data(), ok=st.booleans())
    def end_load(self, data, ok):
        name = data.draw(st.sampled_from(sorted(self.core.loading())))
        if ok:
            self.core.finish_load(name, 0.01)
        else:
            self.core.abort_load(name)
            while name in self.held:
                self.held.remove(name)
                self.core.unpin(name)

    @precondition(lambda self: self.core.resident() | self.core.loading())
    @rule(data=st.data())
    def pin(self, data):
        name = data.draw(st.sampled_from(sorted(self.core.resident() | self.core.loading())))
        self.core.pin(name)
        self.held.append(name)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def unpin(self, data):
        name = data.draw(st.sampled_from(self.held))
        self.held.remove(name)
        self.core.unpin(name)

    @invariant()
    def consistent(self):
        self.core.validate()
        # the cached pair follows every load begun, ended, aborted and every eviction
        assert self.core.residency() == (self.core.resident(), self.core.loading())
        for name in set(self.held):
            assert name in self.core.resident() | self.core.loading()
            assert self.core.pins(name) == self.held.count(name)


CoreMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_core_state_machine = CoreMachine.TestCase


def test_warming_only_uses_free_slabs_and_skips_what_is_held():
    core = make_core(9, {"a": 3 * S, "b": 3 * S, "c": 3 * S, "big": 7 * S})
    load(core, "a")
    plan = core.plan_load("b", [])
    assert plan is not None
    core.begin_load("b", plan)  # b is loading
    # a is resident and b loading: neither is proposed; big does not fit without evicting
    candidate = core.warm_candidate(["a", "b", "big", "c"])
    assert candidate is not None
    name, warm = candidate
    assert name == "c" and warm.evict == () and warm.slabs == 3
    before = picture(core)
    assert core.warm_candidate(["big"]) is None  # nothing is ever evicted to warm
    assert core.warm_candidate(["unknown"]) is None
    assert picture(core) == before  # choosing changes nothing
    core.begin_load("c", warm, prefetch=True)
    core.finish_load("c")
    core.finish_load("b")
    core.validate()
    assert core.warm_candidate(["big", "a"]) is None  # full
    assert core.stats.prefetches == 1


def test_acquire_steps_through_load_join_ready_and_wait() -> None:
    core = make_core(3, {"a": 3 * S, "b": 3 * S, "huge": 4 * S})
    step = core.acquire("a")
    assert isinstance(step, LoadPlan) and core.pins("a") == 0  # nothing changed yet
    core.begin_load("a", step)
    core.pin("a")
    assert core.acquire("a") == JOIN and core.pins("a") == 2  # a second task joins the load
    assert core.acquire("b") == WAIT  # the only slabs are loading and pinned
    core.finish_load("a")
    assert core.acquire("a") == READY and core.pins("a") == 3
    for _ in range(3):
        core.unpin("a")
    plan = core.acquire("b")  # now a can go
    assert isinstance(plan, LoadPlan) and plan.evict == ("a",)
    with pytest.raises(ModelTooLarge):
        core.acquire("huge")
    core.validate()
