"""Counters a worker keeps so that benchmarks can explain their results.

Each counter has one writer: the core counts in its own :class:`WorkerStats` (jobs, moves,
peers lost, messages it dropped) inside ``handle``, the asyncio adapter in another (tasks run,
where their time went, peers joined, messages refused at the door, its own errors); what
``compass status`` and the metrics read is their sum (:meth:`WorkerStats.plus`).
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass
from typing import Any, Protocol

# re-exported for old imports: it lives in compass.payload, below the core and the wire
from compass.payload import payload_bytes

__all__ = ["RanTask", "WorkerStats", "payload_bytes"]


class RanTask(Protocol):
    """What the stats read of a task that ran (the executor's outcome is one)."""

    @property
    def error(self) -> BaseException | None: ...

    @property
    def model(self) -> str | None: ...

    @property
    def cache_hit(self) -> bool: ...

    @property
    def queue_s(self) -> float: ...

    @property
    def fetch_s(self) -> float: ...

    @property
    def transfer_s(self) -> float: ...

    @property
    def exec_s(self) -> float: ...


@dataclass(slots=True)
class WorkerStats:
    """Cumulative since start. Seconds are this worker's clock (scaled in emulated mode)."""

    tasks_run: int = 0
    tasks_failed: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    queue_s: float = 0.0
    fetch_s: float = 0.0
    transfer_s: float = 0.0
    exec_s: float = 0.0
    jobs_submitted: int = 0
    jobs_completed: int = 0
    jobs_failed: int = 0
    jobs_refused: int = 0
    #: jobs refused at once because no plan met their deadline (DeadlineUnreachable)
    jobs_unreachable: int = 0
    #: jobs answered DeadlineExceeded: a task of theirs would have started too late
    jobs_dropped: int = 0
    #: tasks this worker dropped because their job could no longer make its deadline
    tasks_shed: int = 0
    moves: int = 0
    replans: int = 0
    peers_joined: int = 0
    peers_lost: int = 0
    #: times a peer suspected this worker and it refuted in time (a busy worker, not a dead
    #: one: nothing is re-planned); and times a peer had declared it dead (it rejoined)
    suspicions_refuted: int = 0
    deaths_refuted: int = 0
    messages_dropped: int = 0
    #: events whose handling raised (logged with their traceback); the worker serves on
    internal_errors: int = 0

    def record(self, ran: RanTask) -> None:
        self.tasks_run += 1
        if ran.error is not None:
            self.tasks_failed += 1
        if ran.model is not None:
            if ran.cache_hit:
                self.cache_hits += 1
            else:
                self.cache_misses += 1
        self.queue_s += ran.queue_s
        self.fetch_s += ran.fetch_s
        self.transfer_s += ran.transfer_s
        self.exec_s += ran.exec_s

    def plus(self, other: WorkerStats) -> WorkerStats:
        """A new count: this one and ``other``, field by field."""
        return WorkerStats(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)
