"""The worker's local task queue: ready tasks in priority order, and what they add up to.

Sans-IO (every call that depends on time is given ``now``): the lanes
(:class:`~compass.core.lanes.Lanes`) pop entries, the view reads :meth:`TaskQueue.wait_s` (the
paper's queue wait: expected seconds of queued plus running work) and the cache decisions read
:meth:`TaskQueue.upcoming_models` (the look-ahead input for eviction and prefetch; with the
models a decision task's likely successors will need, :meth:`TaskQueue.look_ahead`).

Batches: tasks that share a :attr:`QueuedTask.group` (one function and model) may run as one
batch of up to ``max_batch`` items (:meth:`TaskQueue.take`), of runs within ``SIMILAR_RUNS`` of
each other (a batch runs as long as its longest item): the queue's expected work counts
each group's queued tasks as the batches they will form (a batch of ``b`` costs
``expected_s * scale(b)``), and :meth:`TaskQueue.batchable` tells the view, per model, how many
such tasks wait and when the first of them is expected to start.

Order: the highest :attr:`QueuedTask.level` (the job's priority) first; within a level, the
job's own deadline where it has one (:attr:`QueuedTask.deadline`), else the smallest
:attr:`QueuedTask.priority`; ties (and tasks without either) in arrival order. A task without
a priority ranks at its enqueue time, so a queue where no task has one is plain FIFO, as in
the paper (and the baselines). Compass gives each task an internal deadline, the job's arrival
plus ``deadline_slack`` times its workflow's best time (the worker core computes it): a short
job's step overtakes a longer job's that arrived a little earlier, and a job that has waited
long overtakes fresh ones. With ``oldest_job_first`` instead, a task ranks at its job's
arrival.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from typing import Any

from compass.workflow.dag import batch_key, batch_limit, batch_scale

#: a heap item: (minus the level, the rank within it, arrival order, the task)
_Item = tuple[int, float, int, "QueuedTask"]

__all__ = ["SIMILAR_RUNS", "QueuedTask", "TaskQueue"]

#: the longest single run in a batch is at most this many times its shortest: a batch runs as
#: long as its longest item (times the curve), so a short task batched with a long one of the
#: same model would wait for it. Emulated tasks of one model group together whatever their
#: lengths (a real function's calls share one expected time); measured against grouping them
#: all on the paper's workload and six generated ones (docs/RESULTS.md, "Batching").
SIMILAR_RUNS = 2.0


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
    #: when it was first queued (never reset: a suspended task's wait counts from
    #: :attr:`suspended_at` instead)
    enqueued_at: float
    #: seconds its inputs spent on the wire (summed over pushes), for the time breakdown
    transfer_s: float = 0.0
    started_at: float = 0.0
    #: the job's wall-clock submit time, forwarded with the task's output
    t0: float = 0.0
    #: the queue runs smaller first (on the queue's clock, e.g. the job's arrival time);
    #: None ranks the task at its enqueue time
    priority: float | None = None
    #: the job's submit time on this worker's clock (what oldest-job-first ranks by)
    arrival: float = 0.0
    #: the job's priority: a higher level runs first, whatever the rest of the order
    level: int = 0
    #: the job's deadline on this worker's clock (None: it has none); it ranks the task
    #: instead of :attr:`priority`
    deadline: float | None = None
    #: run it past its deadline (the job's ``on_miss="finish"``); otherwise a task that would
    #: start too late for its job to finish in time is dropped instead of run
    finish: bool = False
    #: its job streams its sinks' partial outputs to its caller (a step-wise sink reports
    #: each step: :class:`~compass.core.events.TaskStep`)
    stream: bool = False
    #: the job's remaining critical path from this task's start: its own best time plus the
    #: longest best path of its successors
    remaining_s: float = 0.0
    #: seconds to copy its model here when it is not resident (0: no model)
    fetch_s: float = 0.0
    #: tasks of one group (one function and model) may run as one batch; None: never batched
    group: str | None = None
    #: the most items one batch of its group takes
    max_batch: int = 1
    #: a batch of b items costs ``expected_s * batch_scale(scale, b)`` (empty: b runs)
    scale: tuple[float, ...] = ()
    #: expected seconds of the run it is part of (a batch's, on its first entry; 0 on the
    #: others), set when the run starts
    run_s: float = 0.0
    #: steps it is expected to take (1: a plain task) and the bytes its state grows by per step
    steps: int = 1
    state_bytes: int = 0
    #: steps it ran before it was suspended (0: never run); ``expected_s`` is then the rest's
    done_steps: int = 0
    #: its job's best time (its workflow's), the yardstick of its slowdown (preemption at step
    #: boundaries weighs the slowdowns of the jobs it would delay: :mod:`compass.core.preempt`)
    best_s: float = 0.0
    #: the models of the successors its most likely choice runs that the plan puts on this
    #: worker (a decision task of a workflow decided at run time; :mod:`compass.core.likely`):
    #: the look-ahead may prefetch them while it runs (empty: none)
    likely: tuple[str, ...] = ()
    #: when its run last gave its lane up at a step boundary and it went back to the queue
    #: (None: never): the queue ranks it there (:meth:`TaskQueue.push`), and its wait to
    #: resume counts from it
    suspended_at: float | None = None
    #: runs begun (:meth:`begin`; above 1: resumed after a suspension)
    runs: int = 0
    #: seconds it waited in the queue before its first run, and suspended before its later
    #: runs (in all, up to the current run's start); and the current run's own wait
    queued_s: float = 0.0
    suspended_s: float = 0.0
    run_wait_s: float = 0.0

    def begin(self, now: float) -> None:
        """A lane takes it at ``now``: a run begins (its first, or one resuming it)."""
        self.started_at = now
        self.runs += 1
        if self.suspended_at is None:
            self.run_wait_s = self.queued_s = now - self.enqueued_at
        else:
            self.run_wait_s = now - self.suspended_at
            self.suspended_s += self.run_wait_s

    @property
    def first_started_at(self) -> float:
        """When its first run began (:attr:`started_at` is its current run's)."""
        return self.started_at if self.runs <= 1 else self.enqueued_at + self.queued_s

    def run_waits(self) -> tuple[float, float]:
        """How long its current run waited before it began: ``(queued, suspended)`` seconds,
        in the queue before its first run, or suspended before a later one (the other 0)."""
        if self.runs > 1:
            return 0.0, self.run_wait_s
        return self.run_wait_s, 0.0


#: :meth:`TaskQueue.lifted_s` of a queue with nothing running and nothing above level 0
_IDLE_LIFTED = (0.0,)


def _work(scale: tuple[float, ...], size: int, count: int) -> float:
    """Cost (in single runs) of ``count`` tasks run in batches of at most ``size``."""
    full, rest = divmod(count, size)
    return full * batch_scale(scale, size) + (batch_scale(scale, rest) if rest else 0.0)


class _Group:
    """The queued tasks of one batch group: how many, and their summed single times."""

    __slots__ = ("count", "expected_s", "scale", "size")

    def __init__(self, entry: QueuedTask) -> None:
        self.count = 0
        self.expected_s = 0.0
        self.size = batch_limit(entry.scale, entry.max_batch)
        self.scale = entry.scale

    def work_s(self) -> float:
        """Expected seconds of the batches the group's queued tasks will form."""
        if not self.count:
            return 0.0
        return self.expected_s / self.count * _work(self.scale, self.size, self.count)


class TaskQueue:
    """Ready tasks by priority plus the running ones, with an O(1) expected-wait total."""

    def __init__(self) -> None:
        self._ready: list[_Item] = []  # a heap
        self._order = itertools.count()
        # insertion-ordered, so upcoming_models() is deterministic
        self._running: dict[QueuedTask, None] = {}
        #: expected seconds of the queued tasks that never batch
        self._queued_s = 0.0
        #: batch group -> its queued tasks (groups with none are removed)
        self._groups: dict[str, _Group] = {}
        #: level above 0 -> expected seconds of its queued tasks (each as a run of its own)
        self._raised: dict[int, float] = {}
        #: queued tasks whose job has a deadline it does not finish past
        self._timed = 0
        #: job id -> how many of its tasks are queued (jobs with none are removed), so that a
        #: job's end looks through the queue only when some task of it waits there
        self._jobs: dict[str, int] = {}
        #: the worker preempts at step boundaries: a higher level waits for a step-wise run's
        #: step under way only (:meth:`wait_s`, :meth:`lifted_s`)
        self.preempt = False

    def __len__(self) -> int:
        return len(self._ready)

    def __iter__(self) -> Iterator[QueuedTask]:
        """The queued tasks in the order they would be popped."""
        # items differ in their arrival number, the third field, so they sort as their first
        # three fields do without comparing the tasks: no key function to call per item
        return (item[3] for item in sorted(self._ready))

    @property
    def queued_s(self) -> float:
        """Expected seconds of the queued (not running) tasks, each batch group's as the
        batches it will form."""
        if not self._groups:
            return self._queued_s
        return self._queued_s + sum(g.work_s() for g in self._groups.values())

    @property
    def running(self) -> frozenset[QueuedTask]:
        """The runs under way (a batch by its first task), popped and not yet finished."""
        return frozenset(self._running)

    def run_ends(self) -> list[float]:
        """When each run under way is expected to end, in the order they started."""
        return [e.started_at + e.run_s for e in self._running]

    def push(self, entry: QueuedTask) -> None:
        """Queue ``entry`` at its priority (when it has none: when it was queued, or suspended
        last)."""
        key = entry.priority
        if key is None:
            key = entry.enqueued_at if entry.suspended_at is None else entry.suspended_at
        if entry.deadline is not None:
            key = entry.deadline  # the job's own deadline, where it has one
        heapq.heappush(self._ready, (-entry.level, key, next(self._order), entry))
        self._count_in(entry)

    def _count_in(self, entry: QueuedTask) -> None:
        jobs = self._jobs
        jobs[entry.job_id] = jobs.get(entry.job_id, 0) + 1
        if entry.deadline is not None and not entry.finish:
            self._timed += 1
        if entry.level > 0:
            self._raised[entry.level] = self._raised.get(entry.level, 0.0) + entry.expected_s
        if entry.group is None:
            self._queued_s += entry.expected_s
            return
        group = self._groups.get(entry.group)
        if group is None:
            group = self._groups[entry.group] = _Group(entry)
        group.count += 1
        group.expected_s += entry.expected_s

    def _count_out(self, entry: QueuedTask) -> None:
        of_job = self._jobs[entry.job_id] - 1
        if of_job:
            self._jobs[entry.job_id] = of_job
        else:
            del self._jobs[entry.job_id]
        if entry.deadline is not None and not entry.finish:
            self._timed -= 1
        level = entry.level
        if level > 0:
            left = self._raised[level] - entry.expected_s
            if left > 1e-12:
                self._raised[level] = left
            else:
                del self._raised[level]  # none left at this level (no float drift either)
        if entry.group is None:
            # no float drift once empty, and never below zero before that
            self._queued_s = max(0.0, self._queued_s - entry.expected_s) if self._ready else 0.0
            return
        group = self._groups[entry.group]
        group.count -= 1
        group.expected_s -= entry.expected_s
        if not group.count:
            del self._groups[entry.group]

    def pop(self, now: float) -> QueuedTask | None:
        """The next task to run (marked running at ``now``), or ``None`` when it is empty."""
        if not self._ready:
            return None
        entry = heapq.heappop(self._ready)[3]
        self._count_out(entry)
        entry.begin(now)
        entry.run_s = entry.expected_s
        self._running[entry] = None
        return entry

    def pop_entry(self, entry: QueuedTask, now: float) -> QueuedTask:
        """:meth:`pop` ``entry`` itself (queued), wherever it ranks."""
        self._ready = [item for item in self._ready if item[3] is not entry]
        heapq.heapify(self._ready)
        self._count_out(entry)
        entry.begin(now)
        entry.run_s = entry.expected_s
        self._running[entry] = None
        return entry

    def take(self, lead: QueuedTask, now: float) -> list[QueuedTask]:
        """Batch ``lead`` (just popped) with the queued tasks of its group, in queue order, up
        to its ``max_batch`` and as long as an extra item costs less than a run of its own
        (with no gain, a batch would only delay its first items), skipping those that would
        make the batch's longest run more than ``SIMILAR_RUNS`` times its shortest, and those
        that would make a member miss its job's deadline (a batch runs longer than any of its
        items alone); return the others taken (started at ``now``). The run's expected time,
        kept on ``lead``, is the batch's."""
        group = lead.group
        room = batch_limit(lead.scale, lead.max_batch) - 1
        if group is None or room <= 0 or group not in self._groups:
            return []
        shortest = longest = lead.expected_s
        chosen: list[_Item] = []
        members = [lead]
        for item in sorted([i for i in self._ready if i[3].group == group]):
            run_s = item[3].expected_s
            if max(longest, run_s) > SIMILAR_RUNS * min(shortest, run_s):
                continue
            batch_s = max(longest, run_s) * batch_scale(lead.scale, len(members) + 1)
            if not _in_time([*members, item[3]], now + batch_s):
                continue
            chosen.append(item)
            members.append(item[3])
            shortest, longest = min(shortest, run_s), max(longest, run_s)
            if len(chosen) == room:
                break
        taken = {id(item[3]) for item in chosen}
        self._ready = [item for item in self._ready if id(item[3]) not in taken]
        heapq.heapify(self._ready)
        mates = [item[3] for item in chosen]
        for entry in mates:
            self._count_out(entry)
            entry.begin(now)
        if not self._ready:
            self._queued_s = 0.0
            self._raised.clear()
        lead.run_s = max(e.expected_s for e in (lead, *mates)) * batch_scale(
            lead.scale, 1 + len(mates)
        )
        return mates

    def take_steps(
        self,
        group: str,
        room: int,
        ends: dict[QueuedTask, float],
        now: float,
        first: Container[QueuedTask] = (),
    ) -> list[QueuedTask]:
        """Step batching: up to ``room`` queued step-wise tasks of ``group`` that join a
        running batch at its next step boundary (started at ``now``): those at the head of the
        queue, before any task of another group (a batch that kept taking its group's tasks
        would hold its lane from the rest for good). ``ends``: the members' expected ends at
        the batch's size now. Each extra member makes every step of the batch longer (the
        curve :func:`batch_scale` gives), so a task is skipped when it would make a member, or
        itself, miss its job's deadline. ``ends`` is updated for the batch's new size, the
        joiners' included. Tasks of ``group`` in ``first`` (members of a suspended batch,
        resuming) are taken before the others wherever they rank, and whatever the deadlines
        (they ran together before)."""
        if room <= 0 or group not in self._groups:
            return []
        chosen: list[_Item] = []
        size = len(ends)
        items = sorted(self._ready)
        if first:
            ahead = [i for i in items if i[3].group == group and i[3] in first]
            items = ahead + [i for i in items if not (i[3].group == group and i[3] in first)]
        for item in items:
            entry = item[3]
            if entry.group != group:
                break  # the rest of the queue waits for this one: the batch takes no more
            grown = batch_scale(entry.scale, size + 1) / batch_scale(entry.scale, max(1, size))
            trial = {m: now + max(0.0, end - now) * grown for m, end in ends.items()}
            trial[entry] = now + entry.expected_s * batch_scale(entry.scale, size + 1)
            # a member that misses its deadline anyway does not hold the others' seats
            if entry not in first and not all(
                _in_time([m], end) or not _in_time([m], ends.get(m, now))
                for m, end in trial.items()
            ):
                continue
            chosen.append(item)
            ends.clear()
            ends.update(trial)
            size += 1
            if len(chosen) == room:
                break
        if not chosen:
            return []
        taken = {id(item[3]) for item in chosen}
        self._ready = [item for item in self._ready if id(item[3]) not in taken]
        heapq.heapify(self._ready)
        joined = [item[3] for item in chosen]
        for entry in joined:
            self._count_out(entry)
            entry.begin(now)
            entry.run_s = ends[entry] - now
        if not self._ready:
            self._queued_s = 0.0
            self._raised.clear()
        return joined

    def peek(self) -> QueuedTask | None:
        """The task :meth:`pop` would return, left in the queue."""
        return self._ready[0][3] if self._ready else None

    def finish(self, entry: QueuedTask) -> None:
        """``entry``'s run stopped (done or failed): a batch by its first task."""
        self._running.pop(entry, None)

    def holds_job(self, job_id: str) -> bool:
        """Whether a task of ``job_id`` is queued (not running)."""
        return job_id in self._jobs

    def drop_job(self, job_id: str, below_attempt: int | None = None) -> list[QueuedTask]:
        """Remove the job's queued tasks (of attempts below ``below_attempt`` when given)."""
        if job_id not in self._jobs:
            return []  # what the look through the queue would find
        return self.drop(
            lambda e: e.job_id == job_id and (below_attempt is None or e.attempt < below_attempt)
        )

    def drop(self, stale: Callable[[QueuedTask], bool]) -> list[QueuedTask]:
        """Remove the queued tasks ``stale`` is true of; return them."""
        kept: list[_Item] = []
        dropped: list[QueuedTask] = []
        for item in self._ready:
            entry = item[3]
            if stale(entry):
                dropped.append(entry)
            else:
                kept.append(item)
        if dropped:
            heapq.heapify(kept)
            self._ready = kept
            self._queued_s = 0.0
            self._groups.clear()
            self._raised.clear()
            self._timed = 0
            self._jobs.clear()
            for item in kept:
                self._count_in(item[3])
        return dropped

    def wait_s(self, now: float, level: int = 0) -> float:
        """Expected seconds before a task queued at ``now`` could start on a single lane (one
        that ranks behind every queued task of its ``level`` and above, as a new job's does:
        the running work, then those tasks)."""
        if level <= 0:
            remaining = sum(max(0.0, e.started_at + e.run_s - now) for e in self._running)
            return self.queued_s + remaining
        remaining = self._running_s(now, level)
        return remaining + sum(s for lv, s in self._raised.items() if lv >= level)

    def _running_s(self, now: float, level: int) -> float:
        """Expected seconds of the runs under way that a task of ``level`` waits for: all of
        each, but, where the worker preempts at step boundaries (:attr:`preempt`), only the
        step under way of a step-wise run of a lower level (the task takes its lane there)."""
        total = 0.0
        for e in self._running:
            left = max(0.0, e.started_at + e.run_s - now)
            if self.preempt and e.steps > 1 and e.level < level:
                left = min(left, e.run_s / max(1, e.steps - e.done_steps))
            total += left
        return total

    def late(self, now: float, lanes: int = 1) -> list[tuple[QueuedTask, float]]:
        """The queued tasks whose jobs can no longer finish by their deadlines: in the order
        the queue runs them, a task's expected start (the running work and the work ahead of
        it, spread over ``lanes``) plus its job's remaining critical path is past the
        deadline. The work of a late task does not count for those behind it (it will not
        run). Lower priorities run last, so under overload they are the ones found late first.
        Tasks whose job finishes anyway (``finish``) are never late. Each comes with the
        seconds from ``now`` it would wait."""
        if not self._timed:
            return []
        ahead = sum(max(0.0, e.started_at + e.run_s - now) for e in self._running)
        counted: dict[str, int] = {}
        late: list[tuple[QueuedTask, float]] = []
        for entry in self:
            deadline = entry.deadline
            if (
                deadline is not None
                and not entry.finish
                and now + ahead / lanes + entry.remaining_s > deadline
            ):
                late.append((entry, ahead / lanes))
                continue
            group = entry.group
            if group is None:
                ahead += entry.expected_s
            else:  # its share of the batches its group forms
                k = counted.get(group, 0)
                counted[group] = k + 1
                size = self._groups[group].size
                ahead += entry.expected_s * (
                    _work(entry.scale, size, k + 1) - _work(entry.scale, size, k)
                )
        return late

    def raised_s(self) -> dict[int, float]:
        """Per level above 0 with queued tasks, their expected seconds (each as a run of its
        own)."""
        return dict(self._raised)

    def lifted_s(self, now: float) -> tuple[float, ...]:
        """:meth:`wait_s` at levels 1, 2, ... up to the highest level queued (at least 1), the
        last one holding for every level above: what heartbeats report so that a planner
        places a job above the lowest priority by the work that would run before it, not by
        the lower levels' queues it overtakes."""
        if not self._raised and not self._running:
            return _IDLE_LIFTED  # what the loop below gives for an idle queue, the usual case
        top = max(self._raised, default=1)
        waits: list[float] = []
        above = sum(self._raised.values())
        for level in range(1, top + 1):
            waits.append(self._running_s(now, level) + max(0.0, above))
            above -= self._raised.get(level, 0.0)
        return tuple(waits)

    def batchable(self, now: float, lanes: int = 1) -> dict[str, tuple[int, float]]:
        """Per model (per :func:`batch_key`), the queued tasks that may batch: how many, and
        the expected seconds before the first of them starts (the work ahead of it, spread
        over ``lanes``). A task of that model arriving in time joins their batch instead of
        queueing behind everything (the planner's batch-aware rule reads this)."""
        if not self._groups:
            return {}
        found: dict[str, tuple[int, float]] = {}
        ahead = sum(max(0.0, e.started_at + e.run_s - now) for e in self._running)
        started: set[str] = set()
        for entry in self:
            group = entry.group
            if group is None:
                ahead += entry.expected_s
                continue
            assert entry.model is not None  # only model tasks batch
            key = batch_key(entry.model, entry.steps)
            count, first = found.get(key, (0, ahead / lanes))
            found[key] = (count + 1, first)
            if group not in started:
                # the group's first task leads its batches: they run from here on
                started.add(group)
                ahead += self._groups[group].work_s()
        return found

    def any_likely(self) -> bool:
        """Whether a running or queued task carries :attr:`~QueuedTask.likely` models (no sort,
        no list: the prefetch asks it each time, and static workflows never have any)."""
        return any(e.likely for e in self._running) or any(i[3].likely for i in self._ready)

    def look_ahead(self) -> list[tuple[str, bool]]:
        """:meth:`upcoming_models` in the same order, each a pair ``(model, False)``, with each
        task's :attr:`~QueuedTask.likely` models right after its own as ``(model, True)``: the
        models its likely successors will need once it finishes."""
        ahead: list[tuple[str, bool]] = []
        for entries in (self._running, self):
            for e in entries:
                if e.model is not None:
                    ahead.append((e.model, False))
                ahead.extend((m, True) for m in e.likely)
        return ahead

    def upcoming_models(self) -> list[str]:
        """Models of the running and queued tasks, running first (they are pinned), then in
        the order the queue will run them."""
        models = [e.model for e in self._running if e.model is not None]
        models.extend(e.model for e in self if e.model is not None)
        return models


def _in_time(members: list[QueuedTask], ends: float) -> bool:
    """Whether every member of a batch ending at ``ends`` can still make its job's deadline
    (the rest of its job's critical path after it included)."""
    return all(
        m.deadline is None or m.finish or ends + m.remaining_s - m.expected_s <= m.deadline
        for m in members
    )
