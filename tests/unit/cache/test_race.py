"""Race 1 of issue 22, on the strict backend: a load must not overwrite slabs that a task which
just finished may still be reading (its kernels queued, not done).

The worker's own pieces run here, minus the sockets: the lanes decide (run, load, evict), the
task runner runs the task in a thread, the model cache copies into slabs. Two models, room for
one: the second task's load evicts the first model right after the first task ends. Without a
compute fence between the task's end and the unpin, the strict backend refuses the copy (on a
GPU it would overwrite weights under running kernels).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from torch import nn

import compass
from compass.cache.backend import StrictBackend
from compass.cache.models import ModelCache
from compass.config import CacheConfig, WorkerConfig
from compass.core.lanes import CannotRun, Lanes, LoadModel, RunTask, Step
from compass.core.queue import QueuedTask
from compass.errors import CompassError
from compass.worker.executor import TaskOutcome, TaskRunner

KiB = 1024


def linear(seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(16, 16)  # 1088 B: one 4 KiB slab


def build_app() -> compass.App:
    app = compass.App("race")
    app.model("a", lambda: linear(1))
    app.model("b", lambda: linear(2))
    flow = app.workflow("flow", inputs=["x"])

    @flow.task(model="a", expected_ms=1.0)
    def first(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = model(x)
        return out

    @flow.task(model="b", after=["first"], expected_ms=1.0)
    def second(model: nn.Module, first: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = model(first)
        return out

    return app


class Worker:
    """The lanes, the runner and the model cache wired as the worker wires them."""

    def __init__(self, app: compass.App, cache: ModelCache, *, fenced: bool) -> None:
        self.app = app
        self.cache = cache
        self.lanes = Lanes(lanes=1, cache=cache.core, prefetch_depth=0)
        self.runner = TaskRunner(
            lookup=lambda wf, task: app.get_workflow(wf).tasks[task],
            module_of=cache.module,
            compute=cache.compute if fenced else None,
            config=WorkerConfig(),  # real tasks, at their own speed
            on_outcome=self._outcome,
            on_returned=lambda entry: None,
        )
        self.outcomes: dict[str, TaskOutcome] = {}
        self.errors: dict[str, CompassError] = {}
        #: what the backend said when each task's outcome was reported
        self.reads_at_report: dict[str, dict[str, int]] = {}
        self.done = asyncio.Event()

    def submit(self, entry: QueuedTask) -> None:
        self._carry_out(self.lanes.submit(entry, 0.0))

    def _carry_out(self, steps: list[Step]) -> None:
        for step in steps:
            if isinstance(step, RunTask):
                self.runner.start(step)
            elif isinstance(step, LoadModel):
                self.cache.fetch(step.model, step.evict, self._fetched)
            elif isinstance(step, CannotRun):  # no step-wise tasks here: nothing else comes
                self.errors[step.entry.task] = step.error
                self.done.set()

    def _fetched(self, model: str, result: float | CompassError) -> None:
        if isinstance(result, CompassError):
            self._carry_out(self.lanes.load_failed(model, result, 0.0))
        else:
            self._carry_out(self.lanes.loaded(model, result, 0.0))

    def _outcome(self, outcome: TaskOutcome) -> None:
        task = outcome.entry.task
        backend = self.cache.backend
        assert isinstance(backend, StrictBackend)
        self.reads_at_report[task] = backend.reads_in_flight()
        self.outcomes[task] = outcome
        self._carry_out(self.lanes.ended(outcome.entry, 0.0))
        if task == "first" and outcome.error is None:
            self.submit(entry("second", "b", {"first": outcome.output}))
        else:
            self.done.set()


def entry(task: str, model: str, inputs: dict[str, Any]) -> QueuedTask:
    return QueuedTask(
        job_id="j1", attempt=0, workflow="flow", task=task, model=model, expected_s=0.001,
        inputs=inputs, plan={}, ingress="w0", enqueued_at=0.0,
    )  # fmt: skip


async def run_job(*, fenced: bool) -> Worker:
    app = build_app()
    config = CacheConfig(capacity_bytes=4 * KiB, slab_bytes=4 * KiB, backend="strict")
    cache = ModelCache(app.models, config)
    await cache.prepare()
    worker = Worker(app, cache, fenced=fenced)
    x = torch.randn(3, 16)
    worker.submit(entry("first", "a", {"x": x}))
    await asyncio.wait_for(worker.done.wait(), 30)
    worker.x = x  # type: ignore[attr-defined]
    await worker.runner.aclose()
    await cache.aclose()
    return worker


@pytest.mark.asyncio
async def test_a_load_never_overwrites_slabs_a_finished_task_may_still_read():
    worker = await run_job(fenced=True)
    assert worker.errors == {}
    assert worker.outcomes["second"].error is None, worker.outcomes["second"].error
    # the second load evicted the first model from the only slab, after the first task's fence
    stats = worker.cache.stats
    assert stats.loads == 2
    assert stats.evictions == 1
    backend = worker.cache.backend
    assert isinstance(backend, StrictBackend)
    assert backend.urgent_copies == 2  # tasks waited for both loads: high-priority streams
    # the first task's reads were closed (its compute fence passed) before it was reported,
    # hence before its model was unpinned and could be evicted
    assert worker.reads_at_report["first"] == {}
    with torch.inference_mode():
        expected = linear(2)(linear(1)(worker.x))  # type: ignore[attr-defined]
    torch.testing.assert_close(worker.outcomes["second"].output, expected)


@pytest.mark.asyncio
async def test_without_the_fence_the_strict_backend_refuses_the_copy():
    # what the worker did before the fix: the task's thread returned with its kernels queued,
    # the model was unpinned at once and the next load copied into its slabs
    worker = await run_job(fenced=False)
    assert worker.reads_at_report["first"] == {"a": 1}
    assert "second" in worker.errors
    assert "may still be reading" in str(worker.errors["second"])
