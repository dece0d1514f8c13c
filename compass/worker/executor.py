"""Execution lanes: each lane takes the next ready task, makes its model resident and pinned,
runs it off the event loop, and reports the outcome.

With ``host_lanes=0`` (the paper's execution model) the GPU lanes (``lanes``) run every task,
so a model-less task (a join that aggregates, a decoding step) waits for the GPU like any
other. With ``host_lanes`` > 0 (a worker's default is 1), model-less tasks go to a queue of
their own served by that many host lanes, and never wait behind a GPU task (nor hold one up).

Real mode calls the task's function with its torch module under ``torch.inference_mode()`` in a
thread. Emulated mode sleeps for the task's profiled time (times ``time_scale``) and returns a
payload of the declared output size; model loads are emulated by the cache. Everything else (the
queue, the pool, the cache decisions, the wire) is the real code in both modes.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compass.cache.models import ModelCache
from compass.worker.queue import QueuedTask, TaskQueue
from compass.workflow.dag import Task

__all__ = ["Executor", "TaskOutcome", "emulated_output"]

_payloads: dict[int, np.ndarray] = {}


def emulated_output(nbytes: int) -> np.ndarray:
    """A shared zero payload of ``nbytes`` standing in for an emulated task's output.

    Shared and read-only: the wire sends it from this memory, so no copy is made per task.
    """
    payload = _payloads.get(nbytes)
    if payload is None:
        payload = np.zeros(max(0, nbytes), dtype=np.uint8)
        payload.setflags(write=False)
        _payloads[nbytes] = payload
    return payload


@dataclass(slots=True)
class TaskOutcome:
    """What happened to one task, with where its time went (seconds)."""

    entry: QueuedTask
    output: Any = None
    error: BaseException | None = None
    error_text: str = ""
    queue_s: float = 0.0
    fetch_s: float = 0.0
    exec_s: float = 0.0
    cache_hit: bool = True


class Executor:
    """``lanes`` concurrent runners over one :class:`TaskQueue` (GPU lanes), and
    ``host_lanes`` over another for model-less tasks (none: they use the GPU lanes)."""

    def __init__(
        self,
        *,
        lanes: int,
        cache: ModelCache,
        lookup: Callable[[str, str], Task],
        emulate: bool,
        time_scale: float,
        on_outcome: Callable[[TaskOutcome], None],
        clock: Callable[[], float] = time.monotonic,
        prefetch: bool = True,
        on_change: Callable[[], None] | None = None,
        host_lanes: int = 0,
    ) -> None:
        self.queue = TaskQueue(clock)
        self._clock = clock
        self.lanes = lanes
        self.busy = 0
        #: model-less tasks when host lanes run them (else unused and empty)
        self.host_queue = TaskQueue(clock)
        self.host_lanes = host_lanes
        self.host_busy = 0
        self._host_ready = asyncio.Semaphore(0)
        self._cache = cache
        self._lookup = lookup
        self._emulate = emulate
        self._time_scale = time_scale
        self._on_outcome = on_outcome
        self._prefetch = prefetch
        self._ready = asyncio.Semaphore(0)
        #: called when the queue's expected wait changes (a task queued, finished or dropped)
        self._on_change = on_change or _nothing

    def submit(self, entry: QueuedTask) -> None:
        if entry.model is None and self.host_lanes:
            self.host_queue.push(entry)
            self._host_ready.release()
            return  # the GPU queue, the only one a heartbeat reports, is unchanged
        self.queue.push(entry)
        self._ready.release()
        self._on_change()
        if self._prefetch and self.busy >= self.lanes:
            # every lane is busy: use the time to bring in what the queue needs next
            self._cache.prefetch(self.queue.upcoming_models())

    def drop_job(self, job_id: str, below_attempt: int | None = None) -> int:
        dropped = len(self.queue.drop_job(job_id, below_attempt))
        if dropped:
            self._on_change()
        return dropped + len(self.host_queue.drop_job(job_id, below_attempt))

    async def run(self) -> None:
        """Run the lanes until cancelled."""
        async with asyncio.TaskGroup() as group:
            for _ in range(self.lanes):
                group.create_task(self._lane())
            for _ in range(self.host_lanes):
                group.create_task(self._lane(host=True))

    async def _lane(self, host: bool = False) -> None:
        queue, ready = (self.host_queue, self._host_ready) if host else (self.queue, self._ready)
        while True:
            await ready.acquire()
            entry = queue.pop()
            if entry is None:  # its job was dropped while it waited
                continue
            self._count(host, 1)
            try:
                outcome = await self._run_one(entry)
            finally:
                self._count(host, -1)
                queue.finish(entry)
            if not host:
                self._on_change()
            self._on_outcome(outcome)

    def _count(self, host: bool, delta: int) -> None:
        if host:
            self.host_busy += delta
        else:
            self.busy += delta

    async def _run_one(self, entry: QueuedTask) -> TaskOutcome:
        outcome = TaskOutcome(entry, queue_s=entry.started_at - entry.enqueued_at)
        task = self._lookup(entry.workflow, entry.task)
        lease = None
        try:
            if task.model is not None:
                t0 = self._clock()
                lease = await self._cache.ensure(task.model, self.queue.upcoming_models())
                outcome.fetch_s = self._clock() - t0
                outcome.cache_hit = lease.hit
            if self._prefetch:
                self._cache.prefetch(self.queue.upcoming_models())
            t0 = self._clock()
            if self._emulate or task.fn is None:
                await asyncio.sleep(task.profile.exec_ms / 1000.0 * self._time_scale)
                outcome.output = emulated_output(task.profile.output_bytes)
            else:
                module = None if lease is None else lease.module
                outcome.output = await asyncio.to_thread(_call, task, module, entry.inputs)
            outcome.exec_s = self._clock() - t0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outcome.error = exc
            outcome.error_text = traceback.format_exc()
        finally:
            if lease is not None:
                lease.release()
        return outcome


def _nothing() -> None:
    pass


def _call(task: Task, module: Any, inputs: dict[str, Any]) -> Any:
    import torch

    assert task.fn is not None
    with torch.inference_mode():
        return task.fn(module, **inputs)
