"""TaskQueue: priority order (FIFO without priorities), the wait total, look-ahead models."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given
from hypothesis import strategies as st

from compass.core.queue import QueuedTask, TaskQueue


def entry(
    name: str,
    *,
    job: str = "j",
    seconds: float = 1.0,
    model: str | None = "m",
    at: float = 0.0,
    priority: float | None = None,
    attempt: int = 0,
) -> QueuedTask:
    return QueuedTask(
        job_id=job,
        attempt=attempt,
        workflow="wf",
        task=name,
        model=model,
        expected_s=seconds,
        inputs={},
        plan={},
        ingress="w0",
        enqueued_at=at,
        priority=priority,
    )


def drain(queue: TaskQueue) -> list[str]:
    names = []
    while (e := queue.pop(0.0)) is not None:
        names.append(e.task)
        queue.finish(e)
    return names


def test_without_priorities_the_queue_is_fifo() -> None:
    queue = TaskQueue()
    for i, name in enumerate("abcd"):
        queue.push(entry(name, at=float(i)))
    assert [e.task for e in queue] == list("abcd")
    assert drain(queue) == list("abcd")


def test_the_oldest_job_runs_first_and_ties_keep_arrival_order() -> None:
    queue = TaskQueue()
    queue.push(entry("young", priority=5.0, at=1.0))
    queue.push(entry("old-1", priority=1.0, at=2.0))
    queue.push(entry("old-2", priority=1.0, at=3.0))
    queue.push(entry("middle", priority=3.0, at=4.0))
    assert [e.task for e in queue] == ["old-1", "old-2", "middle", "young"]
    assert queue.upcoming_models() == ["m"] * 4
    assert drain(queue) == ["old-1", "old-2", "middle", "young"]


def test_a_task_without_priority_ranks_at_its_enqueue_time() -> None:
    queue = TaskQueue()
    queue.push(entry("fifo-at-2", at=2.0))
    queue.push(entry("job-from-1", priority=1.0, at=3.0))
    queue.push(entry("job-from-9", priority=9.0, at=4.0))
    assert drain(queue) == ["job-from-1", "fifo-at-2", "job-from-9"]


def test_upcoming_models_lists_running_in_start_order_then_the_queue_order() -> None:
    queue = TaskQueue()
    for name, model, prio in (("r1", "x", 0.0), ("r2", "y", 1.0), ("r3", "z", 2.0)):
        queue.push(entry(name, model=model, priority=prio))
    for _ in range(3):
        queue.pop(0.0)  # three lanes
    queue.push(entry("late", model="b", priority=9.0))
    queue.push(entry("early", model="a", priority=4.0))
    queue.push(entry("none", model=None, priority=5.0))
    # running tasks in the order they started (deterministic), then by priority
    assert queue.upcoming_models() == ["x", "y", "z", "a", "b"]
    assert {e.task for e in queue.running} == {"r1", "r2", "r3"}


def test_wait_counts_queued_work_and_what_is_left_of_running_tasks() -> None:
    queue = TaskQueue()
    queue.push(entry("a", seconds=2.0))
    queue.push(entry("b", seconds=0.5))
    assert queue.wait_s(0.0) == 2.5
    running = queue.pop(0.0)
    assert running is not None and running.task == "a"
    assert queue.wait_s(0.5) == 0.5 + 1.5
    # overran its estimate: nothing left, never negative
    assert queue.wait_s(3.0) == 0.5
    queue.finish(running)
    assert queue.wait_s(3.0) == 0.5


def test_drop_job_keeps_the_others_in_order() -> None:
    queue = TaskQueue()
    queue.push(entry("a", job="keep", priority=2.0))
    queue.push(entry("b", job="drop", priority=1.0))
    queue.push(entry("c", job="keep", priority=0.5))
    queue.push(entry("d", job="drop", priority=3.0, attempt=1))
    dropped = queue.drop_job("drop", below_attempt=1)
    assert [e.task for e in dropped] == ["b"]
    assert queue.wait_s(0.0) == 3.0
    assert [e.task for e in queue] == ["c", "a", "d"]
    assert len(queue.drop_job("drop")) == 1
    assert drain(queue) == ["c", "a"]


@given(st.lists(st.floats(min_value=1e-6, max_value=1e6, allow_subnormal=False), max_size=40))
def test_the_wait_total_never_drifts_below_zero(seconds: list[float]) -> None:
    queue = TaskQueue()
    for i, s in enumerate(seconds):
        queue.push(entry(str(i), seconds=s, priority=float(i % 3)))
    while (e := queue.pop(0.0)) is not None:
        assert queue.wait_s(0.0) >= 0.0
        queue.finish(e)
    assert queue.wait_s(0.0) == 0.0


def test_a_higher_priority_runs_first_then_each_level_by_its_jobs_deadlines() -> None:
    queue = TaskQueue()
    queue.push(entry("low-soon", priority=0.5, at=0.0))
    queue.push(dataclasses.replace(entry("high-late", at=1.0), level=1, deadline=9.0))
    queue.push(dataclasses.replace(entry("high-soon", at=2.0), level=1, deadline=3.0))
    # within a level the job's own deadline ranks a task where the internal one would
    queue.push(dataclasses.replace(entry("low-deadline", priority=8.0, at=3.0), deadline=0.2))
    assert drain(queue) == ["high-soon", "high-late", "low-deadline", "low-soon"]


def raised(name: str, level: int, seconds: float = 1.0, **kw: object) -> QueuedTask:
    return dataclasses.replace(entry(name, seconds=seconds), level=level, **kw)  # type: ignore[arg-type]


def test_a_higher_priority_waits_only_for_running_work_and_its_own_level_and_above() -> None:
    queue = TaskQueue()
    queue.push(entry("running", seconds=2.0))
    assert queue.pop(0.0) is not None  # 2 s of running work, ending at 2.0
    queue.push(entry("low", seconds=5.0))
    queue.push(raised("one", 1, 0.5))
    queue.push(raised("three", 3, 0.25))
    at = 1.0  # 1 s of the running task left
    assert queue.wait_s(at) == 1.0 + 5.0 + 0.5 + 0.25
    assert queue.wait_s(at, 1) == 1.0 + 0.5 + 0.25
    assert queue.wait_s(at, 2) == queue.wait_s(at, 3) == 1.0 + 0.25
    assert queue.wait_s(at, 9) == 1.0
    # what heartbeats carry: levels 1..3, the last holding for every level above
    assert queue.lifted_s(at) == (1.75, 1.25, 1.25)
    assert queue.raised_s() == {1: 0.5, 3: 0.25}
    assert drain(queue) == ["three", "one", "low"]
    assert queue.raised_s() == {} and queue.lifted_s(at) == (1.0,)  # "running" is left


def test_an_empty_queue_lifts_nothing_but_the_running_work() -> None:
    queue = TaskQueue()
    assert queue.lifted_s(0.0) == (0.0,)
    queue.push(entry("low", seconds=3.0))
    assert queue.lifted_s(0.0) == (0.0,)  # a level-1 task would overtake it
    dropped = queue.drop(lambda e: True)
    assert [e.task for e in dropped] == ["low"] and queue.wait_s(0.0, 1) == 0.0


def test_late_finds_queued_tasks_that_cannot_make_their_deadline_lowest_levels_first() -> None:
    queue = TaskQueue()
    # four 1 s tasks, each with 1 s of work left on its job's path and a deadline at 2.5 s:
    # only the first two in queue order can start by 1.5 s
    for name, level in (("low-a", 0), ("high-a", 1), ("low-b", 0), ("high-b", 1)):
        queue.push(raised(name, level, deadline=2.5, remaining_s=1.0))
    late = queue.late(0.0)
    assert [e.task for e, _ in late] == ["low-a", "low-b"]  # the high ones run first
    # a late task's work does not hold up those behind it
    queue = TaskQueue()
    queue.push(raised("doomed", 1, 5.0, deadline=1.0, remaining_s=5.0))
    queue.push(raised("fine", 0, 1.0, deadline=1.5, remaining_s=1.0))
    assert [e.task for e, _ in queue.late(0.0)] == ["doomed"]


def test_late_spreads_the_work_ahead_over_the_lanes_and_spares_finish_anyway_jobs() -> None:
    queue = TaskQueue()
    for name in ("a", "b", "c"):
        queue.push(raised(name, 0, deadline=2.5, remaining_s=1.0))
    # ranks after them, and starts too late, but its job finishes anyway
    queue.push(raised("stubborn", 0, deadline=2.6, remaining_s=1.0, finish=True))
    queue.push(entry("no-deadline", at=9.0))
    assert [e.task for e, _ in queue.late(0.0, lanes=1)] == ["c"]
    assert queue.late(0.0, lanes=2) == []


def test_a_job_is_looked_for_only_where_it_has_queued_tasks() -> None:
    # holds_job follows every way in and out (push, pop, drop, drop_job): drop_job finds what
    # a look through the queue finds, and holds_job answers what such a look would
    rng = random.Random(5)
    queue = TaskQueue()
    jobs = [f"j{i}" for i in range(4)]
    for n in range(3_000):
        op = rng.random()
        if op < 0.45:
            queue.push(entry(f"t{n}", job=rng.choice(jobs), attempt=rng.randrange(2), at=n))
        elif op < 0.7:
            popped = queue.pop(float(n))
            if popped is not None:
                queue.finish(popped)
        elif op < 0.85:
            job, below = rng.choice(jobs), rng.choice((None, 1))
            expected = [
                e for e in queue if e.job_id == job and (below is None or e.attempt < below)
            ]
            dropped = queue.drop_job(job, below)
            assert sorted(e.task for e in dropped) == sorted(e.task for e in expected)
        else:
            doomed = {id(e) for e in queue if rng.random() < 0.3}
            queue.drop(lambda e: id(e) in doomed)  # noqa: B023 (called here, at once)
        for job in jobs:
            assert queue.holds_job(job) == any(e.job_id == job for e in queue)
