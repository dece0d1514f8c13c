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
from collections.abc import Callable, Collection, Mapping
from typing import assert_never

from compass.core import unfold
from compass.core.admission import Admission, AdmittedShare
from compass.core.answers import KEEP_ANSWERS, KeptAnswers
from compass.core.causes import Cause
from compass.core.edges import FeedGap, StreamedEdges, keep_fed, step_messages
from compass.core.estimates import Estimates
from compass.core.events import (
    NOT_HANDLING,
    Cancel,
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
from compass.core.ingress import Ingress
from compass.core.jobs import Inbox, check_task
from compass.core.lanes import CannotRun, Lanes, LanesFault, Step
from compass.core.links import Links, Sent
from compass.core.messages import (
    JOB_INPUTS,
    OTHER_VERSION,
    ChoseMsg,
    ChunkMsg,
    DoneMsg,
    FailedMsg,
    PeerMessage,
    PlacedMsg,
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
    ProtocolError,
    WorkerUnavailable,
)
from compass.sched import JobInfo, Policy, ViewSnapshot, adjust_successors, record_plan
from compass.sched.candidates import PlanScope
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["WorkerCore"]


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
        self.learn = options.learn  # measurements update the profiles (real mode)
        self.h2d_measured = False  # its own host-to-device copies were timed (heartbeats say)
        self.stats = stats if stats is not None else WorkerStats()
        self._workflow = workflow
        self._forget_after = options.forget_after
        self.inbox = Inbox(options.inbox_keep_s)
        #: the streams into tasks here (streamed edges: :mod:`compass.core.edges`)
        self.edges = StreamedEdges()
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
        #: best times, critical paths, deadlines and queue entries, from the profiles
        self.estimates = Estimates(name, policy, profiles, host_lanes=self.host_lanes)
        #: the jobs it accepted, until each is answered; their keys' kept answers
        self.ingress = Ingress(
            self,
            Admission(name, options.max_jobs, options.max_job_bytes, options.max_held_bytes),
            KeptAnswers(max_bytes=options.keep_answer_bytes, keep_s=options.keep_answer_s),
            AdmittedShare() if options.admission == "learned" else None,
        )

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
                    self.ingress.submit(event)
                case Tick():
                    ticked = self.lanes.tick(event.now, cause, event.hot, event.cold_s, event.spare)
                    self._take(ticked, event.now)
                    for (job, attempt, task), entry in self.inbox.expire(event.now):
                        waited = f"{task}'s inputs waited {self.inbox.keep_s:g} s for the rest"
                        self.report_failure(job, attempt, task, entry.ingress, event.now,
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
                    self.ingress.plan_ready(event)
                case PeerLost():
                    self._peer_lost(event)
                case Cancel():
                    self.ingress.cancel(event)
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

    # -- what the ingress (and the rest of the core) uses -----------------------------------

    @property
    def cause(self) -> Cause:
        """The id of the event being handled: every instruction carries it."""
        return self._cause

    def emit(self, instruction: Instruction) -> None:
        """Add ``instruction`` to what the event being handled decided."""
        self._out.append(instruction)

    def workflow(self, name: str) -> Workflow:
        """The workflow named ``name`` (:class:`~compass.errors.UnknownWorkflow` if none)."""
        return self._workflow(name)

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
            workflow = self.workflow(request.workflow)
            info = JobInfo(request.job, workflow, request.ingress, request.input_bytes)
            plan: dict[str, str] | None = self.plan_here(info, ev.now)
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

    def plan_here(
        self, info: JobInfo, now: float, view: ViewSnapshot | None = None
    ) -> dict[str, str]:
        """Plan on ``view`` (a fresh snapshot when None: nothing changed since it was taken)."""
        if view is None:
            # this worker plans; the job's ingress holds its inputs
            scope = PlanScope(info.workflow, (self.name, info.ingress))
            view = self.view.snapshot(now, without=info.job_id, priority=info.priority, scope=scope)
        plan = self.policy.plan(info, view, self.profiles, now)
        workflow = info.workflow
        likely = None if workflow.unfold is None else self.estimates.choices.likely(workflow)
        self._note_placements(info, unfold.counted(workflow, plan, likely, self.policy), now)
        return plan

    def _note_placements(self, info: JobInfo, placed: Mapping[str, str], now: float) -> None:
        """Count the tasks just placed on peers in their waits (:func:`record_plan`)."""
        record_plan(
            self.view, info, placed, self.profiles, now, host_lanes=self.host_lanes,
            planner=self.name, batch_aware=self.policy.batch_aware,
        )  # fmt: skip

    def _peer_lost(self, ev: PeerLost) -> None:
        if ev.name == self.name:
            return
        self.view.remove(ev.name)
        self.stats.peers_lost += 1
        # inputs of jobs whose ingress is gone would wait forever; the ingress hears of the
        # attempts forgotten here if it comes back (a false suspicion): it plans them again
        lost = ev.name
        dropped = self.inbox.drop_ingress(lost)
        queued = self.lanes.drop(lambda e: e.ingress == lost)
        if suspended := [e for e in queued if e in self.lanes.held]:  # their kept states end
            self._take(self.lanes.release(suspended, ev.now, self._cause), ev.now)
        for entry in [*queued, *self.lanes.running()]:
            if entry.ingress == lost:
                mark = (entry.attempt, entry.task)
                dropped[entry.job_id] = max(dropped.get(entry.job_id, mark), mark)
        for job_id, (attempt, task) in dropped.items():
            self._forget(job_id, attempt + 1)
            self.links.orphan(lost, Sent(job_id, attempt, task, lost))
        self.ingress.peer_lost(lost, ev.now)
        # what was sent there may be lost (:mod:`compass.core.links`)
        for to, report in self.links.lost(lost, self._stale):
            self.send(to, report, ev.now)

    def _peer_joined(self, ev: PeerJoined) -> None:
        """A peer is connected: new, back, or restarted. It and the ingresses of what a broken
        link to it may have lost hear what they must (:meth:`Links.joined`)."""
        self.view.joined(ev.name, ev.instance)
        for to, message in self.links.joined(ev.name, self._stale):
            self.send(to, message, ev.now)

    def _stale(self, job_id: str, attempt: int, ingress: str) -> bool:
        """Whether what was sent of ``job_id``'s ``attempt`` is stale: done here, or planned
        again already (this worker is its ``ingress``)."""
        done = self.is_done(job_id, attempt)
        return done or (ingress == self.name and self.ingress.live(job_id, attempt) is None)

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
            self.ingress.result(msg, now)
        elif isinstance(msg, FailedMsg):
            self.ingress.failed(msg, now)
        elif isinstance(msg, PlacedMsg):
            self.ingress.placed(msg, now)
        elif isinstance(msg, ChoseMsg):
            self.ingress.chose(msg)
        elif isinstance(msg, ChunkMsg) and msg.to:
            self._fed(msg, now)
        elif isinstance(msg, ChunkMsg):
            self.ingress.chunk(msg)
        else:
            self._drop_job(msg.job, msg.below, now)

    def _task_input(
        self, msg: TaskMsg, now: float, transfer_s: float, job_arrival: float | None
    ) -> None:
        if self.is_done(msg.job, msg.attempt):
            return  # a late message of a job already done or re-planned
        if msg.version and msg.version != self.view.version_id and self.view.version_id:
            self._other_version(msg, now)
            return
        try:
            workflow = self.workflow(msg.workflow)
            check_task(workflow, msg)
        except CompassError as exc:
            self.stats.messages_dropped += 1
            self.report_failure(
                msg.job, msg.attempt, msg.task, msg.ingress, now, str(exc), exc.code
            )
            return
        if self.edges.takes(workflow, msg):  # a streamed edge: its task starts at its opening
            present, feeds = self.edges.input(msg, self._cause)
            self._out.extend(feeds)
            if not present:
                return
        entry = self.inbox.add(msg, workflow, transfer_s=transfer_s, now=now)
        if entry is None:
            return
        if workflow.unfold is not None and workflow.unfold.all_skipped(msg.task, entry.inputs):
            unfold.skip_task(self, workflow, msg, entry.plan, now)
            return
        queued = self.estimates.queued(msg, workflow, entry, now, transfer_s, job_arrival)
        steps = self.lanes.submit(queued, now, self._cause)
        if steps:
            self._take(steps, now)

    def _other_version(self, msg: TaskMsg, now: float) -> None:
        """A task planned on another version of the weights than this worker serves (its
        planner had not heard this worker's yet: it restarted with other weights) is refused,
        never run: its job's ingress plans it again without this worker."""
        self.stats.messages_dropped += 1
        why = (
            f"worker {self.name} serves another version of the weights than job {msg.job} was "
            f"planned with (version id {self.view.version_id}, not {msg.version}); planning "
            "the job again without it"
        )
        self.report_failure(msg.job, msg.attempt, msg.task, msg.ingress, now, why, OTHER_VERSION)

    def _task_failed(self, ev: TaskFailed) -> None:
        entry = ev.entry
        self.edges.task_ended(entry)
        self._take(
            self.lanes.ended(entry, ev.now, still_running=ev.still_running, cause=self._cause),
            ev.now,
        )
        if not self.is_done(entry.job_id, entry.attempt):
            self.report_failure(
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
            self.report_failure(
                entry.job_id, entry.attempt, entry.task, entry.ingress, now,
                f"{type(error).__name__}: {error.message}", error.code,
            )  # fmt: skip

    def _step(self, ev: TaskStep) -> None:
        """A step of a running step-wise task ended: a streaming job's sink's partial output
        goes to its ingress; the lanes decide whether the task goes on (preemption)."""
        e = ev.entry
        workflow = self.workflow(e.workflow)
        if e.task in workflow.sinks:
            if e.stream:
                self.send(
                    e.ingress, ChunkMsg(e.job_id, e.attempt, e.task, ev.seq, ev.value), ev.now
                )
        elif not self.is_done(e.job_id, e.attempt):  # to the successors it streams into
            for peer, msg in step_messages(workflow, e, ev.seq, ev.value, ev.now):
                self.send(peer, msg, ev.now, job_arrival=e.arrival)
        if self.lanes.preempt and not self.is_done(e.job_id, e.attempt):
            done = ev.seq + 1 - e.done_steps  # steps of this run (a resumed one's count on)
            steps = self.lanes.stepped(e, done, ev.now, self._cause)
            self._take(steps, ev.now)
            if any(isinstance(s, StopTask) for s in steps):  # past saving: its job is answered
                self._forget(e.job_id, e.attempt + 1)  # nothing of it goes on from here

    def _fed(self, msg: ChunkMsg, now: float) -> None:
        """A chunk of a stream into a task here; a gap in the stream fails its job."""
        if self.is_done(msg.job, msg.attempt):
            return
        try:
            feed = self.edges.chunk(msg, self._cause)
        except FeedGap as gap:
            self.report_failure(msg.job, msg.attempt, msg.to, gap.ingress, now, str(gap),
                                gap.code)  # fmt: skip
            return
        if feed is not None:
            self._out.append(feed)

    def report_failure(
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
        self.send(ingress, failed, now)

    def _task_done(self, ev: TaskDone) -> None:
        if self.learn:  # a batch is one measurement, under its lead
            measured = ev.exec_s if ev.first else None
            self.estimates.observe_run(ev.entry, ev.output, measured, ev.batch, ev.steps)
        now, cause, lanes = ev.now, self._cause, self.lanes
        self.edges.task_ended(ev.entry)
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
        workflow = self.workflow(entry.workflow)
        if workflow.unfold is not None:  # a run-time choice may skip some successors
            unfold.pass_on(self, workflow, entry, ev.output, now)
            return
        succs = workflow.succs(entry.task)
        if not succs:
            result = ResultMsg(entry.job_id, entry.attempt, entry.task, ev.output)
            self.send(entry.ingress, result, now)
            return
        plan = entry.plan
        if self.policy.dynamic:
            try:
                plan = self.adjust_plan(workflow, entry, now)
            except CompassError as exc:
                self.report_failure(
                    entry.job_id, entry.attempt, entry.task, entry.ingress, now,
                    f"{type(exc).__name__}: {exc}", exc.code,
                )  # fmt: skip
                return
        for succ in succs:
            msg = TaskMsg.onward(entry, workflow.name, succ, ev.output, plan, now)
            self.send(plan[succ], msg, now, job_arrival=entry.arrival)

    def adjust_plan(
        self, workflow: Workflow, entry: QueuedTask, now: float, live: Collection[str] = ()
    ) -> dict[str, str]:
        """Re-place the successors of ``entry`` (the paper's dynamic adjustment); the
        ingress hears of every move. With ``live`` (a run-time choice was made) only those
        successors count in their workers' waits: the others will not run."""
        plan = entry.plan
        info = JobInfo(entry.job_id, workflow, entry.ingress, 0, entry.level)
        # the workers of the plan hold (or will) the successors' other inputs, and the
        # adjustment may keep a successor where it was planned
        scope = PlanScope(workflow, (*plan.values(), self.name))
        view = self.view.snapshot(now, without=entry.job_id, priority=entry.level, scope=scope)
        adjusted = adjust_successors(self.policy, info, entry.task, plan, view, self.profiles, now)
        keep_fed(workflow, plan, adjusted)
        moved = {t: adjusted[t] for t in workflow.order if adjusted[t] != plan[t]}
        if not moved:
            return plan
        self.stats.moves += len(moved)
        for task, worker in moved.items():
            self.send(entry.ingress, PlacedMsg(entry.job_id, entry.attempt, task, worker), now)
        if live:
            moved = {t: w for t, w in moved.items() if t in live}
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
        self.report_failure(msg.job, msg.attempt, task, ingress, ev.now, text, code)

    def _forget(self, job_id: str, below: int | None) -> None:
        """Messages of ``job_id`` (of attempts below ``below``; all when None) are stale now."""
        mark = (below - 1) if below is not None else 1 << 30
        self._finished[job_id] = max(self._finished.get(job_id, -1), mark)
        self._finished.move_to_end(job_id)
        while len(self._finished) > self._forget_after:
            self._finished.popitem(last=False)
        self._out.extend(self.edges.drop(job_id, below, self._cause))  # open streams break

    # -- messages and bookkeeping -------------------------------------------------------------

    def send(
        self, peer: str, msg: PeerMessage, now: float, job_arrival: float | None = None
    ) -> None:
        if peer == self.name:
            # as a Received from itself, which would learn nothing (no time on the wire)
            self._here(msg, now, 0.0, job_arrival)
            return
        if isinstance(msg, (TaskMsg, ResultMsg)) and self.is_done(msg.job, msg.attempt):
            # its job ended meanwhile: a successor delivered here just before failed it (its
            # deadline, say), and this worker is its ingress. The peer would drop the output,
            # and the link would keep it for good: no end of the job is coming any more. (A
            # report of a failure does go: one kept for an ingress that was lost, of a job
            # dropped here then, is sent when it is back.)
            return
        if type(msg) is TaskMsg:
            msg.stamp(self.view.version_id)  # the version the job was planned with
        self._out.append(Send(peer, msg, self._cause))
        self.links.note(peer, msg)

    def send_done(self, job_id: str, workers: set[str], *, below: int | None, now: float) -> None:
        for worker in sorted(workers):
            self.send(worker, DoneMsg(job_id, below), now)

    def _drop_job(self, job_id: str, below: int | None, now: float) -> None:
        self._forget(job_id, below)
        self.links.forget(job_id, below)
        self.inbox.drop_job(job_id, below)
        if suspended := [e for e in self.lanes.drop_job(job_id, below) if e in self.lanes.held]:
            self._take(self.lanes.release(suspended, now, self._cause), now)  # they stop now
        if running := self.lanes.running_of(job_id, below):  # a step-wise one stops at a step
            self._out.append(StopTask(running, self._cause))
