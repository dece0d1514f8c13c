"""The step-wise tasks suspended on one worker's lanes, sans-IO: whether a task gives its lane
up at a step boundary, the memory its state holds while it waits, and the error of a task
stopped there past saving.

Part of the worker core: :class:`~compass.core.lanes.Lanes` asks :class:`Suspensions` at each
step boundary (:meth:`Lanes.stepped <compass.core.lanes.Lanes.stepped>`) and carries out what
it allows (the task back in the queue, the head on its lane). The rules of the switch itself
are :mod:`compass.core.preempt`'s; here are the worker's own limits on them: one suspended
task a lane at most (preemptions never nest), a step batch member gives way to no task of its
own group (that one takes a seat instead), and a suspended task's state (``state_bytes`` per
step it ran) is held in the cache's free slabs beside the head's model, or the switch is
refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from compass.cache.policy import CacheCore
from compass.cache.slab import SlabHandle
from compass.core.preempt import preempts
from compass.core.queue import QueuedTask
from compass.errors import CompassError, DeadlineExceeded

__all__ = ["Suspensions", "past_saving_error"]


class Suspensions:
    """The tasks suspended on a worker whose cache is ``cache``, in the order they were
    suspended (the first resumes first), each with the slabs its state holds (None: none);
    ``count`` suspensions so far, ``refused_for_state`` switches refused for want of room."""

    __slots__ = ("cache", "count", "held", "refused_for_state")

    def __init__(self, cache: CacheCore) -> None:
        self.cache = cache
        self.held: dict[QueuedTask, SlabHandle | None] = {}
        self.count = 0
        self.refused_for_state = 0

    def __len__(self) -> int:
        return len(self.held)

    def __iter__(self) -> Iterator[QueuedTask]:
        return iter(self.held)

    def loads(self, head: QueuedTask) -> bool:
        """Whether ``head``'s model must be loaded before it can run."""
        cache = self.cache
        model = head.model
        return model is not None and not (cache.is_resident(model) or cache.is_loading(model))

    def switches(
        self,
        entry: QueuedTask,
        left: float,
        head: QueuedTask,
        now: float,
        *,
        lanes: int,
        batched: bool,
    ) -> bool:
        """Whether running ``entry`` (``left`` seconds of steps to go; ``batched``: the last
        member of a step batch) gives its lane to the queue's ``head`` at this boundary: the
        worker holds fewer suspended tasks than its ``lanes``, ``head`` is not of ``entry``'s
        batch group, and :func:`~compass.core.preempt.preempts` says so, the head's model's
        load counted."""
        if len(self.held) >= lanes:
            return False  # one suspended task a lane at most: it resumes before anything else
        if batched and head.group == entry.group:
            return False  # a task of its group takes a seat instead
        switch_s = head.fetch_s if self.loads(head) else 0.0
        return preempts(entry, left, head, now, switch_s=switch_s)

    def hold(
        self,
        entry: QueuedTask,
        steps: int,
        head: QueuedTask,
        upcoming: Callable[[], list[str]],
    ) -> bool:
        """Suspend ``entry`` after ``steps`` steps, its state held in the cache, if it fits and
        ``head``'s model, when it must be loaded, fits beside it (``upcoming``: the models the
        queue needs, which a load may not evict); False (counted) when either does not."""
        state: SlabHandle | None = None
        if entry.state_bytes:
            state = self.cache.hold_state(entry.state_bytes * steps)
            if state is None:
                self.refused_for_state += 1
                return False  # no room for its state: it runs on
        if self.loads(head) and not self._fits(head, upcoming):
            if state is not None:
                self.cache.release_state(state)
            self.refused_for_state += 1
            return False
        self.count += 1
        self.held[entry] = state
        return True

    def _fits(self, head: QueuedTask, upcoming: Callable[[], list[str]]) -> bool:
        """Whether ``head``'s model can be loaded now (evicting what is not pinned)."""
        assert head.model is not None
        try:
            return self.cache.plan_load(head.model, upcoming()) is not None
        except CompassError:  # it can never fit here: its own run fails, not this choice
            return False

    def release(self, entry: QueuedTask) -> None:
        """``entry`` left the queue (to run again, or dropped): its state's slabs are free."""
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
