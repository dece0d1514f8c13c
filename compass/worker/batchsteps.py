"""Running step batches: continuous batching of step-wise tasks, as the worker core decides it.

The core starts a step batch with a :class:`~compass.core.events.RunTask` of a step-wise task
that batches (its entries the first members) and adds members with
:class:`~compass.core.events.JoinRun`; each member ends with an outcome of its own, and the
core frees the lane when the last has ended (:mod:`compass.core.lanes`). Here:

- **Emulated** (a task without a function, or ``--emulate``): a timer a step. A step of ``b``
  members lasts the slowest member's step time times the batch curve at ``b``; at its end,
  every member has a step fewer to go, a member whose steps are done (or whose job ended:
  :meth:`StepBatches.stop`) leaves with its outcome, and the members added since take their
  seats.
- **Real** (a step function, :func:`~compass.workflow.seats.step_batch`): one thread a batch
  calls the function once a step on the seats taken now, under inference mode in the model
  cache's compute scope, as a task thread does. What each seat's item says (a partial output,
  :class:`~compass.workflow.seats.Done`, an exception) decides whether it stays; members
  added meanwhile are seated before the next call; a member whose job ended leaves with
  :class:`~compass.worker.executor.TaskStopped`. A raise fails the members seated then.

A member's partial outputs are reported like a generator's steps where they are wanted (its
job streams, or it feeds a streamed edge). A member's measured time teaches its task's profile
only when it ran alone throughout (a batch's step is not one job's).
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from compass.core.events import JoinRun, RunTask
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.worker.calling import ThreadLoop
from compass.worker.devices import device_of, moved, to_host
from compass.workflow.dag import Task, batch_scale
from compass.workflow.seats import Done, Seat, is_step_batch

__all__ = ["StepBatches"]


class Running(Protocol):
    """What the step batches use of the worker's task runner."""

    def lookup(self, workflow: str, task: str) -> Task: ...
    def tells_steps(self, entry: QueuedTask) -> bool: ...
    def step(self, entry: QueuedTask, seq: int, value: Any) -> None: ...
    def report(self, outcomes: list[TaskOutcome]) -> None: ...
    def emulated(self, task: Task, *, partial: bool) -> Any: ...
    def stopped_error(self, entry: QueuedTask, steps: int) -> Exception: ...
    def call(
        self, model: str | None, fn: Callable[[Any], Any], entry: QueuedTask
    ) -> asyncio.Future[Any]: ...
    def refresh(self, entry: QueuedTask) -> None: ...
    def unwatch(self, work: asyncio.Future[Any]) -> None: ...
    def timeout_error(self, entry: QueuedTask) -> Exception: ...


@dataclass(slots=True, eq=False)
class _Member:
    outcome: TaskOutcome
    task: Task
    #: emulated: steps to go; real: its seat
    left: int = 0
    seat: Seat | None = None
    began: float = field(default_factory=time.monotonic)
    #: the most members it shared a step with (itself included)
    size: int = 1
    stopped: bool = False
    #: suspended by the core (with its whole batch): it leaves at this step (an emulated
    #: one) or the next (a real one, whose thread has gone on), or before it took its seat,
    #: parked with its progress until resumed
    suspended: bool = False


@dataclass(slots=True, eq=False)
class _Batch:
    run: RunTask
    #: what the core knows it by: its first task (that of the :class:`JoinRun` that started
    #: it again, for a batch started anew by a join)
    key: QueuedTask
    members: list[_Member] = field(default_factory=list)
    joining: list[_Member] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    #: real: the lock the thread and the loop share over ``joining`` and stops, and whether
    #: the thread is gone (a join then starts another)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    #: real: a step ran past the task's timeout and its members failed; the thread, when it
    #: returns, reports nothing more
    dead: bool = False


class StepBatches:
    """The step batches of one worker (see the module docstring)."""

    def __init__(
        self, runner: Running, *, emulate: bool, time_scale: float, preempt: bool = False
    ) -> None:
        self._runner = runner
        self._emulate = emulate
        self._time_scale = time_scale
        #: the core decides at every step (preemption): each step is reported
        self._preempt = preempt
        #: suspended members, until their run resumes them
        self._parked: dict[QueuedTask, _Member] = {}
        #: batches under way by the core's first entry, and each member's batch
        self._batches: dict[QueuedTask, _Batch] = {}
        self._of: dict[QueuedTask, _Batch] = {}

    def handles(self, run: RunTask) -> bool:
        """Whether ``run`` is a step batch: a step-wise task that batches (or a step function,
        which is always called with seats)."""
        task = self._runner.lookup(run.entry.workflow, run.entry.task)
        if task.fn is not None and not self._emulate:
            return is_step_batch(task.fn)
        return run.entry.group is not None and run.entry.steps > 1

    def start(
        self, run: RunTask, outcomes: Sequence[TaskOutcome], key: QueuedTask | None = None
    ) -> None:
        """Step batch ``run`` starts with its entries seated (their outcomes given); ``key``:
        the first task the core knows it by (default: ``run``'s)."""
        outcomes = [o for o in outcomes if not self._unsuspended(o.entry)]
        if not outcomes:
            return
        batch = _Batch(run, run.entry if key is None else key)
        self._batches[batch.key] = batch
        members = [self._member(batch, o, run.lane) for o in outcomes]
        if self._is_real(members[0].task):
            batch.joining = members
            self._thread(batch)
        else:
            batch.members = members
            self._next(batch)

    def join(self, order: JoinRun, outcomes: Sequence[TaskOutcome]) -> None:
        """The core added ``order.entries`` to the batch of ``order.lead``: they take their
        seats at its next step (a batch whose last member just left starts again)."""
        batch = self._batches.get(order.lead)
        if batch is None:  # it emptied while the core added these: they run as a batch anew
            anew = RunTask(order.entries[0], order.lane, False, 0.0, None, order.entries[1:],
                           order.stimulus)  # fmt: skip
            self.start(anew, outcomes, key=order.lead)
            return
        members = [self._member(batch, o, order.lane) for o in outcomes]
        with batch.lock:
            restart = batch.closed
            batch.joining.extend(members)
            batch.closed = False
        if restart:
            self._thread(batch)

    def _unsuspended(self, entry: QueuedTask) -> bool:
        """Resumed ``entry`` is still seated (a real batch's thread had not reached the step
        where it would have parked it): it stays where it is. Whether it was."""
        return self._mark(entry, suspended=False)

    def suspend(self, entry: QueuedTask) -> bool:
        """The core suspended member ``entry`` (with its whole batch). Whether it is a member
        here."""
        return self._mark(entry, suspended=True)

    def _mark(self, entry: QueuedTask, *, suspended: bool) -> bool:
        """Mark member ``entry`` (seated, or about to be) suspended or not; whether it is a
        member here."""
        batch = self._of.get(entry)
        if batch is None:
            return False
        with batch.lock:
            for member in (*batch.members, *batch.joining):
                if member.outcome.entry is entry:
                    member.suspended = suspended
        return True

    def stop(self, entries: tuple[QueuedTask, ...]) -> None:
        """The jobs of ``entries`` ended: the members among them leave at the next step (a
        parked one at once); the others are not this module's."""
        for entry in entries:
            if (parked := self._parked.pop(entry, None)) is not None:
                parked.outcome.error = self._runner.stopped_error(entry, parked.outcome.steps)
                parked.outcome.stopped = True
                self._runner.report([parked.outcome])
                continue
            batch = self._of.get(entry)
            if batch is None:
                continue
            with batch.lock:
                for member in (*batch.members, *batch.joining):
                    if member.outcome.entry is entry:
                        member.stopped = True

    def close(self) -> None:
        """The worker stops: no more steps (real batches' threads end at their next step)."""
        for batch in self._batches.values():
            if batch.timer is not None:
                batch.timer.cancel()
            with batch.lock:
                for member in (*batch.members, *batch.joining):
                    member.stopped = True
        self._batches.clear()
        self._of.clear()

    def _member(self, batch: _Batch, outcome: TaskOutcome, lane: int) -> _Member:
        """``outcome``'s task takes a seat in ``batch`` on ``lane``: a resumed one as it was
        parked (its steps, its seat's state), a new one fresh."""
        entry = outcome.entry
        self._of[entry] = batch
        if (parked := self._parked.pop(entry, None)) is not None:
            parked.suspended = False
            parked.outcome.lane = lane
            return parked
        task = self._runner.lookup(entry.workflow, entry.task)
        member = _Member(outcome, task, left=task.profile.steps)
        if self._is_real(task):
            member.seat = Seat(dict(task.arguments(entry.inputs)), entry.job_id)
        return member

    def _is_real(self, task: Task) -> bool:
        return task.fn is not None and not self._emulate

    # -- emulated: a timer a step ----------------------------------------------------------

    def _next(self, batch: _Batch) -> None:
        members = batch.members
        scale = members[0].task.profile.batch_scale
        step_s = max(m.task.profile.exec_s / m.task.profile.steps for m in members)
        delay = step_s * batch_scale(scale, len(members)) * self._time_scale
        for member in members:
            member.size = max(member.size, len(members))
        batch.timer = asyncio.get_running_loop().call_later(delay, self._boundary, batch)

    def _boundary(self, batch: _Batch) -> None:
        runner = self._runner
        for member in list(batch.members):  # each reports its step first: the core decides
            outcome, entry = member.outcome, member.outcome.entry
            member.left -= 1
            outcome.steps += 1
            if outcome.steps == 1:
                outcome.first_step_s = time.monotonic() - member.began
            tells = runner.tells_steps(entry)
            if not member.stopped and (tells or (self._preempt and member.left > 0)):
                value = runner.emulated(member.task, partial=True) if tells else None
                runner.step(entry, outcome.steps - 1, value)  # the core may stop it here
        staying: list[_Member] = []
        leaving: list[_Member] = []
        for member in batch.members:  # then what the core decided there is carried out
            outcome = member.outcome
            if member.stopped:
                outcome.error = runner.stopped_error(outcome.entry, outcome.steps)
                outcome.stopped = True
                leaving.append(member)
            elif member.left <= 0:
                outcome.output = runner.emulated(member.task, partial=False)
                leaving.append(member)
            elif member.suspended:
                self._park(member)
            else:
                staying.append(member)
        batch.members = staying
        self._leave(batch, leaving)
        for member in batch.joining:  # suspended before it took its seat: parked as it is
            if member.suspended and not member.stopped:
                self._park(member)
        joining = [m for m in batch.joining if not m.suspended or m.stopped]
        batch.members += [m for m in joining if not m.stopped]
        self._leave(batch, [m for m in joining if m.stopped], seated=False)
        batch.joining = []
        if batch.members:
            self._next(batch)
        else:
            batch.timer = None
            self._batches.pop(batch.key, None)

    def _park(self, member: _Member) -> None:
        """Suspended ``member`` waits, outside any batch, for the core to resume it."""
        self._of.pop(member.outcome.entry, None)
        self._parked[member.outcome.entry] = member

    def _leave(self, batch: _Batch, members: list[_Member], *, seated: bool = True) -> None:
        """``members`` leave the batch: each one's outcome is reported."""
        if not members:
            return
        for member in members:
            outcome = member.outcome
            self._of.pop(outcome.entry, None)
            outcome.exec_s = time.monotonic() - member.began
            # the batch is one run of its size, counted under its lead; a shared step's time is
            # not one job's to learn from (:meth:`Estimates.observe_run`)
            outcome.batch = member.size
            outcome.first = outcome.entry is batch.run.entry
            if not seated and outcome.error is None:
                outcome.error = self._runner.stopped_error(outcome.entry, 0)
                outcome.stopped = True
        self._runner.report([m.outcome for m in members])

    # -- real: a thread a batch --------------------------------------------------------------

    def _thread(self, batch: _Batch) -> None:
        loop = asyncio.get_running_loop()
        lead = batch.run.entry
        task = self._runner.lookup(lead.workflow, lead.task)

        def body(module: Any) -> None:  # in the batch's thread, in the compute scope
            self._drive(batch, task, module, loop)

        def ended(work: asyncio.Future[Any]) -> None:  # on the loop
            self._runner.unwatch(work)
            if not work.cancelled() and (error := work.exception()) is not None:
                if isinstance(error, TimeoutError):  # a step past the timeout: abandoned
                    self._fail_all(batch, self._runner.timeout_error(lead), stuck=True)
                else:
                    self._fail_all(batch, error)
            with batch.lock:
                over = batch.closed and not batch.joining
            if over and self._batches.get(batch.key) is batch:
                del self._batches[batch.key]

        work = self._runner.call(lead.model, body, lead)
        work.add_done_callback(ended)

    def _drive(
        self, batch: _Batch, task: Task, module: Any, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Call the step function once a step on the seats taken now, until none is left."""
        thread_loop = ThreadLoop()  # an async step function's, kept from step to step
        try:
            self._steps(batch, task, module, loop, thread_loop)
        finally:
            thread_loop.close()

    def _steps(
        self,
        batch: _Batch,
        task: Task,
        module: Any,
        loop: asyncio.AbstractEventLoop,
        thread_loop: ThreadLoop,
    ) -> None:
        runner = self._runner
        device = device_of(module)
        members: list[_Member] = []
        while True:
            with batch.lock:
                for member in members:
                    if member.suspended:  # its seat, state and all, waits to be resumed
                        loop.call_soon_threadsafe(self._park, member)
                members = [m for m in members if not m.suspended]
                stopped = [m for m in members if m.stopped]
                members = [m for m in members if not m.stopped]
                for member in batch.joining:  # suspended before it took its seat
                    if member.suspended and not member.stopped:
                        loop.call_soon_threadsafe(self._park, member)
                seated = [m for m in batch.joining if not m.suspended or m.stopped]
                members += seated
                batch.members, batch.joining = members, []
                if not members and not stopped:
                    batch.closed = True
                    return
            if device is not None and device.type != "cpu":
                for member in seated:  # its inputs on the model's device
                    assert member.seat is not None
                    member.seat.inputs = moved(member.seat.inputs, device)
            leaving: list[_Member] = []
            for member in stopped:
                member.outcome.error = runner.stopped_error(member.outcome.entry,
                                                            member.outcome.steps)  # fmt: skip
                member.outcome.stopped = True
                leaving.append(member)
            if members:
                for member in members:
                    member.size = max(member.size, len(members))
                seats = [m.seat for m in members]
                assert all(seat is not None for seat in seats)
                loop.call_soon_threadsafe(runner.refresh, batch.run.entry)  # its timeout
                try:
                    items = task.call_steps(module, seats, thread_loop.awaited)  # type: ignore[arg-type]
                except Exception as exc:
                    text = "".join(traceback.format_exception(exc))
                    for member in members:
                        member.outcome.error, member.outcome.error_text = exc, text
                    leaving += members
                    members = []
                else:
                    members = self._stepped(members, items, leaving, loop)
            with batch.lock:
                if batch.dead:  # its step ran past the timeout: its members failed then
                    return
            if leaving:
                loop.call_soon_threadsafe(self._leave, batch, leaving)

    def _stepped(
        self,
        members: list[_Member],
        items: list[Any],
        leaving: list[_Member],
        loop: asyncio.AbstractEventLoop,
    ) -> list[_Member]:
        """What each seat's item says: the members that stay (the others join ``leaving``)."""
        runner = self._runner
        staying = []
        for member, item in zip(members, items, strict=True):
            seat, outcome = member.seat, member.outcome
            assert seat is not None
            seat.step += 1
            outcome.steps += 1
            if outcome.steps == 1:
                outcome.first_step_s = time.monotonic() - member.began
            if isinstance(item, Done):
                outcome.output = to_host(item.value)
                leaving.append(member)
            elif isinstance(item, Exception):
                outcome.error = item
                outcome.error_text = "".join(traceback.format_exception(item))
                leaving.append(member)
            else:
                tells = runner.tells_steps(outcome.entry)
                if tells or self._preempt:
                    value = to_host(item) if tells else None
                    loop.call_soon_threadsafe(runner.step, outcome.entry, outcome.steps - 1, value)
                staying.append(member)
        return staying

    def _fail_all(self, batch: _Batch, error: BaseException, *, stuck: bool = False) -> None:
        """The batch's thread failed outside the step function, or (``stuck``) a step ran
        past the task's timeout: every member fails. A stuck thread runs on, its model pinned
        until it returns (one member says so: the lane's run is stuck)."""
        with batch.lock:
            members = [*batch.members, *batch.joining]
            batch.members, batch.joining, batch.closed = [], [], True
            batch.dead = stuck
        for member in members:
            member.outcome.error = error
        if stuck and members:
            members[0].outcome.still_running = True
        self._leave(batch, members)
