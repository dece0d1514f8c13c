"""Streamed edges, sans-IO: a successor fed a predecessor's partial outputs as they come.

An edge declared streamed (:attr:`Task.streamed <compass.workflow.dag.Task.streamed>`) runs
as follows; the worker core (:mod:`compass.core.state`) calls this module at each point.

- **At the producer.** Each step of the predecessor (:class:`~compass.core.events.TaskStep`)
  goes to every streamed successor's planned worker: step 0 as the successor's input
  (a :class:`~compass.core.messages.TaskMsg` with ``opens``, carrying the job's plan and
  objective like any push), the later ones as :class:`~compass.core.messages.ChunkMsg` to it.
  Its end goes on as for any edge (the final output, a plain ``TaskMsg``), which ends the
  stream. A successor fed by a stream is never moved by dynamic adjustment
  (:func:`keep_fed`): chunks already went to its planned worker.
- **At the consumer.** The opening message makes the successor's input present (its inbox
  entry, and so its place in the queue, is ready at the first chunk, not at the end); every
  chunk after it, in order, and the end become :class:`~compass.core.events.Feed`
  instructions, which the adapter hands to the running task's iterator (the worker's
  :mod:`compass.worker.feeds`, the simulator's emulated steps). A chunk out of order (a gap)
  fails the job with a :class:`~compass.errors.ProtocolError`: never a silent gap. A job that
  ends here (answered, failed, re-planned, its ingress lost) breaks its open streams (a
  ``Feed`` with an error), so a task blocked reading one stops waiting.

Chunks of one edge travel on the one connection between two workers, in order, and the
opening message before them; the end comes after the last chunk, as the producer's steps are
reported before its end. A producer never waits for its consumer (no credit flows back): what a
consumer holds unread is at most what the plain edge would have carried whole, and a producer
blocked by a consumer that waits for a lane the producer holds could never end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compass.core.causes import Cause
from compass.core.events import Feed
from compass.core.messages import ChunkMsg, PeerMessage, TaskMsg
from compass.core.queue import QueuedTask
from compass.errors import JobFailed, ProtocolError
from compass.workflow.dag import Workflow

__all__ = ["FeedGap", "StreamedEdges", "keep_fed", "step_messages"]

#: a stream's key: job, attempt, the task it feeds
Key = tuple[str, int, str]


def step_messages(
    workflow: Workflow, entry: QueuedTask, seq: int, value: Any, now: float
) -> list[tuple[str, PeerMessage]]:
    """What step ``seq`` of ``entry`` (a step-wise task running here) sends to the successors
    that take it as a stream, each with the worker it goes to (the entry's plan)."""
    out: list[tuple[str, PeerMessage]] = []
    for succ in workflow.streamed_succs(entry.task):
        if seq == 0:
            msg: PeerMessage = TaskMsg.onward(
                entry, workflow.name, succ, value, entry.plan, now, opens=True
            )
        else:
            msg = ChunkMsg(entry.job_id, entry.attempt, entry.task, seq, value, to=succ)
        out.append((entry.plan[succ], msg))
    return out


def keep_fed(workflow: Workflow, plan: Mapping[str, str], adjusted: dict[str, str]) -> None:
    """Put back in ``adjusted`` (dynamic adjustment's plan) every task fed by a stream where
    ``plan`` had it: its stream's chunks went there, or will, from its first."""
    for task in workflow.order:
        if workflow.tasks[task].streamed and adjusted[task] != plan[task]:
            adjusted[task] = plan[task]


class FeedGap(ProtocolError):
    """A chunk of a streamed edge came out of order: the stream lost one. ``ingress``: its
    job's, which hears of it."""

    def __init__(self, message: str, ingress: str) -> None:
        super().__init__(message)
        self.ingress = ingress


@dataclass(slots=True)
class _Fed:
    """The streams into one task here: per source, the next step expected (absent once it
    ended); whether the task ended here already."""

    next: dict[str, int] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    task_over: bool = False
    #: the job's ingress
    ingress: str = ""


class StreamedEdges:
    """The streams into tasks of this worker, from their opening message until both their
    task and every one of its streams ended, or their job ended here. Bounded as the jobs
    in flight are: a job's end (:meth:`drop`) removes all of its own."""

    def __init__(self) -> None:
        self._fed: dict[Key, _Fed] = {}
        #: job id -> its keys here
        self._jobs: dict[str, set[Key]] = {}

    def __len__(self) -> int:
        return len(self._fed)

    def takes(self, workflow: Workflow, msg: TaskMsg) -> bool:
        """Whether ``msg`` is of a streamed edge (its opening, or its end)."""
        return msg.opens or msg.source in workflow.tasks[msg.task].streamed

    def input(self, msg: TaskMsg, cause: Cause) -> tuple[bool, list[Feed]]:
        """A message of a streamed edge arrived (:meth:`takes`): whether it makes the task's
        input present (the inbox gets it, its value aside), and what the task's stream
        gets. The opening gives step 0; the end, the stream's end. An end with no opening
        before it (a predecessor that yielded nothing) opens and ends the stream at once."""
        key = (msg.job, msg.attempt, msg.task)
        source = msg.source
        fed = self._fed.get(key)
        if fed is not None and (source in fed.next or source in fed.ended):
            if msg.opens or source in fed.ended:
                return False, []  # a second opening, or an end again: stale
            del fed.next[source]
            fed.ended.add(source)
            self._settle(key, fed)
            if fed.task_over:  # it ended without reading to the end: nothing reads this
                return False, []
            return False, [Feed(msg.job, msg.attempt, msg.task, source, -1, msg.value, True,
                                None, cause)]  # fmt: skip
        if fed is None:
            fed = self._fed[key] = _Fed(ingress=msg.ingress)
            self._jobs.setdefault(msg.job, set()).add(key)
        if msg.opens:
            fed.next[source] = 1
            return True, [Feed(msg.job, msg.attempt, msg.task, source, 0, msg.value, False, None,
                               cause)]  # fmt: skip
        fed.ended.add(source)
        return True, [Feed(msg.job, msg.attempt, msg.task, source, -1, msg.value, True, None,
                           cause)]  # fmt: skip

    def chunk(self, msg: ChunkMsg, cause: Cause) -> Feed | None:
        """Step ``msg.seq`` of a stream into task ``msg.to`` here: what its task gets (None:
        the stream is not open here, its job ended or was planned again). :class:`FeedGap`
        when a step is missing before it."""
        key = (msg.job, msg.attempt, msg.to)
        fed = self._fed.get(key)
        expected = None if fed is None else fed.next.get(msg.task)
        if fed is None or expected is None:
            return None
        if msg.seq != expected:
            raise FeedGap(
                f"step {msg.seq} of {msg.task!r} streamed into {msg.to!r} came where step "
                f"{expected} was due: the stream lost a step",
                fed.ingress,
            )
        fed.next[msg.task] = expected + 1
        if fed.task_over:
            return None
        return Feed(msg.job, msg.attempt, msg.to, msg.task, msg.seq, msg.value, False, None, cause)

    def task_ended(self, entry: QueuedTask) -> None:
        """``entry``'s task ended here: its streams are forgotten once each has ended too."""
        key = (entry.job_id, entry.attempt, entry.task)
        fed = self._fed.get(key)
        if fed is not None:
            fed.task_over = True
            self._settle(key, fed)

    def drop(self, job_id: str, below: int | None, cause: Cause) -> list[Feed]:
        """``job_id`` (its attempts below ``below``; all when None) ended here: its streams
        are forgotten, and those still open break (a task reading one stops waiting)."""
        keys = self._jobs.get(job_id)
        if not keys:
            return []
        error = JobFailed(f"job {job_id!r} ended while its task read a stream")
        feeds = []
        for key in sorted(keys):
            if below is not None and key[1] >= below:
                continue
            fed = self._fed.pop(key)
            keys.discard(key)
            if not fed.task_over:
                feeds.append(Feed(*key, "", -1, None, True, error, cause))
        if not keys:
            del self._jobs[job_id]
        return feeds

    def _settle(self, key: Key, fed: _Fed) -> None:
        if fed.task_over and not fed.next:
            del self._fed[key]
            keys = self._jobs[key[0]]
            keys.discard(key)
            if not keys:
                del self._jobs[key[0]]
