"""The ingress, sans-IO: the jobs one worker accepted, from admission to their one answer.

A worker is the ingress of the jobs submitted to it: it admits them (its limits, their
deadlines), has them planned, sends their roots, gathers their sinks' outputs, plans them again
when a peer they involve is lost, and answers each exactly once. A job's key names it for the
client: a resubmission of a running job's key attaches to it, one of an answered job's key gets
the kept answer (:class:`~compass.core.answers.KeptAnswers`). The worker core
(:class:`~compass.core.state.WorkerCore`) owns one and hands it the events and messages that
concern its jobs; what it needs of the core (planning, sending, the view) is :class:`Host`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from compass.core.admission import Admission, AdmittedShare, unreachable, work_before
from compass.core.answers import KeptAnswers, final_answer
from compass.core.causes import Cause
from compass.core.estimates import Estimates
from compass.core.events import (
    Answer,
    AskPlan,
    Cancel,
    Chunk,
    Instruction,
    PlanReady,
    Submit,
    ViewPort,
)
from compass.core.jobs import IngressJob, failure_of
from compass.core.links import Links
from compass.core.messages import (
    JOB_INPUTS,
    LINK_LOST,
    OTHER_VERSION,
    ChoseMsg,
    ChunkMsg,
    FailedMsg,
    PeerMessage,
    PlacedMsg,
    PlanRequest,
    ResultMsg,
    TaskMsg,
)
from compass.core.stats import WorkerStats
from compass.core.unfold import ChainedStep, answer_value, forward_step
from compass.errors import (
    CompassError,
    DeadlineExceeded,
    InvalidInputs,
    RemoteError,
    WorkersLost,
    WorkerUnavailable,
    error_from_wire,
)
from compass.sched import JobInfo, Policy, ViewSnapshot
from compass.sched.candidates import PlanScope
from compass.workflow.dag import Workflow

__all__ = ["MAX_ATTEMPTS", "Host", "Ingress"]

#: attempts of a job at most when workers report they could not take or pass on its tasks
#: (lost peers and broken links plan it again besides)
MAX_ATTEMPTS = 4


class Host(Protocol):
    """What the ingress uses of its worker core."""

    name: str
    policy: Policy
    view: ViewPort
    estimates: Estimates
    stats: WorkerStats
    links: Links

    @property
    def cause(self) -> Cause: ...

    def emit(self, instruction: Instruction) -> None: ...

    def workflow(self, name: str) -> Workflow: ...

    def plan_here(
        self, info: JobInfo, now: float, view: ViewSnapshot | None = None
    ) -> dict[str, str]: ...

    def send(
        self, peer: str, msg: PeerMessage, now: float, job_arrival: float | None = None
    ) -> None: ...

    def send_done(
        self, job_id: str, workers: set[str], *, below: int | None, now: float
    ) -> None: ...


class Ingress:
    """The jobs worker ``host.name`` accepted; see the module docstring. ``admission``: its
    limits; ``answered``: the answers kept for keys; ``learned``: the share of each kind of
    job it admits, learned from what became of those it admitted (None: the plan's estimate
    alone decides)."""

    def __init__(
        self,
        host: Host,
        admission: Admission,
        answered: KeptAnswers,
        learned: AdmittedShare | None = None,
    ) -> None:
        self._host = host
        self.admission = admission
        self.learned = learned
        #: unanswered jobs this worker is the ingress of
        self.jobs: dict[str, IngressJob] = {}
        self.held_bytes = 0  # of inputs, held for unanswered jobs (to re-plan them)
        #: job key -> the unanswered job it names; -> the answer of an answered one (bounded in
        #: keys, bytes, time); requests waiting for another's job (its key resubmitted) -> it
        self.keys: dict[str, str] = {}
        self.answered = answered
        self.attached: dict[str, str] = {}

    # -- a job comes in -----------------------------------------------------------------------

    def submit(self, ev: Submit) -> None:
        host = self._host
        if ev.key is not None and self._resubmitted(ev):
            return
        refusal = self.admission.refusal(
            ev.job_id, ev.input_bytes, in_flight=len(self.jobs), held_bytes=self.held_bytes
        )
        if refusal is not None:
            host.stats.jobs_refused += 1
            self._answer_now(ev.job_id, refusal)
            return
        try:
            workflow = host.workflow(ev.workflow)
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
        deadline_s = host.estimates.deadline_s(workflow, ev.objective)
        if deadline_s is not None:
            job.deadline = ev.now + deadline_s
        self.jobs[job.job_id] = job
        self.held_bytes += job.input_bytes
        if ev.key is not None:
            self.keys[ev.key] = job.job_id
        host.stats.jobs_submitted += 1
        # the ingress holds the job's inputs
        scope = PlanScope(workflow, (host.name,))
        view = host.view.snapshot(ev.now, priority=ev.objective.priority, scope=scope)
        central = host.policy.planner(view)
        if central is not None and central != host.name:
            request = PlanRequest(job.job_id, workflow.name, host.name, job.input_bytes)
            host.emit(AskPlan(central, request, host.cause))
            return
        self._first_attempt(job, None, ev.now, view)

    def _resubmitted(self, ev: Submit) -> bool:
        """A key this ingress knows: wait for its running job, or get its kept answer."""
        assert ev.key is not None
        running = self.keys.get(ev.key)
        if running is not None:
            self.jobs[running].waiters.append(ev.job_id)
            self.attached[ev.job_id] = running
            return True
        kept = self.answered.get(ev.key, ev.now)
        if kept is not None:
            value, error = kept
            self._host.emit(Answer(ev.job_id, value=value, error=error, stimulus=self._host.cause))
            return True
        return False

    def plan_ready(self, ev: PlanReady) -> None:
        """The central planner's plan for a job (the ``central`` policy)."""
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
                plan = self._host.plan_here(self._info(job), now, view)
            # a job whose choices are yet to be made is dropped when late, not refused
            if _admitted_by_deadline(job):
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
        host = self._host
        # the waits of its priority: a job above the lowest runs ahead of the lower levels' work
        scope = PlanScope(job.workflow, (*plan.values(), host.name))
        view = host.view.snapshot(
            now, without=job.job_id, priority=job.objective.priority, scope=scope
        )
        finish = host.estimates.plan_finish_s(job.workflow, plan, view, now, job.input_bytes)
        error = unreachable(job, finish)
        learned = self.learned
        if (
            error is None
            and learned is not None
            and not learned.admits(job.workflow.name, job.objective.priority)
        ):
            error = learned.refusal(job)
        if error is not None:
            host.stats.jobs_unreachable += 1
            raise error

    def _new_attempt(self, job: IngressJob, lost: str, now: float) -> None:
        """Plan ``job`` again from the inputs kept here; older attempts are dropped by the
        workers that held them (``lost`` hears it if it comes back)."""
        host = self._host
        old_workers = job.workers()
        job.attempt += 1
        host.links.forget(job.job_id, job.attempt)
        job.outputs.clear()
        job.choices.clear()
        if lost in old_workers:
            old_workers.discard(lost)
            host.links.owe_done(lost, job.job_id, job.attempt)
        host.send_done(job.job_id, old_workers, below=job.attempt, now=now)
        try:
            job.plan = host.plan_here(self._info(job), now)
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
            f"worker {self._host.name} failed to plan job {job.job_id} ({job.workflow.name}): "
            f"{type(exc).__name__}: {exc} (a bug in compass: please report it)",
            detail={"job_id": job.job_id},
        ))  # fmt: skip

    def _send_roots(self, job: IngressJob, now: float) -> None:
        host = self._host
        for root in job.workflow.roots:
            host.send(
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
                    ingress=host.name,
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
        name = self._host.name
        return JobInfo(job.job_id, job.workflow, name, job.input_bytes, job.objective.priority)

    # -- its workers report -------------------------------------------------------------------

    def live(self, job_id: str, attempt: int) -> IngressJob | None:
        """The unanswered job a report is about, if it is about its current attempt."""
        job = self.jobs.get(job_id)
        return job if job is not None and job.attempt == attempt else None

    def result(self, msg: ResultMsg, now: float) -> None:
        job = self.live(msg.job, msg.attempt)
        if job is None:
            return
        if isinstance(msg.value, ChainedStep):  # one step of a chained job: the next goes on
            forward_step(self._host, self._host.name, job, msg, now)
            return
        job.outputs[msg.task] = msg.value
        sinks = job.workflow.sinks
        if all(s in job.outputs for s in sinks):
            self._host.stats.jobs_completed += 1
            value, late = final_answer(job, now)  # late: answered as such (core/answers.py)
            if late is None and job.workflow.unfold is not None:  # the sinks that ran
                value = answer_value(job.workflow.sinks, job.outputs)
            self._answer(job, now, value=value, error=late)

    def failed(self, msg: FailedMsg, now: float) -> None:
        job = self.live(msg.job, msg.attempt)
        if job is None:
            return
        stats = self._host.stats
        if msg.code == DeadlineExceeded.code:
            stats.jobs_dropped += 1
            why = msg.message.removeprefix(f"{DeadlineExceeded.__name__}: ")
            where = {"job_id": job.job_id, "task": msg.task, "worker": msg.worker}
            # done to every worker: the job's other tasks and inputs are dropped everywhere
            self._answer(job, now, error=DeadlineExceeded(why, detail=where))
            return
        refused = msg.code == WorkerUnavailable.code or msg.code == OTHER_VERSION
        if msg.code == LINK_LOST or (refused and job.refused < MAX_ATTEMPTS - 1):
            # a link of the job broke (as a lost peer, any number of times), or a worker could
            # not take or pass on a task (it had no connection to the next one yet, or it
            # refuses GPU work, or it serves another version of the weights: out of the view
            # until it says which): plan the job again, from the inputs kept here
            if msg.code == OTHER_VERSION:
                self._host.view.other_version(msg.worker)
            job.refused += refused
            stats.replans += 1
            self._new_attempt(job, "", now)
            return
        stats.jobs_failed += 1
        self._answer(job, now, error=failure_of(job, msg, refused=refused))

    def chose(self, msg: ChoseMsg) -> None:
        """A decision task of the job chose: kept for the job's record, and learned from
        (:class:`~compass.workflow.frequencies.ChoiceFrequencies`)."""
        job = self.live(msg.job, msg.attempt)
        unfolding = None if job is None else job.workflow.unfold
        if job is not None and unfolding is not None and msg.task in unfolding.points:
            job.choices[msg.task] = msg.label
            self._host.estimates.choices.observe(job.workflow, msg.task, msg.label)

    def placed(self, msg: PlacedMsg, now: float) -> None:
        """A worker moved ``msg.task`` (dynamic adjustment): the plan follows, so that the
        job's end reaches the worker it moved to. A move heard after the job (or that attempt)
        ended here, as a report on another link can overtake it, is told that end now: what it
        sent of the job (:class:`~compass.core.links.Links`) would stay noted there for good."""
        job = self.live(msg.job, msg.attempt)
        if job is not None:
            if msg.task in job.plan:
                job.plan[msg.task] = msg.worker
            return
        if msg.worker == self._host.name:
            return  # the ingress forgets its own when it answers
        current = self.jobs.get(msg.job)
        below = None if current is None else current.attempt
        self._host.send_done(msg.job, {msg.worker}, below=below, now=now)

    def chunk(self, msg: ChunkMsg) -> None:
        """A partial output of a streaming job's sink: on to its caller."""
        job = self.jobs.get(msg.job)
        if job is not None and job.attempt == msg.attempt and job.stream:
            self._host.emit(Chunk(msg.job, msg.task, msg.seq, msg.value, self._host.cause))

    def peer_lost(self, peer: str, now: float) -> None:
        """Plan again every job that had a task placed on ``peer``."""
        for job in list(self.jobs.values()):
            if job.involves(peer):
                self._host.stats.replans += 1
                self._new_attempt(job, peer, now)

    # -- answers ------------------------------------------------------------------------------

    def _answer(
        self, job: IngressJob, now: float, *, value: Any = None, error: CompassError | None = None
    ) -> None:
        """Answer ``job`` (once: it leaves :attr:`jobs`) and tell its workers to drop it."""
        host = self._host
        del self.jobs[job.job_id]
        self.held_bytes -= job.input_bytes
        if self.learned is not None and _admitted_by_deadline(job):
            self._learn(self.learned, job, error)
        host.links.forget(job.job_id)
        host.send_done(job.job_id, job.workers(), below=None, now=now)
        if job.key is not None:
            del self.keys[job.key]
            self.answered.put(job.key, value, error, now)
        cause = host.cause
        for waiter in job.waiters:
            del self.attached[waiter]
            # an exception of its own each: a raised one takes its raiser's frames along
            own = None if error is None else error_from_wire(*error.to_wire().values())
            host.emit(Answer(waiter, value=value, error=own, stimulus=cause))
        record = job.record(now, ok=error is None)
        host.emit(Answer(job.job_id, value=value, error=error, record=record, stimulus=cause))

    def _learn(self, learned: AdmittedShare, job: IngressJob, error: CompassError | None) -> None:
        """What admitted ``job``'s answer teaches: in time, or dropped on the way or late,
        with the share of its work that ran (a failure or a cancel teaches nothing)."""
        if error is not None and type(error) is not DeadlineExceeded:
            return
        name, lost = job.workflow.name, 0.0
        if error is not None:  # the task dropped (none: answered late, all its work ran)
            profiles, here = self._host.estimates.profiles, self._host.name
            detail = error.detail
            task = detail.get("task") if isinstance(detail, dict) else None
            lost = work_before(job.workflow, task, lambda t: profiles.exec_s(name, t, here))
        learned.observe(name, job.objective.priority, dropped=error is not None, lost=lost)

    def _answer_now(self, job_id: str, error: CompassError) -> None:
        """Refuse a job that was never accepted."""
        self._host.emit(Answer(job_id, error=error, stimulus=self._host.cause))

    def cancel(self, ev: Cancel) -> None:
        """A requester stopped waiting: its job is dropped once nobody waits for it (a
        resubmission of its key may still wait, or the request it was attached to)."""
        attached = self.attached.pop(ev.job_id, None)
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


def _admitted_by_deadline(job: IngressJob) -> bool:
    """Whether ``job`` was admitted by its deadline (:meth:`Ingress._admit`)."""
    return job.deadline is not None and not job.objective.finish and not job.workflow.unfold
