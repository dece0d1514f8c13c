"""Hot models replicated ahead of need: the rule (which worker warms which model) and the
lanes' side of it (a hot tick loads the model, evicting only what the queue does not need)."""

from __future__ import annotations

import pytest

from compass.core.lanes import LoadModel
from compass.elastic.replicate import Holding, ReplicaConfig, replicas_wanted
from compass.errors import ConfigError
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
