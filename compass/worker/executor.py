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

Nothing a task does stops its lane: an exception, ``sys.exit()`` or any other ``BaseException``
from user code becomes the task's error. A task past its timeout (its ``timeout_ms``, else the
worker's ``task_timeout_s``) fails with :class:`~compass.errors.CompassTimeout` and its lane
moves on at once; the thread, which Python cannot interrupt, is abandoned and keeps the model
pinned until it returns. Task threads are daemon threads, so a stuck one never holds up the
worker's exit. Past ``max_stuck`` such threads the worker is *degraded*: it runs no more GPU
work (tasks with a model fail with :class:`~compass.errors.WorkerUnavailable`) and its
heartbeats say so, so planners send their work elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compass.cache.models import Lease, ModelCache
from compass.errors import CompassTimeout, WorkerUnavailable
from compass.worker.queue import QueuedTask, TaskQueue
from compass.workflow.dag import Task

__all__ = ["Executor", "TaskAborted", "TaskOutcome", "TaskThreads", "emulated_output"]

log = logging.getLogger("compass.worker")


class TaskAborted(Exception):
    """A task's code raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``
    from ``sys.exit()``, ``KeyboardInterrupt``...): it fails that task's job, nothing more."""


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
        task_timeout_s: float = 300.0,
        max_stuck: int = 4,
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
        self._task_timeout_s = task_timeout_s
        self._max_stuck = max_stuck
        self._threads = TaskThreads()
        #: task threads abandoned past their timeout and still running
        self.stuck = 0

    @property
    def degraded(self) -> bool:
        """Too many stuck task threads: no more GPU work here (see the module docstring)."""
        return self.stuck >= self._max_stuck

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
        return self._drop(
            lambda e: e.job_id == job_id and (below_attempt is None or e.attempt < below_attempt)
        )

    def drop_ingress(self, ingress: str) -> int:
        """Drop the queued tasks of every job whose ingress is ``ingress``."""
        return self._drop(lambda e: e.ingress == ingress)

    def _drop(self, stale: Callable[[QueuedTask], bool]) -> int:
        dropped = len(self.queue.drop(stale))
        if dropped:
            self._on_change()
        return dropped + len(self.host_queue.drop(stale))

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
                outcome = await self._run_one(
                    entry, refuse=self.degraded and entry.model is not None
                )
            finally:
                self._count(host, -1)
                queue.finish(entry)
            if not host:
                self._on_change()
            try:
                self._on_outcome(outcome)
            except Exception:  # a bug in reporting one task must not end the lane
                log.exception("reporting the outcome of task %r failed", entry.task)

    def _count(self, host: bool, delta: int) -> None:
        if host:
            self.host_busy += delta
        else:
            self.busy += delta

    async def _run_one(self, entry: QueuedTask, refuse: bool = False) -> TaskOutcome:
        outcome = TaskOutcome(entry, queue_s=entry.started_at - entry.enqueued_at)
        if refuse:
            outcome.error = WorkerUnavailable(
                f"this worker has {self.stuck} stuck tasks (timed out, still running) and "
                "takes no more GPU work"
            )
            return outcome
        task = self._lookup(entry.workflow, entry.task)
        timeout_s = (
            task.timeout_ms / 1000.0 if task.timeout_ms is not None else self._task_timeout_s
        ) * self._time_scale
        lease: Lease | None = None
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
                delay = task.profile.exec_ms / 1000.0 * self._time_scale
                await asyncio.sleep(min(delay, timeout_s))
                if delay > timeout_s:
                    raise TimeoutError
                outcome.output = emulated_output(task.profile.output_bytes)
            else:
                module = None if lease is None else lease.module
                work = self._threads.run(_call, task, module, entry.inputs)
                # a timer, not wait_for + shield: those cost two more loop turns per task
                timer = asyncio.get_running_loop().call_later(timeout_s, self._abandon, work, lease)
                try:
                    outcome.output = await work
                except TimeoutError:
                    if work in self._threads.abandoned:
                        lease = None  # released when the thread returns
                    raise
                finally:
                    timer.cancel()
            outcome.exec_s = self._clock() - t0
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            outcome.error = CompassTimeout(
                f"task {task.name!r} ran past its timeout of {timeout_s / self._time_scale:g} s"
            )
        except Exception as exc:
            outcome.error = exc
            outcome.error_text = traceback.format_exc()
        finally:
            if lease is not None:
                lease.release()
        return outcome

    def _abandon(self, work: asyncio.Future[Any], lease: Lease | None) -> None:
        """A task ran past its timeout: its lane moves on (``work`` fails with TimeoutError),
        its thread runs on, counted stuck until it returns and keeping its model pinned (its
        module is in use) until then."""
        if work.done():
            return

        def returned() -> None:
            self.stuck -= 1
            if lease is not None:
                lease.release()
            self._on_change()

        self._threads.abandon(work, returned)
        self.stuck += 1
        self._on_change()
        log.warning("a task thread is stuck past its timeout (%d stuck)", self.stuck)


class TaskThreads:
    """Daemon threads that run task functions, reused when idle. A thread stuck in a task is
    never joined, so it cannot hold up the worker's exit; the next task gets another."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._count = 0
        #: work given up on (timed out) -> what to call when its thread returns after all
        self.abandoned: dict[asyncio.Future[Any], Callable[[], None]] = {}

    def abandon(self, work: asyncio.Future[Any], returned: Callable[[], None]) -> None:
        """Stop waiting for ``work`` (it fails with TimeoutError now); ``returned`` is called
        on the loop when its thread is done with it."""
        self.abandoned[work] = returned
        work.set_exception(TimeoutError())
        work.exception()  # retrieved: its awaiter may be gone

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in a task thread; the future settles on the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if self._idle:
                self._idle -= 1  # that thread takes this work
            else:
                self._count += 1
                thread = threading.Thread(
                    target=self._serve, name=f"compass-task-{self._count}", daemon=True
                )
                thread.start()
        self._work.put((loop, future, fn, args))
        return future

    def _settle(
        self, future: asyncio.Future[Any], result: Any, error: BaseException | None
    ) -> None:
        returned = self.abandoned.pop(future, None)
        if returned is not None:
            returned()
        elif not future.done():  # else cancelled: the worker is stopping
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def _serve(self) -> None:
        while True:
            loop, future, fn, args = self._work.get()
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # _call turns user code's into Exceptions already
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(self._settle, future, result, error)
            del loop, future, fn, args, result, error
            with self._lock:
                self._idle += 1


def _nothing() -> None:
    pass


def _call(task: Task, module: Any, inputs: dict[str, Any]) -> Any:
    import torch

    assert task.fn is not None
    try:
        with torch.inference_mode():
            return task.call(module, inputs)
    except Exception:
        raise
    except BaseException as exc:  # sys.exit() and the like fail the task, not the worker
        raise TaskAborted(f"task {task.name!r} raised {type(exc).__name__}: {exc}") from exc
