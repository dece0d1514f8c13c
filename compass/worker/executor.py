"""Running tasks: the code of each task the worker core starts (a
:class:`~compass.core.lanes.RunTask`), off the event loop, under its timeout.

Which task runs when, on which lane, and with which model resident is the worker core's
decision (:mod:`compass.core.lanes`); this module carries it out and reports the outcome.

Real mode calls the task's function with its torch module under ``torch.inference_mode()`` in a
thread, inside the model cache's compute scope (:meth:`ModelCache.compute
<compass.cache.models.ModelCache.compute>`): the thread synchronizes its compute stream before
the task is reported done, so the model is unpinned (and its slabs may be overwritten by the
next load) only once its kernels have finished, and ``exec_s`` is the task's time on the device.

**Devices.** A task with a model gets its inputs on the model's device: every torch tensor in
them (inside dicts, lists and tuples too) is moved there before the call. Its output leaves on
the host: every tensor in it is moved to the CPU before it is reported, so it can be sent to
another worker or answered. A task without a model gets and returns host tensors.

Emulated mode sleeps for the task's profiled time (times ``time_scale``) and returns a payload
of the declared output size. A batch (a :class:`RunTask` with mates) is one call of the function
on every entry's inputs, each keyword a list with one item per entry
(:meth:`Task.call_batch <compass.workflow.dag.Task.call_batch>`), or one sleep for the batch's
profiled time; each entry gets its own outcome: its own output, or the batch's error when the
call failed (an output that is an ``Exception`` fails its entry alone). Everything else (the
queue, the pool, the cache decisions, the wire) is the real code in both modes.

**Steps.** A step-wise task (a generator function, :attr:`Task.stepwise
<compass.workflow.dag.Task.stepwise>`) is driven a step at a time in its thread: each item it
yields ends a step (moved to the host like an output), and between two steps the thread looks at
the task's stop flag (:meth:`TaskRunner.stop`, the core's :class:`~compass.core.events.StopTask`):
set, the generator is closed (its ``finally`` runs) and the task ends there, its lane free. Its
final output is what it returns, or its last item if it returns nothing; an async generator runs
on an event loop of its thread's own. An emulated step-wise task sleeps its profile and, stopped,
ends at its next step boundary. A task function declared ``async def`` is run to its end on an
event loop of its thread's own too (:mod:`compass.worker.calling`), never on the worker's.

**Streamed inputs.** A task fed by a streamed edge gets, for each such input, the
:class:`~compass.worker.feeds.FeedReader` the core's :class:`~compass.core.events.Feed`
instructions fill (:attr:`TaskRunner.feeds`): it reads the predecessor's partial outputs as
they come. An emulated one ends no sooner than one of its steps after its streams end. A task
that feeds a streamed edge reports its steps for any job, as a streaming job's sinks do.

Nothing a task does stops the worker: an exception, ``sys.exit()`` or any other
``BaseException`` from user code becomes the task's error. A task past its timeout (its
``timeout_ms``, else the worker's ``task_timeout_s``) fails with
:class:`~compass.errors.CompassTimeout` at once, reported as still running: the thread, which
Python cannot interrupt, is abandoned and keeps its model pinned until it returns (then
``on_returned``). Task threads are daemon threads, so a stuck one never holds up the worker's
exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from compass.config import WorkerConfig
from compass.core.events import JoinRun, StopTask, SuspendTask
from compass.core.lanes import RunTask
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.errors import CompassTimeout
from compass.worker.batchsteps import StepBatches
from compass.worker.calling import (
    Steps,
    TaskAborted,
    TaskStopped,
    TimedOut,
    awaited,
    call_on_loop,
    call_scoped,
    call_task,
    run_steps,
)
from compass.worker.devices import to_host
from compass.worker.feeds import Feeds
from compass.worker.stepgate import StepGate
from compass.worker.windows import StreamedSteps
from compass.workflow.dag import Task, Workflow, emulated_run_s

__all__ = [
    "TaskAborted",
    "TaskOutcome",
    "TaskRunner",
    "TaskStopped",
    "TaskThreads",
    "emulated_output",
]

log = logging.getLogger("compass.worker")


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


class TaskRunner:
    """Runs the tasks the worker core starts; reports each outcome to ``on_outcome``.

    ``config``: the worker's (``emulate``, ``time_scale``, ``task_timeout_s``);
    ``module_of`` gives a resident model's module (the core pinned it for the task); ``compute``
    gives the scope a real task's code runs in, in its thread (the model cache's
    :meth:`~compass.cache.models.ModelCache.compute`: a compute stream, and the fence before the
    task is reported). No coroutine per task: an emulated task is a timer, a real one a thread
    whose future reports when it settles, and one timer at the earliest deadline watches every
    real task's timeout.
    """

    def __init__(
        self,
        *,
        lookup: Callable[[str, str], Task],
        module_of: Callable[[str], Any],
        config: WorkerConfig,
        on_outcome: Callable[[TaskOutcome], None],
        on_returned: Callable[[QueuedTask], None],
        streamed: StreamedSteps | None = None,
        clock: Callable[[], float] = time.monotonic,
        compute: Callable[[str | None], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self._lookup = lookup
        self._module_of = module_of
        self._compute = compute
        # what the worker's config says of running tasks: emulated or not, how fast, how long
        self._emulate = config.emulate
        self._time_scale = config.time_scale
        self._on_outcome = on_outcome
        self._on_returned = on_returned
        #: a step-wise task of a streaming job reports each step's partial output there (on
        #: the loop), and a sink whose caller reads here steps within its window
        self._streamed = streamed
        #: each step reported to the core (on the loop): a streaming job's partial outputs,
        #: a task's that feeds a streamed edge, and every step where the core decides at step
        #: boundaries (preemption)
        self._on_step = None if streamed is None else streamed.report
        #: the workflows by name, which say whether a task feeds a streamed edge (its steps
        #: are reported for any job then); the worker sets it (None: none does)
        self.workflows: Callable[[str], Workflow] | None = None
        #: the streams tasks here read (streamed edges), as the core feeds them
        self.feeds = Feeds()
        self._clock = clock
        self._task_timeout_s = config.task_timeout_s
        self._threads = TaskThreads(clock)
        #: emulated tasks under way: their timers
        self._timers: dict[QueuedTask, asyncio.TimerHandle] = {}
        #: real tasks under way: their thread's future -> (deadline on the loop's clock, entry)
        self._deadlines: dict[asyncio.Future[Any], tuple[float, QueuedTask]] = {}
        self._watchdog: asyncio.TimerHandle | None = None
        #: tasks declared ``on_loop`` under way (each under its timeout: :func:`call_on_loop`)
        self._on_loop: set[asyncio.Task[tuple[Any, float]]] = set()
        self._closed = False
        #: step-wise tasks under way: the flag their thread looks at between two steps (real),
        #: or their run's start and step time (emulated)
        self._stops: dict[QueuedTask, threading.Event] = {}
        self._emulated_steps: dict[QueuedTask, tuple[list[TaskOutcome], Task, float, float]] = {}
        self._steps_told: dict[QueuedTask, int] = {}  # emulated: partial outputs told so far
        #: preemption (``--preempt``): every step of a step-wise task is told to the core, which
        #: may suspend it there; the gates of real ones (:mod:`compass.worker.stepgate`), and
        #: the suspended emulated ones: their outcomes, task, start and step time, and when
        self._preempt = config.sched.preempt
        self._gates: dict[QueuedTask, StepGate] = {}
        self._parked: dict[QueuedTask, tuple[list[TaskOutcome], Task, float, float, float]] = {}
        #: step batches (continuous batching of step-wise tasks)
        self.batches = StepBatches(
            self, emulate=self._emulate, time_scale=self._time_scale, preempt=self._preempt
        )

    def start(self, run: RunTask) -> None:
        """Run ``run``'s entries (one task, or a batch) now (needs a running event loop)."""
        loop = asyncio.get_running_loop()
        if run.entry.done_steps and self._resume(run, loop):
            return
        entries = run.entries
        task = self._lookup(run.entry.workflow, run.entry.task)
        outcomes = _outcomes(run)
        # a step batch is a step-wise task, or an emulated one of steps: a plain one never is
        if (task.stepwise or run.entry.steps > 1) and self.batches.handles(run):
            self.batches.start(run, outcomes)
            return
        timeout_s = self._limit_s(task)
        if self._emulate or task.fn is None:
            t0 = self._clock()
            members = [self._lookup(e.workflow, e.task).profile for e in entries]
            delay = emulated_run_s(task.profile, members) * self._time_scale
            self._timers[run.entry] = loop.call_later(
                min(delay, timeout_s), self._emulated_done, outcomes, task, t0, delay > timeout_s
            )
            if task.profile.steps > 1:
                step_s = delay / task.profile.steps
                self._emulated_steps[run.entry] = (outcomes, task, loop.time(), step_s)
                tells = self._tells_steps(run.entry)
                if (tells or self._preempt) and self._on_step is not None:
                    loop.call_later(step_s, self._emulated_step, run.entry, 0)  # each step
            return
        if task.on_loop:
            self._start_on_loop(outcomes, task, timeout_s, loop)
            return
        model = run.entry.model
        payload: Any = run.entry.inputs
        if task.streamed:  # a streamed input is read as it comes
            payload = {**payload, **self.feeds.readers(run.entry, task.streamed)}
        method: Callable[[Any, Any], Any] = task.call
        if task.batch > 1:  # a batchable function takes lists, even for one item
            payload = [self._lookup(e.workflow, e.task).arguments(e.inputs) for e in entries]
            method = functools.partial(task.call_batch, awaited=awaited)
        elif task.stepwise:
            tells = self._tells_steps(run.entry)
            stop = self._stops[run.entry] = threading.Event()
            report, window = None, None
            if self._preempt and self._on_step is not None:  # the core's word at each step
                gate = self._gates[run.entry] = StepGate()
                report = self._gated(loop, run.entry, gate, tells)
            elif tells:
                assert self._on_step is not None
                report = _reporter(loop, self._on_step, run.entry)
            if run.entry.stream and self._streamed is not None:  # its caller's reads pace it
                window = self._streamed.open(run.entry)
            steps = Steps(stop, outcomes[0], report, window)
            method = functools.partial(run_steps, task, steps)
        # taken last: from here the model's slabs count as read until the thread's fence
        module = None if model is None else self._module_of(model)
        scope = nullcontext() if self._compute is None else self._compute(model)
        then = functools.partial(self._thread_done, outcomes, task)
        work = self._threads.run(loop, call_task, task, method, module, payload, scope, then=then)
        deadline = loop.time() + timeout_s
        self._deadlines[work] = (deadline, run.entry)
        watchdog = self._watchdog
        if watchdog is None or deadline < watchdog.when():
            self._arm(deadline)

    def stop(self, entries: tuple[QueuedTask, ...]) -> None:
        """Stop the step-wise tasks among ``entries`` at their next step boundary (the others,
        one call each, cannot be stopped: they run to their end)."""
        for entry in entries:
            flag = self._stops.get(entry)
            if flag is not None:
                flag.set()
                if self._streamed is not None:  # waiting for its caller's reading: no more
                    self._streamed.stop(entry)
            if (gate := self._gates.get(entry)) is not None:
                gate.stop()  # a suspended one wakes to stop
            if (parked := self._parked.pop(entry, None)) is not None:  # suspended, emulated
                outcomes, _, _, _, _ = parked
                self._timers[entry] = asyncio.get_running_loop().call_later(
                    0.0, self._emulated_stopped, outcomes, entry.done_steps
                )
                continue
            emulated = self._emulated_steps.pop(entry, None)
            timer = self._timers.get(entry)
            if emulated is not None and timer is not None:
                outcomes, _, began, step_s = emulated  # real seconds, the loop's clock
                loop = asyncio.get_running_loop()
                begun = max(1, math.ceil((loop.time() - began) / step_s - 1e-9))
                timer.cancel()  # it ends with the step under way
                self._timers[entry] = loop.call_at(
                    began + begun * step_s, self._emulated_stopped, outcomes, begun
                )

    def _emulated_stopped(self, outcomes: list[TaskOutcome], steps: int) -> None:
        self._steps_told.pop(outcomes[0].entry, None)
        del self._timers[outcomes[0].entry]
        outcomes[0].error = TaskStopped(f"task {outcomes[0].entry.task!r} stopped")
        outcomes[0].steps, outcomes[0].stopped = steps, True
        self._report(outcomes)

    async def aclose(self) -> None:
        """Stop waiting for the tasks under way (their threads are abandoned)."""
        self._closed = True
        for entry, flag in self._stops.items():
            flag.set()
            if self._streamed is not None:
                self._streamed.stop(entry)
        for gate in self._gates.values():
            gate.stop()
        self.batches.close()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for work in list(self._deadlines):
            self._threads.cancel(work)
        self._deadlines.clear()
        for work in list(self._on_loop):
            work.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _start_on_loop(
        self,
        outcomes: list[TaskOutcome],
        task: Task,
        timeout_s: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Run ``task`` (declared ``on_loop``: model-less, ``async def``) as a task of this event
        loop: no thread, so no hand-off to one and back. Past its timeout it is cancelled, and
        its lane is free at once: nothing of it keeps running, unlike an abandoned thread."""
        inputs = outcomes[0].entry.inputs
        work = loop.create_task(call_on_loop(task, inputs, self._clock, timeout_s))
        self._on_loop.add(work)
        work.add_done_callback(functools.partial(self._on_loop_done, outcomes, task))

    def _on_loop_done(
        self, outcomes: list[TaskOutcome], task: Task, work: asyncio.Task[tuple[Any, float]]
    ) -> None:
        self._on_loop.discard(work)
        if work.cancelled():
            return  # the worker is stopping
        outcome = outcomes[0]
        error = work.exception()
        if isinstance(error, TimedOut):
            outcome.error = self._timeout_error(task)  # cancelled: nothing left running
        elif error is not None:
            outcome.error = error
            outcome.error_text = "".join(traceback.format_exception(error))
        else:
            outcome.output, outcome.exec_s = work.result()
        self._report(outcomes)

    def _emulated_step(self, entry: QueuedTask, seq: int) -> None:
        """Step ``seq`` of an emulated step-wise task of a streaming job ended: its partial
        output (a payload of its share of the declared output), then the next step's timer;
        none once the task ended or was stopped."""
        running = self._emulated_steps.get(entry)
        if running is None or self._on_step is None:
            return
        _, task, _, step_s = running
        steps = task.profile.steps
        if seq + 1 < steps:  # the last step's ends with the task (_emulated_done)
            self._on_step(entry, seq, _step_output(task) if self._tells_steps(entry) else None)
            self._steps_told[entry] = seq + 1
            if self._emulated_steps.get(entry) is running:  # not suspended nor stopped there
                asyncio.get_running_loop().call_later(step_s, self._emulated_step, entry, seq + 1)

    def between_steps(self, order: StopTask | SuspendTask | JoinRun) -> None:
        """Carry out what the core decided of running step-wise tasks (:meth:`stop`,
        :meth:`suspend`, a step batch's new members)."""
        if isinstance(order, StopTask):  # a job's entries: step batch members and the rest
            self.batches.stop(order.entries)
            self.stop(order.entries)
        elif isinstance(order, SuspendTask) and self.batches.suspend(order.entry):
            return
        elif isinstance(order, JoinRun):
            self.batches.join(
                order,
                _outcomes(
                    RunTask(
                        order.entries[0],
                        order.lane,
                        False,
                        0.0,
                        None,
                        order.entries[1:],
                        order.stimulus,
                    )
                ),
            )
        else:
            self.suspend(order.entry)

    # -- what the step batches use (:class:`~compass.worker.batchsteps.Running`) ---------------

    def lookup(self, workflow: str, task: str) -> Task:
        return self._lookup(workflow, task)

    def tells_steps(self, entry: QueuedTask) -> bool:
        return self._tells_steps(entry)

    def step(self, entry: QueuedTask, seq: int, value: Any) -> None:
        if self._on_step is not None:
            self._on_step(entry, seq, to_host(value))

    def report(self, outcomes: list[TaskOutcome]) -> None:
        for outcome in outcomes:
            outcome.output = to_host(outcome.output)
        self._report(outcomes)

    def emulated(self, task: Task, *, partial: bool) -> Any:
        return _step_output(task) if partial else emulated_output(task.profile.output_bytes)

    def stopped_error(self, entry: QueuedTask, steps: int) -> Exception:
        return TaskStopped(f"task {entry.task!r} stopped after {steps} steps")

    def call(
        self, model: str | None, fn: Callable[[Any], Any], entry: QueuedTask
    ) -> asyncio.Future[Any]:
        """``fn(module)`` in a task thread, in the model's compute scope, under inference
        mode (the thread of ``entry``'s step batch), under ``entry``'s task timeout, which
        :meth:`refresh` starts again at each step."""
        module = None if model is None else self._module_of(model)
        scope = nullcontext() if self._compute is None else self._compute(model)
        work = self._threads.run(asyncio.get_running_loop(), call_scoped, fn, module, scope)
        self.refresh(entry, work)
        return work

    def refresh(self, entry: QueuedTask, work: asyncio.Future[Any] | None = None) -> None:
        """A step of ``entry``'s step batch begins: its timeout counts from now."""
        work = self._work_of(entry) if work is None else work
        if work is None or work.done():
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limit_s(self._lookup(entry.workflow, entry.task))
        self._deadlines[work] = (deadline, entry)
        if self._watchdog is None or deadline < self._watchdog.when():
            self._arm(deadline)

    def unwatch(self, work: asyncio.Future[Any]) -> None:
        """A step batch's thread is done: no timeout to watch."""
        self._deadlines.pop(work, None)

    def timeout_error(self, entry: QueuedTask) -> CompassTimeout:
        return self._timeout_error(self._lookup(entry.workflow, entry.task))

    def _limit_s(self, task: Task) -> float:
        """Seconds ``task`` may run (its ``timeout_ms``, else the worker's), time-scaled."""
        limit = task.timeout_ms / 1000.0 if task.timeout_ms is not None else self._task_timeout_s
        return limit * self._time_scale

    def suspend(self, entry: QueuedTask) -> None:
        """Step-wise ``entry`` gives its lane up at the boundary it just reported
        (:class:`~compass.core.events.SuspendTask`): a real one's thread waits at its gate, an
        emulated one's timers stop; :meth:`start` of its :class:`RunTask` resumes it."""
        if (gate := self._gates.get(entry)) is not None:
            gate.suspend()
            if (work := self._work_of(entry)) is not None:  # no timeout while it waits
                self._deadlines[work] = (math.inf, entry)
            return
        running = self._emulated_steps.pop(entry, None)
        timer = self._timers.pop(entry, None)
        if running is None or timer is None:
            return
        timer.cancel()
        outcomes, task, began, step_s = running
        self._parked[entry] = (outcomes, task, began, step_s, asyncio.get_running_loop().time())

    def _work_of(self, entry: QueuedTask) -> asyncio.Future[Any] | None:
        """The thread's future of real task ``entry`` (None: none under way)."""
        return next((work for work, (_, of) in self._deadlines.items() if of is entry), None)

    def _resume(self, run: RunTask, loop: asyncio.AbstractEventLoop) -> bool:
        """Resume suspended ``run.entry`` on ``run.lane`` (False: nothing of it is here)."""
        entry = run.entry
        if (gate := self._gates.get(entry)) is not None and gate.suspended:
            if (work := self._work_of(entry)) is not None:  # its timeout starts again
                limit = self._limit_s(self._lookup(entry.workflow, entry.task))
                self._deadlines[work] = (loop.time() + limit, entry)
                self._arm(min(d for d, _ in self._deadlines.values()))
            gate.resume()
            return True
        parked = self._parked.pop(entry, None)
        if parked is None:
            return False
        outcomes, task, began, step_s, since = parked
        for outcome in outcomes:
            outcome.lane = run.lane
        ran_s = since - began  # its steps so far: the time it waited is not its run's
        left_s = max(0.0, task.profile.steps * step_s - ran_s)
        t0 = self._clock() - ran_s
        self._timers[entry] = loop.call_later(
            left_s, self._emulated_done, outcomes, task, t0, False
        )
        self._emulated_steps[entry] = (outcomes, task, loop.time() - ran_s, step_s)
        if self._on_step is not None and entry.done_steps < task.profile.steps - 1:
            loop.call_later(step_s, self._emulated_step, entry, entry.done_steps)
        return True

    def _gated(
        self, loop: asyncio.AbstractEventLoop, entry: QueuedTask, gate: StepGate, tells: bool
    ) -> Callable[[int, Any], None]:
        """The step report of a real step-wise task when the core decides at each boundary:
        the thread reports the step (its output only where it ``tells`` its steps: its job
        streams, or it feeds a stream) and waits at ``gate`` until the core has handled it
        (:mod:`compass.worker.stepgate`)."""
        on_step = self._on_step
        assert on_step is not None

        def told(seq: int, value: Any) -> None:  # on the loop
            try:
                on_step(entry, seq, value if tells else None)
            finally:
                gate.go()  # unless it was suspended or stopped there

        def report(seq: int, value: Any) -> None:  # in the task's thread
            gate.ask()
            loop.call_soon_threadsafe(told, seq, value)
            gate.wait()

        return report

    def _emulated_done(
        self, outcomes: list[TaskOutcome], task: Task, t0: float, late: bool, fed: bool = False
    ) -> None:
        entry = outcomes[0].entry
        del self._timers[entry]
        if not late and not fed and task.streamed and self._fed_later(outcomes, task, t0):
            return
        if self._emulated_steps.pop(entry, None) is not None and not late:
            steps = outcomes[0].steps = task.profile.steps
            told = self._steps_told.pop(entry, 0)
            on_step = self._on_step
            if on_step is not None and self._tells_steps(entry):  # outputs not told yet
                for seq in range(told, steps):
                    on_step(entry, seq, _step_output(task))
        exec_s = self._clock() - t0
        for outcome in outcomes:
            entry = outcome.entry
            if late:
                outcome.error = self._timeout_error(task)
            else:
                size = self._lookup(entry.workflow, entry.task).profile.output_bytes
                outcome.output = emulated_output(size)
                outcome.exec_s = exec_s
        self._report(outcomes)

    def _tells_steps(self, entry: QueuedTask) -> bool:
        """Whether ``entry``'s steps are reported: its job streams, or it feeds a stream."""
        if self._on_step is None:
            return False
        workflows = self.workflows
        return entry.stream or (
            workflows is not None and bool(workflows(entry.workflow).streamed_succs(entry.task))
        )

    def _fed_later(self, outcomes: list[TaskOutcome], task: Task, t0: float) -> bool:
        """An emulated task fed by streams ends no sooner than one of its steps after they
        end: whether it waits for them (then it ends later, by the same way)."""
        entry = outcomes[0].entry
        step_s = task.profile.exec_s / task.profile.steps * self._time_scale
        loop = asyncio.get_running_loop()

        def ended() -> None:  # (a job that ended breaks its streams: this comes then too)
            if not self._closed:
                self._timers[entry] = loop.call_later(
                    step_s, self._emulated_done, outcomes, task, t0, False, True
                )

        return self.feeds.when_ended(entry, ended)

    def _thread_done(
        self,
        outcomes: list[TaskOutcome],
        task: Task,
        work: asyncio.Future[Any],
        took: float | None,
    ) -> None:
        if self._stops.pop(outcomes[0].entry, None) is not None and self._streamed is not None:
            self._streamed.close(outcomes[0].entry)
        self._gates.pop(outcomes[0].entry, None)
        if self._deadlines.pop(work, None) is None or work.cancelled():
            return  # the worker is stopping
        error = work.exception()
        if error is None:
            # its call's own time in its thread, not the loop's turns before it heard of it;
            # a step-wise task suspended at its gate waited there: not its run's time either
            assert took is not None  # a call that returned
            exec_s = took - outcomes[0].entry.suspended_s
            result = work.result()
            if task.batch <= 1:
                outcomes[0].output = result
                outcomes[0].exec_s = exec_s
            else:
                for outcome, output in zip(outcomes, result, strict=True):
                    outcome.exec_s = exec_s
                    if isinstance(output, Exception):  # this item alone failed
                        outcome.error = output
                        outcome.error_text = "".join(traceback.format_exception(output))
                    else:
                        outcome.output = output
        elif isinstance(error, TimeoutError) and work in self._threads.abandoned:
            for outcome in outcomes:
                outcome.error = self._timeout_error(task)
                outcome.still_running = True
        else:
            text = "".join(traceback.format_exception(error))
            for outcome in outcomes:
                outcome.error = error
                outcome.error_text = text
        self._report(outcomes)

    def _report(self, outcomes: list[TaskOutcome]) -> None:
        for outcome in outcomes:
            self.feeds.discard(outcome.entry)
            try:
                self._on_outcome(outcome)
            except Exception:  # a bug in reporting one task must not go unseen
                log.exception("reporting the outcome of task %r failed", outcome.entry.task)

    def _timeout_error(self, task: Task) -> CompassTimeout:
        limit = task.timeout_ms / 1000.0 if task.timeout_ms is not None else self._task_timeout_s
        return CompassTimeout(f"task {task.name!r} ran past its timeout of {limit:g} s")

    def _arm(self, deadline: float) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = asyncio.get_running_loop().call_at(deadline, self._expire)

    def _expire(self) -> None:
        """Abandon every real task past its deadline, then wait for the next deadline. An
        abandoned task fails with TimeoutError at once; its thread runs on, and
        ``on_returned`` hears when it is done."""
        self._watchdog = None
        now = asyncio.get_running_loop().time()
        for work, (deadline, entry) in list(self._deadlines.items()):
            if deadline <= now and not work.done():
                log.warning("task %r of job %s is stuck past its timeout", entry.task,
                            entry.job_id)  # fmt: skip
                self._threads.abandon(work, functools.partial(self._on_returned, entry))
        if self._deadlines and not self._closed:
            self._arm(min(deadline for deadline, _ in self._deadlines.values()))


#: called on the loop once work settles: its future, and its call's own time in its thread
#: (None where the call did not return: given up on, or cancelled)
Then = Callable[[asyncio.Future[Any], float | None], None]


class TaskThreads:
    """Daemon threads that run task functions, reused when idle. A thread stuck in a task is
    never joined, so it cannot hold up the worker's exit; the next task gets another.

    Each call is timed in its thread, by ``clock``: a task's measured time is its own, not the
    wait for the GIL before it nor for the loop's turn after it, which grow with the worker's
    load (a no-op's learned time measured on the loop moved past the planner's tolerance about
    every ten jobs on a loaded machine, each rebuilding its workflow's cost table)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._work: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._count = 0
        #: work given up on (timed out) -> what to call when its thread returns after all
        self.abandoned: dict[asyncio.Future[Any], Callable[[], None]] = {}
        #: work under way -> what :meth:`run` was told to call once it settles
        self._then: dict[asyncio.Future[Any], Then] = {}

    def abandon(self, work: asyncio.Future[Any], returned: Callable[[], None]) -> None:
        """Stop waiting for ``work`` (it fails with TimeoutError now, ``then`` on the next turn);
        ``returned`` is called on the loop when its thread is done with it."""
        self.abandoned[work] = returned
        work.set_exception(TimeoutError())
        work.exception()  # retrieved: its awaiter may be gone
        then = self._then.pop(work, None)
        if then is not None:
            work.get_loop().call_soon(then, work, None)

    def cancel(self, work: asyncio.Future[Any]) -> None:
        """Stop waiting for ``work`` (the worker stops): cancelled, ``then`` on the next turn."""
        if work.cancel():
            then = self._then.pop(work, None)
            if then is not None:
                work.get_loop().call_soon(then, work, None)

    def run(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Callable[..., Any],
        *args: Any,
        then: Then | None = None,
    ) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in a task thread; the future settles on ``loop``, the running
        one (passed in: asking for it is a system call on Python 3.11, getpid). ``then``:
        called with the future and the call's time as soon as it settles (a done callback
        would wait for the loop's next turn), unless it is cancelled (the worker stops)."""
        future: asyncio.Future[Any] = loop.create_future()
        if then is not None:
            self._then[future] = then
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
        self, future: asyncio.Future[Any], result: Any, error: BaseException | None, took: float
    ) -> None:
        returned = self.abandoned.pop(future, None)
        then = self._then.pop(future, None)
        if returned is not None:
            returned()
        elif not future.done():  # else cancelled: the worker is stopping
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
            if then is not None:
                then(future, took)

    def _serve(self) -> None:
        while True:
            loop, future, fn, args = self._work.get()
            began = self._clock()
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # call_task turns user code's into Exceptions already
                result, error = None, exc
            took = self._clock() - began
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(self._settle, future, result, error, took)
            del loop, future, fn, args, result, error
            with self._lock:
                self._idle += 1


def _outcomes(run: RunTask) -> list[TaskOutcome]:
    """The outcomes of ``run``'s entries, to be filled as they end."""
    entries = run.entries
    return [
        TaskOutcome(
            entry,
            queue_s=entry.queued_s,  # before its first step
            fetch_s=run.fetch_s,
            cache_hit=run.hit is not False,
            batch=len(entries),
            first=entry is run.entry,
            lane=run.lane,
            run=entries,
            stimulus=run.stimulus,
        )
        for entry in entries
    ]


def _step_output(task: Task) -> np.ndarray:
    """An emulated step's partial output: its share of the task's declared output."""
    return emulated_output(task.profile.output_bytes // task.profile.steps)


def _reporter(
    loop: asyncio.AbstractEventLoop,
    on_step: Callable[[QueuedTask, int, Any], None],
    entry: QueuedTask,
) -> Callable[[int, Any], None]:
    """``report(seq, value)`` for a task's thread: ``on_step(entry, seq, value)`` on ``loop``."""

    def report(seq: int, value: Any) -> None:
        loop.call_soon_threadsafe(on_step, entry, seq, value)

    return report
