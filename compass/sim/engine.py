"""The discrete-event simulator: the real worker's decisions, in virtual time.

Each simulated worker does what :class:`~compass.worker.server.Worker` does, with the same code
for every decision:

- the ingress plans a job with its policy (:func:`~compass.sched.make_policy`, one instance per
  worker, as in a cluster) on a :class:`~compass.sched.view.ViewSnapshot` of its view, counts
  the placements on peers, and pushes each root task to its worker (``central``: the plan is
  asked of one worker, a round trip away);
- every simulated worker runs the real worker's core (:class:`~compass.core.state.WorkerCore`
  and its :class:`~compass.core.lanes.Lanes`), whose rules decide everything; the simulator
  carries out its instructions in virtual time: a :class:`RunTask` ends after the task's
  profiled time (step-wise runs: :mod:`compass.sim.stepping`, step batches:
  :mod:`compass.sim.batching`), a :class:`LoadModel` after the model's load time, a message
  after its transfer time. Idle workers warm their caches when their policy does.

Time costs: a model load takes ``Profiles.fetch_s`` at the spec's host-to-device bandwidth,
a push between two workers ``Profiles.transfer_s`` of the output's declared size, a task its
profiled execution time. What each worker sees of its peers is modelled in
:mod:`compass.sim.state`, and for a bounded view in :mod:`compass.sim.heard`: its watched
candidates as pushed, the others as last heard, aged, and residency as rumors spread it.

Events at the same virtual time run in the order they were scheduled; bookkeeping messages
that change no simulated outcome run after the current event, in order.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

import numpy as np

from compass.cache.policy import CacheCore
from compass.cache.pool import SlabPool
from compass.core.assemble import build_core
from compass.core.events import (
    Answer,
    AskPlan,
    Chunk,
    Event,
    Fault,
    Feed,
    JoinRun,
    LoadModel,
    ModelLoaded,
    PlanAsked,
    Planned,
    PlanReady,
    Received,
    RunTask,
    Send,
    StopTask,
    Submit,
    SuspendTask,
    TaskDone,
    TaskStep,
    Tick,
    Watch,
)
from compass.core.jobs import JobIds
from compass.core.lanes import Lanes
from compass.core.messages import (
    JOB_INPUTS,
    DoneMsg,
    PeerMessage,
    PlacedMsg,
    PlanRequest,
    ResultMsg,
    TaskMsg,
)
from compass.core.options import core_options
from compass.core.queue import QueuedTask
from compass.core.state import WorkerCore
from compass.errors import ConfigError, UnknownWorkflow
from compass.gossip.spread import gossip_gap_s
from compass.objective import NO_OBJECTIVE, Objective, outcome_of
from compass.sched import CompassPolicy, Policy, make_policy
from compass.sched.candidates import CandidateRule
from compass.sched.policies import worker_seed
from compass.sim.arrivals import Arrival
from compass.sim.batching import StepBatches
from compass.sim.collector import collector_eased
from compass.sim.heard import LINK_S
from compass.sim.hooks import SimHooks
from compass.sim.modes import ingress_spread, view_rule
from compass.sim.replicas import Replication
from compass.sim.result import JobRecord, SimResult, TaskRecord
from compass.sim.settings import SimSettings
from compass.sim.state import ClusterState
from compass.sim.stepping import RunEnd, Stepping
from compass.sim.streams import SimStreams, ends_stream, stream_bytes
from compass.sim.traffic import view_traffic
from compass.sim.unfold import RanBest
from compass.sim.view import SimView
from compass.workflow.batching import without_step_batches
from compass.workflow.best import best_time_s
from compass.workflow.choices import is_skipped
from compass.workflow.dag import TaskProfile, Workflow, batch_scale, emulated_run_s
from compass.workflow.profile import Profiles
from compass.workflow.spec import Workload

__all__ = ["Simulation", "simulate"]

MiB = 1 << 20

#: bytes of a plan request or reply on the wire (``central``): a few hundred bytes of msgpack
_RPC_BYTES = 256
#: the wait a planner sees on a closed worker (:meth:`Simulation.set_open`): it places nothing
_CLOSED_S = 1e6

Handler = Callable[[Any], None]


def simulate(workload: Workload, settings: SimSettings, arrivals: Sequence[Arrival]) -> SimResult:
    """Run ``arrivals`` on ``settings.workers`` simulated workers under ``settings.policy``
    (:class:`~compass.sim.settings.SimSettings` says what each setting does).

    ``"auto"`` ingress deals jobs over every worker from :data:`SPREAD_FROM` workers on (a few
    clients' ingresses would otherwise plan, hold and send every job of a large cluster). A
    bounded view shows a planner, for each job it plans or re-plans, only its candidates
    (:func:`~compass.sched.candidates.pick`): itself, the workers of the job's inputs and
    plan, the holders of the job's models and workers sampled from the rest, by a generator
    seeded per planner from ``seed``, each shown as the planner has heard of it
    (:mod:`compass.sim.heard`: watched ones pushed a 1 ms gap and
    :data:`~compass.sim.heard.LINK_S` away, the others as last heard and aged; residency, also
    for finding the holders and for warming, as rumors spread it); ``heartbeat_s`` and
    ``staleness_s`` are the mesh's only.
    """
    if not settings.step_batch:
        workload = without_step_batches(workload)
    spread = ingress_spread(settings.ingress, settings.workers)
    rule = view_rule(settings.view, settings.candidates, settings.holders)
    replicas = None if settings.replicate is None else Replication(settings.replicate)
    simulation = Simulation(workload, settings, spread=spread, rule=rule, hooks=replicas)
    if replicas is not None:
        replicas.attach(simulation)
    result = simulation.run(arrivals, warm_start=settings.warm_start)
    result.replicas = replicas.copies if replicas else 0
    return result


@dataclass(slots=True, eq=False)
class _Job:
    """What the simulation records of a job; its rules are the ingress core's."""

    id: str
    workflow: Workflow
    client: int
    arrival: float
    best_s: float
    placed: dict[str, str] = field(default_factory=dict)
    objective: Objective = NO_OBJECTIVE
    #: when its first output reached its ingress (a step-wise sink's first step, one hop on)
    first_output: float | None = None


@dataclass(slots=True, eq=False)
class _Worker:
    index: int
    name: str
    policy: Policy
    #: the worker's rules, the real worker's core (set once the worker exists)
    rules: WorkerCore | None = None
    busy_s: float = 0.0
    #: the lanes' version last published to the cluster state
    version: int = -1
    #: what the worker sees of the others (set once the worker exists)
    view: SimView | None = None
    #: the ids of the jobs it takes in, as a real ingress names them (set with the name)
    job_ids: JobIds | None = None

    @property
    def lanes(self) -> Lanes:
        return _rules(self).lanes


class Simulation:
    """One simulated cluster (see the module docstring); ``hooks``: what a simulation built
    on this one adds (:class:`~compass.sim.hooks.SimHooks`), through the public methods."""

    def __init__(
        self,
        workload: Workload,
        settings: SimSettings,
        *,
        spread: bool = False,
        rule: CandidateRule | None = None,
        hooks: SimHooks | None = None,
    ) -> None:
        self.hooks = hooks
        self._background = 0  # background events in the heap
        #: deal jobs over every worker (else client i enters at worker i)
        self.spread = spread
        self._arrived = 0  # jobs dealt so far (``spread``)
        workers, policy, seed = settings.workers, settings.policy, settings.seed
        lanes, host_lanes = settings.lanes, settings.host_lanes
        heartbeat_s = settings.heartbeat_s
        staleness_s = heartbeat_s if settings.staleness_s is None else settings.staleness_s
        prefetch = settings.prefetch
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
        # configured as a worker is (the cache's checks: capacity vs slab size, prefetch depth)
        config = settings.worker_config(workload)
        cache_bytes, slab_bytes = config.cache.capacity, config.cache.slab_bytes
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
        # one policy per worker, made as a worker makes its own: round_robin and random keep
        # per-instance state, compass a per-instance cost cache
        policies = [
            make_policy(
                policy,
                seed=worker_seed(seed, name),
                host_lanes=host_lanes > 0,
                options=settings.policy_options,
            )
            for name in names
        ]
        if rule is not None and any(_central(p) for p in policies):
            raise ConfigError(
                f"policy {policy!r} plans every job at one worker: a bounded view, which shows "
                "each planner only its candidates, does not apply"
            )
        # every worker runs the same policy; warming needs prefetching (a speculative load)
        self.warm = settings.warm and prefetch and policies[0].warms_cache
        caches = [CacheCore(SlabPool(cache_bytes, slab_bytes), workload.models) for _ in names]
        self.workers = [_Worker(i, name, policies[i]) for i, name in enumerate(names)]
        sched = config.sched
        # a bounded view: a watched peer pushes each change a gap apart, a link away; its
        # view counts a placement for two gaps of the mesh of its size (Gossip._settle_s)
        gap_s = sched.heartbeat_min_ms / 1000.0
        mesh_gap_s = gossip_gap_s(gap_s, workers - 1, sched.heartbeat_max_rate)
        self.state = ClusterState(
            names,
            sorted(workload.models),
            [cache.capacity_bytes() for cache in caches],
            lanes=lanes,
            heartbeat_s=heartbeat_s if rule is None else gap_s,
            staleness_s=staleness_s if rule is None else LINK_S,
            # ClusterView's default: a heartbeat two intervals after a placement reflects it
            settle_s=2.0 * (heartbeat_s if rule is None else mesh_gap_s),
        )
        self.positions = self.state.positions
        # as a worker makes its core's, but keeping no stimulus log: millions of events, and
        # nobody to read a story
        options = replace(core_options(config), keep_stimuli=0)
        self.core_options = options  # a restarted worker's core (:meth:`restart`) reuses them
        self.slab_bytes = slab_bytes
        #: the messages a bounded view's real workers would send (none counted for the mesh)
        self.traffic = None if rule is None else view_traffic(self.state, caches, seed)
        for worker, cache in zip(self.workers, caches, strict=True):
            worker.view = SimView(self.state, worker, rule, seed, self.traffic)
            worker.rules = build_core(
                worker.name,
                workflows=workload.workflows,
                policy=worker.policy,
                profiles=self.profiles,
                view=worker.view,
                cache=cache,
                options=options,
            )
        self._heap: list[tuple[float, int, Handler, Any]] = []
        self._seq = itertools.count()
        self._later: deque[tuple[Handler, Any]] = deque()
        self._jobs: dict[str, _Job] = {}
        #: step-wise runs: their steps and ends (sooner if stopped, later if suspended)
        self.stepping = Stepping(self, self._apply, self._task_end)
        self.batching = StepBatches(
            self, self._apply, self._tells, lambda name: self.workload.workflows[name]
        )
        self._streams = SimStreams()  # streamed edges' steps, ends and order on a link
        #: some workflow streams an edge (else none of their rules is looked at)
        self._streamed = any(
            task.streamed for wf in workload.workflows.values() for task in wf.tasks.values()
        )
        # computed, never trusted from the spec: no job can beat it (slowdown >= 1)
        self._best_s = {
            name: best_time_s(wf, self.profiles, lanes=lanes, host_lanes=host_lanes) or math.inf
            for name, wf in workload.workflows.items()
        }
        self._ran_best = RanBest(self.profiles, lanes=lanes, host_lanes=host_lanes)
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

    def run(self, arrivals: Sequence[Arrival], *, warm_start: bool = False) -> SimResult:
        if self.hooks is not None:
            self.hooks.began()
        with collector_eased():
            return self._simulate(arrivals, warm_start=warm_start)

    def _simulate(self, arrivals: Sequence[Arrival], *, warm_start: bool = False) -> SimResult:
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
                self._at(0.0, self._tick, worker)
        heap = self._heap
        later = self._later
        state = self.state
        pop = heapq.heappop
        n = len(ordered)
        next_arrival = 0
        events = 0
        # with a warm start, the warming (all the heap holds before the first job) settles
        # first, and every arrival comes that much later
        offset = math.inf if warm_start else 0.0
        while True:
            if offset == math.inf and not heap:
                offset = self.now
                ordered = [replace(a, t_s=a.t_s + offset) for a in ordered]
            if len(heap) > (0 if next_arrival < n else self._background) and (
                offset == math.inf or next_arrival >= n or heap[0][0] < ordered[next_arrival].t_s
            ):
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
        if self.traffic is not None:
            self.traffic.finish()
        for job in self._jobs.values():  # never answered: stuck
            self._record_job(job, None, "did not finish", "failed")
        self._jobs.clear()
        self.job_records.sort(key=lambda j: (j.arrival, j.id))
        return self._result(time.perf_counter() - started)

    def _result(self, wall_s: float) -> SimResult:
        stats = [w.lanes.cache.stats for w in self.workers]
        traffic = self.traffic
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
            scoped_views=sum(w.view.scoped for w in self.workers if w.view is not None),
            scoped_workers=sum(w.view.shown for w in self.workers if w.view is not None),
            view_asks=0 if traffic is None else traffic.asks,
            view_pushes=0 if traffic is None else traffic.pushes,
            cache_changes=0 if traffic is None else traffic.cache_changes,
        )

    # -- ingress ------------------------------------------------------------------------------

    def _arrive(self, arrival: Arrival) -> None:
        wf = self.workload.workflows[arrival.workflow]
        worker = self.workers[self.positions[f"w{self._entry(arrival)}"]]
        rules = _rules(worker)
        if worker.job_ids is None:
            worker.job_ids = JobIds(worker.name, rules.instance)
        job = _Job(
            id=worker.job_ids(),  # the real ingress's job id
            workflow=wf,
            client=arrival.client,
            arrival=self.now,
            best_s=self._best_s[wf.name],
            objective=arrival.objective,
        )
        self._jobs[job.id] = job
        inputs = dict.fromkeys(wf.inputs)  # values are not simulated, only their size
        submit = Submit(self.now, job.id, wf.name, inputs, 0, self.now, None, arrival.objective)
        self._apply(worker, submit)

    def _entry(self, arrival: Arrival) -> int:
        """The number of the worker ``arrival`` enters at (or the hooks')."""
        return self.entry_of(arrival) if self.hooks is None else self.hooks.entry(arrival)

    def entry_of(self, arrival: Arrival) -> int:
        """The number of the worker ``arrival`` enters at by the ingress setting."""
        n = len(self.names)
        if self.spread:
            self._arrived += 1
            return (self._arrived - 1) % n
        return arrival.client % n

    def _apply(self, worker: _Worker, event: Event) -> None:
        """Feed ``event`` to ``worker``'s core and carry out its instructions in virtual time."""
        for step in _rules(worker).handle(event):
            match step:
                case Send():
                    self._send(worker, step.peer, step.msg)
                case RunTask():
                    self._run(worker, step)
                case LoadModel():
                    self._load(worker, step)
                case Answer():
                    self._answered(step)
                case AskPlan():
                    delay = self.profiles.transfer_s(worker.name, step.peer, _RPC_BYTES)
                    self._at(self.now + delay, self._plan_remote, (step.peer, step.request))
                case Planned():
                    # the plan goes back to the ingress (an error: it plans the job itself)
                    delay = self.profiles.transfer_s(worker.name, step.peer, _RPC_BYTES)
                    ingress = self.workers[self.positions[step.peer]]
                    self._at(self.now + delay, self._plan_back, (ingress, step.job_id, step.plan))
                case Watch():
                    pass  # watches are modelled by what each planner has heard (heard.py)
                case StopTask():
                    self.stepping.stop(step.entries)
                    self.batching.stop(step.entries)
                case JoinRun():
                    self.batching.join(step)
                    self._first_outputs(worker, step.entries, len(step.entries))
                case SuspendTask() if self.batching.holds(step.entry):
                    self.batching.suspend(step.entry)
                case SuspendTask():
                    self.stepping.suspend(worker, step.entry)
                case Chunk():
                    pass  # a first output is timed at the step that makes it (_steps_begun)
                case Feed():
                    self._streams.feed(step)
                case Fault():
                    raise RuntimeError(
                        f"{worker.name} failed handling {step.cause}"
                    ) from step.error
                case _:
                    assert_never(step)
        lanes = worker.lanes
        if lanes.version != worker.version:  # what a heartbeat shows changed
            worker.version = lanes.version
            if self.traffic is not None:  # a send due before this change carries the old state
                self.traffic.catch_up(worker.index, self.now)
            self.state.queue_changed(
                worker.index,
                lanes.queue.queued_s,
                lanes.queue.run_ends(),
                lanes.batchable(self.now),
                lanes.queue.raised_s(),
            )
            if self.traffic is not None:  # the real worker sends its state to its watchers
                self.traffic.changed(worker.index, self.now, lanes.cache.residency())

    def _plan_remote(self, arg: tuple[str, PlanRequest]) -> None:
        """At the ``central`` planner: plan (its answer goes back as :class:`Planned`)."""
        planner, request = arg
        self._apply(self.workers[self.positions[planner]], PlanAsked(self.now, request))

    def _plan_back(self, arg: tuple[_Worker, str, dict[str, str] | None]) -> None:
        ingress, job_id, plan = arg
        self._apply(ingress, PlanReady(self.now, job_id, plan))

    def _answered(self, answer: Answer) -> None:
        job = self._jobs.pop(answer.job_id, None)
        if job is None:
            return
        error = answer.error
        # the deadline the ingress gave the job (its own, or its workflow's objective)
        deadline_s = answer.record.get("deadline_s") if answer.record else None
        outcome = outcome_of(error)
        # a job answered late finished all the same: its latency counts, as it always did
        finished = error is None or outcome == "late"
        self._record_job(
            job,
            self.now if finished else None,
            "" if error is None else error.message,
            outcome,
            deadline_s,
        )

    def _record_job(
        self,
        job: _Job,
        finish: float | None,
        error: str,
        outcome: str,
        deadline_s: float | None = None,
    ) -> None:
        latency = None if finish is None else finish - job.arrival
        if job.workflow.unfold is not None and job.placed:  # measured against what it ran
            job.best_s = self._ran_best(job.workflow, job.placed)
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
                priority=job.objective.priority,
                deadline_s=deadline_s,
                outcome=outcome,
                ttfo_s=None if latency is None else _first_output_s(job, latency),
            )
        )
        if self.hooks is not None:
            self.hooks.recorded(self.job_records[-1])

    # -- messages between workers -------------------------------------------------------------

    def _send(self, src: _Worker, dst: str, msg: PeerMessage) -> None:
        """Deliver ``msg`` after its transfer time: a task input of its declared size, a sink's
        output likewise, control messages as a few hundred bytes. A task input carries its own
        copy of the plan, as on the wire."""
        job = self._jobs.get(msg.job) if self._streamed else None
        step_bytes = None if job is None else stream_bytes(job.workflow, msg)
        if step_bytes is not None:  # a step of a streamed edge
            nbytes = step_bytes
            if isinstance(msg, TaskMsg):
                msg = msg.with_plan(dict(msg.plan))
        elif isinstance(msg, TaskMsg):
            tasks = self.workload.workflows[msg.workflow].tasks
            profile = tasks[msg.task if msg.source == JOB_INPUTS else msg.source].profile
            nbytes = profile.input_bytes if msg.source == JOB_INPUTS else profile.output_bytes
            if is_skipped(msg.value):  # a skip mark weighs a control message
                nbytes = _RPC_BYTES
            msg = msg.with_plan(dict(msg.plan))  # every field kept: the budget too
        elif isinstance(msg, ResultMsg):
            job = self._jobs.get(msg.job)
            nbytes = (
                _RPC_BYTES if job is None else job.workflow.tasks[msg.task].profile.output_bytes
            )
            if is_skipped(msg.value):  # a skip mark weighs a control message
                nbytes = _RPC_BYTES
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
        at = self.now + seconds
        if job is not None and (step_bytes is not None or ends_stream(job.workflow, msg)):
            at = self._streams.arrival(src.name, dst, at, streamed=True)
        self._at(at, self._deliver, (target, src.name, msg, seconds))

    def _deliver(self, arg: tuple[_Worker, str, PeerMessage, float]) -> None:
        worker, sender, msg, seconds = arg
        # one clock for every simulated worker: a task's t0 is its job's arrival
        arrival = msg.t0 if isinstance(msg, TaskMsg) else None
        self._apply(worker, Received(self.now, sender, msg, seconds, arrival))

    # -- what a worker's lanes do -------------------------------------------------------------

    def _run(self, worker: _Worker, run: RunTask) -> None:
        """A task runs for its profiled time; a batch for its profile's batch curve at its
        size, from the slowest of its tasks' single times."""
        workflows = self.workload.workflows
        for entry in run.entries:
            job = self._jobs.get(entry.job_id)
            if job is not None:
                job.placed[entry.task] = worker.name
        profile = workflows[run.entry.workflow].tasks[run.entry.task].profile
        if self.batching.is_batch(run):  # a step batch: its members come and go at steps
            self.batching.begin(worker, run)
            self._first_outputs(worker, run.entries, len(run.entries))
            return
        exec_s = emulated_run_s(
            profile, [workflows[e.workflow].tasks[e.task].profile for e in run.entries]
        )
        if profile.steps > 1:  # a step-wise task: its first output, and it can be stopped
            entry = run.entry
            if entry.done_steps:  # resumed: the steps it has left
                exec_s *= (profile.steps - entry.done_steps) / profile.steps
            self._steps_begun(worker, run, exec_s, profile)
            return
        self._at(self.now + exec_s, self._task_end, (worker, run, exec_s, None))

    def _steps_begun(
        self, worker: _Worker, run: RunTask, exec_s: float, profile: TaskProfile
    ) -> None:
        entry = run.entry
        job = self._jobs.get(entry.job_id)
        # its steps are told where the core preempts, or where it feeds a streamed edge
        feeds = self._streamed and job is not None and bool(job.workflow.streamed_succs(entry.task))
        step_s = self.stepping.begun(
            worker, run, exec_s, profile.steps - entry.done_steps, tell=feeds
        )
        if entry.done_steps == 0 and job is not None and entry.task in job.workflow.sinks:
            hop = self.profiles.transfer_s(worker.name, entry.ingress,
                                           profile.output_bytes // profile.steps)  # fmt: skip
            first = self.now + step_s + hop
            if job.first_output is None or first < job.first_output:
                job.first_output = first

    def _tells(self, worker: _Worker, entry: QueuedTask) -> bool:
        """Whether ``worker``'s core hears each step of ``entry``: where it preempts, or where
        the task feeds a streamed edge."""
        if worker.lanes.preempt:
            return True
        job = self._jobs.get(entry.job_id) if self._streamed else None
        return job is not None and bool(job.workflow.streamed_succs(entry.task))

    def _first_outputs(self, worker: _Worker, entries: tuple[QueuedTask, ...], size: int) -> None:
        """Step-wise ``entries`` took seats in a step batch of at least ``size``: the first
        output of a job whose sink one is comes after its first step and a hop."""
        for entry in entries:
            job = self._jobs.get(entry.job_id)
            if job is None or entry.task not in job.workflow.sinks:
                continue
            profile = job.workflow.tasks[entry.task].profile
            step_s = profile.exec_s / profile.steps * batch_scale(profile.batch_scale, size)
            hop = self.profiles.transfer_s(worker.name, entry.ingress,
                                           profile.output_bytes // profile.steps)  # fmt: skip
            first = self.now + step_s + hop
            if job.first_output is None or first < job.first_output:
                job.first_output = first

    def _task_end(self, arg: tuple[_Worker, RunTask, float, RunEnd | None]) -> None:
        worker, run, exec_s, end = arg
        if end is not None and not end.live:
            return  # step-wise: the end that counts is the last one set
        if self._streamed:
            task = self.workload.workflows[run.entry.workflow].tasks[run.entry.task]
            fed = functools.partial(self._fed, worker, run)
            if task.streamed and self._streams.wait(run.entry, task, fed):
                return  # fed by streams: it ends one of its steps after they do
        if end is not None and self.stepping.finish(run) and self._streamed:
            self._last_step(worker, run.entry)  # not stopped: its last step, then its end
        if not run.host:
            worker.busy_s += self.now - run.entry.started_at
        size = len(run.mates) + 1
        for entry in run.entries:
            queued, suspended = entry.run_waits()  # a resumed run's wait is since its suspension
            self.task_records.append(
                TaskRecord(entry.job_id, entry.task, worker.name, queued, run.fetch_s,
                           entry.transfer_s, exec_s, run.hit, size, suspended)
            )  # fmt: skip
        for entry in run.entries:
            self._apply(worker, TaskDone(self.now, entry, None))

    def _last_step(self, worker: _Worker, entry: QueuedTask) -> None:
        """A step-wise task that feeds a streamed edge ends: its last step is told first."""
        workflow = self.workload.workflows[entry.workflow]
        if workflow.streamed_succs(entry.task):
            steps = workflow.tasks[entry.task].profile.steps
            self._apply(worker, TaskStep(self.now, entry, steps - 1, None))

    def _fed(self, worker: _Worker, run: RunTask) -> None:
        """The streams into ``run``'s task ended: it ends one of its steps later."""
        profile = self.workload.workflows[run.entry.workflow].tasks[run.entry.task].profile
        end = self.now + profile.exec_s / profile.steps
        if profile.steps > 1:  # a step-wise run's end: the one set last counts
            self.stepping.end_at(worker, run, end, end - run.entry.started_at)
        else:
            self._at(end, self._task_end, (worker, run, end - run.entry.started_at, None))

    def _load(self, worker: _Worker, load: LoadModel) -> None:
        """A model load takes its bytes over the host-to-device bandwidth."""
        cache = worker.lanes.cache
        self.state.cache_changed(worker.index, load.model, load.evict, cache.free_bytes())
        seconds = self.profiles.fetch_s(worker.name, cache.size_bytes(load.model))
        self._at(self.now + seconds, self._load_end, (worker, load.model, seconds))

    def _load_end(self, arg: tuple[_Worker, str, float]) -> None:
        worker, model, seconds = arg
        self._apply(worker, ModelLoaded(self.now, model, seconds))

    def _tick(self, worker: _Worker) -> None:
        if self.hooks is None or self.hooks.may_tick(worker.index):
            self._apply(worker, Tick(self.now))

    # -- what a simulation built on this one does (:class:`~compass.sim.hooks.SimHooks`) ------

    def schedule(self, t: float, handler: Handler, arg: Any, *, background: bool = False) -> None:
        """Call ``handler(arg)`` at virtual time ``t``; ``background``: only if the run goes on
        until then (a timer of its own: the run ends when nothing else is left to happen)."""
        if background:
            self._background += 1
            handler, arg = self._in_background, (handler, arg)
        self._at(t, handler, arg)

    def _in_background(self, call: tuple[Handler, Any]) -> None:
        self._background -= 1
        call[0](call[1])

    def apply(self, index: int, event: Event) -> None:
        """Feed ``event`` to worker ``index``'s core, now, and carry out what it decides."""
        self._apply(self.workers[index], event)

    @property
    def has_jobs(self) -> bool:
        """Whether some job is still in flight."""
        return bool(self._jobs)

    def best_s(self, workflow: str) -> float:
        """A job of ``workflow``'s best time (its slowdown's unit)."""
        return self._best_s[workflow]

    def set_open(self, index: int, serving: bool) -> None:
        """Whether planners may place new work on worker ``index``: a closed one shows them an
        endless queue, so they place nothing new there (it finishes what it holds)."""
        state = self.state
        if state.closed is None:
            state.closed = np.zeros(len(self.workers))
        state.closed[index] = 0.0 if serving else _CLOSED_S

    def restart(self, index: int, instance: str) -> None:
        """Worker ``index`` starts again as a new process (``instance`` in its job ids): a
        fresh core over an empty cache of the same size; its peers' view of it is emptied."""
        worker = self.workers[index]
        capacity = self.state.capacity[index]  # every simulated cache has the same slabs
        cache = CacheCore(SlabPool(int(capacity), self.slab_bytes), self.workload.models)
        assert worker.view is not None  # the same view: what it sees of the others
        worker.rules = build_core(
            worker.name,
            workflows=self.workload.workflows,
            policy=worker.policy,
            profiles=self.profiles,
            view=worker.view,
            cache=cache,
            options=replace(self.core_options, instance=instance),
        )
        worker.version = -1
        worker.job_ids = None  # its ingress names jobs after the new instance
        self.state.held[:, index] = False
        self.state.free[index] = cache.free_bytes()


def _central(policy: Policy) -> bool:
    return isinstance(policy, CompassPolicy) and policy.options.central


def _rules(worker: _Worker) -> WorkerCore:
    assert worker.rules is not None
    return worker.rules


def _first_output_s(job: _Job, latency_s: float) -> float:
    """A job's time to first output: its step-wise sink's first step (one hop on), never
    after its answer; the answer itself for a job of plain sinks."""
    if job.first_output is None:
        return latency_s
    return min(job.first_output - job.arrival, latency_s)
