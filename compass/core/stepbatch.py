"""Step batches (continuous batching) in the lanes: their members and when each should end.

Step-wise tasks of a batch group run as one batch whose members come and go at step
boundaries. The run starts with the queued tasks of its group; while it runs, a task of the
group that would otherwise wait for a lane takes a free seat
(:class:`~compass.core.events.JoinRun`: the adapter seats it at the batch's next step). Each
member leaves when its own steps end, and its seat goes to the queue; the lane is free when the
last one leaves. A join never makes a member miss its deadline (each member makes every step
longer, by the group's batch curve). Where the worker preempts, the batch is suspended whole
at a step boundary (:mod:`compass.core.suspend`); the member that resumes first takes the
others back into its batch before any other queued task.

Part of the worker core (:mod:`compass.core.lanes` drives it). Sans-IO: every call passes the
current time.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any

from compass.core.queue import QueuedTask, TaskQueue
from compass.workflow.dag import batch_key, batch_limit

__all__ = ["StepBatch", "closed", "with_open"]


class StepBatch:
    """The members of the step batch ``lead`` started, and their expected ends at its size
    now. ``lead.run_s`` is kept at the batch's span (what the queue's waits count of it)."""

    __slots__ = ("ends", "lead", "seen")

    def __init__(self, lead: QueuedTask, now: float) -> None:
        self.lead = lead
        self.ends = {lead: now + lead.expected_s}
        #: the steps each member had done in all at its last report (where steps are reported)
        self.seen: dict[QueuedTask, int] = {}

    def take(
        self, queue: TaskQueue, now: float, first: Container[QueuedTask] = ()
    ) -> list[QueuedTask]:
        """Queued tasks of the batch's group take its free seats (:meth:`TaskQueue.take_steps`:
        those in ``first``, suspended members, before the rest; the rest never making a member
        miss its deadline); they are returned."""
        lead = self.lead
        assert lead.group is not None
        room = batch_limit(lead.scale, lead.max_batch) - len(self.ends)
        joined = queue.take_steps(lead.group, room, self.ends, now, first)
        self._span(now)
        return joined

    def left(self, entry: QueuedTask, now: float) -> None:
        """Member ``entry`` ended."""
        self.ends.pop(entry, None)
        self.seen.pop(entry, None)
        self._span(now)

    def progress(
        self, entry: QueuedTask, left: float, now: float
    ) -> list[tuple[QueuedTask, float, int]]:
        """Every member, each with the seconds of steps it has left and the steps it has done,
        at the boundary ``entry`` just reported (``left`` its own seconds to go): the others'
        as of their last report (a member after ``entry`` in the batch reports this boundary
        next) or, never reported, as seated."""
        seen = self.seen
        return [
            (m, left if m is entry else max(0.0, end - now), seen.get(m, m.done_steps))
            for m, end in self.ends.items()
        ]

    def left_s(self, entry: QueuedTask, done: int) -> float:
        """Expected seconds of member ``entry``'s steps after ``done`` of its run's (a resumed
        one's are the rest of its steps), at the batch's size."""
        steps = max(1, entry.steps - entry.done_steps)
        return (self.ends[entry] - entry.started_at) / steps * max(0, steps - done)

    def _span(self, now: float) -> None:
        lead = self.lead
        lead.run_s = max(self.ends.values(), default=now) - lead.started_at


def closed(runs: dict[str, list[Any]], group: str | None, run: Any) -> None:
    """``run``, a step batch of ``group`` among the ``runs`` open on a worker's lanes, is
    over (its last member ended) or suspended: no task joins it any more."""
    if group is None or group not in runs:
        return
    mine = runs[group]
    if run in mine:
        mine.remove(run)
    if not mine:
        del runs[group]


def with_open(
    found: dict[str, tuple[int, float]], batches: Iterable[StepBatch]
) -> dict[str, tuple[int, float]]:
    """``found`` (:meth:`TaskQueue.batchable`) with each running step batch: its members and
    the tasks queued for its seats, starting now (a task of its group takes a seat at its next
    step)."""
    for batch in batches:
        model = batch.lead.model
        assert model is not None
        key = batch_key(model, batch.lead.steps)
        found[key] = (len(batch.ends) + found.get(key, (0, 0.0))[0], 0.0)
    return found
