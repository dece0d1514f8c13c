"""Step-wise tasks: a generator function runs in steps and can be stopped between two.

Declared like any task (a plain function is one step); the executor drives the generator a
step at a time in its thread and looks at the stop flag between two steps; the worker core
stops the running tasks of a job that ended (:class:`~compass.core.events.StopTask`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

import pytest

import compass
from compass.config import SchedConfig, WorkerConfig
from compass.core.events import Event, RunTask, StopTask, Submit, SuspendTask, TaskStep
from compass.core.messages import DoneMsg
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.errors import WorkflowError
from compass.worker.executor import TaskRunner, TaskStopped
from compass.worker.windows import StreamedSteps
from compass.workflow.dag import Task, TaskProfile, is_stepwise

from ..worker.test_state import core, new_job_id, of, received


def plain(model: Any, x: int) -> int:
    return x


def counts(model: Any, x: int) -> Generator[int, None, int]:
    yield from range(x)
    return -1  # the final output, as the rule says


def no_return(model: Any, x: int) -> Iterator[int]:
    yield from range(x)


async def counts_async(model: Any, x: int) -> AsyncIterator[int]:
    for i in range(x):
        await asyncio.sleep(0)
        yield i


def test_a_generator_function_is_step_wise_and_a_plain_one_one_step() -> None:
    assert is_stepwise(counts) and is_stepwise(counts_async) and not is_stepwise(plain)
    app = compass.App("steps")
    flow = app.workflow("flow", inputs=["x"])
    flow.task(name="gen", steps=20, step_ms=5.0)(counts)
    flow.task(name="one", after={"gen": "x"})(plain)
    wf = app.get_workflow("flow")
    gen, one = wf.tasks["gen"], wf.tasks["one"]
    assert gen.stepwise and gen.profile.steps == 20 and gen.profile.exec_ms == 100.0
    assert gen.profile.step_ms == 5.0
    assert not one.stepwise and one.profile.steps == 1


def test_steps_on_a_plain_function_and_a_batched_generator_are_refused() -> None:
    with pytest.raises(WorkflowError, match="not a generator"):
        Task("t", None, (), TaskProfile(exec_ms=10, output_bytes=0, steps=4), fn=plain)
    with pytest.raises(WorkflowError, match="a generator runs one job"):
        Task("t", "m", (), TaskProfile(exec_ms=10, output_bytes=0), fn=counts, batch=4)
    with pytest.raises(WorkflowError, match="steps must be an integer >= 1"):
        TaskProfile(exec_ms=10, output_bytes=0, steps=0)


class Runner:
    """A TaskRunner over one workflow of step-wise tasks, real mode, in this test's loop."""

    def __init__(self, app: compass.App) -> None:
        self.app = app
        self.outcomes: asyncio.Queue[TaskOutcome] = asyncio.Queue()
        self.runner = TaskRunner(
            lookup=lambda wf, task: app.get_workflow(wf).tasks[task],
            module_of=lambda model: None,
            config=WorkerConfig(name="w"),
            on_outcome=self.outcomes.put_nowait,
            on_returned=lambda entry: None,
        )

    def start(self, task: str, x: int, job: str = "j1") -> QueuedTask:
        from compass.core.events import RunTask

        entry = QueuedTask(job, 0, "flow", task, None, 0.001, {"x": x}, {task: "w"}, "w", 0.0)
        self.runner.start(RunTask(entry, 0, True, 0.0, None))
        return entry


def app_of(fn: Any) -> compass.App:
    app = compass.App("steps")
    app.workflow("flow", inputs=["x"]).task(name="t")(fn)
    return app


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fn", "final"), [(counts, -1), (no_return, 4), (counts_async, 4), (plain, 5)]
)
async def test_the_final_output_is_the_return_value_else_the_last_item(fn: Any, final: int) -> None:
    run = Runner(app_of(fn))
    run.start("t", 5)
    outcome = await asyncio.wait_for(run.outcomes.get(), 30)
    assert outcome.error is None and outcome.output == final
    assert outcome.steps == (0 if fn is plain else 5)
    assert (outcome.first_step_s is None) == (fn is plain)


@pytest.mark.asyncio
async def test_a_stopped_task_ends_at_its_next_step_and_its_generator_is_closed() -> None:
    at_step = threading.Event()
    go_on = threading.Event()
    closed: list[int] = []

    def slow(model: Any, x: int) -> Iterator[int]:
        done = 0
        try:
            for i in range(x):
                yield i
                done += 1
                if i == 2:
                    at_step.set()  # three steps done: the test stops it here
                    go_on.wait(10)
        finally:
            closed.append(done)

    run = Runner(app_of(slow))
    entry = run.start("t", 1000)
    assert await asyncio.to_thread(at_step.wait, 10)
    run.runner.stop((entry,))
    go_on.set()
    outcome = await asyncio.wait_for(run.outcomes.get(), 30)
    assert isinstance(outcome.error, TaskStopped)
    assert outcome.steps == 4 and closed == [3]  # its finally ran, far from its 1000 steps


@pytest.mark.asyncio
async def test_an_emulated_step_wise_task_stopped_ends_with_its_step_under_way() -> None:
    app = compass.App("emulated")
    flow = app.workflow("flow", inputs=["x"])
    flow.task(name="t", steps=100, step_ms=20.0)(counts)
    outcomes: asyncio.Queue[TaskOutcome] = asyncio.Queue()
    runner = TaskRunner(
        lookup=lambda wf, task: app.get_workflow(wf).tasks[task],
        module_of=lambda model: None,
        config=WorkerConfig(name="w", emulate=True),
        on_outcome=outcomes.put_nowait,
        on_returned=lambda entry: None,
    )
    from compass.core.events import RunTask

    entry = QueuedTask("j1", 0, "flow", "t", None, 2.0, {"x": 1}, {"t": "w"}, "w", 0.0)
    runner.start(RunTask(entry, 0, True, 0.0, None))
    await asyncio.sleep(0.05)  # within its third step
    runner.stop((entry,))
    outcome = await asyncio.wait_for(outcomes.get(), 30)
    assert isinstance(outcome.error, TaskStopped)
    assert 3 <= outcome.steps < 100  # at the end of the step under way, not after 2 s


def test_the_core_stops_the_running_tasks_of_a_job_that_ended() -> None:
    c, _ = core("a", names=("a",))
    job = new_job_id(c)
    steps = c.handle(Submit(0.0, job, "chain", {"x": 1}, 8, t0=0.0))
    assert not of(StopTask, steps)
    running = c.lanes.running_of(job)
    assert running, "its first task runs"
    stop = of(StopTask, c.handle(received(DoneMsg(job, None), now=0.01, sender="a")))
    assert [s.entries for s in stop] == [running]
    other = new_job_id(c)  # a job with nothing running here: nothing to stop
    assert not of(StopTask, c.handle(received(DoneMsg(other, None), now=0.02, sender="a")))


class Clock:
    """A worker's clock the test moves by hand, and the core's side of a step's report."""

    def __init__(self) -> None:
        self.now = 0.0
        self.steps: asyncio.Queue[TaskStep] = asyncio.Queue()
        self.name = "w"
        self.config = WorkerConfig(name="w", sched=SchedConfig(preempt=True))
        #: the core's word on a step, given as the core gives it: while the step is handled,
        #: before its thread is let go on (a test that waited for the step first would race
        #: the thread through its next steps)
        self.decide: Callable[[TaskStep], None] | None = None

    def clock(self) -> float:
        return self.now

    def apply(self, event: Event) -> None:
        assert isinstance(event, TaskStep)
        if self.decide is not None:
            self.decide(event)
        self.steps.put_nowait(event)


@pytest.mark.asyncio
async def test_a_real_task_suspended_at_its_gate_counts_its_wait_apart_from_its_run() -> None:
    # queued at 0, first run from 1.0, suspended after its first step at 1.5, resumed at 4.5,
    # ended at 5.0: 1 s queued, 3 s suspended, 1 s of its own run (what its profile learns)
    app = app_of(counts)
    clock = Clock()
    outcomes: asyncio.Queue[TaskOutcome] = asyncio.Queue()
    runner = TaskRunner(
        lookup=lambda wf, task: app.get_workflow(wf).tasks[task],
        module_of=lambda model: None,
        config=clock.config,
        on_outcome=outcomes.put_nowait,
        on_returned=lambda entry: None,
        streamed=StreamedSteps(clock),  # type: ignore[arg-type]
        clock=clock.clock,
    )
    runner.workflows = app.get_workflow
    entry = QueuedTask("j1", 0, "flow", "t", None, 0.003, {"x": 3}, {"t": "w"}, "w", 0.0,
                       steps=3)  # fmt: skip

    def suspend_after_its_first_step(step: TaskStep) -> None:
        if step.seq == 0:
            clock.now = entry.suspended_at = 1.5  # as the core does
            runner.between_steps(SuspendTask(entry))

    clock.decide = suspend_after_its_first_step
    clock.now = 1.0
    entry.begin(1.0)
    runner.start(RunTask(entry, 0, False, 0.0, None))
    first = await asyncio.wait_for(clock.steps.get(), 50)  # its thread imports torch first
    assert first.seq == 0
    await asyncio.sleep(0.05)
    assert outcomes.empty()  # parked at its gate
    clock.now = 4.5
    entry.done_steps = 1
    entry.begin(4.5)
    clock.now = 5.0
    runner.start(RunTask(entry, 0, False, 0.0, None))
    while (outcome := await asyncio.wait_for(outcomes.get(), 30)) is None:
        pass
    assert outcome.error is None and outcome.output == -1 and outcome.steps == 3
    assert (outcome.queue_s, outcome.suspended_s) == pytest.approx((1.0, 3.0))
    assert outcome.exec_s == pytest.approx(1.0)
