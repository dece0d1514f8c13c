"""How a task thread calls a task: under torch's inference mode where torch is imported (and
without importing torch where the app never did: tests/unit/cache/test_backend.py)."""

from __future__ import annotations

import asyncio
from contextlib import nullcontext

import pytest
import torch

import compass
from compass.core.events import RunTask
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.worker.calling import TaskAborted, call_task
from compass.workflow.dag import Task, TaskProfile

from .running import runner_of

app = compass.App("calls")
probe = app.workflow("probe", inputs=["x"])


@probe.task(expected_ms=0.01)
def modes(model: None, x: int) -> tuple[int, bool, bool]:
    return x + 1, torch.is_inference_mode_enabled(), torch.is_grad_enabled()


def test_a_task_runs_under_inference_mode_where_torch_is_imported() -> None:
    task = app.workflows["probe"].tasks["modes"]
    assert call_task(task, task.call, None, {"x": 1}, nullcontext()) == (2, True, False)


def test_a_task_that_exits_fails_the_task_not_the_worker() -> None:
    crash = compass.App("crash")
    wf = crash.workflow("w", inputs=["x"])

    @wf.task(expected_ms=0.01)
    def bye(model: None, x: int) -> None:
        raise SystemExit(3)

    task = crash.workflows["w"].tasks["bye"]
    with pytest.raises(TaskAborted, match="raised SystemExit: 3"):
        call_task(task, task.call, None, {"x": 1}, nullcontext())


def test_an_async_task_is_run_to_its_end_on_a_loop_of_its_thread() -> None:
    aio = compass.App("aio")
    wf = aio.workflow("w", inputs=["x"])

    @wf.task(expected_ms=0.01)
    async def later(model: None, x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    @wf.task(expected_ms=0.01, after=["later"])
    async def fails(model: None, later: int) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"no {later}")

    @wf.task(expected_ms=0.01, after=["later"])
    async def exits(model: None, later: int) -> None:
        raise SystemExit(4)

    tasks = aio.workflows["w"].tasks
    assert call_task(tasks["later"], tasks["later"].call, None, {"x": 1}, nullcontext()) == 2
    with pytest.raises(ValueError, match="no 2"):
        call_task(tasks["fails"], tasks["fails"].call, None, {"later": 2}, nullcontext())
    with pytest.raises(TaskAborted, match="raised SystemExit: 4"):
        call_task(tasks["exits"], tasks["exits"].call, None, {"later": 2}, nullcontext())


@pytest.mark.asyncio
async def test_an_async_batched_task_is_awaited_before_its_outputs_are_counted() -> None:
    async def doubles(model: None, x: list[int]) -> list[int]:
        await asyncio.sleep(0)
        return [2 * v for v in x]

    task = Task("t", "m", (), TaskProfile(exec_ms=1, output_bytes=8), fn=doubles, batch=4)
    outcomes: asyncio.Queue[TaskOutcome] = asyncio.Queue()
    runner = runner_of(task, outcomes)
    a, b = (
        QueuedTask(job, 0, "flow", "t", "m", 0.001, {"x": x}, {"t": "w"}, "w", 0.0)
        for job, x in (("a", 1), ("b", 5))
    )
    runner.start(RunTask(a, 0, False, 0.0, True, (b,)))
    done = {(o := await asyncio.wait_for(outcomes.get(), 30)).entry.job_id: o for _ in range(2)}
    assert (done["a"].error, done["b"].error) == (None, None)
    assert (done["a"].output, done["b"].output, done["a"].batch) == (2, 10, 2)
