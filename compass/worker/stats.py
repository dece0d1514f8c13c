"""Counters a worker keeps so that benchmarks can explain their results."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

# re-exported for old imports: it lives in compass.wire.codec (the client must not import worker/)
from compass.wire.codec import payload_bytes

if TYPE_CHECKING:
    from compass.worker.executor import TaskOutcome

__all__ = ["WorkerStats", "payload_bytes"]


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
    messages_dropped: int = 0
    #: events whose handling raised (logged with their traceback); the worker serves on
    internal_errors: int = 0

    def record(self, outcome: TaskOutcome) -> None:
        self.tasks_run += 1
        if outcome.error is not None:
            self.tasks_failed += 1
        if outcome.entry.model is not None:
            if outcome.cache_hit:
                self.cache_hits += 1
            else:
                self.cache_misses += 1
        self.queue_s += outcome.queue_s
        self.fetch_s += outcome.fetch_s
        self.transfer_s += outcome.entry.transfer_s
        self.exec_s += outcome.exec_s

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)
