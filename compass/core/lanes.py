"""A worker's queues, execution lanes and model residency, sans-IO: which task runs next, on
which lane, when its model is resident, what is loaded, prefetched or evicted.

Part of the worker core (:class:`~compass.core.state.WorkerCore` drives it; the asyncio
worker and the simulator both carry out what it decides). It imports no asyncio and reads no
clock: every call passes the current time. Each call that decides something returns its
:data:`Step` list, in order: tasks to run, models to load, and tasks that cannot run here
(:class:`CannotRun`, for the core to answer); the lanes hold no output and call nothing back.

The rules:

- **Queues.** A ready task joins the GPU queue (a :class:`~compass.core.queue.TaskQueue`,
  priority order). With host lanes (``host_lanes > 0``) a model-less task joins a queue of its
  own served by those lanes, never waiting behind a GPU task nor holding one up; without them
  (the paper's model) the GPU lanes run every task.
- **Lanes.** An idle lane takes the next task at once. A task with a model asks the cache for
  it (:meth:`CacheCore.acquire <compass.cache.policy.CacheCore.acquire>`): resident, it runs
  now (:class:`RunTask`, its model pinned); being loaded, it runs when the load ends; missing,
  the load starts (:class:`LoadModel`, evicting what the plan says) and the task runs when it
  ends; when pinned or loading models hold the slabs it needs, it waits until one is released.
- **Batches.** When a task of a batch group (one function and model) starts, the queued tasks
  of its group come along, up to its ``max_batch``, in queue order: one :class:`RunTask` with
  several entries, one lane, one pin of the model. The lane is free when every entry has
  ended. The lanes never hold a lane idle waiting for a batch to fill.
- **Step batches.** Step-wise tasks of a batch group share a lane, joining at step boundaries
  (:class:`JoinRun`) and leaving when their own steps end (:mod:`compass.core.stepbatch`).
- **Prefetch.** When every lane is busy and a task is queued, and when a task starts, the
  first model of the queue's look-ahead that is neither resident nor loading is loaded if it
  fits without evicting anything needed sooner (or, the paper's rule, in free slabs only);
  never while another load is under way (the
  copy bandwidth is shared: a task's own load would take longer).
- **Warming.** An idle worker (no task queued or running, no speculative load) whose policy
  warms caches loads, into free slabs only, the model the cluster holds least for its demand.
  It checks when it falls idle, when a speculative load ends, and on :meth:`Lanes.tick`.
- **Step boundaries.** With ``preempt`` on, a running step-wise task reports each step's end
  (:meth:`Lanes.stepped`): a queued task that the rule of :mod:`compass.core.preempt` lets
  run first takes its lane (the task, or a step batch whole, is suspended: :class:`SuspendTask`
  for each, back in the queue with the steps it has left, its state held in the cache:
  :mod:`compass.core.suspend`), and a task whose job is past saving is stopped
  (:class:`StopTask`) and its job answered. Plain tasks, and batches of them, run to their end.
- **Stuck tasks.** A task that ran past its timeout frees its lane but keeps its model pinned
  until its thread returns. Past ``max_stuck`` such tasks (host lanes' and GPU lanes' alike: each
  holds a thread) the worker is *degraded*: every task it would start fails at once
  (:class:`~compass.errors.WorkerUnavailable`) instead of taking another thread, and its state
  tells planners to place nothing here, until a stuck thread returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from compass.cache.policy import READY, WAIT, CacheCore, LoadPlan
from compass.cache.slab import SlabHandle
from compass.core import likely
from compass.core.causes import Cause
from compass.core.events import JoinRun, LoadModel, RunTask, StopTask, SuspendTask  # its union
from compass.core.options import CoreOptions
from compass.core.preempt import left_s, past_saving
from compass.core.queue import QueuedTask, TaskQueue
from compass.core.replica import COLD_S, replica_plan
from compass.core.shed import queued_too_late, starts_too_late
from compass.core.stepbatch import StepBatch, closed, with_open
from compass.core.suspend import Suspensions, past_saving_error
from compass.errors import CompassError, ConfigError, WorkerUnavailable

__all__ = ["CannotRun", "Lanes", "LanesFault", "LoadModel", "RunTask", "Step", "SuspendTask"]

#: a core's defaults (host lanes aside: lanes made alone share the GPU lanes, the paper's model)
_DEFAULT = CoreOptions()


@dataclass(frozen=True, slots=True)
class CannotRun:
    """``entry`` left the lanes without running: its model can never fit, its load failed,
    the worker is degraded, or it was shed (too late for its job's deadline, ``error`` a
    :class:`~compass.errors.DeadlineExceeded`). Its job must hear ``error``."""

    entry: QueuedTask
    error: CompassError


#: what a call of the lanes decides
Step: TypeAlias = RunTask | LoadModel | CannotRun | SuspendTask | StopTask | JoinRun


class LanesFault(Exception):
    """A call of the lanes raised: ``steps`` are what it decided before (its state changed
    with them, so they must still be carried out); the cause is chained."""

    def __init__(self, steps: list[Step]) -> None:
        super().__init__(f"the lanes failed after deciding {len(steps)} steps")
        self.steps = steps

    @property
    def original(self) -> Exception:
        """The error that made the lanes fail (this fault where none is chained)."""
        cause = self.__cause__
        return cause if isinstance(cause, Exception) else self


@dataclass(slots=True, eq=False)
class _Run:
    """A task on a lane, from the moment the lane took it."""

    entry: QueuedTask
    lane: int
    host: bool
    asked_at: float
    upcoming: list[str] = field(default_factory=list)
    hit: bool | None = None
    waited: bool = False
    #: entries of the run not yet ended (a batch's, once it started)
    pending: int = 1
    #: abandoned past its timeout: its model stays pinned until its thread returns
    stuck: bool = False
    #: a step batch's members (None: not a step batch)
    batch: StepBatch | None = None


class Lanes:
    """The queues, lanes and model residency of one worker; see the module docstring.

    ``cache`` decides residency (its pool is the worker's slabs). ``prefetch_depth`` is how far
    the look-ahead reaches (0: no speculative loads at all); ``prefetch_evicts=False`` keeps
    prefetches to free slabs (the paper's rule); ``demand`` (expected seconds of
    use per model and job) turns warming on; ``wanted`` answers which models are worth warming,
    most wanted first (a query of the view, asked only when an idle cache has room).
    """

    def __init__(
        self,
        *,
        lanes: int,
        cache: CacheCore,
        host_lanes: int = 0,
        prefetch_depth: int = _DEFAULT.prefetch_depth,
        prefetch_evicts: bool = _DEFAULT.prefetch_evicts,
        demand: Mapping[str, float] | None = None,
        max_stuck: int = _DEFAULT.max_stuck,
        wanted: Callable[[float], Sequence[str]] | None = None,
    ) -> None:
        if lanes < 1 or host_lanes < 0:
            raise ConfigError(f"need lanes >= 1 and host_lanes >= 0, got {lanes}, {host_lanes}")
        self.cache = cache
        self.lanes = lanes
        self.host_lanes = host_lanes
        self.queue = TaskQueue()
        #: model-less tasks when host lanes run them (else unused and empty)
        self.host_queue = TaskQueue()
        self.prefetch_depth = prefetch_depth
        self.prefetch_evicts = prefetch_evicts
        known = cache.models()
        #: models worth warming: those with demand the cache knows
        self.demand = {m: s for m, s in (demand or {}).items() if m in known}
        self.max_stuck = max_stuck
        #: scheduling at step boundaries (:meth:`stepped`): preemption, step-level shedding
        #: (off unless the core's options turn it on: ``build_core``)
        self._preempt = _DEFAULT.preempt
        #: the suspended step-wise tasks and the cache's slabs their states hold
        self.held = Suspensions(cache)
        #: tasks abandoned past their timeout whose threads still run
        self.stuck = 0
        #: tasks dropped because their job could no longer make its deadline
        self.shed = 0
        #: counts changes a heartbeat would show (the GPU queue and lanes, the cache, stuck
        #: tasks; not the host lanes): an adapter gossips when it moved
        self.version = 0
        self._idle = list(range(lanes - 1, -1, -1))  # popped from the end: lane 0 first
        self._host_idle = list(range(lanes + host_lanes - 1, lanes - 1, -1))
        self._runs: dict[QueuedTask, _Run] = {}
        #: batch group -> the step batch of that group running here (tasks join it)
        self._open: dict[str, list[_Run]] = {}
        #: model -> the runs waiting for its load
        self._loading: dict[str, list[_Run]] = {}
        #: the model of the speculative load under way (prefetch or warm), if any
        self._speculating: str | None = None
        #: runs waiting for pinned or loading slabs to be released
        self._blocked: list[_Run] = []
        self._sizes = {m: cache.size_bytes(m) for m in self.demand}
        #: model -> when a task here last began with it or a hot copy was warmed (bounded by
        #: the cache's models; :mod:`compass.core.replica`)
        self.used: dict[str, float] = {}
        self._smallest = min(self._sizes.values(), default=0)
        #: models worth warming, most wanted first (a query; none without one)
        self.wanted: Callable[[float], Sequence[str]] = wanted or _nothing_wanted
        #: the steps of the call under way, and the id of the event it is for (:meth:`_decide`)
        self._steps: list[Step] = _NOT_DECIDING
        self._cause: Cause = ""

    @property
    def preempt(self) -> bool:
        """Scheduling at step boundaries is on (:meth:`stepped`)."""
        return self._preempt

    @preempt.setter
    def preempt(self, on: bool) -> None:
        # the queue's waits for a higher priority count a step-wise run's step under way only
        self._preempt = self.queue.preempt = on

    @property
    def suspended(self) -> dict[QueuedTask, SlabHandle | None]:
        """The suspended step-wise tasks -> the slabs their states hold (None: no state)."""
        return self.held.held

    @property
    def suspensions(self) -> int:
        """Suspensions so far."""
        return self.held.count

    @property
    def refused_for_state(self) -> int:
        """Preemptions refused for want of room for the state (or the head's model)."""
        return self.held.refused_for_state

    # -- what the view and status read ---------------------------------------------------------

    @property
    def busy(self) -> int:
        """GPU lanes running (or fetching the model of) a task."""
        return self.lanes - len(self._idle)

    @property
    def host_busy(self) -> int:
        """Host lanes running a task."""
        return self.host_lanes - len(self._host_idle)

    @property
    def degraded(self) -> bool:
        """Too many stuck tasks: no more work here (each would take another thread)."""
        return self.stuck >= self.max_stuck

    def batchable(self, now: float) -> dict[str, tuple[int, float]]:
        """What heartbeats report of batches: the queue's, and the step batches running."""
        found = self.queue.batchable(now, self.lanes)
        runs = (r.batch for rs in self._open.values() for r in rs if r.batch is not None)
        return with_open(found, runs)

    def wait_s(self, now: float, level: int = 0) -> float:
        """The GPU queue's expected wait for a task of priority ``level`` (what heartbeats
        report)."""
        return self.queue.wait_s(now, level)

    # -- tasks ---------------------------------------------------------------------------------

    def submit(self, entry: QueuedTask, now: float, cause: Cause = "") -> list[Step]:
        """``entry``'s inputs are all here: queue it, and start it if a lane is idle."""
        # the per-task calls (submit, fill) are :meth:`_decide` written out: a chain task
        # makes them and :meth:`ended`, which decides only when a model is unpinned
        steps: list[Step] = []
        self._steps = steps
        self._cause = cause
        try:
            if entry.model is None and self.host_lanes:
                # the host queue is not what heartbeats report: no version change
                self.host_queue.push(entry)
                self._fill_host(now)
            else:
                self.version += 1
                self.queue.push(entry)
                if self._idle:
                    self._fill(now)
                elif self._open and entry.group in self._open:
                    for run in self._open[entry.group]:  # the first with room takes it
                        self._join(run, now)
                elif self.prefetch_depth:
                    # every lane is busy: use the time to bring in what the queue needs next
                    self._prefetch()
        except Exception as exc:
            raise LanesFault(steps) from exc
        finally:
            self._steps = _NOT_DECIDING
        return steps

    def drop(self, stale: Callable[[QueuedTask], bool]) -> list[QueuedTask]:
        """Remove the queued (not yet running) tasks ``stale`` is true of; return them."""
        dropped = self.queue.drop(stale)
        if dropped:
            self.version += 1
        return [*dropped, *self.host_queue.drop(stale)]

    def drop_job(self, job_id: str, below: int | None = None) -> list[QueuedTask]:
        """:meth:`drop` the queued tasks of ``job_id`` (of attempts below ``below`` when
        given): nothing to look through when none of its tasks is queued, as at the end of
        nearly every job."""
        if not (self.queue.holds_job(job_id) or self.host_queue.holds_job(job_id)):
            return []
        return self.drop(lambda e: e.job_id == job_id and (below is None or e.attempt < below))

    def running(self) -> list[QueuedTask]:
        """The tasks on a lane now (each entry of a batch)."""
        return list(self._runs)

    def running_of(self, job_id: str, below: int | None = None) -> tuple[QueuedTask, ...]:
        """The tasks of ``job_id`` (of attempts below ``below`` when given) on a lane now."""
        if not self._runs:
            return ()
        return tuple(
            e for e in self._runs if e.job_id == job_id and (below is None or e.attempt < below)
        )

    def stepped(self, entry: QueuedTask, done: int, now: float, cause: Cause = "") -> list[Step]:
        """Step-wise ``entry`` ended ``done`` steps of its run: the rules of
        :mod:`compass.core.preempt` decide whether it goes on (nothing decided), is stopped
        (its job past saving: :class:`StopTask` and its job answered, :class:`CannotRun`), or
        its run (a step batch's members, all of them) gives its lane to the queue's head
        (:class:`SuspendTask` for each, then the head's steps)."""
        run = self._runs.get(entry)
        if not self.preempt or run is None or run.host or run.stuck:
            if run is None and entry in self.held and done > 0:  # its batch was suspended at
                entry.done_steps += done  # this boundary, before it reported: count its step
            return []  # a host task or an abandoned one goes on
        batch = run.batch
        if batch is None and run.pending > 1:
            return []  # a batch of plain calls runs to its end
        left = left_s(entry, done) if batch is None else batch.left_s(entry, done)
        if left <= 0.0:
            return []  # its last step: it ends now anyway
        if past_saving(entry, left, now):
            self.shed += 1
            return [StopTask((entry,), cause),
                    CannotRun(entry, past_saving_error(entry, done, left, now))]  # fmt: skip
        steps = entry.done_steps + done
        if batch is not None:
            batch.seen[entry] = steps
        head = self.queue.peek()
        if head is None:
            return []
        members = [(entry, left, steps)] if batch is None else batch.progress(entry, left, now)
        group = None if batch is None else entry.group
        switches = self.held.switches([(m, s) for m, s, _ in members], head, now,
                                      lanes=self.lanes, group=group)  # fmt: skip
        if not switches:
            return []
        return self._decide(cause, self._suspend, run, members, head, now)

    def _suspend(
        self,
        run: _Run,
        members: list[tuple[QueuedTask, float, int]],
        head: QueuedTask,
        now: float,
    ) -> None:
        """``run`` gives its lane up: each of its ``members`` (for a step batch, all of them),
        back in the queue with the seconds and the steps it has left, its state held in the
        cache and its model kept pinned (its code holds the model's weights; the run's one pin
        becomes one a member), so the queue's head must fit beside them
        (:meth:`Suspensions.hold`); otherwise the run goes on. The lane takes the head."""
        held = [(m, steps) for m, _, steps in members]
        if not self.held.hold(held, head, self.queue.upcoming_models):
            return
        self.version += 1
        self._idle.append(run.lane)
        self.queue.finish(run.entry)
        if run.batch is not None:
            closed(self._open, run.entry.group, run)
        model = run.entry.model
        for entry, left, steps in members:
            del self._runs[entry]
            if model is not None and entry is not members[0][0]:
                self.cache.pin(model)
            entry.remaining_s -= entry.expected_s - left
            entry.expected_s = left
            entry.done_steps = steps
            entry.suspended_at = now
            self._steps.append(SuspendTask(entry, self._cause))
            self.queue.push(entry)
        self._fill(now, first=head)

    def _reseated(self, entries: Sequence[QueuedTask], now: float) -> None:
        """Suspended ``entries`` took seats in a running step batch: their states are free and
        their pins go (the batch's own pin holds the model)."""
        for entry in entries:
            if entry in self.held:
                self.held.release(entry)
                if entry.model is not None:
                    self._unpin(entry.model, now)

    def _abandon(self, entry: QueuedTask, now: float) -> None:
        """Suspended ``entry`` leaves the queue without running again (its job is dropped or
        ended): its state and its model's pin are released, its suspended code stops."""
        self.held.release(entry)
        self._steps.append(StopTask((entry,), self._cause))
        if entry.model is not None:
            self._unpin(entry.model, now)

    def release(self, entries: Sequence[QueuedTask], now: float, cause: Cause = "") -> list[Step]:
        """Suspended ``entries`` were dropped from the queue (:meth:`drop`): see
        :meth:`_abandon`; a lane may take what their models' slabs held up."""
        return self._decide(cause, self._release, entries, now)

    def _release(self, entries: Sequence[QueuedTask], now: float) -> None:
        for entry in entries:
            self._abandon(entry, now)
        self._fill(now)

    def ended(
        self, entry: QueuedTask, now: float, *, still_running: bool = False, cause: Cause = ""
    ) -> list[Step]:
        """``entry``'s run ended (done or failed): its lane is free (the caller fills it).
        ``still_running``: it was abandoned past its timeout, and keeps its model pinned until
        :meth:`returned`. Its model unpinned, a task waiting for the slabs may load or run."""
        # only an unpinned model can make anything happen: the bookkeeping before it decides
        # nothing (if it raised, there would be no steps to carry on), so it runs outside
        # :meth:`_decide` and returns a fresh empty list (one per task less to set up)
        run = self._runs.pop(entry, None)
        if run is None:  # a member ending where its batch was suspended: out of the queue
            return self._decide(cause, self._ended_held, entry, now) if entry in self.held else []
        if still_running and not run.stuck:
            run.stuck = True
            self.stuck += 1
            self.version += 1
        run.pending -= 1
        if run.batch is not None:
            return self._left_batch(run, entry, now, cause)
        if run.pending:
            return []  # the rest of its batch is still to report
        if run.host:
            self._host_idle.append(run.lane)
            self.host_queue.finish(run.entry)
            return []
        return self._free(run, now, cause)

    def _ended_held(self, entry: QueuedTask, now: float) -> None:
        self.version += 1
        self.queue.drop(lambda e: e is entry)
        self.held.release(entry)
        if entry.model is not None:
            self._unpin(entry.model, now)

    def _free(self, run: _Run, now: float, cause: Cause) -> list[Step]:
        """``run``'s last entry ended: its GPU lane is free, its model unpinned."""
        lead = run.entry
        self.version += 1
        self._idle.append(run.lane)
        self.queue.finish(lead)
        if lead.model is not None and not run.stuck:
            return self._decide(cause, self._unpin, lead.model, now)
        return []

    def _left_batch(self, run: _Run, entry: QueuedTask, now: float, cause: Cause) -> list[Step]:
        """Member ``entry`` of step batch ``run`` ended: its seat goes to a queued task of the
        batch's group; once the last member ends, the lane is free (the caller fills it)."""
        assert run.batch is not None
        run.batch.left(entry, now)
        lead = run.entry
        if run.pending:
            return [] if run.stuck else self._decide(cause, self._join, run, now)
        closed(self._open, lead.group, run)
        return self._free(run, now, cause)

    def _join(self, run: _Run, now: float) -> None:
        """Queued tasks of step batch ``run``'s group take its free seats, at its next step
        boundary (:meth:`TaskQueue.take_steps`: never making a member miss its deadline)."""
        assert run.batch is not None
        joined = run.batch.take(self.queue, now, self.held)
        if not joined:
            return
        self.version += 1
        for entry in joined:
            self._runs[entry] = run
        self._reseated(joined, now)
        run.pending += len(joined)
        self._steps.append(JoinRun(run.entry, tuple(joined), run.lane, self._cause))

    def returned(self, entry: QueuedTask, now: float, cause: Cause = "") -> list[Step]:
        """The thread of an abandoned task returned: its model is unpinned."""
        return self._decide(cause, self._returned, entry, now)

    def _returned(self, entry: QueuedTask, now: float) -> None:
        self.version += 1
        self.stuck -= 1
        if entry.model is not None:
            self._unpin(entry.model, now)
        self._fill(now)

    def fill(self, now: float, cause: Cause = "") -> list[Step]:
        """Idle lanes take the next ready tasks."""
        steps: list[Step] = []
        self._steps = steps
        self._cause = cause
        try:
            self._fill(now)
        except Exception as exc:
            raise LanesFault(steps) from exc
        finally:
            self._steps = _NOT_DECIDING
        return steps

    def _decide(self, cause: Cause, rule: Callable[..., None], *args: Any) -> list[Step]:
        """Run ``rule`` (one call's rules) and return what it decided, each step carrying
        ``cause``, the id of the core's event. If it raises, the steps travel with the
        :class:`LanesFault` (the state changed with them)."""
        steps: list[Step] = []
        self._steps, self._cause = steps, cause
        try:
            rule(*args)
        except Exception as exc:
            raise LanesFault(steps) from exc
        finally:
            self._steps = _NOT_DECIDING
        return steps

    def _fill(self, now: float, first: QueuedTask | None = None) -> None:
        """Idle lanes take queued tasks: ``first`` (the task a suspension made way for), then a
        suspended task (it waited for one task, the one that took its lane: its model and its
        state are kept for it meanwhile), then the queue's order. The queue is shed first,
        but not for ``first``: the suspended task now ranks ahead of it, which it overtook."""
        if first is None:
            self._shed_queued(now)
        while self._idle:
            if first is not None:
                entry: QueuedTask | None = self.queue.pop_entry(first, now)
                first = None
            elif self.held:
                entry = self.queue.pop_entry(next(iter(self.held)), now)
            else:
                entry = self.queue.pop(now)
            if entry is None:
                if not self.busy:
                    self._warm(now)
                break
            if self._too_late(self.queue, entry, now):
                if entry in self.held:  # suspended: its kept state ends too
                    self._abandon(entry, now)
                continue
            lane = self._idle.pop()
            self.version += 1
            run = _Run(entry, lane, False, now)
            self._runs[entry] = run
            model = entry.model
            if self.degraded:
                if entry in self.held:
                    self._abandon(entry, now)
                self._fail(run, self._degraded_error(), now)
            elif entry in self.held:  # resumed: its model stayed pinned and resident
                self.held.release(entry)
                self._start(run, now)
            elif model is None:
                self._start(run, now)
            else:
                run.hit = self.cache.record_request(model)
                self.used[model] = now
                run.upcoming = self.queue.upcoming_models()
                self._ensure(run, now)
        self._fill_host(now)

    def _fill_host(self, now: float) -> None:
        while self._host_idle:
            entry = self.host_queue.pop(now)
            if entry is None:
                return
            if self._too_late(self.host_queue, entry, now):
                continue
            run = _Run(entry, self._host_idle.pop(), True, now)
            self._runs[entry] = run
            if self.degraded:
                self._fail(run, self._degraded_error(), now)
                continue
            self._steps.append(RunTask(entry, run.lane, True, 0.0, None, (), self._cause))

    def _degraded_error(self) -> WorkerUnavailable:
        return WorkerUnavailable(
            f"this worker has {self.stuck} stuck tasks (timed out, their threads still "
            f"running; --max-stuck-tasks {self.max_stuck}) and takes no more work until "
            "they return"
        )

    def _shed_queued(self, now: float) -> None:
        """Drop the queued tasks whose jobs can no longer finish in time
        (:meth:`TaskQueue.late`): their jobs are answered now rather than when a lane would
        reach them, and the wait heartbeats report no longer counts work that will not run."""
        late = self.queue.late(now, self.lanes)
        if not late:
            return
        doomed = {id(e) for e, _ in late}
        self.queue.drop(lambda e: id(e) in doomed)
        self.version += 1
        for entry, wait_s in late:
            self.shed += 1
            if entry in self.held:  # suspended: its kept state ends too
                self._abandon(entry, now)
            self._steps.append(CannotRun(entry, queued_too_late(entry, wait_s, now)))

    def _too_late(self, queue: TaskQueue, entry: QueuedTask, now: float) -> bool:
        """Shed ``entry`` (just popped) if its job can no longer finish by its deadline when
        it starts now (now plus its remaining critical path): its job is answered at once
        with :class:`~compass.errors.DeadlineExceeded` (:class:`CannotRun`) instead of taking
        a lane, unless the job asked to finish anyway."""
        deadline = entry.deadline
        if deadline is None or entry.finish:
            return False
        left = entry.remaining_s
        model = entry.model
        load = ""
        if model is not None and not (
            self.cache.is_resident(model) or self.cache.is_loading(model)
        ):
            left += entry.fetch_s  # its model must be copied in first
            load = f", after {entry.fetch_s * 1000:.1f} ms to load model {model!r}"
        if now + left <= deadline:
            return False
        queue.finish(entry)
        self.version += 1
        self.shed += 1
        self._steps.append(CannotRun(entry, starts_too_late(entry, left, load, now)))
        return True

    def _ensure(self, run: _Run, now: float) -> None:
        """The next step towards running ``run``: its model resident and pinned."""
        name = run.entry.model
        assert name is not None
        try:
            step = self.cache.acquire(name, run.upcoming)
        except CompassError as exc:  # ModelTooLarge: it can never fit here
            self._fail(run, exc, now)
            return
        if step == READY:
            self._start(run, now)
        elif step == WAIT:
            if not run.waited:
                self.cache.record_wait()
                run.waited = True
            self._blocked.append(run)
        else:
            if isinstance(step, LoadPlan):
                self._begin_load(name, step, prefetch=False)
                self.cache.pin(name)
            self._loading[name].append(run)

    def _start(self, run: _Run, now: float) -> None:
        entry = run.entry
        fetch_s = now - run.asked_at if entry.model is not None else 0.0
        group = entry.group
        mates: list[QueuedTask] = []
        if group is not None and entry.steps > 1:  # a step batch: tasks join at its steps
            run.batch = StepBatch(entry, now)
            mates = run.batch.take(self.queue, now, self.held)
            self._open.setdefault(group, []).append(run)
        elif group is not None and entry not in self.held:
            mates = self.queue.take(entry, now)
        for mate in mates:
            self._runs[mate] = run
        self._reseated(mates, now)
        run.pending = 1 + len(mates)
        self._steps.append(
            RunTask(entry, run.lane, False, fetch_s, run.hit, tuple(mates), self._cause)
        )
        if self.prefetch_depth:
            self._prefetch()

    def _fail(self, run: _Run, error: CompassError, now: float) -> None:
        """``run`` cannot run: its lane is free, its job hears why."""
        self.version += 1
        self._runs.pop(run.entry, None)
        if run.host:
            self._host_idle.append(run.lane)
            self.host_queue.finish(run.entry)
        else:
            self._idle.append(run.lane)
            self.queue.finish(run.entry)
        self._steps.append(CannotRun(run.entry, error))

    # -- models --------------------------------------------------------------------------------

    def _begin_load(self, name: str, plan: LoadPlan, *, prefetch: bool) -> None:
        self.cache.begin_load(name, plan, prefetch=prefetch)
        self.version += 1
        self._loading[name] = []
        if prefetch:
            self._speculating = name
        self._steps.append(LoadModel(name, plan.evict, prefetch, self._cause))

    def loaded(self, name: str, seconds: float, now: float, cause: Cause = "") -> list[Step]:
        """The load of ``name`` ended in ``seconds``: its waiters run."""
        return self._decide(cause, self._loaded, name, seconds, now)

    def _loaded(self, name: str, seconds: float, now: float) -> None:
        waiters = self._loading.pop(name, None)
        if waiters is not None:  # else not a load of this core's (already aborted)
            self.cache.finish_load(name, seconds)
            for run in waiters:
                self._start(run, now)
            self._load_ended(name, now)

    def load_failed(
        self, name: str, error: CompassError, now: float, cause: Cause = ""
    ) -> list[Step]:
        """The load of ``name`` failed: its slabs are freed, the tasks waiting for it fail."""
        return self._decide(cause, self._load_failed, name, error, now)

    def _load_failed(self, name: str, error: CompassError, now: float) -> None:
        waiters = self._loading.pop(name, None)
        if waiters is not None:
            self.cache.abort_load(name)
            for run in waiters:
                self._unpin(name, now)
                self._fail(run, error, now)
            self._load_ended(name, now)

    def _load_ended(self, name: str, now: float) -> None:
        self.version += 1
        self._retry_blocked(now)
        if self._speculating == name:
            self._speculating = None
            self._warm(now)
        self._fill(now)

    def _unpin(self, name: str, now: float) -> None:
        if self.cache.unpin(name) == 0:
            self._retry_blocked(now)

    def _retry_blocked(self, now: float) -> None:
        """A pin or a load was released: every waiting run asks again, in order."""
        if not self._blocked:
            return
        waiting, self._blocked = self._blocked, []
        for run in waiting:
            self._ensure(run, now)

    def _prefetch(self) -> None:
        """One speculative load at a time, never evicting what is needed sooner, and never
        while another load is under way (they would share the copy bandwidth: the load a
        task waits for would take longer); a running decision task's likely successors'
        models are in the look-ahead too (:mod:`compass.core.likely`)."""
        if self._loading:
            return
        candidate = likely.prefetch_candidate(
            self.cache, self.queue, self.prefetch_depth, evict=self.prefetch_evicts
        )
        if candidate is not None:
            self._begin_load(*candidate, prefetch=True)

    def tick(
        self, now: float, cause: Cause = "", hot: str = "", cold_s: float = COLD_S,
        spare: Collection[str] = (),
    ) -> list[Step]:  # fmt: skip
        """A periodic check (the real worker's heartbeat): warm the cache if idle; ``hot``: a
        model to load ahead of need, over models colder than it (:meth:`_replicate`)."""
        if hot:
            return self._decide(cause, self._replicate, hot, now, cold_s, spare)
        return self._decide(cause, self._warm, now)

    def _replicate(self, model: str, now: float, cold_s: float, spare: Collection[str]) -> None:
        """Load ``model``, which the cluster wants another copy of, before a task needs it, never
        while another load is under way, and only over colder models (:mod:`compass.core.replica`).
        Nothing pins the copy: the cache evicts it like any other once unused."""
        if self._loading:
            return
        upcoming = self.queue.upcoming_models()
        plan = replica_plan(self.cache, model, upcoming, self.used, now, cold_s, spare)
        if plan is not None:
            self.used[model] = now
            self._begin_load(model, plan, prefetch=True)

    def _warm(self, now: float) -> None:
        """Warm an idle cache with the model the cluster holds least for its demand: only into
        free slabs, one load at a time, never while work is queued or running."""
        if (
            not self.demand
            or not self.prefetch_depth
            or self._loading
            or self.busy
            or len(self.queue)
        ):
            return
        cache = self.cache
        free = cache.free_bytes()
        if free < self._smallest or not any(
            size <= free and not cache.is_resident(m) and not cache.is_loading(m)
            for m, size in self._sizes.items()
        ):
            return  # the common case once caches fill up: no need to look at the view
        candidate = cache.warm_candidate(self.wanted(now))
        if candidate is not None:
            self._begin_load(*candidate, prefetch=True)


def _nothing_wanted(now: float) -> Sequence[str]:
    return ()


class _NotDeciding(list[Step]):
    """``Lanes._steps`` between calls: a rule that decides outside a call is a bug."""

    def append(self, step: Step, /) -> None:
        raise RuntimeError(f"the lanes decided {step!r} outside a call")


_NOT_DECIDING = _NotDeciding()
