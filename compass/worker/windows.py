"""Backpressure from a streamed job's caller to the steps that make its partial outputs.

A step-wise sink of a streamed job gets a window of ``stream_window`` partial outputs: it
makes that many ahead of what its caller has read, then its next step waits, in its task
thread, until the caller reads one (the ingress's reader, on the event loop, calls
:meth:`StreamedSteps.read`). So a slow caller slows the generation instead of growing a
queue: the ingress holds at most the window for it, the wire its own window.

A caller that stops reading for good would hold the task's lane for ever: a step that waits
longer than ``stream_stall_s`` fails the job with :class:`~compass.errors.StreamOverrun`, which
says why. A stopped task (its job ended elsewhere) stops waiting at once.

A sink running on another worker than its job's ingress has its window there, and the
ingress tells it what its caller read: a ``read`` notify (``{job, task, seq}``, from peers
only) to the worker its plan places the sink on, one per partial output read, each saying all
read so far (a lost one is made good by the next). It is flow control, as the wire's credit
frames are, so it goes from adapter to adapter, not through the worker cores.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from compass.config import WorkerConfig
from compass.core.events import Event, TaskStep
from compass.core.queue import QueuedTask
from compass.errors import StreamOverrun

if TYPE_CHECKING:
    from compass.app import App
    from compass.core.state import WorkerCore

__all__ = ["READ_OP", "Chunks", "StepHost", "StepWindow", "StreamedSteps"]

#: the notify an ingress sends the worker running a streamed sink: what its caller read
READ_OP = "read"

#: where an ingress hands a streamed job's partial outputs: ``chunks(job, task, seq, value)``
Chunks = Callable[[str, str, int, Any], None]


class StepWindow:
    """One streamed sink's steps against its caller's reads (thread-safe: the task's thread
    waits in :meth:`before_step`, the event loop calls :meth:`read` and :meth:`wake`)."""

    __slots__ = ("_changed", "_ended", "_read", "size", "stall_s", "task")

    def __init__(self, task: str, size: int, stall_s: float) -> None:
        self.task = task
        self.size = size
        self.stall_s = stall_s
        self._changed = threading.Condition()
        self._read = 0  # partial outputs the caller has read
        self._ended = False

    def before_step(self, made: int) -> float:
        """In the task's thread, before it makes its partial output number ``made`` (from 0):
        wait while the caller is a whole window behind. Returns the seconds waited; raises
        :class:`StreamOverrun` past ``stall_s`` of waiting for one read."""
        with self._changed:
            if made - self._read < self.size or self._ended:
                return 0.0
            began = time.monotonic()
            deadline = began + self.stall_s
            while made - self._read >= self.size and not self._ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StreamOverrun(
                        f"task {self.task!r} made {made} partial outputs and its caller read "
                        f"{self._read}: it waited {self.stall_s:g} s for the caller to read one "
                        f"(--stream-stall-s), so its job failed rather than hold its lane"
                    )
                self._changed.wait(left)
            return time.monotonic() - began

    def read(self, seq: int) -> None:
        """The caller read partial output ``seq``: the steps may run that much further."""
        with self._changed:
            if seq + 1 > self._read:
                self._read = seq + 1
                self._changed.notify_all()

    def wake(self) -> None:
        """The task is stopped: it waits for no read any more (it stops at its next step)."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()


class StepHost(Protocol):
    """What :class:`StreamedSteps` needs of its worker (the worker is one)."""

    name: str
    config: WorkerConfig
    app: App
    clock: Callable[[], float]

    @property
    def core(self) -> WorkerCore: ...

    @property
    def membership(self) -> Told | None: ...

    def apply(self, event: Event) -> None: ...


class Told(Protocol):
    """A worker's membership, whose channels tell peers."""

    @property
    def channels(self) -> Sends: ...


class Sends(Protocol):
    def send(self, name: str, op: str, body: Any) -> bool: ...


class StreamedSteps:
    """Where the steps of a streamed job's step-wise tasks go, and the windows of the sinks
    among them, by (job, task).

    Each step's partial output goes to the worker core (:meth:`report`, on the event loop:
    its :class:`~compass.core.events.TaskStep`); a sink of a streamed job gets a window
    (:meth:`open`) of the worker's ``stream_window``, waiting at most its ``stream_stall_s``
    for a read. One window per running task at most (it goes when the task ends): the table
    is as big as the lanes.
    """

    def __init__(self, worker: StepHost) -> None:
        self._worker = worker
        self.size = worker.config.stream_window
        self.stall_s = worker.config.stream_stall_s
        self._open: dict[tuple[str, str], StepWindow] = {}

    def report(self, entry: QueuedTask, seq: int, value: Any) -> None:
        """Partial output ``seq`` of ``entry``, made: to the core (on the event loop)."""
        self._worker.apply(TaskStep(self._worker.clock(), entry, seq, value))

    def __len__(self) -> int:
        return len(self._open)

    def open(self, entry: QueuedTask) -> StepWindow | None:
        """A window for step-wise ``entry`` of a streamed job, starting now, or None when its
        partial outputs go to no caller (it is not a sink of its workflow)."""
        if entry.task not in self._worker.app.get_workflow(entry.workflow).sinks:
            return None
        window = StepWindow(entry.task, self.size, self.stall_s)
        self._open[entry.job_id, entry.task] = window
        return window

    def close(self, entry: QueuedTask) -> None:
        """``entry`` ended: its window goes (a read that comes later finds none)."""
        window = self._open.pop((entry.job_id, entry.task), None)
        if window is not None:
            window.wake()

    def stop(self, entry: QueuedTask) -> None:
        """``entry`` is stopped: it waits no more."""
        window = self._open.get((entry.job_id, entry.task))
        if window is not None:
            window.wake()

    def read(self, job_id: str, task: str, seq: int) -> None:
        """The caller of ``job_id``, reading at this ingress, took partial output ``seq`` of
        sink ``task``: its window moves on, here or where the job's plan runs it."""
        window = self._open.get((job_id, task))
        if window is not None:
            window.read(seq)
            return
        worker = self._worker
        job = worker.core.ingress.jobs.get(job_id)
        runs_on = None if job is None else job.plan.get(task)
        membership = worker.membership
        if runs_on is not None and runs_on != worker.name and membership is not None:
            membership.channels.send(runs_on, READ_OP, {"job": job_id, "task": task, "seq": seq})

    def heard_read(self, job_id: str, task: str, seq: int) -> None:
        """A peer, the ingress of ``job_id``, says its caller read partial output ``seq`` of
        ``task``, which runs here (a read for a task not running here is late: ignored)."""
        window = self._open.get((job_id, task))
        if window is not None:
            window.read(seq)
