"""Scheduling at step boundaries: the rule (compass/core/preempt.py) and how the lanes carry it
out (suspend, resume first, state held in the cache, stopped past saving), with plain calls and
explicit times: no loop, no threads."""

from __future__ import annotations

from typing import Any

import pytest

from compass.cache.policy import CacheCore
from compass.cache.pool import SlabPool
from compass.core.events import StopTask, SuspendTask
from compass.core.lanes import CannotRun, Lanes, RunTask, Step
from compass.core.preempt import left_s, past_saving, preempts
from compass.core.queue import QueuedTask
from compass.errors import DeadlineExceeded

GB = 1_000_000_000


def task(
    name: str,
    *,
    job: str = "j1",
    model: str | None = "a",
    expected_s: float = 1.0,
    steps: int = 1,
    best_s: float = 1.0,
    arrival: float = 0.0,
    level: int = 0,
    deadline: float | None = None,
    state_bytes: int = 0,
) -> QueuedTask:
    return QueuedTask(
        job_id=job, attempt=0, workflow="wf", task=name, model=model, expected_s=expected_s,
        inputs={}, plan={}, ingress="w0", enqueued_at=arrival, arrival=arrival, level=level,
        deadline=deadline, remaining_s=expected_s, steps=steps, best_s=best_s,
        state_bytes=state_bytes,
    )  # fmt: skip


def generation(**kw: Any) -> QueuedTask:
    """A long step-wise task: 10 steps of 0.1 s, in a job whose best time is its own."""
    return task("gen", job="long", expected_s=1.0, steps=10, best_s=1.0, **kw)


def short(**kw: Any) -> QueuedTask:
    """A short plain task of another job (best 0.1 s)."""
    return task("det", job="short", expected_s=0.1, best_s=0.1, **kw)


# -- the rule ------------------------------------------------------------------------------


def test_a_short_job_behind_a_long_generation_preempts_it_by_slowdown() -> None:
    running, head = generation(), short(arrival=0.1)
    running.run_s = 1.0
    left = left_s(running, 1)  # after step 1 of 10: 0.9 s left
    assert left == pytest.approx(0.9)
    # waiting, the short job ends at 0.1 + 0.9 + 0.1: slowdown 10; the long one, delayed by
    # 0.1 s, ends at 1.1: slowdown 1.1
    assert preempts(running, left, head, 0.1)
    # a long job that has waited long already weighs more: delayed, its slowdown would be the
    # larger one (6.1 against the short job's 1.2 if it waits)
    waited = generation(arrival=-5.0)
    assert not preempts(waited, 0.01, short(arrival=0.98), 0.99)


def test_priority_wins_either_way_and_a_lower_level_never_preempts() -> None:
    running = generation(level=1)
    assert not preempts(running, 0.9, short(level=0), 0.1)
    assert preempts(generation(level=0), 0.01, short(level=1), 0.99)


def test_a_deadline_preempts_only_when_waiting_misses_it_and_starting_now_makes_it() -> None:
    running = generation()
    assert preempts(running, 0.9, short(deadline=0.5), 0.1)  # waiting ends at 1.1
    assert not preempts(running, 0.9, short(deadline=1.5), 0.1)  # makes it by waiting
    assert not preempts(running, 0.9, short(deadline=0.15), 0.1)  # hopeless either way
    # the head's model must be loaded first (0.5 s): then it misses anyway
    assert not preempts(running, 0.9, short(deadline=0.5), 0.1, switch_s=0.5)


def test_a_head_past_saving_never_preempts_whatever_its_priority() -> None:
    running = generation()
    assert preempts(running, 0.9, short(level=1, deadline=1.0), 0.1)
    # it could not make its deadline even starting now (0.1 + 0.1 > 0.15): shed, not run
    assert not preempts(running, 0.9, short(level=1, deadline=0.15), 0.1)


def test_the_running_jobs_own_deadline_is_kept() -> None:
    head = short(arrival=0.1)
    assert not preempts(generation(deadline=1.05), 0.9, head, 0.1)  # 0.1 s later misses it
    assert preempts(generation(deadline=1.2), 0.9, head, 0.1)


def test_past_saving_only_for_a_job_whose_deadline_no_longer_holds() -> None:
    assert past_saving(generation(deadline=0.5), 0.9, 0.1)
    assert not past_saving(generation(deadline=1.5), 0.9, 0.1)
    assert not past_saving(generation(), 0.9, 0.1)  # no deadline


# -- the lanes -------------------------------------------------------------------------------


class Harness:
    """One GPU lane over a 4 GB cache (slabs of 0.25 GB) holding 1 GB models a and b."""

    def __init__(self, *, preempt: bool = True, capacity_gb: float = 4.0) -> None:
        models = {"a": GB, "b": GB, "c": 2 * GB}
        self.cache = CacheCore(SlabPool(int(capacity_gb * GB), GB // 4), models)
        self.lanes = Lanes(lanes=1, cache=self.cache)
        self.lanes.preempt = preempt
        self.failed: list[tuple[str, Any]] = []

    def steps(self, steps: list[Step]) -> list[Any]:
        out = []
        for step in steps:
            if isinstance(step, CannotRun):
                self.failed.append((step.entry.task, step.error))
            else:
                out.append(step)
        return out

    def start(self, entry: QueuedTask, now: float) -> None:
        (run,) = self.steps(self.lanes.submit(entry, now))
        assert isinstance(run, RunTask) and run.entry is entry

    def load(self, *models: str) -> None:
        for model in models:
            plan = self.cache.plan_load(model)
            assert plan is not None
            self.cache.begin_load(model, plan)
            self.cache.finish_load(model)


def started(h: Harness, steps: list[Any]) -> list[str]:
    return [s.entry.task for s in steps if isinstance(s, RunTask)]


def test_a_suspended_task_gives_its_lane_and_resumes_first_where_it_stopped() -> None:
    h = Harness()
    h.load("a")
    gen, det, later = generation(), short(arrival=0.1), task("other", job="o", arrival=0.2)
    h.start(gen, 0.0)
    assert h.steps(h.lanes.submit(det, 0.1)) == []  # queued: the lane is busy
    decided = h.steps(h.lanes.stepped(gen, 1, 0.1))
    assert decided[0] == SuspendTask(gen) and started(h, decided) == ["det"]
    assert gen.done_steps == 1 and gen.expected_s == pytest.approx(0.9)
    assert h.cache.pins("a") == 2  # the generation's model stays pinned for it
    h.steps(h.lanes.submit(later, 0.2))  # it ranks ahead of nothing: the suspended one goes on
    resumed = h.steps(h.lanes.ended(det, 0.2)) + h.steps(h.lanes.fill(0.2))
    assert started(h, resumed) == ["gen"]
    (run,) = [s for s in resumed if isinstance(s, RunTask)]
    assert run.entry.done_steps == 1  # the adapter resumes it, never runs it again
    assert not h.lanes.suspended


def test_plain_tasks_and_a_core_without_preemption_are_never_suspended() -> None:
    for preempt, running in ((True, task("plain", expected_s=1.0)), (False, generation())):
        h = Harness(preempt=preempt)
        h.load("a")
        h.start(running, 0.0)
        h.steps(h.lanes.submit(short(arrival=0.1), 0.1))
        assert h.steps(h.lanes.stepped(running, 1, 0.1)) == []
        assert h.lanes.suspensions == 0


def test_one_suspended_task_a_lane_at_most() -> None:
    h = Harness()
    h.load("a")
    gen = generation()
    mid = task("mid", job="mid", expected_s=0.3, steps=3, best_s=0.3, arrival=0.1)
    h.start(gen, 0.0)
    h.steps(h.lanes.submit(mid, 0.1))
    assert isinstance(h.steps(h.lanes.stepped(gen, 1, 0.1))[0], SuspendTask)
    assert h.lanes.running() == [mid]
    # a shorter job now waits behind mid, which would be preempted but for gen held already
    h.steps(h.lanes.submit(task("tiny", job="tiny", expected_s=0.01, best_s=0.01,
                                arrival=0.15), 0.15))  # fmt: skip
    assert h.steps(h.lanes.stepped(mid, 1, 0.2)) == []
    assert list(h.lanes.suspended) == [gen]


def test_a_state_that_does_not_fit_refuses_the_preemption() -> None:
    h = Harness(capacity_gb=2.0)  # a (1 GB) leaves 1 GB
    h.load("a")
    gen = generation(state_bytes=GB // 2)  # 0.5 GB per step: 1 step fits, 3 do not
    h.start(gen, 0.0)
    h.steps(h.lanes.submit(short(arrival=0.3), 0.3))
    assert h.steps(h.lanes.stepped(gen, 3, 0.3)) == []
    assert h.lanes.refused_for_state == 1 and h.cache.state_bytes == 0
    h2 = Harness(capacity_gb=2.0)
    h2.load("a")
    gen2 = generation(state_bytes=GB // 2)
    h2.start(gen2, 0.0)
    h2.steps(h2.lanes.submit(short(arrival=0.1), 0.1))
    assert isinstance(h2.steps(h2.lanes.stepped(gen2, 1, 0.1))[0], SuspendTask)
    assert h2.cache.state_bytes == GB // 2  # held while it waits
    h2.steps(h2.lanes.ended(h2.lanes.running()[0], 0.2))
    assert started(h2, h2.steps(h2.lanes.fill(0.2))) == ["gen"]
    assert h2.cache.state_bytes == 0  # released when it resumes
    h2.cache.validate()


def test_a_head_whose_model_cannot_fit_beside_the_pinned_one_does_not_preempt() -> None:
    h = Harness(capacity_gb=2.0)
    h.load("a")
    gen = generation()
    h.start(gen, 0.0)
    h.steps(h.lanes.submit(task("det", job="short", model="c", expected_s=0.1, best_s=0.1,
                                arrival=0.1), 0.1))  # fmt: skip
    assert h.steps(h.lanes.stepped(gen, 1, 0.1)) == []  # c (2 GB) cannot load beside a


def test_a_dropped_suspended_task_stops_and_releases_its_model_and_state() -> None:
    h = Harness()
    h.load("a")
    gen = generation(state_bytes=GB // 4)
    h.start(gen, 0.0)
    h.steps(h.lanes.submit(short(arrival=0.1), 0.1))
    h.steps(h.lanes.stepped(gen, 1, 0.1))
    dropped = h.lanes.drop_job("long")
    assert dropped == [gen]
    released = h.steps(h.lanes.release(dropped, 0.15))
    assert StopTask((gen,)) in released
    assert h.cache.pins("a") == 1 and h.cache.state_bytes == 0  # only the short task's pin


def test_a_generation_past_saving_is_stopped_at_its_step_and_its_job_told() -> None:
    h = Harness()
    h.load("a")
    gen = generation(deadline=1.05)
    h.start(gen, 0.0)
    decided = h.steps(h.lanes.stepped(gen, 1, 0.3))  # a slow step: 0.9 s left, past 1.05
    assert decided == [StopTask((gen,))]
    ((name, error),) = h.failed
    assert name == "gen" and isinstance(error, DeadlineExceeded)
    assert h.steps(h.lanes.stepped(generation(deadline=2.0), 1, 0.1)) == []


def test_a_higher_priority_waits_for_the_step_under_way_only_where_the_worker_preempts() -> None:
    for preempt, lifted in ((True, 0.1), (False, 1.0)):
        h = Harness(preempt=preempt)
        h.load("a")
        h.start(generation(), 0.0)  # 1 s of 10 steps, running
        queue = h.lanes.queue
        assert queue.wait_s(0.0) == pytest.approx(1.0)  # its own level waits for all of it
        assert queue.wait_s(0.0, level=1) == pytest.approx(lifted)
        assert queue.lifted_s(0.0) == pytest.approx((lifted,))


def test_a_deadline_that_preempts_is_not_shed_behind_the_task_it_suspended() -> None:
    """The suspended generation goes back to the queue ahead of the head that preempted it (it
    arrived first): shedding the queue then would find the head late behind it, drop it, and
    leave its lane to nobody (a KeyError once, in a goodput run with shedding on)."""
    h = Harness()
    h.load("a")
    gen = generation(arrival=0.0)  # no deadline: it ranks by its enqueue time, ahead of 0.5
    h.start(gen, 0.0)
    head = short(arrival=0.1, deadline=0.5)  # waiting for the 0.9 s left misses it
    h.steps(h.lanes.submit(head, 0.1))
    decided = h.steps(h.lanes.stepped(gen, 1, 0.1))
    assert [type(s).__name__ for s in decided] == ["SuspendTask", "RunTask"]
    assert decided[1].entry is head and not h.failed


def test_a_suspended_task_keeps_when_it_was_queued_and_counts_its_waits_apart() -> None:
    # queued at 0.0 behind a short job, first run 0.1-0.3, suspended at 0.3 for another short
    # job, resumed at 0.4: 0.1 s in the queue before its first step, 0.1 s suspended
    h = Harness()
    h.load("a")
    first, gen, det = short(), generation(), short(arrival=0.25)
    h.start(first, 0.0)
    h.steps(h.lanes.submit(gen, 0.0))
    assert started(h, h.steps(h.lanes.ended(first, 0.1)) + h.steps(h.lanes.fill(0.1))) == ["gen"]
    assert gen.run_waits() == pytest.approx((0.1, 0.0))
    h.steps(h.lanes.stepped(gen, 1, 0.2))
    h.steps(h.lanes.submit(det, 0.25))
    assert started(h, h.steps(h.lanes.stepped(gen, 2, 0.3))) == ["det"]
    # what it waited stays truthful while it is suspended: its first wait from its enqueue
    # (never reset), its rank and its wait to resume from the suspension
    assert (gen.enqueued_at, gen.suspended_at) == (0.0, 0.3)
    assert gen.run_waits() == pytest.approx((0.1, 0.0))  # the run that just gave way
    assert started(h, h.steps(h.lanes.ended(det, 0.4)) + h.steps(h.lanes.fill(0.4))) == ["gen"]
    assert gen.run_waits() == pytest.approx((0.0, 0.1))
    assert (gen.queued_s, gen.suspended_s) == pytest.approx((0.1, 0.1))
    assert gen.first_started_at == pytest.approx(0.1) and gen.started_at == 0.4
