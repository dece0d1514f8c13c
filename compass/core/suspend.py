"""The step-wise tasks suspended on one worker's lanes, sans-IO: whether a run gives its lane
up at a step boundary, the memory its state holds while it waits, and the error of a task
stopped there past saving.

Part of the worker core: :class:`~compass.core.lanes.Lanes` asks :class:`Suspensions` at each
step boundary (:meth:`Lanes.stepped <compass.core.lanes.Lanes.stepped>`) and carries out what
it allows (the tasks back in the queue, the head on their lane). The rules of the switch itself
are :mod:`compass.core.preempt`'s; here are the worker's own limits on them: one suspended
run a lane at most (preemptions never nest), a step batch gives way to no task of its own group
(that one takes a seat instead), and a suspended task's state (``state_bytes`` per step it ran)
is held in the cache's free slabs beside the head's model, or the switch is refused.

A step batch is suspended whole, as one run: every member goes back to the queue with the steps
it has left, and the switch is refused unless all their states fit. The members resume
together (the first to resume takes the others into its batch first:
:meth:`TaskQueue.take_steps <compass.core.queue.TaskQueue.take_steps>`), or join a batch of
their group running on another lane; each runs its steps once (the adapter keeps each member's
progress while it is parked). A member whose steps end at the very boundary where its batch is
suspended ends there as usual (:meth:`Lanes.ended <compass.core.lanes.Lanes.ended>` takes it
out of the queue).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from compass.cache.policy import CacheCore
from compass.cache.slab import SlabHandle
from compass.core.preempt import preempts_batch
from compass.core.queue import QueuedTask
from compass.errors import CompassError, DeadlineExceeded

__all__ = ["Suspensions", "past_saving_error"]


class Suspensions:
    """The tasks suspended on a worker whose cache is ``cache``, in the order they were
    suspended (the first resumes first), each with the slabs its state holds (None: none);
    ``count`` suspensions so far (a step batch's counts once), ``refused_for_state`` switches
    refused for want of room."""

    __slots__ = ("_runs", "cache", "count", "held", "refused_for_state")

    def __init__(self, cache: CacheCore) -> None:
        self.cache = cache
        self.held: dict[QueuedTask, SlabHandle | None] = {}
        #: each suspended task -> the suspension it was part of (a step batch's members share
        #: one): the worker holds at most one suspended run a lane
        self._runs: dict[QueuedTask, int] = {}
        self.count = 0
        self.refused_for_state = 0

    def __len__(self) -> int:
        return len(self.held)

    def __iter__(self) -> Iterator[QueuedTask]:
        return iter(self.held)

    def __contains__(self, entry: object) -> bool:
        return entry in self.held

    def loads(self, head: QueuedTask) -> bool:
        """Whether ``head``'s model must be loaded before it can run."""
        cache = self.cache
        model = head.model
        return model is not None and not (cache.is_resident(model) or cache.is_loading(model))

    def switches(
        self,
        members: Sequence[tuple[QueuedTask, float]],
        head: QueuedTask,
        now: float,
        *,
        lanes: int,
        group: str | None,
    ) -> bool:
        """Whether the run of ``members`` (each with the seconds of steps it has left; a step
        batch of ``group``, or a lone task with None) gives its lane to the queue's ``head`` at
        this boundary: the worker holds fewer suspended runs than its ``lanes``, ``head`` is
        not of the batch's group, and :func:`~compass.core.preempt.preempts_batch` says so,
        the head's model's load counted."""
        if len(set(self._runs.values())) >= lanes:
            return False  # one suspended run a lane at most: it resumes before anything else
        if group is not None and head.group == group:
            return False  # a task of its group takes a seat instead
        switch_s = head.fetch_s if self.loads(head) else 0.0
        return preempts_batch(members, head, now, switch_s=switch_s)

    def hold(
        self,
        members: Sequence[tuple[QueuedTask, int]],
        head: QueuedTask,
        upcoming: Callable[[], list[str]],
    ) -> bool:
        """Suspend ``members`` (each after the steps it ran), their states held in the cache,
        if they all fit and ``head``'s model, when it must be loaded, fits beside them
        (``upcoming``: the models the queue needs, which a load may not evict); False
        (counted, nothing held) when any does not."""
        states: list[SlabHandle | None] = []
        for entry, steps in members:
            state: SlabHandle | None = None
            if entry.state_bytes and steps:
                state = self.cache.hold_state(entry.state_bytes * steps)
                if state is None:
                    return self._refused(states)  # no room for its state: the run goes on
            states.append(state)
        if self.loads(head) and not self._fits(head, upcoming):
            return self._refused(states)
        self.count += 1
        for (entry, _), state in zip(members, states, strict=True):
            self.held[entry] = state
            self._runs[entry] = self.count
        return True

    def _refused(self, states: list[SlabHandle | None]) -> bool:
        for state in states:
            if state is not None:
                self.cache.release_state(state)
        self.refused_for_state += 1
        return False

    def _fits(self, head: QueuedTask, upcoming: Callable[[], list[str]]) -> bool:
        """Whether ``head``'s model can be loaded now (evicting what is not pinned)."""
        assert head.model is not None
        try:
            return self.cache.plan_load(head.model, upcoming()) is not None
        except CompassError:  # it can never fit here: its own run fails, not this choice
            return False

    def release(self, entry: QueuedTask) -> None:
        """``entry`` left the queue (to run again, or dropped): its state's slabs are free."""
        self._runs.pop(entry, None)
        state = self.held.pop(entry, None)
        if state is not None:
            self.cache.release_state(state)


def past_saving_error(entry: QueuedTask, done: int, left: float, now: float) -> DeadlineExceeded:
    """What the job of ``entry``, stopped after ``done`` steps of its run with ``left`` seconds
    of steps to go, is answered: its deadline cannot be made
    (:func:`~compass.core.preempt.past_saving`)."""
    assert entry.deadline is not None
    late_s = now + left - entry.deadline
    return DeadlineExceeded(
        f"job {entry.job_id}: task {entry.task!r} stopped after step {done}: the "
        f"{left * 1000:.1f} ms of steps it has left end {late_s * 1000:.1f} ms past the "
        "job's deadline; dropped",
        detail={"job_id": entry.job_id, "task": entry.task, "late_s": late_s},
    )
