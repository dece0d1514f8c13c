"""The discrete-event simulator: the real worker's decisions, in virtual time.

Each simulated worker does what :class:`~compass.worker.server.Worker` does, with the same code
for every decision:

- the ingress plans a job with its policy (:func:`~compass.sched.make_policy`, one instance per
  worker, as in a cluster) on a :class:`~compass.sched.view.ViewSnapshot` of its view, counts
  the placements on peers, and pushes each root task to its worker (``central``: the plan is
  asked of one worker, a round trip away);
- a worker gathers a task's inputs in an :class:`~compass.worker.jobs.Inbox` (a join waits for
  all) and queues it in a :class:`~compass.worker.queue.TaskQueue` on the virtual clock, with
  its job's arrival time as its priority when the policy runs queues oldest job first;
- a lane pops tasks in queue order; a task's model is made resident and pinned exactly as
  :meth:`ModelCache.ensure <compass.cache.models.ModelCache.ensure>` does it, over a
  :class:`~compass.cache.policy.CacheCore` (plan_load, begin_load, pin, waiting while pinned or
  loading models hold the slabs), then at most one prefetch is started as
  :meth:`ModelCache.prefetch <compass.cache.models.ModelCache.prefetch>` does; then the task
  runs for its profiled time;
- when it finishes, :func:`~compass.sched.adjust_successors` re-places its successors (and,
  for Compass, the joins only they feed) on this worker's view, and the output is pushed on;
  a sink's output goes to the ingress;
- a worker whose lanes and queue are idle, with no prefetch under way, warms its cache when the
  policy does: it loads the first model of :func:`~compass.sched.replicas.warm_order` that fits
  in its free slabs (:meth:`~compass.cache.policy.CacheCore.warm_candidate`). It checks when it
  falls idle and when such a load ends (a real worker checks at every heartbeat; nothing else
  changes its answer in between), and every worker checks once at time 0.

Time costs: a model load takes ``Profiles.fetch_s`` at the spec's host-to-device bandwidth,
a push between two workers ``Profiles.transfer_s`` of the output's declared size, a task its
profiled execution time. What each worker sees of its peers is modelled in
:mod:`compass.sim.state`.

Events at the same virtual time run in the order they were scheduled; work a real worker would
do in a later event-loop iteration (a lane waking up, a waiter retrying) runs after the current
event, in order, as asyncio's ready queue would run it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compass.cache.policy import READY, WAIT, CacheCore, LoadPlan
from compass.cache.pool import SlabPool
from compass.config import CacheConfig
from compass.errors import CompassError, ConfigError, UnknownWorkflow
from compass.sched import Policy, ViewSnapshot, make_policy
from compass.sched.policies import worker_seed
from compass.sched.replicas import model_demand, warm_order
from compass.sim.arrivals import Arrival
from compass.sim.result import JobRecord, SimResult, TaskRecord
from compass.sim.state import ClusterState
from compass.worker.messages import (
    JOB_INPUTS,
    DoneMsg,
    PeerMessage,
    PlacedMsg,
    PlanRequest,
    ResultMsg,
    TaskMsg,
)
from compass.worker.queue import QueuedTask, TaskQueue
from compass.worker.state import (
    Answer,
    Drop,
    DropIngress,
    Enqueue,
    Event,
    PlanReady,
    Received,
    Send,
    Submit,
    TaskDone,
    TaskFailed,
    WorkerCore,
)
from compass.workflow.dag import Task, Workflow
from compass.workflow.profile import Profiles
from compass.workflow.spec import Workload

__all__ = ["simulate"]

MiB = 1 << 20

#: bytes of a plan request or reply on the wire (``central``): a few hundred bytes of msgpack
_RPC_BYTES = 256

Handler = Callable[[Any], None]


def simulate(
    workload: Workload,
    *,
    workers: int,
    policy: str,
    arrivals: Sequence[Arrival],
    heartbeat_s: float = 0.01,
    staleness_s: float | None = None,
    lanes: int = 1,
    prefetch: bool = True,
    warm: bool = True,
    cache_bytes: int | None = None,
    slab_bytes: int = 64 * MiB,
    seed: int = 0,
    host_lanes: int = 0,
) -> SimResult:
    """Run ``arrivals`` on ``workers`` simulated workers under ``policy``; see the module doc.

    Workers are named ``w0`` .. ``w{n-1}`` (as a LocalCluster names them); client ``i`` submits
    to ``w{i % workers}``. ``staleness_s`` (default ``heartbeat_s``) is how old the peers' state
    in a view is at least; ``cache_bytes`` (default the spec's GPU memory) is each worker's
    cache, in slabs of ``slab_bytes``; ``seed`` seeds the ``random`` policy. ``prefetch=False``
    turns off every speculative load; ``warm=False`` only the warming of idle caches.
    ``host_lanes`` > 0 runs model-less tasks on that many host lanes per worker, off the GPU
    lanes (``compass worker start --host-lanes``).
    """
    sim = _Simulation(
        workload,
        workers=workers,
        policy=policy,
        heartbeat_s=heartbeat_s,
        staleness_s=heartbeat_s if staleness_s is None else staleness_s,
        lanes=lanes,
        prefetch=prefetch,
        warm=warm,
        cache_bytes=workload.cluster.gpu_memory_bytes if cache_bytes is None else cache_bytes,
        slab_bytes=slab_bytes,
        seed=seed,
        host_lanes=host_lanes,
    )
    return sim.run(arrivals)


@dataclass(slots=True, eq=False)
class _Job:
    """What the simulation records of a job; its rules are the ingress core's."""

    id: str
    workflow: Workflow
    client: int
    arrival: float
    best_s: float
    placed: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Run:
    """One task on a lane, from pop to finish."""

    worker: _Worker
    entry: QueuedTask
    task: Task
    lane: int
    fetch_from: float
    upcoming: list[str] = field(default_factory=list)
    hit: bool | None = None
    waited: bool = False
    fetch_s: float = 0.0


@dataclass(slots=True, eq=False)
class _Load:
    model: str
    prefetch: bool
    seconds: float
    waiters: list[_Run] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _Worker:
    index: int
    name: str
    queue: TaskQueue
    core: CacheCore
    policy: Policy
    #: the worker's rules, the real worker's core (set once the worker exists)
    rules: WorkerCore | None = None
    busy: int = 0
    idle_lanes: list[int] = field(default_factory=list)
    inflight: dict[str, _Load] = field(default_factory=dict)
    prefetching: bool = False
    blocked: list[_Run] = field(default_factory=list)
    busy_s: float = 0.0
    host_free: int = 0
    host_waiting: deque[_Run] = field(default_factory=deque)


class _Simulation:
    def __init__(
        self,
        workload: Workload,
        *,
        workers: int,
        policy: str,
        heartbeat_s: float,
        staleness_s: float,
        lanes: int,
        prefetch: bool,
        warm: bool,
        cache_bytes: int,
        slab_bytes: int,
        seed: int,
        host_lanes: int = 0,
    ) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError(f"simulate needs workers >= 1, got {workers!r}")
        if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
            raise ConfigError(f"simulate needs lanes >= 1, got {lanes!r}")
        if not isinstance(host_lanes, int) or isinstance(host_lanes, bool) or host_lanes < 0:
            raise ConfigError(f"simulate needs host_lanes >= 0, got {host_lanes!r}")
        if not heartbeat_s > 0:
            raise ConfigError(f"heartbeat_s must be > 0, got {heartbeat_s!r}")
        if not staleness_s >= 0:
            raise ConfigError(f"staleness_s must be >= 0, got {staleness_s!r}")
        # the same cache settings a worker validates (capacity vs slab size, prefetch depth)
        self.cache_config = CacheConfig(
            capacity_bytes=cache_bytes, slab_bytes=slab_bytes, backend="capacity"
        )
        self.workload = workload
        self.policy_name = policy
        self.lanes = lanes
        self.host_lanes = host_lanes
        self.prefetch = prefetch
        self.profiles = Profiles.from_workload(workload)
        self.now = 0.0
        names = tuple(sorted(f"w{i}" for i in range(workers)))
        self.names = names
        self.workers: list[_Worker] = []
        for i, name in enumerate(names):
            core = CacheCore(SlabPool(cache_bytes, slab_bytes), workload.models)
            worker = _Worker(
                index=i,
                name=name,
                queue=TaskQueue(self._clock),
                core=core,
                # one policy per worker, made as a worker makes its own: round_robin and
                # random keep per-instance state, compass a per-instance cost cache
                policy=make_policy(policy, seed=worker_seed(seed, name), host_lanes=host_lanes > 0),
                host_free=host_lanes,
            )
            worker.idle_lanes = list(range(lanes - 1, -1, -1))
            self.workers.append(worker)
        # every worker runs the same policy; warming needs prefetching (a speculative load)
        self.warm = warm and prefetch and self.workers[0].policy.warms_cache
        self.demand = model_demand(workload.workflows.values(), self.profiles)
        self.model_sizes = {m: self.profiles.model_bytes(m) for m in self.demand}
        self._smallest_model = min(self.model_sizes.values(), default=0)
        capacity = [w.core.capacity_bytes() for w in self.workers]
        self.state = ClusterState(
            names,
            sorted(workload.models),
            capacity,
            lanes=lanes,
            heartbeat_s=heartbeat_s,
            staleness_s=staleness_s,
            # ClusterView's default: a heartbeat two intervals after a placement reflects it
            settle_s=2.0 * heartbeat_s,
        )
        self.positions = self.state.positions
        for worker in self.workers:
            worker.rules = WorkerCore(
                worker.name,
                workflow=self._workflow,
                policy=worker.policy,
                profiles=self.profiles,
                view=_SimView(self.state, worker),
                host_lanes=host_lanes > 0,
                max_jobs=1 << 62,  # the simulator models no admission limit
            )
        self._heap: list[tuple[float, int, Handler, Any]] = []
        self._seq = itertools.count()
        self._later: deque[tuple[Handler, Any]] = deque()
        self._jobs: dict[str, _Job] = {}
        self._best_s = {name: _best_s(wf) for name, wf in workload.workflows.items()}
        self.job_records: list[JobRecord] = []
        self.task_records: list[TaskRecord] = []
        self.moves = 0
        self.events = 0

    def _clock(self) -> float:
        return self.now

    def _workflow(self, name: str) -> Workflow:
        try:
            return self.workload.workflows[name]
        except KeyError:
            raise UnknownWorkflow(f"unknown workflow {name!r}") from None

    # -- the event loop -----------------------------------------------------------------------

    def _at(self, t: float, handler: Handler, arg: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), handler, arg))

    def _soon(self, handler: Handler, arg: Any) -> None:
        """Run after the current event, at the same time (a later event-loop iteration)."""
        self._later.append((handler, arg))

    def run(self, arrivals: Sequence[Arrival]) -> SimResult:
        started = time.perf_counter()
        ordered = sorted(arrivals, key=lambda a: a.t_s)
        for a in ordered:
            if a.workflow not in self.workload.workflows:
                raise UnknownWorkflow(
                    f"arrival for workflow {a.workflow!r}, which the workload "
                    f"{self.workload.name!r} does not define "
                    f"(it has {', '.join(sorted(self.workload.workflows))})"
                )
            if not a.t_s >= 0 or a.client < 0:
                raise ConfigError(f"arrival {a!r}: need t_s >= 0 and client >= 0")
        if self.warm:
            for worker in self.workers:
                self._at(0.0, self._warm, worker)
        heap = self._heap
        later = self._later
        state = self.state
        pop = heapq.heappop
        n = len(ordered)
        next_arrival = 0
        events = 0
        while True:
            if heap and (next_arrival >= n or heap[0][0] < ordered[next_arrival].t_s):
                t, _, handler, arg = pop(heap)
            elif next_arrival < n:
                arg = ordered[next_arrival]
                t, handler = arg.t_s, self._arrive
                next_arrival += 1
            else:
                break
            state.advance(t)
            self.now = t
            handler(arg)
            while later:
                handler, arg = later.popleft()
                handler(arg)
            events += 1
        self.events = events
        for job in self._jobs.values():  # never answered: stuck
            self._record_job(job, None, "did not finish")
        self._jobs.clear()
        self.job_records.sort(key=lambda j: (j.arrival, j.id))
        return self._result(time.perf_counter() - started)

    def _result(self, wall_s: float) -> SimResult:
        stats = [w.core.stats for w in self.workers]
        return SimResult(
            policy=self.policy_name,
            workers=self.names,
            lanes=self.lanes,
            jobs=self.job_records,
            tasks=self.task_records,
            busy_s={w.name: w.busy_s for w in self.workers},
            horizon_s=self.now,
            model_bytes_loaded=sum(s.bytes_loaded for s in stats),
            loads=sum(s.loads for s in stats),
            prefetches=sum(s.prefetches for s in stats),
            evictions=sum(s.evictions for s in stats),
            moves=self.moves,
            events=self.events,
            wall_s=wall_s,
        )

    # -- ingress ------------------------------------------------------------------------------

    def _arrive(self, arrival: Arrival) -> None:
        wf = self.workload.workflows[arrival.workflow]
        worker = self.workers[self.positions[f"w{arrival.client % len(self.names)}"]]
        rules = _rules(worker)
        job = _Job(
            id=rules.new_job_id(),  # the real ingress's job id
            workflow=wf,
            client=arrival.client,
            arrival=self.now,
            best_s=self._best_s[wf.name],
        )
        self._jobs[job.id] = job
        inputs = dict.fromkeys(wf.inputs)  # values are not simulated, only their size
        self._apply(worker, Submit(self.now, job.id, wf.name, inputs, 0, self.now))

    def _apply(self, worker: _Worker, event: Event) -> None:
        """Feed ``event`` to ``worker``'s core and carry out its instructions in virtual time."""
        for step in _rules(worker).handle(event):
            if isinstance(step, Send):
                self._send(worker, step.peer, step.msg)
            elif isinstance(step, Enqueue):
                self._enqueue(worker, step.entry)
            elif isinstance(step, Drop):
                self._drop(worker, step.job_id, step.below)
            elif isinstance(step, Answer):
                self._answered(step)
            elif isinstance(step, DropIngress):
                pass  # simulated workers are never lost
            else:
                delay = self.profiles.transfer_s(worker.name, step.peer, _RPC_BYTES)
                self._at(self.now + delay, self._plan_remote, (worker, step.peer, step.request))

    def _plan_remote(self, arg: tuple[_Worker, str, PlanRequest]) -> None:
        """At the ``central`` planner: plan, and send the plan back to the ingress."""
        ingress, planner, request = arg
        try:
            plan: dict[str, str] | None = _rules(self.workers[self.positions[planner]]).plan_for(
                request, self.now
            )
        except CompassError:
            plan = None  # the ingress plans it itself
        delay = self.profiles.transfer_s(planner, ingress.name, _RPC_BYTES)
        self._at(self.now + delay, self._plan_back, (ingress, request.job, plan))

    def _plan_back(self, arg: tuple[_Worker, str, dict[str, str] | None]) -> None:
        ingress, job_id, plan = arg
        self._apply(ingress, PlanReady(self.now, job_id, plan))

    def _answered(self, answer: Answer) -> None:
        job = self._jobs.pop(answer.job_id, None)
        if job is None:
            return
        if answer.error is None:
            self._record_job(job, self.now, "")
        else:
            self._record_job(job, None, answer.error.message)

    def _record_job(self, job: _Job, finish: float | None, error: str) -> None:
        latency = None if finish is None else finish - job.arrival
        self.job_records.append(
            JobRecord(
                id=job.id,
                workflow=job.workflow.name,
                client=job.client,
                arrival=job.arrival,
                finish=finish,
                latency_s=latency,
                slowdown=None if latency is None else latency / job.best_s,
                plan=job.placed,
                error=error,
            )
        )

    # -- messages between workers -------------------------------------------------------------

    def _send(self, src: _Worker, dst: str, msg: PeerMessage) -> None:
        """Deliver ``msg`` after its transfer time: a task input of its declared size, a sink's
        output likewise, control messages as a few hundred bytes. A task input carries its own
        copy of the plan, as on the wire."""
        if isinstance(msg, TaskMsg):
            tasks = self.workload.workflows[msg.workflow].tasks
            profile = tasks[msg.task if msg.source == JOB_INPUTS else msg.source].profile
            nbytes = profile.input_bytes if msg.source == JOB_INPUTS else profile.output_bytes
            msg = TaskMsg(
                msg.job,
                msg.attempt,
                msg.workflow,
                msg.task,
                msg.source,
                msg.value,
                dict(msg.plan),
                msg.ingress,
                msg.sent,
                msg.t0,
            )
        elif isinstance(msg, ResultMsg):
            job = self._jobs.get(msg.job)
            nbytes = (
                _RPC_BYTES if job is None else job.workflow.tasks[msg.task].profile.output_bytes
            )
        else:
            target = self.workers[self.positions[dst]]
            if isinstance(msg, DoneMsg | PlacedMsg):
                # bookkeeping that changes no simulated outcome (no simulated worker is ever
                # lost): delivered after this event instead of through the heap
                self._soon(self._deliver, (target, src.name, msg, 0.0))
                return
            nbytes = _RPC_BYTES
        seconds = self.profiles.transfer_s(src.name, dst, nbytes)
        target = self.workers[self.positions[dst]]
        self._at(self.now + seconds, self._deliver, (target, src.name, msg, seconds))

    def _deliver(self, arg: tuple[_Worker, str, PeerMessage, float]) -> None:
        worker, sender, msg, seconds = arg
        # one clock for every simulated worker: a task's t0 is its job's arrival
        arrival = msg.t0 if isinstance(msg, TaskMsg) else None
        self._apply(worker, Received(self.now, sender, msg, seconds, arrival))

    def _enqueue(self, worker: _Worker, queued: QueuedTask) -> None:
        """Executor.submit: a host lane for a model-less task when there are host lanes, else
        the GPU queue (and a prefetch when every lane is busy)."""
        task = self.workload.workflows[queued.workflow].tasks[queued.task]
        if task.model is None and self.host_lanes:
            # Executor.submit: a host lane, FIFO, outside the queue a heartbeat reports
            run = _Run(worker, queued, task, -1, fetch_from=self.now)
            if worker.host_free:
                self._host_start(run)
            else:
                worker.host_waiting.append(run)
            return
        worker.queue.push(queued)
        self.state.queue_push(worker.index, queued.expected_s)
        # Executor.submit: with every lane busy, use the time to bring in what comes next
        if self.prefetch and worker.busy >= self.lanes:
            self._prefetch(worker)
        self._soon(self._lanes, worker)

    def _drop(self, worker: _Worker, job_id: str, below: int | None) -> None:
        """Executor.drop_job: the job's queued tasks leave the queues (a failed or re-planned
        job), and the published queue with them."""
        if worker.queue.drop_job(job_id, below):
            self.state.queue_set(worker.index, worker.queue.queued_s)
        if worker.host_waiting:
            worker.host_waiting = deque(
                run
                for run in worker.host_waiting
                if run.entry.job_id != job_id or (below is not None and run.entry.attempt >= below)
            )

    def _placed(self, entry: QueuedTask, worker: _Worker) -> None:
        job = self._jobs.get(entry.job_id)
        if job is not None:
            job.placed[entry.task] = worker.name

    # -- a worker's lanes ---------------------------------------------------------------------

    def _lanes(self, worker: _Worker) -> None:
        """Idle lanes take the next ready tasks (Executor._lane)."""
        while worker.idle_lanes:
            entry = worker.queue.pop()
            if entry is None:
                if worker.busy == 0:
                    self._warm(worker)
                return
            worker.busy += 1
            lane = worker.idle_lanes.pop()
            self.state.queue_pop(
                worker.index,
                entry.expected_s,
                lane,
                entry.started_at + entry.expected_s,
                empty=len(worker.queue) == 0,
            )
            task = self.workload.workflows[entry.workflow].tasks[entry.task]
            self._placed(entry, worker)
            run = _Run(worker, entry, task, lane, fetch_from=self.now)
            if entry.model is None:
                self._run_task(run)
                continue
            run.hit = worker.core.record_request(entry.model)
            run.upcoming = worker.queue.upcoming_models()
            self._ensure(run)

    def _ensure(self, run: _Run) -> None:
        """ModelCache.ensure in virtual time: the same :meth:`CacheCore.acquire` steps."""
        worker = run.worker
        name = run.entry.model
        assert name is not None
        try:
            step = worker.core.acquire(name, run.upcoming)
        except CompassError as exc:
            self._task_failed(run, exc)
            return
        if step == READY:
            self._run_task(run)
        elif step == WAIT:
            if not run.waited:
                worker.core.record_wait()
                run.waited = True
            worker.blocked.append(run)
        else:
            if isinstance(step, LoadPlan):
                self._start_load(worker, name, step, prefetch=False)
                worker.core.pin(name)
            worker.inflight[name].waiters.append(run)

    def _warm(self, worker: _Worker) -> None:
        """Warm an idle cache with the model the cluster holds least for its demand (module
        docstring): only into free slabs, one load at a time, never while work is queued."""
        if not self.warm or worker.prefetching or worker.busy or len(worker.queue):
            return
        core = worker.core
        free = core.free_bytes()
        if free < self._smallest_model or not any(
            size <= free and not core.is_resident(m) and not core.is_loading(m)
            for m, size in self.model_sizes.items()
        ):
            return  # the common case once caches fill up: no need to look at the view
        wanted = warm_order(self._view(worker), worker.name, self.demand)
        candidate = worker.core.warm_candidate(wanted)
        if candidate is not None:
            name, plan = candidate
            self._start_load(worker, name, plan, prefetch=True)

    def _prefetch(self, worker: _Worker) -> None:
        """ModelCache.prefetch: one prefetch at a time, never evicting what is needed sooner."""
        if worker.prefetching:
            return
        candidate = worker.core.prefetch_candidate(
            worker.queue.upcoming_models(), self.cache_config.prefetch_depth
        )
        if candidate is not None:
            name, plan = candidate
            self._start_load(worker, name, plan, prefetch=True)

    def _start_load(self, worker: _Worker, name: str, plan: LoadPlan, *, prefetch: bool) -> _Load:
        core = worker.core
        core.begin_load(name, plan, prefetch=prefetch)
        self.state.cache_changed(worker.index, name, plan.evict, core.free_bytes())
        seconds = self.profiles.fetch_s(worker.name, core.size_bytes(name))
        load = _Load(name, prefetch, seconds)
        worker.inflight[name] = load
        if prefetch:
            worker.prefetching = True
        self._at(self.now + seconds, self._load_done, (worker, load))
        return load

    def _load_done(self, arg: tuple[_Worker, _Load]) -> None:
        worker, load = arg
        worker.core.finish_load(load.model, load.seconds)
        del worker.inflight[load.model]
        if load.prefetch:
            worker.prefetching = False
            self._soon(self._warm, worker)
        self._notify(worker)
        for run in load.waiters:
            self._soon(self._loaded, run)

    def _loaded(self, run: _Run) -> None:
        self._run_task(run)

    def _notify(self, worker: _Worker) -> None:
        """The cache changed: every waiter re-checks (after this event)."""
        if worker.blocked:
            waiting, worker.blocked = worker.blocked, []
            for run in waiting:
                self._soon(self._retry, run)

    def _retry(self, run: _Run) -> None:
        self._ensure(run)

    def _run_task(self, run: _Run) -> None:
        """The model is pinned (or none is needed): prefetch, then run for the profiled time."""
        if run.entry.model is not None:
            run.fetch_s = self.now - run.fetch_from
        if self.prefetch:
            self._prefetch(run.worker)
        self._at(self.now + run.task.profile.exec_ms / 1000.0, self._task_done, run)

    def _task_failed(self, run: _Run, exc: CompassError) -> None:
        self._release_lane(run)
        error = f"{type(exc).__name__}: {exc.message}"
        self._apply(run.worker, TaskFailed(self.now, run.entry, error, "", exc.code))
        self._soon(self._lanes, run.worker)

    def _release_lane(self, run: _Run) -> None:
        worker = run.worker
        worker.busy -= 1
        worker.queue.finish(run.entry)
        worker.idle_lanes.append(run.lane)
        self.state.lane_free(worker.index, run.lane)
        worker.busy_s += self.now - run.entry.started_at

    def _task_done(self, run: _Run) -> None:
        worker = run.worker
        entry = run.entry
        if entry.model is not None and worker.core.unpin(entry.model) == 0:
            self._notify(worker)
        self._release_lane(run)
        self._record_task(run)
        self._apply(worker, TaskDone(self.now, entry, None))
        self._lanes(worker)

    def _host_start(self, run: _Run) -> None:
        worker = run.worker
        worker.host_free -= 1
        run.entry.started_at = self.now
        self._placed(run.entry, worker)
        self._at(self.now + run.task.profile.exec_ms / 1000.0, self._host_done, run)

    def _host_done(self, run: _Run) -> None:
        worker = run.worker
        worker.host_free += 1
        self._record_task(run)
        self._apply(worker, TaskDone(self.now, run.entry, None))
        while worker.host_waiting and worker.host_free:
            self._host_start(worker.host_waiting.popleft())

    def _record_task(self, run: _Run) -> None:
        entry = run.entry
        self.task_records.append(
            TaskRecord(
                job_id=entry.job_id,
                task=entry.task,
                worker=run.worker.name,
                queue_s=entry.started_at - entry.enqueued_at,
                fetch_s=run.fetch_s,
                transfer_s=entry.transfer_s,
                exec_s=run.task.profile.exec_ms / 1000.0,
                cache_hit=run.hit,
            )
        )

    def _view(self, worker: _Worker) -> ViewSnapshot:
        return self.state.snapshot(worker.index, self.now, worker.queue.wait_s())


class _SimView:
    """A simulated worker's :class:`~compass.worker.state.ViewPort`: its peers as
    :class:`ClusterState` says it sees them, itself exactly."""

    def __init__(self, state: ClusterState, worker: _Worker) -> None:
        self._state = state
        self._worker = worker

    def snapshot(self, now: float) -> ViewSnapshot:
        worker = self._worker
        return self._state.snapshot(worker.index, now, worker.queue.wait_s())

    def note_placement(
        self, worker: str, seconds: float, model: str | None, model_bytes: int, now: float
    ) -> None:
        target = self._state.positions[worker]
        self._state.note_placement(self._worker.index, target, seconds, model, model_bytes, now)

    def remove(self, worker: str) -> None:
        pass  # simulated workers are never lost


def _rules(worker: _Worker) -> WorkerCore:
    assert worker.rules is not None
    return worker.rules


def _best_s(wf: Workflow) -> float:
    """The workflow's best execution time: declared, or else its critical path of execution
    times (no transfers, no model loads)."""
    if wf.best_ms is not None:
        return wf.best_ms / 1000.0
    longest: dict[str, float] = {}
    for t in wf.order:
        before = max((longest[p] for p in wf.preds(t)), default=0.0)
        longest[t] = before + wf.tasks[t].profile.exec_s
    best = max(longest.values())
    return best if best > 0 else math.inf
