"""What happened to one task that ran: the executor's report, read by the core (its event), the
stats, metrics, timeline and traces. A record of the core's, so that what reads it needs no
import of the adapter that runs tasks (:mod:`compass.worker.executor`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compass.core.causes import Cause, Caused
from compass.core.events import TaskDone, TaskFailed
from compass.core.queue import QueuedTask
from compass.errors import CompassTimeout, JobFailed, StreamOverrun, WorkerUnavailable

__all__ = ["TaskOutcome"]


@dataclass(slots=True)
class TaskOutcome(Caused):
    """What happened to one task, with where its time went (seconds)."""

    entry: QueuedTask
    output: Any = None
    error: BaseException | None = None
    error_text: str = ""
    queue_s: float = 0.0
    fetch_s: float = 0.0
    exec_s: float = 0.0
    cache_hit: bool = True
    #: abandoned past its timeout, its thread still runs (it keeps its model pinned)
    still_running: bool = False
    #: how many tasks its run took (1: it ran alone)
    batch: int = 1
    #: the first entry of its run (the one a batch's measurements are recorded under)
    first: bool = True
    #: the lane it ran on (GPU lanes from 0, host lanes after them)
    lane: int = 0
    #: every entry of its run, its own included (a batch's mates are the others)
    run: tuple[QueuedTask, ...] = ()
    #: the core's event that started its run (:attr:`RunTask.stimulus`; :attr:`cause`)
    stimulus: Cause = ""
    #: steps it took (a step-wise task; 0 for a plain one), and when its first ended (seconds
    #: after its call began: the basis of its time to first output)
    steps: int = 0
    first_step_s: float | None = None
    #: stopped between two steps because its job ended (its error says so; not a failure)
    stopped: bool = False
    #: seconds its steps waited for a slow caller to read their partial outputs (backpressure:
    #: counted in ``exec_s``, left out of what the profiles learn)
    waited_s: float = 0.0

    @property
    def model(self) -> str | None:
        return self.entry.model

    @property
    def transfer_s(self) -> float:
        return self.entry.transfer_s

    @property
    def suspended_s(self) -> float:
        """Seconds it waited suspended at step boundaries, in all (``queue_s`` is its wait
        before its first step; ``exec_s`` counts neither)."""
        return self.entry.suspended_s

    def event(self, now: float) -> TaskDone | TaskFailed:
        """The worker core's event for this outcome. compass's own verdicts (a timeout, a
        degraded worker, a caller too slow to read) keep their type for the client; a task's
        own error is JobFailed."""
        error = self.error
        if error is None:
            measured = self.exec_s - self.waited_s  # the task's own time, not its caller's
            return TaskDone(now, self.entry, self.output, measured, self.batch, self.first,
                            self.steps)  # fmt: skip
        kept = CompassTimeout | WorkerUnavailable | StreamOverrun
        code = error.code if isinstance(error, kept) else ""
        text = f"{type(error).__name__}: {error}"
        if self.batch > 1:
            text += f" (in a batch of {self.batch})"
        return TaskFailed(
            now, self.entry, text, self.error_text, code or JobFailed.code, self.still_running
        )
