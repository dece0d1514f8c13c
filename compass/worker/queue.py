"""The worker's local task queue: ready tasks in priority order, and what they add up to.

Sans-IO (every call that depends on time is given ``now``): the lanes
(:class:`~compass.worker.lanes.Lanes`) pop entries, the view reads :meth:`TaskQueue.wait_s` (the
paper's queue wait: expected seconds of queued plus running work) and the cache decisions read
:meth:`TaskQueue.upcoming_models` (the look-ahead input for eviction and prefetch).

Order: the smallest :attr:`QueuedTask.priority` first, ties (and tasks without one) in arrival
order. A task without a priority ranks at its enqueue time, so a queue where no task has one is
plain FIFO, as in the paper (and compass by default). Compass with ``oldest_job_first`` gives
each task its job's arrival time (oldest job first):
a task of a job that has been in the system longer overtakes tasks of younger jobs, so the
short tail of a long job (a join, a last branch) does not queue behind fresh work.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["QueuedTask", "TaskQueue"]


@dataclass(slots=True, eq=False)
class QueuedTask:
    """One task whose inputs are all here, waiting for a lane."""

    job_id: str
    attempt: int
    workflow: str
    task: str
    model: str | None
    expected_s: float
    inputs: dict[str, Any]
    plan: dict[str, str]
    ingress: str
    enqueued_at: float
    #: seconds its inputs spent on the wire (summed over pushes), for the time breakdown
    transfer_s: float = 0.0
    started_at: float = 0.0
    #: the job's wall-clock submit time, forwarded with the task's output
    t0: float = 0.0
    #: the queue runs smaller first (on the queue's clock, e.g. the job's arrival time);
    #: None ranks the task at its enqueue time
    priority: float | None = None
    #: the job's submit time on this worker's clock (what oldest-job-first ranks by)
    arrival: float = 0.0


class TaskQueue:
    """Ready tasks by priority plus the running ones, with an O(1) expected-wait total."""

    def __init__(self) -> None:
        self._ready: list[tuple[float, int, QueuedTask]] = []  # a heap
        self._order = itertools.count()
        # insertion-ordered, so upcoming_models() is deterministic
        self._running: dict[QueuedTask, None] = {}
        self._queued_s = 0.0

    def __len__(self) -> int:
        return len(self._ready)

    def __iter__(self) -> Iterator[QueuedTask]:
        """The queued tasks in the order they would be popped."""
        return (entry for _, _, entry in sorted(self._ready, key=_heap_key))

    @property
    def queued_s(self) -> float:
        """Expected seconds of the queued (not running) tasks."""
        return self._queued_s

    @property
    def running(self) -> frozenset[QueuedTask]:
        """The tasks popped and not yet finished."""
        return frozenset(self._running)

    def run_ends(self) -> list[float]:
        """When each running task is expected to end, in the order they started."""
        return [e.started_at + e.expected_s for e in self._running]

    def push(self, entry: QueuedTask) -> None:
        """Queue ``entry`` at its priority (its enqueue time when it has none)."""
        key = entry.enqueued_at if entry.priority is None else entry.priority
        heapq.heappush(self._ready, (key, next(self._order), entry))
        self._queued_s += entry.expected_s

    def pop(self, now: float) -> QueuedTask | None:
        """The next task to run (marked running at ``now``), or ``None`` when it is empty."""
        if not self._ready:
            return None
        entry = heapq.heappop(self._ready)[2]
        # no float drift once empty, and never below zero before that
        self._queued_s = max(0.0, self._queued_s - entry.expected_s) if self._ready else 0.0
        entry.started_at = now
        self._running[entry] = None
        return entry

    def finish(self, entry: QueuedTask) -> None:
        """``entry`` stopped running (done or failed)."""
        self._running.pop(entry, None)

    def drop_job(self, job_id: str, below_attempt: int | None = None) -> list[QueuedTask]:
        """Remove the job's queued tasks (of attempts below ``below_attempt`` when given)."""
        return self.drop(
            lambda e: e.job_id == job_id and (below_attempt is None or e.attempt < below_attempt)
        )

    def drop(self, stale: Callable[[QueuedTask], bool]) -> list[QueuedTask]:
        """Remove the queued tasks ``stale`` is true of; return them."""
        kept: list[tuple[float, int, QueuedTask]] = []
        dropped: list[QueuedTask] = []
        for item in self._ready:
            entry = item[2]
            if stale(entry):
                dropped.append(entry)
            else:
                kept.append(item)
        if dropped:
            heapq.heapify(kept)
            self._ready = kept
            self._queued_s = sum(item[2].expected_s for item in kept)
        return dropped

    def wait_s(self, now: float) -> float:
        """Expected seconds before a task queued at ``now`` could start on a single lane (one
        that ranks behind every queued task, as a new job's does)."""
        remaining = sum(max(0.0, e.started_at + e.expected_s - now) for e in self._running)
        return self._queued_s + remaining

    def upcoming_models(self) -> list[str]:
        """Models of the running and queued tasks, running first (they are pinned), then in
        the order the queue will run them."""
        models = [e.model for e in self._running if e.model is not None]
        models.extend(e.model for e in self if e.model is not None)
        return models


def _heap_key(item: tuple[float, int, QueuedTask]) -> tuple[float, int]:
    return item[0], item[1]
