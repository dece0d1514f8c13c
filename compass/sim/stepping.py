"""The simulator's step-wise runs: when each step ends, when a run ends (sooner when stopped,
later when suspended and resumed), and which scheduled end still counts.

A step-wise task's run (:class:`~compass.core.events.RunTask` of a task whose profile has
``steps`` above 1) ends once its steps are done, unless its worker's core stops it at a step
boundary (:class:`~compass.core.events.StopTask`: it ends with its step under way) or suspends
it there (:class:`~compass.core.events.SuspendTask`: its run ends now, and its next run, when
the core resumes it, has the steps it has left). Where the core preempts, every step's end is
an event of its own (:class:`~compass.core.events.TaskStep`). Each run's end is scheduled
once; a later decision makes the scheduled one stale (:class:`RunEnd.live`), never a second
end of the task.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from compass.core.events import Event, RunTask, TaskStep
from compass.core.lanes import Lanes
from compass.core.queue import QueuedTask
from compass.sim.result import TaskRecord

__all__ = ["RunEnd", "Stepping"]


class SteppingWorker(Protocol):
    """What the step-wise runs use of a simulated worker."""

    name: str
    busy_s: float

    @property
    def lanes(self) -> Lanes: ...


class SteppingHost(Protocol):
    """What the step-wise runs use of the simulation."""

    now: float
    task_records: list[TaskRecord]

    def schedule(self, t: float, handler: Callable[[Any], None], arg: Any) -> None: ...


@dataclass(slots=True, eq=False)
class RunEnd:
    """When a step-wise run is to end; no longer ``live`` once stopped sooner, suspended, or
    ended (its scheduled event is then stale)."""

    at: float
    live: bool = True


class Stepping:
    """The step-wise runs of one simulation (see the module docstring). ``feed(worker, event)``
    hands a step's end to that worker's core; ``end(arg)`` is the handler of a run's end, with
    ``arg`` ``(worker, run, exec_s, RunEnd)``."""

    def __init__(
        self,
        host: SteppingHost,
        feed: Callable[[Any, Event], None],
        end: Callable[[tuple[Any, RunTask, float, RunEnd | None]], None],
    ) -> None:
        self._host = host
        self._feed = feed
        self._end = end
        #: runs under way: their worker, run, start and step time
        self._running: dict[QueuedTask, tuple[Any, RunTask, float, float]] = {}
        self._ends: dict[QueuedTask, RunEnd] = {}

    def begun(
        self, worker: SteppingWorker, run: RunTask, exec_s: float, steps: int, *, tell: bool
    ) -> float:
        """``run`` began, ``exec_s`` of ``steps`` steps: its end is scheduled, and each step's
        but the last where the core preempts or the run must ``tell`` them (it feeds a
        streamed edge; its last step is told with its end). Its step time."""
        now = self._host.now
        step_s = exec_s / steps
        self._running[run.entry] = (worker, run, now, step_s)
        self.end_at(worker, run, now + exec_s, exec_s)
        if (tell or worker.lanes.preempt) and steps > 1:  # the core hears each step's end
            self._host.schedule(now + step_s, self._boundary, (worker, run, 1))
        return step_s

    def _boundary(self, arg: tuple[Any, RunTask, int]) -> None:
        """Step ``done`` of ``run`` (its run's count) ended: the worker's core hears it, and
        the next one is timed."""
        worker, run, done = arg
        entry = run.entry
        began = self._running.get(entry)
        if began is None or began[1] is not run:
            return  # stopped or suspended since
        self._feed(worker, TaskStep(self._host.now, entry, entry.done_steps + done - 1, None))
        if self._running.get(entry) is began and done + 1 < entry.steps - entry.done_steps:
            self._host.schedule(self._host.now + began[3], self._boundary, (worker, run, done + 1))

    def suspend(self, worker: SteppingWorker, entry: QueuedTask) -> None:
        """``entry`` gave its lane up at this step boundary: its scheduled end is stale (it
        ends after it resumes), its lane time so far counts, as a task record of its own."""
        host = self._host
        began = self._running.pop(entry, None)
        self._ends.pop(entry).live = False
        ran = host.now - entry.started_at
        worker.busy_s += ran
        fetch_s = 0.0 if began is None else began[1].fetch_s
        queued, suspended = entry.run_waits()
        host.task_records.append(
            TaskRecord(entry.job_id, entry.task, worker.name, queued, fetch_s, entry.transfer_s,
                       ran, None if entry.model is None else True, suspended_s=suspended)
        )  # fmt: skip

    def stop(self, entries: tuple[QueuedTask, ...]) -> None:
        """The job of ``entries`` ended: a step-wise one ends with its step under way (the
        end it had scheduled is then stale); a plain one runs on, a suspended one never
        resumes."""
        for entry in entries:
            began = self._running.pop(entry, None)
            if began is None:
                continue
            worker, run, start, step_s = began
            steps = max(1, math.ceil((self._host.now - start) / step_s - 1e-9))
            end = start + steps * step_s
            if end < self._ends[entry].at:
                self.end_at(worker, run, end, end - start)

    def finish(self, run: RunTask) -> bool:
        """``run`` ended at its live end: forget it. Whether it ran all its steps (not
        stopped sooner)."""
        self._ends.pop(run.entry, None)
        return self._running.pop(run.entry, None) is not None

    def end_at(self, worker: SteppingWorker, run: RunTask, at: float, exec_s: float) -> None:
        """``run`` ends at ``at``: the end scheduled before, if any, is stale."""
        entry = run.entry
        if (before := self._ends.get(entry)) is not None:
            before.live = False
        end = self._ends[entry] = RunEnd(at)
        self._host.schedule(at, self._end, (worker, run, exec_s, end))
