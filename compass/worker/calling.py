"""How a task thread calls user code: a task's function (:func:`call_task`), a step batch's
step function (:func:`call_scoped`), a step-wise task's generator a step at a time
(:func:`run_steps`).

Each runs in a task thread (:class:`~compass.worker.executor.TaskThreads`), never on the
worker's event loop, so user code that computes or blocks cannot stall the worker's heartbeats.
That holds for coroutines too: a task function declared ``async def`` is run to its end on an
event loop of its thread's own, as an async generator's steps are, and so is a step batch's
``async def`` step function (one loop a batch, :class:`ThreadLoop`), so an ``await`` in a task
(a call to another service, an ``asyncio.sleep``) works as it reads.

Torch's inference mode is entered only where torch is imported already: an app that never
imports it has no tensors, and a worker need not pay the import (issue 32).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from compass.core.outcome import TaskOutcome
from compass.worker.devices import device_of, moved, to_host
from compass.worker.windows import StepWindow
from compass.workflow.dag import Task

__all__ = [
    "Steps",
    "TaskAborted",
    "TaskStopped",
    "ThreadLoop",
    "TimedOut",
    "awaited",
    "call_on_loop",
    "call_scoped",
    "call_task",
    "run_steps",
]


class TaskAborted(Exception):
    """A task's code raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``
    from ``sys.exit()``, ``KeyboardInterrupt``...): it fails that task's job, nothing more."""


class TaskStopped(Exception):
    """A step-wise task was stopped between two steps (its job ended elsewhere)."""


class TimedOut(Exception):
    """A task on the worker's loop (``on_loop``) ran past its timeout, and was cancelled."""


def call_task(
    task: Task,
    method: Callable[..., Any],
    module: Any,
    payload: Any,
    scope: AbstractContextManager[Any],
) -> Any:
    """``method(module, payload)`` (the task's ``call`` or ``call_batch``) under inference mode
    (where torch is imported) inside ``scope`` (the compute stream and fence): inputs moved to
    the module's device, the output to the host; a coroutine (an ``async def`` task) run to its
    end first. A ``BaseException`` from user code becomes the task's error, not the worker's."""
    torch = sys.modules.get("torch")
    assert task.fn is not None
    try:
        with scope, nullcontext() if torch is None else torch.inference_mode():
            device = device_of(module)
            if device is None or device.type == "cpu":
                return awaited(method(module, payload))
            return to_host(awaited(method(module, moved(payload, device))))
    except Exception:
        raise
    except BaseException as exc:  # sys.exit() and the like fail the task, not the worker
        raise _aborted(task, exc) from exc


async def call_on_loop(
    task: Task, payload: Any, clock: Callable[[], float], timeout_s: float
) -> tuple[Any, float]:
    """Task ``task`` (declared ``on_loop``) awaited on the worker's own loop: its output and
    its time. Past ``timeout_s`` it is cancelled and :class:`TimedOut` raised (a
    ``TimeoutError`` of its own code's is its error like any other); a ``BaseException`` from
    its code becomes the task's error (a ``SystemExit`` must not end the worker's loop). (A
    timer of its own, not ``asyncio.timeout``: that, a class of Python code, doubled what the
    loop spends on a no-op task.)"""
    began = clock()
    this = asyncio.current_task()
    assert this is not None
    expired: list[bool] = []

    def expire() -> None:
        expired.append(True)
        this.cancel()

    timer = asyncio.get_running_loop().call_later(timeout_s, expire)
    try:
        output = await task.call(None, payload)
    except asyncio.CancelledError:
        if expired:
            raise TimedOut from None
        raise  # the worker stops
    except Exception:
        raise
    except BaseException as exc:
        raise _aborted(task, exc) from exc
    finally:
        timer.cancel()
    return output, clock() - began


def _aborted(task: Task, exc: BaseException) -> TaskAborted:
    """``task``'s code raised ``exc``, a ``BaseException`` that is not an ``Exception``
    (``SystemExit`` from ``sys.exit()``, ``KeyboardInterrupt``...): its error, never the
    worker's."""
    return TaskAborted(f"task {task.name!r} raised {type(exc).__name__}: {exc}")


def call_scoped(fn: Callable[[Any], Any], module: Any, scope: AbstractContextManager[Any]) -> Any:
    """``fn(module)`` under inference mode (where torch is imported) inside ``scope`` (a step
    batch's thread)."""
    torch = sys.modules.get("torch")
    with scope, nullcontext() if torch is None else torch.inference_mode():
        return fn(module)


def awaited(made: Any) -> Any:
    """``made``, or what it returns when it is a coroutine: run on an event loop of this
    thread's own (never the worker's), closed after it (a batched task's call passes it to
    :meth:`Task.call_batch <compass.workflow.dag.Task.call_batch>`, which checks the outputs)."""
    if not inspect.iscoroutine(made):
        return made
    coroutine: Coroutine[Any, Any, Any] = made
    return asyncio.run(coroutine)


class ThreadLoop:
    """An event loop of a task thread's own for a function called many times in it (a step
    batch's step function, once a step): made the first time a call returns a coroutine, and
    kept, so what one step opens on it (a client session) the next can use; :meth:`close`
    when the thread is done with it."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def awaited(self, made: Any) -> Any:
        """``made``, or what it returns when it is a coroutine, run on this loop."""
        return self.run(made) if inspect.iscoroutine(made) else made

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """What ``awaitable`` gives, run to its end on this loop."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(awaitable)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None


@dataclass(slots=True)
class Steps:
    """What drives a step-wise task in its thread: the stop flag it looks at between two
    steps, the outcome it counts them in, where each partial output is reported (None: its job
    does not stream) and the window its caller's reads open (None: no caller reads here)."""

    stop: threading.Event
    outcome: TaskOutcome
    report: Callable[[int, Any], Any] | None
    window: StepWindow | None


def run_steps(task: Task, steps: Steps, module: Any, payload: Any) -> Any:
    """Drive step-wise ``task``'s generator (its ``call``), a step at a time: each item ends a
    step (counted in the outcome, the first's time kept; reported, on the host, for a job that
    streams); before each step, the caller's window must have room (the wait is counted as
    ``waited_s``); the stop flag set, the generator is closed between two steps and
    :class:`TaskStopped` raised. The final output: the value returned, or the last item when
    it returns nothing (an async generator cannot return one)."""
    outcome, stop, report, window = steps.outcome, steps.stop, steps.report, steps.window
    started = time.perf_counter()
    made = task.call(module, payload)
    items = _async_items(made) if inspect.isasyncgen(made) else made
    last: Any = None
    try:
        while True:
            if window is not None:  # a slow caller holds the next step here
                outcome.waited_s += window.before_step(outcome.steps)
            if stop.is_set():
                outcome.stopped = True
                raise TaskStopped(f"task {task.name!r} stopped after {outcome.steps} steps")
            try:
                last = next(items)
            except StopIteration as end:
                return last if end.value is None else end.value
            if report is not None:
                report(outcome.steps, to_host(last))
            outcome.steps += 1
            if outcome.steps == 1:
                outcome.first_step_s = time.perf_counter() - started
    finally:
        items.close()  # a stopped or failed generator's finally clauses run here


def _async_items(agen: Any) -> Generator[Any, None, None]:
    """The items of async generator ``agen``, driven on an event loop of this thread's own."""
    loop = ThreadLoop()
    try:
        while True:
            try:
                yield loop.run(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run(agen.aclose())
        loop.close()
