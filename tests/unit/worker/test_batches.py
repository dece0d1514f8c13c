"""Batch formation in the queue and the lanes: which queued tasks run together, what the queue's
expected work counts, what the view is told, and when a batched lane is free again.

Driven with plain calls and explicit times (no loop, no threads); each test names the rule it
guards and fails if that rule is broken.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest

from compass.cache.policy import CacheCore
from compass.cache.pool import SlabPool
from compass.core.lanes import CannotRun, Lanes, RunTask, Step
from compass.core.queue import SIMILAR_RUNS, QueuedTask, TaskQueue
from compass.errors import CompassError
from compass.sched.view import Heartbeat
from compass.workflow.dag import batch_limit, linear_scale

GB = 1_000_000_000
MILD = linear_scale(0.15, 8)


def entry(
    task: str,
    model: str | None = "a",
    *,
    job: str = "j1",
    at: float = 0.0,
    group: str | None = "a",
    size: int = 4,
    scale: tuple[float, ...] = MILD,
    expected_s: float = 1.0,
) -> QueuedTask:
    return QueuedTask(
        job_id=job,
        attempt=0,
        workflow="wf",
        task=task,
        model=model,
        expected_s=expected_s,
        inputs={},
        plan={},
        ingress="w0",
        enqueued_at=at,
        group=group,
        max_batch=size,
        scale=scale,
    )


class Harness:
    """One GPU lane over a cache where models a and b (1 GB each) are ``resident``."""

    def __init__(self, resident: tuple[str, ...] = ("a", "b"), **kwargs: Any) -> None:
        self.cache = CacheCore(SlabPool(10 * GB, GB // 4), {"a": GB, "b": GB})
        for model in resident:
            plan = self.cache.plan_load(model)
            assert plan is not None
            self.cache.begin_load(model, plan)
            self.cache.finish_load(model)
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

    def runs(self) -> list[RunTask]:
        steps, self.out[:] = list(self.out), []
        return [s for s in steps if isinstance(s, RunTask)]

    def hold_lane(self) -> QueuedTask:
        """Start a task of model b that never batches, so what comes next queues."""
        busy = entry("busy", "b", group=None, job="j0")
        self.record(self.lanes.submit(busy, 0.0))
        assert len(self.runs()) == 1
        return busy


def test_a_lane_takes_the_queued_tasks_of_its_group_up_to_the_largest_batch() -> None:
    h = Harness()
    first = h.hold_lane()
    queued = [entry(f"t{i}", job=f"j{i}", at=0.1 * i) for i in range(1, 7)]
    other = entry("other", "b", group=None, job="jx", at=0.15)
    h.record(h.lanes.submit(queued[0], 0.1))
    h.record(h.lanes.submit(other, 0.15))
    for e in queued[1:]:
        h.record(h.lanes.submit(e, e.enqueued_at))
    h.record(h.lanes.ended(first, 1.0))
    h.record(h.lanes.fill(1.0))
    (run,) = h.runs()
    # t1 leads (first in the queue); its mates come in queue order, overtaking "other"
    assert [e.task for e in run.entries] == ["t1", "t2", "t3", "t4"]
    assert run.lane == 0
    assert [e.task for e in h.lanes.queue] == ["other", "t5", "t6"]
    assert h.cache.pins("a") == 1  # one pin for the whole batch


def test_a_batched_lane_is_free_only_when_every_entry_has_ended() -> None:
    h = Harness()
    busy = h.hold_lane()
    batch = [entry(f"t{i}", job=f"j{i}") for i in range(3)]
    for e in batch:
        h.record(h.lanes.submit(e, 0.1))
    later = entry("later", "b", group=None, job="j9")
    h.record(h.lanes.submit(later, 0.2))
    h.record(h.lanes.ended(busy, 1.0))
    h.record(h.lanes.fill(1.0))
    (run,) = h.runs()
    assert len(run.entries) == 3
    h.record(h.lanes.ended(batch[0], 2.0))
    h.record(h.lanes.fill(2.0))
    h.record(h.lanes.ended(batch[1], 2.0))
    h.record(h.lanes.fill(2.0))
    assert h.runs() == [] and h.lanes.busy == 1 and h.cache.pins("a") == 1
    h.record(h.lanes.ended(batch[2], 2.0))
    h.record(h.lanes.fill(2.0))
    assert [r.entry.task for r in h.runs()] == ["later"]
    assert h.cache.pins("a") == 0  # the batch's pin released once


def test_no_gain_never_batches_and_the_gain_bounds_the_batch() -> None:
    # a batch of b costing b runs only delays its first items: never worth it
    assert batch_limit(linear_scale(1.0, 8), 8) == 1
    assert batch_limit(MILD, 8) == 8
    assert batch_limit(MILD, 3) == 3
    # a curve whose fourth item costs a whole run stops at three
    assert batch_limit((1.0, 1.2, 1.4, 2.4, 2.5), 5) == 3
    q = TaskQueue()
    for i in range(3):
        q.push(entry(f"t{i}", job=f"j{i}", scale=linear_scale(1.0, 8)))
    lead = q.pop(0.0)
    assert lead is not None and q.take(lead, 0.0) == []


def test_tasks_of_other_groups_and_ungrouped_tasks_never_join_a_batch() -> None:
    q = TaskQueue()
    q.push(entry("t1", job="j1"))
    q.push(entry("t2", "b", group="b", job="j2"))
    q.push(entry("t3", group=None, job="j3"))
    q.push(entry("t4", job="j4"))
    lead = q.pop(0.0)
    assert lead is not None
    assert [e.task for e in q.take(lead, 0.5)] == ["t4"]
    assert [e.task for e in q] == ["t2", "t3"]


def test_the_queue_counts_a_group_as_the_batches_it_will_form() -> None:
    q = TaskQueue()
    for i in range(6):
        q.push(entry(f"t{i}", job=f"j{i}", size=4))
    q.push(entry("solo", "b", group=None, expected_s=2.0))
    # six mild tasks in batches of 4 and 2: 1.45 + 1.15 runs of 1 s; plus the 2 s task
    assert q.queued_s == pytest.approx(1.45 + 1.15 + 2.0)
    lead = q.pop(10.0)
    assert lead is not None
    mates = q.take(lead, 10.0)
    assert len(mates) == 3
    assert lead.run_s == pytest.approx(1.45)
    assert q.queued_s == pytest.approx(1.15 + 2.0)
    # the running batch counts once in the wait, as its expected time
    assert q.wait_s(10.5) == pytest.approx(1.15 + 2.0 + 0.95)
    assert q.run_ends() == [pytest.approx(11.45)]
    q.drop(lambda e: e.task == "t4")
    assert q.queued_s == pytest.approx(1.0 + 2.0)


def test_the_view_is_told_per_model_how_many_wait_and_when_the_first_starts() -> None:
    q = TaskQueue()
    q.push(entry("head", "b", group=None, expected_s=2.0, at=0.0))
    q.push(entry("t1", job="j1", at=1.0))
    q.push(entry("t2", job="j2", at=2.0))
    assert q.batchable(0.0) == {"a": (2, 2.0)}
    running = q.pop(0.0)
    assert running is not None
    # 0.5 s into the 2 s task: the batch of a starts in 1.5 s (over two lanes: half that)
    assert q.batchable(0.5) == {"a": (2, 1.5)}
    assert q.batchable(0.5, lanes=2) == {"a": (2, 0.75)}
    q.push(entry("plain", "b", group=None, at=3.0))
    assert TaskQueue().batchable(0.0) == {}
    # tasks that never batch are not reported
    only_plain = TaskQueue()
    only_plain.push(entry("p", group=None))
    assert only_plain.batchable(0.0) == {}


def test_tasks_that_queue_while_the_leads_model_loads_join_its_batch() -> None:
    h = Harness(resident=("b",))
    lead = entry("t0", job="j0")
    h.record(h.lanes.submit(lead, 0.0))
    assert h.runs() == [] and h.cache.is_loading("a")
    mates = [entry(f"t{i}", job=f"j{i}", at=0.1 * i) for i in range(1, 3)]
    for e in mates:
        h.record(h.lanes.submit(e, e.enqueued_at))
    h.record(h.lanes.loaded("a", 0.5, 0.5))
    (run,) = h.runs()
    assert [e.task for e in run.entries] == ["t0", "t1", "t2"]
    assert run.fetch_s == pytest.approx(0.5) and run.hit is False


def test_a_timed_out_batch_is_one_stuck_run_that_keeps_its_pin_until_it_returns() -> None:
    h = Harness()
    busy = h.hold_lane()
    batch = [entry(f"t{i}", job=f"j{i}") for i in range(3)]
    for e in batch:
        h.record(h.lanes.submit(e, 0.1))
    h.record(h.lanes.ended(busy, 1.0))
    h.record(h.lanes.fill(1.0))
    (run,) = h.runs()
    assert len(run.entries) == 3
    for e in batch:
        h.record(h.lanes.ended(e, 5.0, still_running=True))
    assert h.lanes.stuck == 1 and h.cache.pins("a") == 1 and h.lanes.busy == 0
    h.record(h.lanes.returned(batch[0], 6.0))
    assert h.lanes.stuck == 0 and h.cache.pins("a") == 0


def test_heartbeats_carry_the_queued_batches_and_none_from_a_degraded_worker() -> None:
    from compass.config import WorkerConfig
    from compass.worker.gossip import Gossip
    from compass.workflow import Profiles

    h = Harness()
    h.hold_lane()  # model b, expected 1 s, started at 0
    for i in (1, 2, 3):
        h.record(h.lanes.submit(entry(f"t{i}", job=f"j{i}", at=0.1 * i), 0.1 * i))
    profiles = Profiles(h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, net_fixed_s=0.0,
                        model_sizes={"a": GB, "b": GB}, workflows=(), staged=False)  # fmt: skip
    gossip = Gossip(
        "w0", WorkerConfig(name="w0"), profiles=profiles, clock=lambda: 0.25, tick=lambda: None
    )  # fmt: skip
    gossip.attach(types.SimpleNamespace(lanes=h.lanes, h2d_measured=False))
    state = gossip.own_state(0.25)
    # three tasks of a wait to batch; the first starts when the running 1 s task ends
    assert dict(state.batches) == {"a": (3, 0.75)}
    # the batches travel in the heartbeat and come back out of it
    assert dict(Heartbeat.from_wire(state.to_wire()).batches) == {"a": (3, 0.75)}
    h.lanes.stuck = h.lanes.max_stuck  # degraded: it takes no GPU work, so no batch to join
    degraded = gossip.own_state(0.25)
    assert degraded.batches == {} and degraded.wait_s >= 1e6
    # made without the constructor's checks (Heartbeat.own): what the checks would make
    for own in (state, degraded):
        checked = Heartbeat(**{f.name: getattr(own, f.name) for f in dataclasses.fields(own)})
        assert own == checked and type(own.batches) is type(checked.batches)
        assert own.lifted_s and all(type(w) is float for w in own.lifted_s)


def test_a_batch_takes_only_mates_whose_runs_are_within_twice_each_other() -> None:
    # a batch runs as long as its longest item: a 0.3 s task would wait for a 1 s lead, and a
    # 1.5 s one would make the 0.6 s mate wait 2.5 times its run
    assert SIMILAR_RUNS == 2.0
    q = TaskQueue()
    lead = entry("lead", job="j0", expected_s=1.0)
    q.push(lead)
    lengths = {"t1": 0.3, "t2": 0.6, "t3": 1.5, "t4": 1.1}
    for i, (name, seconds) in enumerate(lengths.items(), start=1):
        q.push(entry(name, job=f"j{i}", at=0.1 * i, expected_s=seconds))
    assert q.pop(1.0) is lead
    mates = q.take(lead, 1.0)
    assert [e.task for e in mates] == ["t2", "t4"]
    assert lead.run_s == pytest.approx(1.1 * 1.3)  # the longest, times the curve for 3
    assert [e.task for e in q] == ["t1", "t3"]


def test_a_batch_takes_no_mate_that_would_make_a_member_miss_its_deadline() -> None:
    import dataclasses

    queue = TaskQueue()
    lead = dataclasses.replace(entry("lead", job="j1"), deadline=1.1, remaining_s=1.0)
    relaxed = entry("relaxed", job="j2", at=5.0)  # ranks after the lead (its deadline 1.1)
    queue.push(lead)
    queue.push(relaxed)
    popped = queue.pop(0.0)
    assert popped is lead
    # alone the lead ends at 1.0; with a mate the batch runs 1.15 s: past the lead's 1.1
    assert queue.take(lead, 0.0) == [] and len(queue) == 1
    # a mate whose own deadline the batch would miss stays out too; one in time joins
    queue = TaskQueue()
    lead = entry("lead", job="j1")
    queue.push(lead)
    queue.push(dataclasses.replace(entry("tight", job="j2", at=1.0), deadline=1.1, remaining_s=1.0))
    queue.push(dataclasses.replace(entry("easy", job="j3", at=2.0), deadline=9.0, remaining_s=3.0))
    assert queue.pop(0.0) is lead
    assert [m.task for m in queue.take(lead, 0.0)] == ["easy"]
