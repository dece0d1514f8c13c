"""Hot models replicated ahead of need: the rule (which worker warms which model) and the
lanes' side of it (a hot tick loads the model, evicting only what the queue does not need)."""

from __future__ import annotations

import msgpack
import pytest

from compass.core.lanes import LoadModel
from compass.core.replica import recent_models
from compass.elastic.replicate import (
    Holding,
    ReplicaConfig,
    Replicator,
    hot_models,
    replicas_wanted,
    spare_models,
)
from compass.errors import ConfigError, ProtocolError
from compass.sched.heartbeat import MAX_RECENT, Heartbeat
from tests.unit.worker.test_lanes import Harness, entry, loaded

#: the thresholds the tests are written for (slack 1 s: hot past 0.15 s of mean wait at the
#: holders, headroom below 0.05 s)
RULE = ReplicaConfig(warm_fraction=0.15, headroom_fraction=0.05)


def h(name: str, wait_s: float, *models: str, loading: bool = False) -> Holding:
    return Holding(name, wait_s, frozenset(models), loading)


def test_a_pressed_model_is_warmed_on_the_least_loaded_worker_with_headroom() -> None:
    workers = [h("a", 0.4, "m"), h("b", 0.2, "m"), h("c", 0.04, "x"), h("d", 0.0, "x", "y")]
    assert replicas_wanted(workers, ["m", "x"], 1.0, RULE) == [("d", "m")]
    # the holders' mean wait is what presses: one long queue beside an idle holder is not
    assert (
        replicas_wanted([h("a", 0.25, "m"), h("b", 0.0, "m"), h("c", 0.0)], ["m"], 1.0, RULE) == []
    )
    # a model no recent job used is not hot, whatever its holders' queues
    assert replicas_wanted(workers, ["x"], 1.0, RULE) == []


def test_no_headroom_no_copy_and_a_loading_worker_is_not_asked() -> None:
    assert replicas_wanted([h("a", 0.5, "m"), h("b", 0.06)], ["m"], 1.0, RULE) == []
    assert replicas_wanted([h("a", 0.5, "m"), h("b", 0.0, loading=True)], ["m"], 1.0, RULE) == []
    # no holder at all: the planner's own load, not a replica
    assert replicas_wanted([h("a", 0.5), h("b", 0.0)], ["m"], 1.0, RULE) == []


def test_the_most_pressed_model_first_and_one_copy_per_worker_per_step() -> None:
    workers = [h("a", 0.3, "m"), h("b", 0.9, "n"), h("c", 0.0), h("d", 0.01)]
    assert replicas_wanted(workers, ["m", "n"], 1.0, RULE) == [("c", "n"), ("d", "m")]
    assert replicas_wanted(workers[:3], ["m", "n"], 1.0, RULE) == [("c", "n")]


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ConfigError, match="headroom_fraction < warm_fraction"):
        ReplicaConfig(warm_fraction=0.1, headroom_fraction=0.2)


def test_a_hot_tick_loads_the_model_evicting_only_what_the_queue_does_not_need() -> None:
    harness = Harness(capacity_gb=2)
    loaded(harness.cache, "a", "b")  # full; b is least recently used
    harness.record(harness.lanes.submit(entry("t1", "a"), 0.0))  # a runs
    harness.record(harness.lanes.submit(entry("t2", "b"), 0.0))  # b is queued: needed
    harness.take()
    harness.record(harness.lanes.tick(0.1, hot="c"))
    assert harness.take() == []  # a is running and b queued: nothing may go

    idle = Harness(capacity_gb=2)
    loaded(idle.cache, "a", "b")
    idle.record(idle.lanes.tick(0.0, hot="c"))
    (load,) = idle.take()
    assert load == LoadModel("c", ("a",), True)  # the cache's own order: least recently used
    idle.record(idle.lanes.tick(0.1, hot="b"))
    assert idle.take() == []  # b is resident already
    idle.record(idle.lanes.tick(0.1, hot="huge"))
    assert idle.take() == []  # never fits: nothing, and no error
    idle.record(idle.lanes.loaded("c", 0.1, 0.2))
    # nothing pins the copy: unused, it is the least recently used and goes first
    used = entry("t3", "b")
    idle.record(idle.lanes.submit(used, 0.3))
    idle.record(idle.lanes.ended(used, 0.4))
    idle.take()
    idle.record(idle.lanes.submit(entry("t4", "a"), 0.5))
    assert idle.take()[0] == LoadModel("a", ("c",), False)


def _ran_a_until(ended: float) -> Harness:
    """A full 1 GB cache holding ``a``, whose one task ran from 0 to ``ended``: none queued."""
    busy = Harness(capacity_gb=1)
    loaded(busy.cache, "a")
    ran = entry("t1", "a")
    busy.record(busy.lanes.submit(ran, 0.0))
    busy.record(busy.lanes.ended(ran, ended))
    busy.take()
    return busy


def test_a_copy_that_would_evict_a_model_used_lately_is_refused() -> None:
    """Worker w1 serves ``a`` (one task just ended, none queued) and its cache is full: a
    copy of the hot ``c`` would evict ``a``, still in use, so the lanes refuse it; over a
    model unused for ``cold_s`` (``b``), or into free slabs, it loads."""
    busy = _ran_a_until(1.0)
    busy.record(busy.lanes.tick(5.0, hot="c", cold_s=10.0))
    assert busy.take() == [] and busy.cache.resident() == {"a"}  # a ran 5 s ago: warmer
    busy.record(busy.lanes.tick(10.5, hot="c", cold_s=10.0))
    assert busy.take() == [LoadModel("c", ("a",), True)]  # unused for 10.5 s: colder

    mixed = Harness(capacity_gb=2)
    loaded(mixed.cache, "b", "a")
    for at, model in ((0.0, "b"), (20.0, "a")):
        task = entry(f"t{at:g}", model)
        mixed.record(mixed.lanes.submit(task, at))
        mixed.record(mixed.lanes.ended(task, at + 0.5))
    mixed.take()
    mixed.record(mixed.lanes.tick(21.0, hot="c"))  # the default cold_s
    assert mixed.take() == [LoadModel("c", ("b",), True)]  # b, unused for 21 s, goes; a stays

    roomy = Harness(capacity_gb=2)
    loaded(roomy.cache, "a")
    task = entry("t1", "a")
    roomy.record(roomy.lanes.submit(task, 0.0))
    roomy.record(roomy.lanes.tick(0.1, hot="c"))
    assert roomy.take()[-1] == LoadModel("c", (), True)  # free room: no eviction at all


def test_a_model_used_lately_but_spare_makes_room_and_the_rule_names_the_spare_ones() -> None:
    busy = _ran_a_until(1.0)
    busy.record(busy.lanes.tick(2.0, hot="c", spare={"a"}))
    assert busy.take() == [LoadModel("c", ("a",), True)]  # another copy of a takes its work
    # spare: held by another worker too, whose holders queue less than the hot model's
    workers = [h("x", 0.8, "m", "k"), h("y", 0.0, "k", "n", "j"), h("z", 1.8, "j")]
    assert spare_models(workers, "y", "m") == {"k"}  # n: the only copy; j: pressed more
    assert spare_models(workers, "nobody", "m") == frozenset()


def test_a_fresh_copy_is_not_evicted_by_the_next_one() -> None:
    idle = Harness(capacity_gb=1)
    idle.record(idle.lanes.tick(0.0, hot="a"))
    idle.record(idle.lanes.loaded("a", 1.0, 1.0))
    idle.take()
    idle.record(idle.lanes.tick(2.0, hot="b"))
    assert idle.take() == []  # a was warmed 2 s ago: it has not had its chance yet


def test_the_rule_does_not_ask_a_worker_again_for_a_model_within_its_cool_down() -> None:
    rule = Replicator(ReplicaConfig(warm_fraction=0.15, headroom_fraction=0.05, cooldown_s=30.0))
    workers = [h("a", 0.5, "m"), h("b", 0.0, "n"), h("c", 0.01, "k")]
    assert rule.step(0.0, workers, ["m"], 1.0) == [("b", "m")]
    # b's core declined (nothing loading there): the next worker with headroom is asked
    assert rule.step(2.0, workers, ["m"], 1.0) == [("c", "m")]
    assert rule.step(4.0, workers, ["m"], 1.0) == []  # both cooling: nobody is asked
    assert rule.step(30.0, workers, ["m"], 1.0) == [("b", "m")]  # b's window is over
    assert set(rule.cooling) == {("b", "m"), ("c", "m")}


def test_a_model_a_worker_dropped_is_not_warmed_back_there_within_the_cool_down() -> None:
    """The thrash of two models short of room: b's copy of m evicted n; n's holder queues
    then, but b, which dropped n a round ago, is not asked to warm it back."""
    rule = Replicator(ReplicaConfig(warm_fraction=0.15, headroom_fraction=0.05, cooldown_s=30.0))
    assert rule.step(0.0, [h("a", 0.0, "n"), h("b", 0.0, "n")], ["n"], 1.0) == []
    # m copied onto b over n (the planner's or a copy's load): b dropped n
    after = [h("a", 0.5, "n"), h("b", 0.0, "m")]
    assert rule.step(2.0, after, ["n"], 1.0) == []
    assert rule.cooling == {("b", "n"): 2.0}
    assert rule.step(31.9, after, ["n"], 1.0) == []
    assert rule.step(32.0, after, ["n"], 1.0) == [("b", "n")]
    # bounded: windows that ended are forgotten, and so are workers no longer serving
    assert rule.step(70.0, [h("a", 0.0, "n")], ["n"], 1.0) == []
    assert rule.cooling == {} and set(rule._held) == {"a"}


def test_cool_down_and_cold_thresholds_are_checked() -> None:
    with pytest.raises(ConfigError, match="cooldown_s >= 0"):
        ReplicaConfig(cooldown_s=-1.0)
    with pytest.raises(ConfigError, match="cold_s >= 0"):
        ReplicaConfig(cold_s=-1.0)
    # zero: no memory at all, every round as the one before
    rule = Replicator(ReplicaConfig(cooldown_s=0.0))
    workers = [h("a", 0.9, "m"), h("b", 0.0)]
    assert rule.step(0.0, workers, ["m"], 1.0) == rule.step(0.0, workers, ["m"], 1.0)


def test_the_models_a_worker_uses_are_those_queued_and_those_begun_within_cold_s() -> None:
    """b began 12 s ago (cold), a 3 s ago, c is queued behind a: the worker uses a and c; the
    cluster's hot set is every worker's, and a model held but used nowhere is not in it."""
    lanes = Harness(capacity_gb=3)
    loaded(lanes.cache, "a", "b", "c")
    for at, model in ((0.0, "b"), (9.0, "a")):
        task = entry(f"t{at:g}", model)
        lanes.record(lanes.lanes.submit(task, at))
        lanes.record(lanes.lanes.ended(task, at + 0.5))
    lanes.record(lanes.lanes.submit(entry("long", "a"), 11.0))
    lanes.record(lanes.lanes.submit(entry("queued", "c"), 11.0))
    used, upcoming = lanes.lanes.used, lanes.lanes.queue.upcoming_models()
    assert recent_models(used, upcoming, 12.0, 10.0, MAX_RECENT) == {"a", "c"}
    assert recent_models(used, upcoming, 12.0, 13.0, MAX_RECENT) == {"a", "b", "c"}
    assert recent_models(used, [], 12.0, 13.0, 1) == {"a"}  # bounded: the latest first
    assert recent_models(used, ["c", "c", "b"], 12.0, 13.0, 2) == {"c", "b"}  # queued first
    workers = [Holding("x", 0.5, frozenset("ab"), recent=frozenset("a")), h("y", 0.0, "b")]
    assert hot_models(workers) == {"a"}


def test_recent_models_ride_the_heartbeat_bounded_and_optional() -> None:
    state = Heartbeat("w1", 0.5, frozenset("ab"), 5, 10, recent=frozenset("a"))
    wire = msgpack.unpackb(msgpack.packb(state.to_wire()))
    assert wire["r"] == ["a"] and Heartbeat.from_wire(wire) == state
    plain = Heartbeat("w1", 0.5, frozenset("ab"), 5, 10)
    assert "r" not in plain.to_wire()  # nothing used: no bytes, as a peer that predates it
    assert Heartbeat.from_wire(plain.to_wire()).recent == frozenset()
    with pytest.raises(ProtocolError, match="at most 64 model names"):
        Heartbeat.from_wire(plain.to_wire() | {"r": [f"m{i}" for i in range(MAX_RECENT + 1)]})
    with pytest.raises(ProtocolError, match="'r' must be a list of model names"):
        Heartbeat.from_wire(plain.to_wire() | {"r": [1]})
