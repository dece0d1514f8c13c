"""What a job hears when the lanes drop one of its tasks for its deadline, sans-IO: the
:class:`~compass.errors.DeadlineExceeded` of a task shed from the queue (its expected start is
too late) or when a lane takes it (starting now is too late).

Part of the worker core (:mod:`compass.core.lanes` decides; here is only what it says).
"""

from __future__ import annotations

from compass.core.queue import QueuedTask
from compass.errors import DeadlineExceeded

__all__ = ["queued_too_late", "starts_too_late"]


def queued_too_late(entry: QueuedTask, wait_s: float, now: float) -> DeadlineExceeded:
    """Queued ``entry`` would wait ``wait_s`` from ``now``: too long for its job's deadline."""
    assert entry.deadline is not None
    late_s = now + wait_s + entry.remaining_s - entry.deadline
    return DeadlineExceeded(
        f"job {entry.job_id}: task {entry.task!r} would start {late_s * 1000:.1f} ms too "
        f"late for the job to finish by its deadline ({wait_s * 1000:.1f} ms of work "
        f"ahead of it, {entry.remaining_s * 1000:.1f} ms of work left on its critical "
        "path); dropped",
        detail={"job_id": entry.job_id, "task": entry.task, "late_s": late_s},
    )


def starts_too_late(entry: QueuedTask, left: float, load: str, now: float) -> DeadlineExceeded:
    """``entry``, taken by a lane at ``now`` with ``left`` seconds of its job's critical path
    to go (``load``: what its model's load adds, in words, or empty), misses the deadline."""
    assert entry.deadline is not None
    late_s = now + left - entry.deadline
    return DeadlineExceeded(
        f"job {entry.job_id}: task {entry.task!r} would start {late_s * 1000:.1f} ms too "
        f"late for the job to finish by its deadline ({entry.remaining_s * 1000:.1f} ms "
        f"of work left on its critical path{load}); dropped",
        detail={"job_id": entry.job_id, "task": entry.task, "late_s": late_s},
    )
