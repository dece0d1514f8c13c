"""The worker's step batches (compass/worker/batchsteps.py): a real step function called once a
step on the seats taken now, members joining and leaving between two calls; and the emulated
batch's timers. The executor alone, in this test's loop, with the core's instructions made by
hand."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import compass
from compass.config import WorkerConfig
from compass.core.events import JoinRun, RunTask, StopTask, SuspendTask
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.errors import WorkflowError
from compass.worker.executor import TaskRunner, TaskStopped
from compass.workflow.dag import Task, TaskProfile, linear_scale


class Counter:
    """A step function: each seat counts to its job's ``x``, one a step; its final output is
    the count. Remembers how many seats each call had; the first call waits for ``gate``."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.first = threading.Event()

    def __call__(self, model: Any, seats: list[compass.Seat]) -> list[Any]:
        self.calls.append(len(seats))
        if len(self.calls) == 1:
            self.first.set()
            self.gate.wait(10)
        items: list[Any] = []
        for seat in seats:
            seat.state = (seat.state or 0) + 1
            if seat.inputs["x"] < 0:
                items.append(ValueError(f"job {seat.job}: x must be positive"))
            else:
                items.append(compass.Done(seat.state) if seat.state >= seat.inputs["x"] else 0)
        return items


def make_task(fn: Any, *, emulated: bool = False) -> Task:
    profile = TaskProfile(exec_ms=40, output_bytes=8, steps=4, batch_scale=linear_scale(0.1, 4))
    return Task("t", "m", (), profile, fn=None if emulated else compass.step_batch(fn), batch=4)


class Runner:
    def __init__(self, task: Task, *, emulate: bool = False) -> None:
        self.outcomes: asyncio.Queue[TaskOutcome] = asyncio.Queue()
        self.runner = TaskRunner(
            lookup=lambda wf, name: task,
            module_of=lambda model: None,
            config=WorkerConfig(name="w", emulate=emulate, time_scale=0.1),
            on_outcome=self.outcomes.put_nowait,
            on_returned=lambda entry: None,
        )

    def entry(self, job: str, x: int) -> QueuedTask:
        return QueuedTask(job, 0, "flow", "t", "m", 0.04, {"x": x}, {"t": "w"}, "w", 0.0,
                          group="m/steps", max_batch=4, steps=4)  # fmt: skip

    async def outcome(self) -> TaskOutcome:
        return await asyncio.wait_for(self.outcomes.get(), 30)


@pytest.mark.asyncio
async def test_a_job_joins_a_running_step_batch_between_two_calls_and_each_leaves_when_done() -> (
    None
):
    counter = Counter()
    run = Runner(make_task(counter))
    first, second = run.entry("j1", 3), run.entry("j2", 5)
    run.runner.start(RunTask(first, 0, False, 0.0, True))
    assert await asyncio.to_thread(counter.first.wait, 10)
    run.runner.between_steps(JoinRun(first, (second,), 0))  # seated at the next step
    counter.gate.set()
    done = {(o := await run.outcome()).entry.job_id: o for _ in range(2)}
    assert done["j1"].error is None and done["j1"].output == 3 and done["j1"].steps == 3
    assert done["j2"].error is None and done["j2"].output == 5 and done["j2"].steps == 5
    # j1's first step alone, two with j2, then j2's last three alone: one call a step
    assert counter.calls == [1, 2, 2, 1, 1, 1]
    # one run of two, counted under its first member
    assert (done["j1"].batch, done["j2"].batch) == (2, 2)
    assert done["j1"].first and not done["j2"].first


@pytest.mark.asyncio
async def test_an_async_step_function_is_awaited_on_one_loop_of_its_batch_thread() -> None:
    loops: set[int] = set()

    async def counts(model: Any, seats: list[compass.Seat]) -> list[Any]:
        await asyncio.sleep(0)
        loops.add(id(asyncio.get_running_loop()))
        for seat in seats:
            seat.state = (seat.state or 0) + 1
        return [compass.Done(s.state) if s.state >= s.inputs["x"] else s.state for s in seats]

    run = Runner(make_task(counts))
    a, b = run.entry("a", 2), run.entry("b", 4)
    run.runner.start(RunTask(a, 0, False, 0.0, True, (b,)))
    done = {(o := await run.outcome()).entry.job_id: o for _ in range(2)}
    assert (done["a"].error, done["b"].error) == (None, None)
    assert (done["a"].output, done["b"].output) == (2, 4)
    assert (done["a"].steps, done["b"].steps) == (2, 4)
    assert len(loops) == 1  # the batch's own loop, kept from step to step


@pytest.mark.asyncio
async def test_an_exception_item_fails_its_seat_alone_and_a_stopped_member_leaves() -> None:
    counter = Counter()
    run = Runner(make_task(counter))
    bad, good, stopped = run.entry("bad", -1), run.entry("good", 4), run.entry("stop", 50)
    run.runner.start(RunTask(good, 0, False, 0.0, True, (bad, stopped)))
    assert await asyncio.to_thread(counter.first.wait, 10)
    run.runner.between_steps(StopTask((stopped,)))
    counter.gate.set()
    done = {(o := await run.outcome()).entry.job_id: o for _ in range(3)}
    assert isinstance(done["bad"].error, ValueError) and "x must be positive" in str(
        done["bad"].error
    )
    assert isinstance(done["stop"].error, TaskStopped) and done["stop"].stopped
    assert done["stop"].steps == 1  # the step under way when it was stopped
    assert done["good"].output == 4
    assert counter.calls == [3, 1, 1, 1]


@pytest.mark.asyncio
async def test_a_raise_fails_every_seated_job_and_a_wrong_count_says_so() -> None:
    def raises(model: Any, seats: list[compass.Seat]) -> list[Any]:
        raise RuntimeError("out of memory")

    run = Runner(make_task(raises))
    a, b = run.entry("a", 2), run.entry("b", 2)
    run.runner.start(RunTask(a, 0, False, 0.0, True, (b,)))
    errors = [str((await run.outcome()).error) for _ in range(2)]
    assert errors == ["out of memory", "out of memory"]

    def short(model: Any, seats: list[compass.Seat]) -> list[Any]:
        return [compass.Done(1)]

    run = Runner(make_task(short))
    a, b = run.entry("a", 2), run.entry("b", 2)
    run.runner.start(RunTask(a, 0, False, 0.0, True, (b,)))
    outcome = await run.outcome()
    assert isinstance(outcome.error, WorkflowError)
    assert "returned 1 items for 2 seats" in str(outcome.error)


@pytest.mark.asyncio
async def test_an_emulated_step_batch_runs_its_steps_on_timers_and_seats_joiners() -> None:
    run = Runner(make_task(None, emulated=True), emulate=True)
    first, second = run.entry("j1", 0), run.entry("j2", 0)
    run.runner.start(RunTask(first, 0, False, 0.0, True))
    run.runner.between_steps(JoinRun(first, (second,), 0))
    done = {(o := await run.outcome()).entry.job_id: o for _ in range(2)}
    assert all(o.error is None and o.steps == 4 for o in done.values())
    assert len(done["j1"].output) == 8  # the declared output size


@pytest.mark.asyncio
async def test_a_suspended_member_is_parked_and_resumes_where_it_stopped() -> None:
    counter = Counter()
    run = Runner(make_task(counter))
    entry = run.entry("j1", 6)
    run.runner.start(RunTask(entry, 0, False, 0.0, True))
    assert await asyncio.to_thread(counter.first.wait, 10)
    run.runner.between_steps(SuspendTask(entry))  # during its first step
    counter.gate.set()
    await asyncio.sleep(0.2)
    assert run.outcomes.empty() and counter.calls == [1]  # parked after that step
    entry.done_steps = 1
    run.runner.start(RunTask(entry, 1, False, 0.0, True))  # resumed, on another lane
    outcome = await run.outcome()
    assert outcome.error is None and outcome.output == 6  # its state was kept
    assert len(counter.calls) == 6 and outcome.lane == 1


@pytest.mark.asyncio
async def test_a_step_past_the_timeout_fails_the_seated_jobs_once_and_keeps_the_model() -> None:
    release = threading.Event()
    calls: list[int] = []

    def stuck(model: Any, seats: list[compass.Seat]) -> list[Any]:
        calls.append(len(seats))
        if len(calls) == 2:
            release.wait(10)  # the second step hangs
        return [0] * len(seats)

    task = make_task(stuck)
    task = Task("t", "m", (), task.profile, fn=task.fn, batch=4, timeout_ms=300)
    run = Runner(task)
    returned: list[QueuedTask] = []
    run.runner._on_returned = returned.append
    a, b = run.entry("a", 9), run.entry("b", 9)
    run.runner.start(RunTask(a, 0, False, 0.0, True, (b,)))
    done = [await run.outcome() for _ in range(2)]
    assert all("past its timeout" in str(o.error) for o in done)
    assert [o.still_running for o in done].count(True) == 1  # one stuck thread, its model kept
    release.set()
    await asyncio.sleep(0.2)
    assert run.outcomes.empty()  # the thread returned: nothing reported twice
    assert returned == [a]  # and the worker heard it, so the model is unpinned


@pytest.mark.asyncio
async def test_a_join_after_the_batch_emptied_starts_it_anew_under_the_same_first_task() -> None:
    counter = Counter()
    counter.gate.set()
    run = Runner(make_task(counter))
    first = run.entry("a", 1)
    run.runner.start(RunTask(first, 0, False, 0.0, True))
    assert (await run.outcome()).output == 1
    await asyncio.sleep(0.05)  # its thread closed the batch
    assert not run.runner.batches._batches
    # the core still counted the batch when it added these (their JoinRuns were under way)
    second, third = run.entry("b", 3), run.entry("c", 3)
    run.runner.between_steps(JoinRun(first, (second,), 0))
    run.runner.between_steps(JoinRun(first, (third,), 0))  # the same batch, started anew
    done = {(o := await run.outcome()).entry.job_id: o.output for _ in range(2)}
    assert done == {"b": 3, "c": 3}
    await asyncio.sleep(0.05)
    assert not run.runner.batches._batches  # nothing kept once it ended


@pytest.mark.asyncio
async def test_a_stop_for_a_job_stops_its_step_batch_member_and_its_generator_alike() -> None:
    def endless(model: Any, x: int) -> Any:
        while True:
            yield 0

    def forever(model: Any, seats: list[compass.Seat]) -> list[Any]:
        return [0] * len(seats)

    profile = TaskProfile(exec_ms=40, output_bytes=8, steps=4)
    tasks = {"t": make_task(forever), "g": Task("g", None, (), profile, fn=endless)}
    outcomes: asyncio.Queue[TaskOutcome] = asyncio.Queue()
    runner = TaskRunner(
        lookup=lambda wf, name: tasks[name], module_of=lambda model: None,
        config=WorkerConfig(name="w"), on_outcome=outcomes.put_nowait,
        on_returned=lambda entry: None,
    )  # fmt: skip
    member = Runner(tasks["t"]).entry("j", 5)
    generator = QueuedTask("j", 0, "flow", "g", None, 0.04, {"x": 1}, {"g": "w"}, "w", 0.0)
    runner.start(RunTask(member, 0, False, 0.0, True))
    runner.start(RunTask(generator, 1, False, 0.0, None))
    await asyncio.sleep(0.05)
    runner.between_steps(StopTask((member, generator)))
    done = [await asyncio.wait_for(outcomes.get(), 30) for _ in range(2)]
    assert {o.entry.task for o in done} == {"t", "g"}
    assert all(isinstance(o.error, TaskStopped) for o in done)
