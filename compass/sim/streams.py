"""Streamed edges in virtual time: what the simulator adds to the worker core's rules for them.

The core decides everything (:mod:`compass.core.edges`): which step goes where, when a fed
task may start. The simulator emulates the rest, as the real worker's executor does:

- a step-wise task that feeds a streamed edge reports each step as it ends
  (:class:`~compass.core.events.TaskStep`, at ``start + (k + 1) * step``; the last at its end);
- a task fed by streams runs its profiled time from its start, and ends no sooner than one of
  its steps after every stream into it ended (its :class:`~compass.core.events.Feed` ends);
- the messages of a streamed edge between two workers arrive in the order they were sent, as
  on one connection (a chunk never overtakes the larger message that opened its stream).
"""

from __future__ import annotations

from collections.abc import Callable

from compass.core.events import Feed
from compass.core.messages import JOB_INPUTS, ChunkMsg, PeerMessage, TaskMsg
from compass.core.queue import QueuedTask
from compass.workflow.dag import Task, Workflow

__all__ = ["SimStreams", "ends_stream", "stream_bytes"]

#: a fed task's key: job, attempt, task
Key = tuple[str, int, str]


def ends_stream(workflow: Workflow, msg: PeerMessage) -> bool:
    """Whether ``msg`` is the end of a streamed edge (the final output it streamed)."""
    return (
        isinstance(msg, TaskMsg)
        and msg.source != JOB_INPUTS
        and msg.source in workflow.tasks[msg.task].streamed
    )


def stream_bytes(workflow: Workflow, msg: PeerMessage) -> int | None:
    """The bytes of ``msg`` where it carries one step of a streamed edge (its share of the
    producer's declared output); None for any other message."""
    if isinstance(msg, ChunkMsg) and msg.to:
        source = msg.task
    elif isinstance(msg, TaskMsg) and msg.opens:
        source = msg.source
    else:
        return None
    profile = workflow.tasks[source].profile
    return profile.output_bytes // profile.steps


class SimStreams:
    """The simulator's bookkeeping of streamed edges (see the module docstring)."""

    def __init__(self) -> None:
        #: per fed task: the streams into it that ended
        self._ended: dict[Key, set[str]] = {}
        #: fed tasks whose streams broke (their job ended): they wait for nothing more
        self._broken: set[Key] = set()
        #: fed tasks whose own time is up, waiting for their streams to end: what to do then
        self._waiting: dict[Key, Callable[[], None]] = {}
        #: per pair of workers: when the last message of a streamed edge arrives
        self._link: dict[tuple[str, str], float] = {}

    def arrival(self, src: str, dst: str, at: float, streamed: bool) -> float:
        """When a message sent from ``src`` to ``dst`` arrives, due ``at``: never before the
        last message of a streamed edge on that link when it is one (``streamed``)."""
        if not streamed:
            return at
        link = (src, dst)
        at = max(at, self._link.get(link, at))
        self._link[link] = at
        return at

    def feed(self, feed: Feed) -> None:
        """The core's :class:`Feed`: an end (or a break) counts; a chunk changes nothing
        here (its time is the step's, already)."""
        key = (feed.job_id, feed.attempt, feed.task)
        if feed.error is not None:
            self._ended.pop(key, None)
            then = self._waiting.pop(key, None)
            if then is None:
                self._broken.add(key)
        elif feed.last:
            self._ended.setdefault(key, set()).add(feed.source)
            then = self._waiting.pop(key, None)
        else:
            return
        if then is not None:
            then()

    def wait(self, entry: QueuedTask, task: Task, then: Callable[[], None]) -> bool:
        """Whether ``entry`` (of ``task``, fed by streams) must wait for them to end: then
        ``then`` is called when they have."""
        key = (entry.job_id, entry.attempt, entry.task)
        if key in self._broken or task.streamed <= self._ended.get(key, set()):
            self._ended.pop(key, None)
            self._broken.discard(key)
            return False
        self._waiting[key] = then
        return True
