"""The worker's local task queue: ready tasks in arrival order, and what they add up to.

Sans-IO: the executor pops entries, the view reads :meth:`TaskQueue.wait_s` (the paper's queue
wait: expected seconds of queued plus running work) and the model cache reads
:meth:`TaskQueue.upcoming_models` (the look-ahead input for eviction and prefetch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
    extra: dict[str, Any] = field(default_factory=dict)


class TaskQueue:
    """FIFO of ready tasks plus the set of running ones, with an O(1) expected-wait total."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._ready: deque[QueuedTask] = deque()
        self._running: set[QueuedTask] = set()
        self._queued_s = 0.0

    def __len__(self) -> int:
        return len(self._ready)

    def __iter__(self) -> Iterator[QueuedTask]:
        return iter(self._ready)

    @property
    def running(self) -> frozenset[QueuedTask]:
        return frozenset(self._running)

    def push(self, entry: QueuedTask) -> None:
        self._ready.append(entry)
        self._queued_s += entry.expected_s

    def pop(self) -> QueuedTask | None:
        """The next task to run (marked running), or ``None`` when the queue is empty."""
        if not self._ready:
            return None
        entry = self._ready.popleft()
        self._queued_s -= entry.expected_s
        if not self._ready:
            self._queued_s = 0.0  # no float drift once empty
        entry.started_at = self._clock()
        self._running.add(entry)
        return entry

    def finish(self, entry: QueuedTask) -> None:
        self._running.discard(entry)

    def drop_job(self, job_id: str, below_attempt: int | None = None) -> list[QueuedTask]:
        """Remove the job's queued tasks (of attempts below ``below_attempt`` when given)."""
        kept: deque[QueuedTask] = deque()
        dropped: list[QueuedTask] = []
        for entry in self._ready:
            stale = entry.job_id == job_id and (
                below_attempt is None or entry.attempt < below_attempt
            )
            (dropped if stale else kept).append(entry)
        if dropped:
            self._ready = kept
            self._queued_s = sum(e.expected_s for e in kept)
        return dropped

    def wait_s(self) -> float:
        """Expected seconds before a task queued now could start on a single lane."""
        now = self._clock()
        remaining = sum(max(0.0, e.started_at + e.expected_s - now) for e in self._running)
        return self._queued_s + remaining

    def upcoming_models(self) -> list[str]:
        """Models of the queued tasks in queue order (running ones first: they are pinned)."""
        models = [e.model for e in self._running if e.model is not None]
        models.extend(e.model for e in self._ready if e.model is not None)
        return models
