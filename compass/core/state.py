"""The worker core, sans-IO: a worker's rules as a state machine, events in, instructions out.

:meth:`WorkerCore.handle` is the only way the core's state changes. Each event carries the time
(``now``, on the worker's clock); the core reads no clock and does no I/O, so the same events
give the same instructions. The asyncio :class:`~compass.worker.server.Worker` and the simulator
(:mod:`compass.sim.engine`) drive it. It owns the **ingress records** (the jobs it accepted,
their plans and one answer each), the **inbox** (inputs of tasks waiting for the rest), the
**attempt rules** (a job planned again after a lost peer gets a new attempt; messages of older
ones are dropped), **dynamic adjustment**, and the **queues, lanes and model residency**
(:class:`~compass.core.lanes.Lanes`); docs/ARCHITECTURE.md, "The worker core", says how. Not the
core's: running a task's code, copying a model's bytes, sending bytes, the view's heartbeats.
Messages to this worker itself never leave it: the core handles them at once, in order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, assert_never

from compass.core.admission import Admission, unreachable
from compass.core.answers import KEEP_ANSWERS, KeptAnswers
from compass.core.causes import Cause
from compass.core.estimates import Estimates
from compass.core.events import (
    NOT_HANDLING,
    Answer,
    AskPlan,
    Cancel,
    Chunk,
    Event,
    Fault,
    Heard,
    Instruction,
    LoadFailed,
    ModelLoaded,
    PeerDraining,
    PeerJoined,
    PeerLost,
    PlanAsked,
    Planned,
    PlanReady,
    Received,
    Send,
    StopTask,
    Submit,
    TaskDone,
    TaskFailed,
    TaskReturned,
    TaskStep,
    Tick,
    Undeliverable,
    ViewPort,
    Watch,
    WatchFailed,
)
from compass.core.jobs import Inbox, IngressJob, check_task, failure_of
from compass.core.lanes import CannotRun, Lanes, LanesFault, Step
from compass.core.links import Links, Sent
from compass.core.messages import (
    JOB_INPUTS,
    LINK_LOST,
    ChunkMsg,
    DoneMsg,
    FailedMsg,
    PeerMessage,
    PlacedMsg,
    PlanRequest,
    ResultMsg,
    TaskMsg,
)
from compass.core.options import CoreOptions
from compass.core.queue import QueuedTask
from compass.core.stats import WorkerStats
from compass.core.story import CoreLog, Stimulus
from compass.errors import (
    CompassError,
    CompassTimeout,
    ConfigError,
    DeadlineExceeded,
    InvalidInputs,
    ProtocolError,
    RemoteError,
    WorkersLost,
    WorkerUnavailable,
    error_from_wire,
)
from compass.sched import JobInfo, Policy, ViewSnapshot, adjust_successors, record_plan
from compass.sched.candidates import PlanScope
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["WorkerCore"]

#: attempts of a job at most when workers report they could not take or pass on its tasks
#: (lost peers and broken links plan it again besides)
MAX_ATTEMPTS = 4


class WorkerCore:
    """One worker's rules; see the module docstring. ``workflow`` looks a workflow up by name
    (raising :class:`~compass.errors.UnknownWorkflow`); ``lanes``: its queues, lanes and cache
    (driven by the core); ``options``: :class:`CoreOptions`. Built by ``build_core``."""

    def __init__(
        self,
        name: str,
        *,
        workflow: Callable[[str], Workflow],
        policy: Policy,
        profiles: Profiles,
        view: ViewPort,
        lanes: Lanes,
        options: CoreOptions = CoreOptions(),
        stats: WorkerStats | None = None,
    ) -> None:
        if not name:
            raise ConfigError("a worker core needs its worker's name")
        self.name = name
        #: this worker process's id: in every job id, so that ids never repeat across restarts
        self.instance = options.instance
        self.policy = policy
        self.profiles = profiles
        self.view = view
        self.lanes = lanes
        self.host_lanes = lanes.host_lanes > 0
        #: the ingress's limits: jobs in flight, bytes of inputs held
        self.admission = Admission(name, options.max_jobs, options.max_job_bytes)
        self.learn = options.learn  # measurements update the profiles (real mode)
        self.h2d_measured = False  # its own host-to-device copies were timed (heartbeats say)
        self.held_bytes = 0  # of inputs, held for unanswered jobs (to re-plan them)
        self.stats = stats if stats is not None else WorkerStats()
        self._workflow = workflow
        self._forget_after = options.forget_after
        #: unanswered jobs this worker is the ingress of
        self.jobs: dict[str, IngressJob] = {}
        self.inbox = Inbox(options.inbox_keep_s)
        #: job id -> the highest attempt known done here (late messages of those are dropped)
        self._finished: OrderedDict[str, int] = OrderedDict()
        #: events handled so far (anonymous ones are named by their number), the instructions
        #: of the one being handled and its id (see :meth:`handle`)
        self._handled = 0
        self._out: list[Instruction] = NOT_HANDLING
        self._cause: Cause = ""
        self.log = CoreLog(options.keep_stimuli)
        #: what broken links may have lost: sent to a peer, or dropped for a lost ingress
        self.links = Links(name, KEEP_ANSWERS)
        #: job key -> the unanswered job it names; -> the answer of an answered one (bounded in
        #: keys, bytes, time); requests waiting for another's job (its key resubmitted) -> it
        self._keys: dict[str, str] = {}
        self.answered = KeptAnswers(
            max_bytes=options.keep_answer_bytes, keep_s=options.keep_answer_s
        )
        self._attached: dict[str, str] = {}
        #: best times, critical paths, deadlines and queue entries, from the profiles
        self.estimates = Estimates(name, policy, profiles, host_lanes=self.host_lanes)

    # -- the one entry point ------------------------------------------------------------------

    def handle(self, event: Event) -> list[Instruction]:
        """Apply ``event``; return what the adapter must do, in order. Every instruction carries the
        event's id (``cause``; an anonymous event is named ``kind:subject#n`` when read, see
        :mod:`compass.core.causes`). If handling raises (a bug), the instructions decided before
        are returned, as the state changed with them, then a :class:`Fault`. The event and what
        it decided go into :attr:`log`."""
        self._handled = n = self._handled + 1
        out: list[Instruction] = []
        self._out = out
        # an anonymous event is named only if an instruction's cause is read
        self._cause = cause = event.cause or (event, n)
        try:
            match event:  # the most frequent first: a heartbeat arrives from every peer
                case Received():
                    self._received(event)
                case TaskDone():
                    self._task_done(event)
                case Heard():
                    self._heard(event)
                case Submit():
                    self._submit(event)
                case Tick():
                    self._take(self.lanes.tick(event.now, cause=cause), event.now)
                    for (job, attempt, task), entry in self.inbox.expire(event.now):
                        waited = f"{task}'s inputs waited {self.inbox.keep_s:g} s for the rest"
                        self._report_failure(job, attempt, task, entry.ingress, event.now,
                                             waited, CompassTimeout.code)  # fmt: skip
                case ModelLoaded():
                    self._model_loaded(event)
                case TaskFailed():
                    self._task_failed(event)
                case LoadFailed():
                    steps = self.lanes.load_failed(event.model, event.error, event.now, cause)
                    self._take(steps, event.now)
                case TaskReturned():
                    self._take(self.lanes.returned(event.entry, event.now, cause), event.now)
                case PlanReady():
                    self._plan_ready(event)
                case PeerLost():
                    self._peer_lost(event)
                case Cancel():
                    self._cancel(event)
                case Undeliverable():
                    self._undeliverable(event)
                case PlanAsked():
                    self._plan_asked(event)
                case PeerJoined():
                    self._peer_joined(event)
                case PeerDraining():
                    self.view.drain(event.name, event.instance)
                case WatchFailed():
                    self.view.watch_failed(event.peer)
                case TaskStep():  # of a streaming job's task: its sinks' go to the ingress
                    self._step(event)
                case _:
                    assert_never(event)
            if wanted := self.view.take_wanted():  # a bounded view's candidates to watch
                out.append(Watch(wanted, cause))
        except LanesFault as fault:
            error = fault.original
            try:
                self._take(fault.steps, event.now)
            finally:
                out.append(Fault(error, cause))
        except Exception as exc:
            out.append(Fault(exc, cause))
        finally:
            self._out, self._cause = NOT_HANDLING, ""
        self.log.record(event, n, cause, out)
        return out

    def story(self, key: str) -> list[Stimulus]:
        """What :attr:`log` kept about ``key`` (a job id, a peer, a model, a cause id)."""
        return self.log.story(key)

    def _take(self, steps: list[Step], now: float) -> None:
        """Carry the lanes' decisions on: runs and loads go out, a task that cannot run is
        answered."""
        out = self._out
        for step in steps:
            if isinstance(step, CannotRun):
                self._lane_failed(step.entry, step.error, now)
            else:
                out.append(step)

    def _plan_asked(self, ev: PlanAsked) -> None:
        """Plan a job for another ingress (the ``central`` policy plans at one worker)."""
        request = ev.request
        try:
            workflow = self._workflow(request.workflow)
            info = JobInfo(request.job, workflow, request.ingress, request.input_bytes)
            plan: dict[str, str] | None = self._plan_here(info, ev.now)
            error = None
        except CompassError as exc:
            plan, error = None, exc
        self._out.append(Planned(request.ingress, request.job, plan, error, self._cause))

    def _heard(self, ev: Heard) -> None:
        """A peer's heartbeat: into the view, and what it measured into the profiles."""
        heartbeat = ev.heartbeat
        if not self.view.heard(heartbeat, ev.now):
            return  # stale, of a draining peer or of another version, or this worker's name
        self.estimates.adopt(heartbeat)

    def _model_loaded(self, ev: ModelLoaded) -> None:
        if self.learn and ev.seconds > 0 and self.lanes.cache.is_loading(ev.model):
            self.estimates.observe_load(self.lanes.cache.size_bytes(ev.model), ev.seconds)
            self.h2d_measured = True
        self._take(self.lanes.loaded(ev.model, ev.seconds, ev.now, cause=self._cause), ev.now)

    def is_done(self, job_id: str, attempt: int) -> bool:
        """Whether messages of ``job_id``'s ``attempt`` are stale here."""
        return self._finished.get(job_id, -1) >= attempt

    # -- ingress ------------------------------------------------------------------------------

    def _submit(self, ev: Submit) -> None:
        if ev.key is not None and self._resubmitted(ev):
            return
        refusal = self.admission.refusal(
            ev.job_id, ev.input_bytes, in_flight=len(self.jobs), held_bytes=self.held_bytes
        )
        if refusal is not None:
            self.stats.jobs_refused += 1
            self._answer_now(ev.job_id, refusal)
            return
        try:
            workflow = self._workflow(ev.workflow)
            if not isinstance(ev.inputs, dict):
                raise InvalidInputs(
                    f"inputs of {workflow.name!r} must be a mapping of name to value"
                )
            workflow.check_inputs(ev.inputs)
        except CompassError as exc:
            self._answer_now(ev.job_id, exc)
            return
        job = IngressJob(ev.job_id, workflow, ev.inputs, ev.input_bytes, ev.now, t0=ev.t0,
                         key=ev.key, objective=ev.objective, stream=ev.stream)  # fmt: skip
        deadline_s = self.estimates.deadline_s(workflow, ev.objective)
        if deadline_s is not None:
            job.deadline = ev.now + deadline_s
        self.jobs[job.job_id] = job
        self.held_bytes += job.input_bytes
        if ev.key is not None:
            self._keys[ev.key] = job.job_id
        self.stats.jobs_submitted += 1
        # the ingress holds the job's inputs
        scope = PlanScope(workflow, (self.name,))
        view = self.view.snapshot(ev.now, priority=ev.objective.priority, scope=scope)
        central = self.policy.planner(view)
        if central is not None and central != self.name:
            request = PlanRequest(job.job_id, workflow.name, self.name, job.input_bytes)
            self._out.append(AskPlan(central, request, self._cause))
            return
        self._first_attempt(job, None, ev.now, view)

    def _resubmitted(self, ev: Submit) -> bool:
        """A key this ingress knows: wait for its running job, or get its kept answer."""
        assert ev.key is not None
        running = self._keys.get(ev.key)
        if running is not None:
            self.jobs[running].waiters.append(ev.job_id)
            self._attached[ev.job_id] = running
            return True
        kept = self.answered.get(ev.key, ev.now)
        if kept is not None:
            value, error = kept
            self._out.append(Answer(ev.job_id, value=value, error=error, stimulus=self._cause))
            return True
        return False

    def _plan_ready(self, ev: PlanReady) -> None:
        job = self.jobs.get(ev.job_id)
        if job is not None and not job.plan:
            self._first_attempt(job, ev.plan, ev.now)

    def _first_attempt(
        self,
        job: IngressJob,
        plan: dict[str, str] | None,
        now: float,
        view: ViewSnapshot | None = None,
    ) -> None:
        try:
            if plan is None or set(plan) != set(job.workflow.tasks):
                plan = self._plan_here(self._info(job), now, view)
            if job.deadline is not None and not job.objective.finish:
                self._admit(job, plan, now)
        except CompassError as exc:
            self._answer(job, now, error=exc)
            return
        except Exception as exc:
            self._planning_failed(job, now, exc)
            raise
        job.plan = plan
        self._send_roots(job, now)

    def _admit(self, job: IngressJob, plan: Mapping[str, str], now: float) -> None:
        """Refuse ``job`` (:class:`DeadlineUnreachable`) when its plan, the best this policy
        found, already finishes after its deadline: nothing of it has been sent yet."""
        assert job.deadline is not None
        # the waits of its priority: a job above the lowest runs ahead of the lower levels' work
        scope = PlanScope(job.workflow, (*plan.values(), self.name))
        view = self.view.snapshot(
            now, without=job.job_id, priority=job.objective.priority, scope=scope
        )
        finish = self.estimates.plan_finish_s(job.workflow, plan, view, now, job.input_bytes)
        error = unreachable(job, finish)
        if error is not None:
            self.stats.jobs_unreachable += 1
            raise error

    def _new_attempt(self, job: IngressJob, lost: str, now: float) -> None:
        """Plan ``job`` again from the inputs kept here; older attempts are dropped by the
        workers that held them (``lost`` hears it if it comes back)."""
        old_workers = job.workers()
        job.attempt += 1
        self.links.forget(job.job_id, job.attempt)
        job.outputs.clear()
        if lost in old_workers:
            old_workers.discard(lost)
            self.links.owe_done(lost, job.job_id, job.attempt)
        self._send_done(job.job_id, old_workers, below=job.attempt, now=now)
        try:
            job.plan = self._plan_here(self._info(job), now)
        except CompassError as exc:
            if type(exc) is WorkerUnavailable:  # no worker left: not this ingress going away
                exc = WorkersLost(exc.message, detail={"job_id": job.job_id})
            self._answer(job, now, error=exc)
            return
        except Exception as exc:
            self._planning_failed(job, now, exc)
            raise
        self._send_roots(job, now)

    def _planning_failed(self, job: IngressJob, now: float, exc: Exception) -> None:
        """Planning ``job`` raised what no rule expects (a bug): answer it now (the caller
        raises on, a :class:`Fault`), rather than leave it without a plan until its client
        gives up."""
        self._answer(job, now, error=RemoteError(
            f"worker {self.name} failed to plan job {job.job_id} ({job.workflow.name}): "
            f"{type(exc).__name__}: {exc} (a bug in compass: please report it)",
            detail={"job_id": job.job_id},
        ))  # fmt: skip

    def _send_roots(self, job: IngressJob, now: float) -> None:
        for root in job.workflow.roots:
            self._send(
                job.plan[root],
                TaskMsg(
                    job=job.job_id,
                    attempt=job.attempt,
                    workflow=job.workflow.name,
                    task=root,
                    source=JOB_INPUTS,
                    # only the job inputs the root takes travel (a large unused one stays)
                    value=dict(job.workflow.tasks[root].take_inputs(job.inputs)),
                    plan=job.plan,
                    ingress=self.name,
                    t0=job.t0,
                    priority=job.objective.priority,
                    budget_s=None if job.deadline is None else job.deadline - now,
                    finish=job.objective.finish,
                    stream=job.stream,
                ),
                now,
                job_arrival=job.submitted_at,
            )

    def _info(self, job: IngressJob) -> JobInfo:
        return JobInfo(job.job_id, job.workflow, self.name, job.input_bytes, job.objective.priority)

    def _plan_here(
        self, info: JobInfo, now: float, view: ViewSnapshot | None = None
    ) -> dict[str, str]:
        """Plan on ``view`` (a fresh snapshot when None: nothing changed since it was taken)."""
        if view is None:
            # this worker plans; the job's ingress holds its inputs
            scope = PlanScope(info.workflow, (self.name, info.ingress))
            view = self.view.snapshot(now, without=info.job_id, priority=info.priority, scope=scope)
        plan = self.policy.plan(info, view, self.profiles, now)
        self._note_placements(info, plan, now)
        return plan

    def _note_placements(self, info: JobInfo, placed: Mapping[str, str], now: float) -> None:
        """Count the tasks just placed on peers in their waits (:func:`record_plan`)."""
        record_plan(
            self.view, info, placed, self.profiles, now, host_lanes=self.host_lanes,
            planner=self.name, batch_aware=self.policy.batch_aware,
        )  # fmt: skip

    def _live(self, job_id: str, attempt: int) -> IngressJob | None:
        """The unanswered job a report is about, if it is about its current attempt."""
        job = self.jobs.get(job_id)
        return job if job is not None and job.attempt == attempt else None

    def _result(self, msg: ResultMsg, now: float) -> None:
        job = self._live(msg.job, msg.attempt)
        if job is None:
            return
        job.outputs[msg.task] = msg.value
        sinks = job.workflow.sinks
        if all(s in job.outputs for s in sinks):
            self.stats.jobs_completed += 1
            value = job.outputs[sinks[0]] if len(sinks) == 1 else dict(job.outputs)
            self._answer(job, now, value=value)

    def _failed(self, msg: FailedMsg, now: float) -> None:
        job = self._live(msg.job, msg.attempt)
        if job is None:
            return
        if msg.code == DeadlineExceeded.code:
            self.stats.jobs_dropped += 1
            why = msg.message.removeprefix(f"{DeadlineExceeded.__name__}: ")
            where = {"job_id": job.job_id, "task": msg.task, "worker": msg.worker}
            # done to every worker: the job's other tasks and inputs are dropped everywhere
            self._answer(job, now, error=DeadlineExceeded(why, detail=where))
            return
        refused = msg.code == WorkerUnavailable.code
        if msg.code == LINK_LOST or (refused and job.refused < MAX_ATTEMPTS - 1):
            # a link of the job broke (as a lost peer, any number of times), or a worker could
            # not take or pass on a task (it had no connection to the next one yet, or it
            # refuses GPU work): plan the job again, from the inputs kept here
            job.refused += refused
            self.stats.replans += 1
            self._new_attempt(job, "", now)
            return
        self.stats.jobs_failed += 1
        self._answer(job, now, error=failure_of(job, msg, refused=refused))

    def _placed(self, msg: PlacedMsg) -> None:
        job = self._live(msg.job, msg.attempt)
        if job is not None and msg.task in job.plan:
            job.plan[msg.task] = msg.worker

    def _answer(
        self, job: IngressJob, now: float, *, value: Any = None, error: CompassError | None = None
    ) -> None:
        """Answer ``job`` (once: it leaves :attr:`jobs`) and tell its workers to drop it."""
        del self.jobs[job.job_id]
        self.held_bytes -= job.input_bytes
        self.links.forget(job.job_id)
        self._send_done(job.job_id, job.workers(), below=None, now=now)
        if job.key is not None:
            del self._keys[job.key]
            self.answered.put(job.key, value, error, now)
        for waiter in job.waiters:
            del self._attached[waiter]
            # an exception of its own each: a raised one takes its raiser's frames along
            own = None if error is None else error_from_wire(*error.to_wire().values())
            self._out.append(Answer(waiter, value=value, error=own, stimulus=self._cause))
        record = job.record(now, ok=error is None)
        self._out.append(
            Answer(job.job_id, value=value, error=error, record=record, stimulus=self._cause)
        )

    def _answer_now(self, job_id: str, error: CompassError) -> None:
        """Refuse a job that was never accepted."""
        self._out.append(Answer(job_id, error=error, stimulus=self._cause))

    def _cancel(self, ev: Cancel) -> None:
        """A requester stopped waiting: its job is dropped once nobody waits for it (a
        resubmission of its key may still wait, or the request it was attached to)."""
        attached = self._attached.pop(ev.job_id, None)
        if attached is not None:
            job = self.jobs[attached]
            job.waiters.remove(ev.job_id)
            if job.waiters or not job.abandoned:
                return
        else:
            found = self.jobs.get(ev.job_id)
            if found is None:
                return
            job = found
            if job.waiters:
                job.abandoned = True
                return
        self._answer(job, ev.now, error=WorkerUnavailable("the client stopped waiting"))

    def _peer_lost(self, ev: PeerLost) -> None:
        if ev.name == self.name:
            return
        self.view.remove(ev.name)
        self.stats.peers_lost += 1
        # inputs of jobs whose ingress is gone would wait forever; the ingress hears of the
        # attempts forgotten here if it comes back (a false suspicion): it plans them again
        lost = ev.name
        dropped = self.inbox.drop_ingress(lost)
        for entry in [*self.lanes.drop(lambda e: e.ingress == lost), *self.lanes.running()]:
            if entry.ingress == lost:
                mark = (entry.attempt, entry.task)
                dropped[entry.job_id] = max(dropped.get(entry.job_id, mark), mark)
        for job_id, (attempt, task) in dropped.items():
            self._forget(job_id, attempt + 1)
            self.links.orphan(lost, Sent(job_id, attempt, task, lost))
        for job in list(self.jobs.values()):
            if job.involves(ev.name):
                self.stats.replans += 1
                self._new_attempt(job, ev.name, ev.now)
        # what was sent there may be lost (:mod:`compass.core.links`)
        for to, report in self.links.lost(lost, self._stale):
            self._send(to, report, ev.now)

    def _peer_joined(self, ev: PeerJoined) -> None:
        """A peer is connected: new, back, or restarted. It and the ingresses of what a broken
        link to it may have lost hear what they must (:meth:`Links.joined`)."""
        self.view.joined(ev.name, ev.instance)
        for to, message in self.links.joined(ev.name, self._stale):
            self._send(to, message, ev.now)

    def _stale(self, job_id: str, attempt: int, ingress: str) -> bool:
        """Whether what was sent of ``job_id``'s ``attempt`` is stale: done here, or planned
        again already (this worker is its ``ingress``)."""
        done = self.is_done(job_id, attempt)
        return done or (ingress == self.name and self._live(job_id, attempt) is None)

    # -- every worker: tasks in, outputs out --------------------------------------------------

    def _received(self, ev: Received) -> None:
        msg = ev.msg
        if isinstance(msg, TaskMsg) and self.learn and ev.transfer_s > 0:
            self.estimates.observe_push(ev.sender, msg.value, ev.transfer_s)
        self._here(msg, ev.now, ev.transfer_s, ev.job_arrival)

    def _here(
        self, msg: PeerMessage, now: float, transfer_s: float, job_arrival: float | None
    ) -> None:
        """``msg`` arrived here, from a peer or from this worker itself (:meth:`_send`)."""
        if isinstance(msg, TaskMsg):
            self._task_input(msg, now, transfer_s, job_arrival)
        elif isinstance(msg, ResultMsg):
            self._result(msg, now)
        elif isinstance(msg, FailedMsg):
            self._failed(msg, now)
        elif isinstance(msg, PlacedMsg):
            self._placed(msg)
        elif isinstance(msg, ChunkMsg):
            job = self.jobs.get(msg.job)
            if job is not None and job.attempt == msg.attempt and job.stream:
                self._out.append(Chunk(msg.job, msg.task, msg.seq, msg.value, self._cause))
        else:
            self._drop_job(msg.job, msg.below)

    def _task_input(
        self, msg: TaskMsg, now: float, transfer_s: float, job_arrival: float | None
    ) -> None:
        if self.is_done(msg.job, msg.attempt):
            return  # a late message of a job already done or re-planned
        try:
            workflow = self._workflow(msg.workflow)
            check_task(workflow, msg)
        except CompassError as exc:
            self.stats.messages_dropped += 1
            self._report_failure(
                msg.job, msg.attempt, msg.task, msg.ingress, now, str(exc), exc.code
            )
            return
        entry = self.inbox.add(msg, workflow, transfer_s=transfer_s, now=now)
        if entry is None:
            return
        queued = self.estimates.queued(msg, workflow, entry, now, transfer_s, job_arrival)
        steps = self.lanes.submit(queued, now, self._cause)
        if steps:
            self._take(steps, now)

    def _task_failed(self, ev: TaskFailed) -> None:
        entry = ev.entry
        self._take(
            self.lanes.ended(entry, ev.now, still_running=ev.still_running, cause=self._cause),
            ev.now,
        )
        if not self.is_done(entry.job_id, entry.attempt):
            self._report_failure(
                entry.job_id, entry.attempt, entry.task, entry.ingress, ev.now, ev.error,
                ev.code, ev.traceback,
            )  # fmt: skip
        self._take(self.lanes.fill(ev.now, cause=self._cause), ev.now)

    def _lane_failed(self, entry: QueuedTask, error: CompassError, now: float) -> None:
        """The lanes could not run ``entry`` (its model can never fit, its load failed, the
        worker is degraded; or it was shed, too late for its job's deadline): its ingress
        hears why."""
        if isinstance(error, DeadlineExceeded):
            self.stats.tasks_shed += 1
        else:
            self.stats.tasks_failed += 1
        if not self.is_done(entry.job_id, entry.attempt):
            self._report_failure(
                entry.job_id, entry.attempt, entry.task, entry.ingress, now,
                f"{type(error).__name__}: {error.message}", error.code,
            )  # fmt: skip

    def _step(self, ev: TaskStep) -> None:
        e = ev.entry
        if e.task in self._workflow(e.workflow).sinks:
            self._send(e.ingress, ChunkMsg(e.job_id, e.attempt, e.task, ev.seq, ev.value), ev.now)

    def _report_failure(
        self,
        job: str,
        attempt: int,
        task: str,
        ingress: str,
        now: float,
        message: str,
        code: str,
        traceback: str = "",
    ) -> None:
        """Tell ``job``'s ingress that ``task`` failed here."""
        failed = FailedMsg(job, attempt, task, self.name, message, traceback, code)
        self._send(ingress, failed, now)

    def _task_done(self, ev: TaskDone) -> None:
        if self.learn:  # a batch is one measurement, under its lead
            measured = ev.exec_s if ev.first else None
            self.estimates.observe_run(ev.entry, ev.output, measured, ev.batch)
        now, cause, lanes = ev.now, self._cause, self.lanes
        steps = lanes.ended(ev.entry, now, cause=cause)
        if steps:
            self._take(steps, now)
        self._pass_on(ev)
        steps = lanes.fill(now, cause)
        if steps:
            self._take(steps, now)

    def _pass_on(self, ev: TaskDone) -> None:
        """Send a finished task's output on: to its successors (re-placed first), or, from a
        sink, to the ingress."""
        entry = ev.entry
        if self.is_done(entry.job_id, entry.attempt):
            return
        now = ev.now
        workflow = self._workflow(entry.workflow)
        succs = workflow.succs(entry.task)
        if not succs:
            result = ResultMsg(entry.job_id, entry.attempt, entry.task, ev.output)
            self._send(entry.ingress, result, now)
            return
        plan = entry.plan
        if self.policy.dynamic:
            try:
                plan = self._adjust(workflow, entry, now)
            except CompassError as exc:
                self._report_failure(
                    entry.job_id, entry.attempt, entry.task, entry.ingress, now,
                    f"{type(exc).__name__}: {exc}", exc.code,
                )  # fmt: skip
                return
        for succ in succs:
            msg = TaskMsg(
                job=entry.job_id,
                attempt=entry.attempt,
                workflow=workflow.name,
                task=succ,
                source=entry.task,
                value=ev.output,
                plan=plan,
                ingress=entry.ingress,
                t0=entry.t0,
                priority=entry.level,
                budget_s=None if entry.deadline is None else entry.deadline - now,
                finish=entry.finish,
                stream=entry.stream,
            )
            self._send(plan[succ], msg, now, job_arrival=entry.arrival)

    def _adjust(self, workflow: Workflow, entry: QueuedTask, now: float) -> dict[str, str]:
        """Re-place the successors of ``entry`` (the paper's dynamic adjustment); the
        ingress hears of every move."""
        plan = entry.plan
        info = JobInfo(entry.job_id, workflow, entry.ingress, 0, entry.level)
        # the workers of the plan hold (or will) the successors' other inputs, and the
        # adjustment may keep a successor where it was planned
        scope = PlanScope(workflow, (*plan.values(), self.name))
        view = self.view.snapshot(now, without=entry.job_id, priority=entry.level, scope=scope)
        adjusted = adjust_successors(self.policy, info, entry.task, plan, view, self.profiles, now)
        moved = {t: adjusted[t] for t in workflow.order if adjusted[t] != plan[t]}
        if not moved:
            return plan
        self.stats.moves += len(moved)
        for task, worker in moved.items():
            self._send(entry.ingress, PlacedMsg(entry.job_id, entry.attempt, task, worker), now)
        self._note_placements(info, moved, now)
        return adjusted

    def _undeliverable(self, ev: Undeliverable) -> None:
        """A task's output (pushed on, or a sink's result) that cannot be sent fails the
        job with the task named; a lost control message only counts as dropped."""
        msg = ev.msg
        self.stats.messages_dropped += 1
        if isinstance(msg, TaskMsg) and msg.source != JOB_INPUTS:
            task, ingress = msg.source, msg.ingress
        elif isinstance(msg, TaskMsg) and ev.unreachable:
            task, ingress = msg.task, msg.ingress  # a root, sent by this ingress: plan again
        elif isinstance(msg, ResultMsg):
            task, ingress = msg.task, ev.peer
        elif isinstance(msg, FailedMsg) and ev.unreachable and msg.worker == self.name:
            # this worker's report of a failure could not reach the job's ingress either: it
            # hears of it if it comes back
            self.links.orphan(ev.peer, Sent(msg.job, msg.attempt, msg.task, ev.peer, msg))
            return
        else:
            return
        if self.is_done(msg.job, msg.attempt):
            return
        text = f"its output could not be sent to {ev.peer}: {ev.error}"
        code = WorkerUnavailable.code if ev.unreachable else ProtocolError.code
        self._report_failure(msg.job, msg.attempt, task, ingress, ev.now, text, code)

    def _forget(self, job_id: str, below: int | None) -> None:
        """Messages of ``job_id`` (of attempts below ``below``; all when None) are stale now."""
        mark = (below - 1) if below is not None else 1 << 30
        self._finished[job_id] = max(self._finished.get(job_id, -1), mark)
        self._finished.move_to_end(job_id)
        while len(self._finished) > self._forget_after:
            self._finished.popitem(last=False)

    # -- messages and bookkeeping -------------------------------------------------------------

    def _send(
        self, peer: str, msg: PeerMessage, now: float, job_arrival: float | None = None
    ) -> None:
        if peer == self.name:
            # as a Received from itself, which would learn nothing (no time on the wire)
            self._here(msg, now, 0.0, job_arrival)
        else:
            self._out.append(Send(peer, msg, self._cause))
            self.links.note(peer, msg)

    def _send_done(self, job_id: str, workers: set[str], *, below: int | None, now: float) -> None:
        for worker in sorted(workers):
            self._send(worker, DoneMsg(job_id, below), now)

    def _drop_job(self, job_id: str, below: int | None) -> None:
        self._forget(job_id, below)
        self.links.forget(job_id, below)
        self.inbox.drop_job(job_id, below)
        self.lanes.drop_job(job_id, below)
        if running := self.lanes.running_of(job_id, below):  # a step-wise one stops at a step
            self._out.append(StopTask(running, self._cause))
