"""The simulator's step batches: continuous batching of step-wise tasks, step by step.

A step batch (a :class:`~compass.core.events.RunTask` of a step-wise task with a batch group,
and the :class:`~compass.core.events.JoinRun` tasks its worker's core adds to it) runs one
step of every member at a time. A step of ``b`` members takes the slowest member's step time
times the group's batch curve at ``b`` (:func:`~compass.workflow.dag.batch_scale`), as one
batched call of a real model's step would. At each step boundary:

- every member has one step fewer to go; a member whose steps are done, or whose job ended
  (:class:`~compass.core.events.StopTask`), leaves: its worker's core hears its end
  (:class:`~compass.core.events.TaskDone`), which frees a seat the core may fill at once;
- the tasks the core added since the last boundary take their seats;
- the next step is timed at the batch's new size; with no member left the batch is over (the
  core freed its lane when the last one ended).

A member's lane time is its share of each step it was in (the step's time over the members),
so the lane time of a batch's records adds up to the time its lane was busy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from compass.core.events import Event, JoinRun, RunTask, TaskDone, TaskStep
from compass.core.queue import QueuedTask
from compass.sim.result import TaskRecord
from compass.workflow.dag import Workflow, batch_scale

__all__ = ["StepBatches"]


class BatchingWorker(Protocol):
    """What the step batches use of a simulated worker."""

    name: str
    busy_s: float


class BatchingHost(Protocol):
    """What the step batches use of the simulation."""

    now: float
    task_records: list[TaskRecord]

    def schedule(self, t: float, handler: Callable[[Any], None], arg: Any) -> None: ...


@dataclass(slots=True, eq=False)
class _Member:
    entry: QueuedTask
    step_s: float
    left: int
    #: the member's lane time so far in this run (its share of each step)
    lane_s: float = 0.0
    #: steps done in all (a suspended member's count on when it resumes)
    done: int = 0
    #: its job ended: it leaves at the next boundary
    stopped: bool = False
    #: its worker's core suspended it (with its whole batch) at this boundary: it leaves,
    #: parked with its progress, until the core resumes it in a batch
    suspended: bool = False


@dataclass(slots=True, eq=False)
class _Batch:
    worker: Any
    run: RunTask
    scale: tuple[float, ...]
    members: list[_Member] = field(default_factory=list)
    joining: list[_Member] = field(default_factory=list)
    #: the largest size it reached (what its records say of it)
    size: int = 0


class StepBatches:
    """The step batches of one simulation (see the module docstring). ``feed(worker, event)``
    hands an event to that worker's core; ``tells(entry)`` says whether the core hears each
    step of ``entry`` (a streamed edge it feeds, or preemption on); ``workflow(name)`` gives a
    workflow of the workload."""

    def __init__(
        self,
        host: BatchingHost,
        feed: Callable[[Any, Event], None],
        tells: Callable[[Any, QueuedTask], bool],
        workflow: Callable[[str], Workflow],
    ) -> None:
        self._host = host
        self._feed = feed
        self._tells = tells
        self._workflow = workflow
        #: batches under way by their first task, and the batch of each member
        self._batches: dict[QueuedTask, _Batch] = {}
        self._of: dict[QueuedTask, _Batch] = {}
        #: suspended members, with their progress, until the core resumes them
        self._parked: dict[QueuedTask, _Member] = {}

    def is_batch(self, run: RunTask) -> bool:
        """Whether ``run`` is a step batch (a step-wise task with a batch group)."""
        entry = run.entry
        return entry.group is not None and entry.steps > 1

    def begin(self, worker: BatchingWorker, run: RunTask) -> None:
        """Step batch ``run`` began: its first step is timed."""
        profile = self._profile(run.entry)
        batch = _Batch(worker, run, profile.batch_scale)
        self._batches[run.entry] = batch
        batch.members = [self._member(batch, e) for e in run.entries]
        batch.size = len(batch.members)
        self._next(batch)

    def join(self, step: JoinRun) -> None:
        """Tasks the core added to a running batch: they take their seats at its next step
        boundary."""
        batch = self._batches[step.lead]
        batch.joining.extend(self._member(batch, e) for e in step.entries)

    def holds(self, entry: QueuedTask) -> bool:
        """Whether ``entry`` is a member of a step batch here."""
        return entry in self._of

    def suspend(self, entry: QueuedTask) -> None:
        """The core suspended member ``entry`` (its batch, whole) at the boundary just
        reported: seated, it leaves there; about to take its seat, it never does."""
        batch = self._of[entry]
        for member in (*batch.members, *batch.joining):
            if member.entry is entry:
                member.suspended = True

    def stop(self, entries: tuple[QueuedTask, ...]) -> None:
        """The jobs of ``entries`` ended: the members among them leave at the next boundary (a
        parked one is forgotten: the core already let it go)."""
        for entry in entries:
            self._parked.pop(entry, None)
            batch = self._of.get(entry)
            if batch is None:
                continue
            for member in (*batch.members, *batch.joining):
                if member.entry is entry:
                    member.stopped = True

    def _member(self, batch: _Batch, entry: QueuedTask) -> _Member:
        """``entry`` takes a seat in ``batch``: resumed, with the progress it was parked with
        (or, suspended and resumed within one boundary, moved from its old batch)."""
        member = self._parked.pop(entry, None)
        old = self._of.get(entry)
        if member is None and old is not None:
            member = next(m for m in (*old.members, *old.joining) if m.entry is entry)
            for seats in (old.members, old.joining):
                if member in seats:
                    seats.remove(member)
        if member is None:
            profile = self._profile(entry)
            step_s = profile.exec_s / profile.steps
            member = _Member(entry, step_s, profile.steps - entry.done_steps, done=entry.done_steps)
        member.suspended = False
        self._of[entry] = batch
        return member

    def _profile(self, entry: QueuedTask) -> Any:
        return self._workflow(entry.workflow).tasks[entry.task].profile

    def _next(self, batch: _Batch) -> None:
        """Time the batch's next step at its size now."""
        members = batch.members
        step_s = max(m.step_s for m in members) * batch_scale(batch.scale, len(members))
        self._host.schedule(self._host.now + step_s, self._boundary, (batch, step_s))

    def _boundary(self, arg: tuple[_Batch, float]) -> None:
        batch, step_s = arg
        host, worker = self._host, batch.worker
        worker.busy_s += step_s
        share = step_s / len(batch.members)
        for member in list(batch.members):  # each reports its step first: the core decides
            member.lane_s += share
            member.left -= 1
            member.done += 1
            entry = member.entry
            if member.left > 0 and not member.stopped and self._tells(worker, entry):
                self._feed(worker, TaskStep(host.now, entry, member.done - 1, None))
        leaving: list[_Member] = []
        staying: list[_Member] = []
        for member in batch.members:  # then what the core decided there is carried out
            if member.left <= 0 or member.stopped:
                leaving.append(member)
            elif member.suspended:
                self._parked_at(batch, member)
            else:
                staying.append(member)
        batch.members = staying
        for member in leaving:
            self._left(batch, member)
        for member in batch.joining:
            if member.stopped:  # its job ended before it took its seat
                self._left(batch, member)
            elif member.suspended:  # its batch was suspended before it took its seat
                self._parked_at(batch, member)
            else:
                batch.members.append(member)
        batch.joining = []
        batch.size = max(batch.size, len(batch.members))
        if batch.members:
            self._next(batch)
        else:
            del self._batches[batch.run.entry]

    def _parked_at(self, batch: _Batch, member: _Member) -> None:
        """Suspended ``member`` leaves the batch until the core resumes it: its lane time so
        far is a task record of its own (as a suspended run's is)."""
        entry = member.entry
        del self._of[entry]
        self._parked[entry] = member
        if member.lane_s > 0.0:
            queued, suspended = entry.run_waits()
            self._host.task_records.append(
                TaskRecord(entry.job_id, entry.task, batch.worker.name, queued, 0.0,
                           entry.transfer_s, member.lane_s, batch.run.hit, batch.size,
                           suspended)
            )  # fmt: skip
        member.lane_s = 0.0

    def _left(self, batch: _Batch, member: _Member) -> None:
        """``member`` leaves the batch: its record, and its worker's core hears its end."""
        host, entry = self._host, member.entry
        del self._of[entry]
        run = batch.run
        queued, suspended = entry.run_waits()
        host.task_records.append(
            TaskRecord(
                job_id=entry.job_id,
                task=entry.task,
                worker=batch.worker.name,
                queue_s=queued,
                fetch_s=run.fetch_s if entry is run.entry else 0.0,
                transfer_s=entry.transfer_s,
                exec_s=member.lane_s,
                cache_hit=run.hit,
                batch=batch.size,
                suspended_s=suspended,
            )
        )
        if member.left <= 0 and self._tells(batch.worker, entry):
            self._feed(batch.worker, TaskStep(host.now, entry, member.done - 1, None))
        self._feed(batch.worker, TaskDone(host.now, entry, None))
