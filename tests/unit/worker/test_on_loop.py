"""A model-less ``async def`` task declared ``on_loop`` runs as a task of the worker's event
loop, not in a thread: its output and time come back, its errors fail its job alone (a
``SystemExit`` too), and past its timeout it is cancelled, its lane free at once. Declared on
anything else, it is refused at declaration, saying why."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import compass
from compass.core.events import RunTask
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.errors import CompassTimeout, WorkflowError
from compass.worker.calling import TaskAborted
from compass.workflow.dag import Task

from .running import runner_of


def declared(fn: Any, **options: Any) -> Task:
    app = compass.App("loop")
    app.workflow("w", inputs=["x"]).task(fn, on_loop=True, **options)
    return app.workflows["w"].tasks[fn.__name__]


async def run_one(task: Task, x: Any) -> TaskOutcome:
    outcomes: asyncio.Queue[TaskOutcome] = asyncio.Queue()
    runner = runner_of(task, outcomes)
    entry = QueuedTask("j", 0, "w", task.name, None, 0.001, {"x": x}, {task.name: "w"}, "w", 0.0)
    runner.start(RunTask(entry, 0, False, 0.0, True))
    try:
        return await asyncio.wait_for(outcomes.get(), 10)
    finally:
        await runner.aclose()


@pytest.mark.asyncio
async def test_an_on_loop_task_runs_on_the_workers_loop_and_its_output_comes_back() -> None:
    async def route(model: None, x: int) -> tuple[int, str]:
        await asyncio.sleep(0)
        return x + 1, threading.current_thread().name

    outcome = await run_one(declared(route, timeout_ms=5000), 1)
    assert outcome.error is None
    assert outcome.output == (2, threading.current_thread().name)  # this loop's thread
    assert outcome.exec_s is not None and outcome.exec_s >= 0


@pytest.mark.asyncio
async def test_past_its_timeout_an_on_loop_task_is_cancelled_and_not_left_running() -> None:
    ended: list[str] = []

    async def hangs(model: None, x: int) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            ended.append("cancelled")

    outcome = await run_one(declared(hangs, timeout_ms=50), 1)
    assert isinstance(outcome.error, CompassTimeout), outcome.error
    assert not outcome.still_running  # its lane is free: nothing of it runs on
    assert ended == ["cancelled"]


@pytest.mark.asyncio
async def test_an_on_loop_tasks_errors_fail_its_job_and_not_the_loop() -> None:
    async def fails(model: None, x: int) -> None:
        raise ValueError(f"no {x}")

    async def exits(model: None, x: int) -> None:
        raise SystemExit(3)

    async def times_out_itself(model: None, x: int) -> None:
        raise TimeoutError("the service it called did not answer")

    failed = await run_one(declared(fails), 7)
    own = await run_one(declared(times_out_itself, timeout_ms=5000), 7)
    assert isinstance(own.error, TimeoutError) and not isinstance(own.error, CompassTimeout)
    assert isinstance(failed.error, ValueError) and "no 7" in failed.error_text
    aborted = await run_one(declared(exits), 7)
    assert isinstance(aborted.error, TaskAborted) and "SystemExit: 3" in str(aborted.error)


def test_on_loop_is_refused_where_the_task_could_block_the_loop() -> None:
    def plain(model: None, x: int) -> int:
        return x

    async def steps(model: None, x: int) -> Any:
        yield x

    async def modelled(model: Any, x: int) -> int:
        return x

    with pytest.raises(
        WorkflowError, match=r"'plain' cannot run on the worker's event loop.*not 'async def'"
    ):
        declared(plain)
    with pytest.raises(WorkflowError, match="runs in steps"):
        declared(steps)
    with pytest.raises(WorkflowError, match=r"has a model \('m'\)"):
        declared(modelled, model="m")
