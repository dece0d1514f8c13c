"""The lanes' rules (queues, lanes, model residency, prefetch, warming, stuck tasks), driven
with plain calls and explicit times: no loop, no threads.

Each test names the rule it guards and would fail if that rule were broken.
"""

from __future__ import annotations

from typing import Any

import pytest

from compass.cache.policy import CacheCore
from compass.cache.pool import SlabPool
from compass.core.lanes import CannotRun, Lanes, LoadModel, RunTask, Step
from compass.core.queue import QueuedTask
from compass.errors import CompassError, ModelTooLarge, WorkerUnavailable

GB = 1_000_000_000


def entry(task: str, model: str | None = "a", *, job: str = "j1", at: float = 0.0) -> QueuedTask:
    return QueuedTask(
        job_id=job,
        attempt=0,
        workflow="wf",
        task=task,
        model=model,
        expected_s=1.0,
        inputs={},
        plan={},
        ingress="w0",
        enqueued_at=at,
    )


class Harness:
    """Lanes over a cache of ``capacity_gb`` holding 1 GB models a, b, c (and 5 GB ``big``),
    recording what they decide and which tasks failed."""

    def __init__(self, capacity_gb: float = 10, **kwargs: Any) -> None:
        models = {"a": GB, "b": GB, "c": GB, "big": 5 * GB, "huge": 50 * GB}
        self.cache = CacheCore(SlabPool(int(capacity_gb * GB), GB // 4), models)
        self.lanes = Lanes(cache=self.cache, **{"lanes": 1, **kwargs})
        self.out: list[Any] = []
        self.failed: list[tuple[str, CompassError]] = []

    def record(self, steps: list[Step]) -> list[Step]:
        """Keep what a call of the lanes decided: runs and loads in order, failures apart."""
        for step in steps:
            if isinstance(step, CannotRun):
                self.failed.append((step.entry.task, step.error))
            else:
                self.out.append(step)
        return steps

    def take(self) -> list[Any]:
        steps, self.out[:] = list(self.out), []
        return steps

    def runs(self) -> list[str]:
        return [s.entry.task for s in self.take() if isinstance(s, RunTask)]


def loaded(cache: CacheCore, *models: str) -> None:
    for model in models:
        plan = cache.plan_load(model)
        assert plan is not None
        cache.begin_load(model, plan)
        cache.finish_load(model)


def test_an_idle_lane_takes_a_task_at_once_and_the_next_when_it_ends() -> None:
    h = Harness()
    loaded(h.cache, "a")
    first, second = entry("t1"), entry("t2")
    h.record(h.lanes.submit(first, 0.0))
    (run,) = h.take()
    assert run == RunTask(first, 0, False, 0.0, True)
    h.record(h.lanes.submit(second, 0.1))
    assert h.runs() == []  # one lane, busy: queued
    assert [e.task for e in h.lanes.queue] == ["t2"]
    h.record(h.lanes.ended(first, 1.0))
    h.record(h.lanes.fill(1.0))
    assert h.runs() == ["t2"]
    assert h.cache.pins("a") == 1  # the second run's pin; the first was released


def test_a_missing_model_is_loaded_and_its_task_runs_when_the_load_ends() -> None:
    h = Harness()
    task = entry("t1")
    h.record(h.lanes.submit(task, 0.0))
    (load,) = h.take()
    assert load == LoadModel("a", (), False)
    assert h.cache.is_loading("a") and h.cache.pins("a") == 1  # nothing may evict it
    h.record(h.lanes.loaded("a", 0.25, 0.25))
    (run,) = h.take()
    assert run.entry is task and run.hit is False and run.fetch_s == pytest.approx(0.25)
    assert h.cache.is_resident("a")


def test_two_lanes_share_one_load_of_the_same_model() -> None:
    h = Harness(lanes=2)
    h.record(h.lanes.submit(entry("t1"), 0.0))
    h.record(h.lanes.submit(entry("t2"), 0.0))
    assert [s for s in h.take() if isinstance(s, LoadModel)] == [LoadModel("a", (), False)]
    h.record(h.lanes.loaded("a", 0.1, 0.1))
    assert sorted(h.runs()) == ["t1", "t2"]
    assert h.cache.pins("a") == 2


def test_a_task_waits_while_pinned_models_hold_the_slabs_then_evicts_them() -> None:
    h = Harness(capacity_gb=5, lanes=2)  # room for big, or for a few small ones
    loaded(h.cache, "big")
    holder, waiter = entry("holder", "big"), entry("waiter", "a")
    h.record(h.lanes.submit(holder, 0.0))
    h.record(h.lanes.submit(waiter, 0.0))
    assert h.runs() == ["holder"]  # waiter: big is pinned and fills the cache
    assert h.cache.stats.waits == 1
    h.record(h.lanes.ended(holder, 1.0))  # big unpinned: the waiter asks again
    (load,) = h.take()
    assert load == LoadModel("a", ("big",), False)
    h.record(h.lanes.loaded("a", 0.1, 1.1))
    (run,) = h.take()
    assert run.entry is waiter and run.fetch_s == pytest.approx(1.1)


def test_with_every_lane_busy_the_queue_s_next_model_is_prefetched() -> None:
    h = Harness()
    loaded(h.cache, "a")
    h.record(h.lanes.submit(entry("t1", "a"), 0.0))
    h.take()
    h.record(h.lanes.submit(entry("t2", "b"), 0.1))
    assert h.take() == [LoadModel("b", (), True)]
    h.record(h.lanes.submit(entry("t3", "c"), 0.2))
    assert h.take() == []  # one speculative load at a time
    assert h.cache.stats.prefetches == 1


def test_no_prefetch_while_a_load_a_task_waits_for_is_under_way() -> None:
    h = Harness()
    h.record(h.lanes.submit(entry("t1", "a"), 0.0))  # a cold: the lane waits for its load
    assert h.take() == [LoadModel("a", (), False)]
    h.record(h.lanes.submit(entry("t2", "b"), 0.1))
    assert h.take() == []  # would share the copy bandwidth with a's load
    h.record(h.lanes.loaded("a", 0.1, 0.2))
    steps = h.take()
    assert [type(s) for s in steps] == [RunTask, LoadModel]  # t1 runs; now b is prefetched
    assert steps[1] == LoadModel("b", (), True)


def test_a_model_that_can_never_fit_fails_its_task_and_frees_the_lane() -> None:
    h = Harness()
    h.record(h.lanes.submit(entry("t1", "huge"), 0.0))
    assert [(task, type(error)) for task, error in h.failed] == [("t1", ModelTooLarge)]
    assert h.lanes.busy == 0
    loaded(h.cache, "a")
    h.record(h.lanes.submit(entry("t2"), 0.1))
    assert h.runs() == ["t2"]


def test_a_failed_load_fails_the_tasks_waiting_for_it_and_frees_its_slabs() -> None:
    h = Harness(lanes=2)
    h.record(h.lanes.submit(entry("t1"), 0.0))
    h.record(h.lanes.submit(entry("t2"), 0.0))
    h.take()
    free = h.cache.free_bytes()
    h.record(h.lanes.load_failed("a", CompassError("disk on fire"), 0.5))
    assert sorted(task for task, _ in h.failed) == ["t1", "t2"]
    assert h.cache.free_bytes() > free and not h.cache.is_loading("a")
    assert h.cache.pins("a") == 0 and h.lanes.busy == 0
    h.cache.validate()


def test_a_stuck_task_keeps_its_model_pinned_and_enough_of_them_degrade_the_worker() -> None:
    h = Harness(lanes=1, max_stuck=2)
    loaded(h.cache, "a")
    stuck = []
    for i in range(2):
        task = entry(f"s{i}")
        h.record(h.lanes.submit(task, float(i)))
        assert h.runs() == [task.task]
        h.record(h.lanes.ended(task, i + 0.5, still_running=True))  # timed out; its thread runs on
        stuck.append(task)
        assert h.cache.pins("a") == i + 1  # never evictable while its thread may use it
    assert h.lanes.degraded and h.lanes.busy == 0
    h.record(h.lanes.submit(entry("refused"), 3.0))
    assert [(task, type(error)) for task, error in h.failed] == [("refused", WorkerUnavailable)]
    # model-less work would take a thread too: refused as well
    h.record(h.lanes.submit(entry("no-model", None), 3.0))
    assert [task for task, _ in h.failed] == ["refused", "no-model"] and h.runs() == []
    h.record(h.lanes.returned(stuck[0], 4.0))
    assert not h.lanes.degraded and h.cache.pins("a") == 1
    h.record(h.lanes.submit(entry("accepted"), 4.0))
    assert h.runs() == ["accepted"]


def test_stuck_host_lane_tasks_count_and_a_degraded_worker_starts_no_thread() -> None:
    """Host lanes run model-less tasks in threads as well: their stuck ones degrade the worker
    like GPU lanes', and a degraded worker starts no task on any lane (each would hold another
    thread for good if it hung too)."""
    h = Harness(lanes=1, host_lanes=1, max_stuck=2)
    stuck = []
    for i in range(2):
        task = entry(f"hang{i}", None)
        h.record(h.lanes.submit(task, float(i)))
        assert h.runs() == [task.task]
        h.record(h.lanes.ended(task, i + 0.5, still_running=True))
        stuck.append(task)
    assert h.lanes.degraded and h.lanes.stuck == 2
    for i in range(3):  # refused at once, and the host lane stays free for after
        h.record(h.lanes.submit(entry(f"more{i}", None), 3.0))
    assert h.runs() == [] and [t for t, _ in h.failed] == ["more0", "more1", "more2"]
    assert all(isinstance(e, WorkerUnavailable) and "--max-stuck-tasks 2" in str(e)
               for _, e in h.failed)  # fmt: skip
    assert len(h.lanes.host_queue) == 0
    h.record(h.lanes.returned(stuck[1], 4.0))
    h.record(h.lanes.submit(entry("after", None), 4.0))
    assert h.runs() == ["after"]


def test_an_idle_worker_warms_free_slabs_with_the_most_wanted_model() -> None:
    h = Harness(capacity_gb=2, demand={"a": 1.0, "b": 2.0, "big": 9.0})
    asked: list[float] = []

    def wanted(now: float) -> list[str]:
        asked.append(now)
        return ["big", "b", "a"]  # big does not fit in free slabs: never evicts for warming

    h.lanes.wanted = wanted
    h.record(h.lanes.tick(0.0))
    assert h.take() == [LoadModel("b", (), True)]
    h.record(h.lanes.tick(0.1))
    assert h.take() == []  # one speculative load at a time
    h.record(h.lanes.loaded("b", 0.1, 0.2))  # ended: warm again
    assert h.take() == [LoadModel("a", (), True)]
    h.record(h.lanes.loaded("a", 0.1, 0.3))
    assert h.take() == [] and h.cache.free_bytes() == 0


def test_a_busy_worker_does_not_warm() -> None:
    h = Harness(demand={"b": 1.0})
    h.lanes.wanted = lambda now: ["b"]
    loaded(h.cache, "a")
    h.record(h.lanes.submit(entry("t1"), 0.0))
    h.take()
    h.record(h.lanes.tick(0.5))
    assert h.take() == []


def test_host_lanes_run_model_less_tasks_beside_a_busy_gpu_lane() -> None:
    h = Harness(lanes=1, host_lanes=1)
    loaded(h.cache, "a")
    h.record(h.lanes.submit(entry("gpu"), 0.0))
    h.record(h.lanes.submit(entry("host-1", None), 0.0))
    h.record(h.lanes.submit(entry("host-2", None), 0.0))
    steps = h.take()
    assert [(s.entry.task, s.lane, s.host) for s in steps] == [
        ("gpu", 0, False),
        ("host-1", 1, True),
    ]
    assert h.lanes.wait_s(0.0) == pytest.approx(1.0)  # host work is not in the GPU wait
    h.record(h.lanes.ended(steps[1].entry, 1.0))
    h.record(h.lanes.fill(1.0))
    assert h.runs() == ["host-2"]


def test_dropping_a_job_removes_only_its_queued_tasks() -> None:
    h = Harness()
    loaded(h.cache, "a")
    running = entry("r", job="j1")
    h.record(h.lanes.submit(running, 0.0))
    h.record(h.lanes.submit(entry("q1", job="j1"), 0.0))
    h.record(h.lanes.submit(entry("q2", job="j2"), 0.0))
    assert len(h.lanes.drop(lambda e: e.job_id == "j1")) == 1
    assert [e.task for e in h.lanes.queue] == ["q2"]
    assert running in h.lanes.queue.running  # a running task is not interrupted


def test_the_version_moves_only_with_what_a_heartbeat_shows() -> None:
    h = Harness(demand={"b": 1.0})
    h.lanes.wanted = lambda now: ["b"]
    version = h.lanes.version
    loaded(h.cache, "b")  # nothing left to warm: a tick changes nothing
    h.record(h.lanes.tick(0.0))
    assert h.lanes.version == version
    h.record(h.lanes.submit(entry("t1", "b"), 0.1))
    assert h.lanes.version > version


def test_host_lane_work_does_not_move_the_version() -> None:
    h = Harness(host_lanes=1)
    version = h.lanes.version
    task = entry("host", None)
    h.record(h.lanes.submit(task, 0.0))
    h.record(h.lanes.ended(task, 1.0))
    assert h.runs() == ["host"] and h.lanes.version == version  # heartbeats show no host work


def test_a_task_is_shed_when_its_model_load_would_make_its_job_late() -> None:
    import dataclasses

    from compass.errors import DeadlineExceeded

    h = Harness()
    loaded(h.cache, "a")

    def due(task: str, model: str, deadline: float) -> QueuedTask:
        # 1 s of work left, and 2 s to copy its model in where it is not resident
        return dataclasses.replace(
            entry(task, model), deadline=deadline, remaining_s=1.0, fetch_s=2.0
        )

    first = due("resident", "a", 1.5)
    h.record(h.lanes.submit(first, 0.0))  # 1 s of work: in time
    assert h.runs() == ["resident"] and not h.failed
    h.record(h.lanes.ended(first, 0.1))
    h.take()
    h.record(h.lanes.submit(due("cold", "b", 2.5), 1.0))  # 1 s of work but 2 s of copying first
    assert h.runs() == [] and h.lanes.shed == 1
    ((task, error),) = h.failed
    assert task == "cold" and isinstance(error, DeadlineExceeded)
    h.record(h.lanes.submit(due("cold-but-early", "b", 9.0), 1.0))  # time for both: its model loads
    assert [s.model for s in h.take() if isinstance(s, LoadModel)] == ["b"]
    assert h.lanes.shed == 1


def test_queued_tasks_that_can_no_longer_make_it_are_shed_lower_priorities_first() -> None:
    import dataclasses

    from compass.errors import DeadlineExceeded

    h = Harness()
    loaded(h.cache, "a")
    busy = entry("busy")
    h.record(h.lanes.submit(busy, 0.0))  # holds the one lane until 1.0
    assert h.runs() == ["busy"]
    for task, level in (("low-1", 0), ("high-1", 1), ("low-2", 0), ("high-2", 1)):
        # 1 s each, 1 s of work left on the job's path, due at 3.5 s: after the busy task,
        # two of the four can start by 2.5 s
        late = dataclasses.replace(entry(task), level=level, deadline=3.5, remaining_s=1.0)
        h.record(h.lanes.submit(late, 0.0))
    assert not h.failed  # nothing is shed while no lane frees
    h.record(h.lanes.ended(busy, 1.0))
    h.record(h.lanes.fill(1.0))
    assert h.runs() == ["high-1"]
    assert sorted(task for task, _ in h.failed) == ["low-1", "low-2"]
    assert all(isinstance(error, DeadlineExceeded) for _, error in h.failed)
    assert "500.0 ms too late" in str(h.failed[0][1])  # 2 s of high work ahead of it at 1 s
    assert h.lanes.shed == 2 and len(h.lanes.queue) == 1  # high-2 still runs in time
