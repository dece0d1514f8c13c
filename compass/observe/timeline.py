"""What ran on a worker lately: bounded rings of its task spans, model loads and answered jobs.

Every task that ends on a worker (ran, failed, timed out) becomes one :class:`TaskSpan`;
every model load, one :class:`LoadSpan`; every job answered at its ingress, one
:class:`JobEnd`. The rings are deques with a ``maxlen``: recording is one tuple appended per
task, nothing is ever scanned on the hot path, and the oldest entries fall off. Readers (the
dashboard's task stream and latency histogram, :mod:`compass.observe.dashboard`) ask for what
ended in the last seconds; a benchmark's timeline (``compass bench e2e --trace``) pages
through everything recorded with :meth:`Timeline.export`. A job's trace does not read these
rings: its spans travel with the job (:mod:`compass.observe.tracing`).

Times. A span's ``queued``, ``start`` and ``end`` are wall-clock seconds since the epoch
(``time.time()``) and its durations real seconds, also on an emulated worker (``--workload``
with a ``--time-scale``), whose own clock runs in workload time: a task stream is drawn
against the viewer's real clock, and spans of workers on several hosts line up once each
worker's ``now`` (sent with them) is subtracted. A job's ``latency_s`` and ``deadline_s`` are
on the worker's clock, as ``compass status`` and the Prometheus histograms have them, so a
latency compares with its deadline as the worker judged it.

Nothing here imports asyncio: the simulator or a test can fill a timeline by hand.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from compass.core.outcome import TaskOutcome

__all__ = [
    "JOB_FIELDS",
    "LOAD_FIELDS",
    "SPAN_FIELDS",
    "JobEnd",
    "LoadSpan",
    "TaskSpan",
    "Timeline",
    "rows",
]

#: task spans a worker keeps (a few seconds of a busy worker, minutes of a typical one)
MAX_SPANS = 8192
#: answered jobs a worker keeps
MAX_JOBS = 4096
#: model loads a worker keeps
MAX_LOADS = 2048


class TaskSpan(NamedTuple):
    """One task's time on a worker, from entering its queue to its end."""

    #: this worker's count of spans recorded, from 1 (with the worker's instance, a unique key)
    seq: int
    job: str
    #: the job's attempt (a job planned again after a lost peer runs a new one)
    attempt: int
    workflow: str
    task: str
    #: its model; None for a task without one
    model: str | None
    #: wall clock: its inputs were all here, it entered the queue
    queued: float
    #: wall clock: a lane took it (the model fetch, if any, then the execution)
    start: float
    #: wall clock: it ended
    end: float
    #: real seconds its lane waited for the model (0 on a cache hit)
    fetch_s: float
    #: real seconds its inputs spent on the wire
    transfer_s: float
    #: tasks in its run (1: alone; more: a batch)
    batch: int
    #: whether its model was resident when it asked; None without a model
    cache_hit: bool | None
    #: "" when it succeeded, else the error's type (``JobFailed``, ``CompassTimeout``...)
    error: str
    #: the lane it ran on (GPU lanes from 0, host lanes after them)
    lane: int = 0
    #: real seconds it executed (a batch: the batch's run)
    exec_s: float = 0.0


class LoadSpan(NamedTuple):
    """One model load on a worker: its weights copied into the cache."""

    #: this worker's count of loads recorded, from 1
    seq: int
    model: str
    #: wall clock: the load began, ended
    start: float
    end: float
    #: begun ahead of need (prefetch or warming), not for a task waiting on a lane
    prefetch: bool
    #: "" when it succeeded, else the error's type
    error: str


class JobEnd(NamedTuple):
    """A job answered at this ingress."""

    job: str
    workflow: str
    #: wall clock: when it was answered
    end: float
    #: submit to answer, on the worker's clock
    latency_s: float
    #: its deadline, on the worker's clock; None without one
    deadline_s: float | None
    #: ``met``, ``late``, ``unreachable``, ``dropped`` (jobs with a deadline); ``ok``,
    #: ``failed``, ``cancelled`` (the rest: ``failed`` too for a deadline job that failed)
    outcome: str
    priority: int
    #: of a workflow decided at run time: the choices it made, in words (``route: expert_a;
    #: refine: 3 iterations``), and how many tasks of its unrolled workflow it skipped
    taken: str = ""
    skipped: int = 0


#: the wire and JSON form of a span or a job: a list of its fields in this order (a map per
#: span would be twice the bytes and the msgpack elements)
SPAN_FIELDS: tuple[str, ...] = TaskSpan._fields
JOB_FIELDS: tuple[str, ...] = JobEnd._fields
LOAD_FIELDS: tuple[str, ...] = LoadSpan._fields

_Row = TypeVar("_Row", TaskSpan, JobEnd)


class Timeline:
    """The recent task spans and answered jobs of one worker.

    ``clock`` is the worker's clock (workload time on an emulated worker: a real second is
    ``1 / time_scale`` of it); ``wall`` the wall clock.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        time_scale: float = 1.0,
        wall: Callable[[], float] = time.time,
        max_spans: int = MAX_SPANS,
        max_jobs: int = MAX_JOBS,
        max_loads: int = MAX_LOADS,
    ) -> None:
        self._clock = clock
        self._scale = time_scale
        self._wall = wall
        self.spans: deque[TaskSpan] = deque(maxlen=max_spans)
        self.jobs: deque[JobEnd] = deque(maxlen=max_jobs)
        self.loads: deque[LoadSpan] = deque(maxlen=max_loads)
        #: spans recorded since the worker started (the last one's ``seq``)
        self.recorded = 0
        #: loads recorded since the worker started
        self.loads_recorded = 0

    def task_ended(self, outcome: TaskOutcome) -> None:
        """Record the span of a task that ended now (on the event loop, once per task)."""
        entry = outcome.entry
        wall, now, scale = self._wall(), self._clock(), self._scale
        self.recorded = seq = self.recorded + 1
        error = outcome.error
        self.spans.append(
            TaskSpan(
                seq,
                entry.job_id,
                entry.attempt,
                entry.workflow,
                entry.task,
                entry.model,
                wall - (now - entry.enqueued_at) * scale,  # first queued
                wall - (now - entry.first_started_at) * scale,  # its first run
                wall,
                outcome.fetch_s * scale,
                entry.transfer_s * scale,
                outcome.batch,
                None if entry.model is None else outcome.cache_hit,
                "" if error is None else type(error).__name__,
                outcome.lane,
                outcome.exec_s * scale,
            )
        )

    def load_ended(self, model: str, start: float, prefetch: bool, error: str = "") -> None:
        """Record a load of ``model`` that began at wall clock ``start`` and ended now."""
        self.loads_recorded = seq = self.loads_recorded + 1
        self.loads.append(LoadSpan(seq, model, start, self._wall(), prefetch, error))

    def job_answered(
        self,
        job: str,
        workflow: str,
        latency_s: float,
        deadline_s: float | None,
        outcome: str,
        priority: int = 0,
        taken: tuple[str, int] = ("", 0),
    ) -> None:
        """Record a job answered now at this ingress (``taken``: its choices in words and the
        tasks it skipped, of a workflow decided at run time)."""
        self.jobs.append(
            JobEnd(job, workflow, self._wall(), latency_s, deadline_s, outcome, priority, *taken)
        )

    def export(self, after: int, limit: int) -> dict[str, Any]:
        """Everything the rings hold past span ``after`` (a span's ``seq``): at most
        ``limit`` spans, the oldest first, as rows of :data:`SPAN_FIELDS`; every load kept, as
        rows of :data:`LOAD_FIELDS`; ``more`` when spans are left (ask again after the last
        ``seq``); ``lost`` when spans past ``after`` fell off the ring before this read."""
        spans = [span for span in self.spans if span.seq > after]
        oldest = self.spans[0].seq if self.spans else self.recorded + 1
        return {
            "span_fields": list(SPAN_FIELDS),
            "load_fields": list(LOAD_FIELDS),
            "spans": rows(spans[:limit]),
            "loads": rows(self.loads),
            "more": len(spans) > limit,
            "lost": oldest > after + 1,
            "now": self._wall(),
        }

    def recent_spans(self, window_s: float, limit: int) -> tuple[list[TaskSpan], bool]:
        """The spans that ended in the last ``window_s`` seconds, oldest first, at most the
        newest ``limit``; and whether ``limit`` cut some off."""
        return _recent(self.spans, self._wall() - window_s, limit)

    def recent_taken(self, limit: int) -> list[JobEnd]:
        """The last ``limit`` jobs of workflows decided at run time, oldest first."""
        out: list[JobEnd] = []
        for row in reversed(self.jobs):
            if len(out) == limit:
                break
            if row.taken:
                out.append(row)
        return out[::-1]

    def recent_jobs(self, window_s: float, limit: int) -> tuple[list[JobEnd], bool]:
        """The jobs answered in the last ``window_s`` seconds, likewise."""
        return _recent(self.jobs, self._wall() - window_s, limit)


def _recent(ring: deque[_Row], since: float, limit: int) -> tuple[list[_Row], bool]:
    # newest first, stopping at the first too old: a read costs what it returns, not the ring
    out: list[_Row] = []
    for row in reversed(ring):
        if row.end < since:
            return out[::-1], False
        if len(out) == limit:
            return out[::-1], True
        out.append(row)
    return out[::-1], False


def rows(items: Iterable[tuple[Any, ...]], digits: int = 6) -> list[list[Any]]:
    """``items`` (spans or jobs) as lists for the wire and JSON, floats rounded to
    ``digits`` decimals (microseconds: a span's times need no more)."""
    return [[round(v, digits) if type(v) is float else v for v in item] for item in items]
