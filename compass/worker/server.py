"""The worker process: the asyncio adapter around the worker core.

The rules live in the sans-IO :class:`~compass.core.state.WorkerCore`; this module owns the
sockets, threads and timers: it turns what arrives (a submit, a peer's message, a task's
outcome, a model loaded, a lost peer) into the core's events and carries out its instructions.
Requests are checked at the door by :mod:`compass.worker.requests`; see docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, assert_never

from compass.app import App
from compass.cache.models import ModelCache
from compass.config import WorkerConfig
from compass.core.assemble import build_core
from compass.core.events import (
    Answer,
    AskPlan,
    Cancel,
    Chunk,
    Event,
    Fault,
    Feed,
    Heard,
    JoinRun,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    PeerDraining,
    PeerJoined,
    PeerLost,
    PlanAsked,
    Planned,
    PlanReady,
    Received,
    RunTask,
    Send,
    StopTask,
    Submit,
    SuspendTask,
    TaskReturned,
    Tick,
    Watch,
    WatchFailed,
)
from compass.core.jobs import INBOX_KEEP_S, JobIds
from compass.core.lanes import Lanes
from compass.core.messages import (
    DoneMsg,
    FailedMsg,
    PeerMessage,
    PlanReply,
    PlanRequest,
    ResultMsg,
    TaskMsg,
)
from compass.core.options import core_options
from compass.core.queue import QueuedTask
from compass.core.stats import WorkerStats, payload_bytes
from compass.elastic.replicate import ReplicaConfig
from compass.errors import CompassError, WorkerUnavailable
from compass.objective import NO_OBJECTIVE, Objective
from compass.observe import dashboard
from compass.observe.metrics import WorkerMetrics
from compass.observe.otel import OtelExport
from compass.observe.tracing import Tracer, task_span
from compass.sched import Policy, make_policy
from compass.sched.heartbeat import Heartbeat
from compass.sched.policies import worker_seed
from compass.supervisor import Supervisor
from compass.wire.transport import ChannelOptions, Server, serve
from compass.worker.executor import TaskOutcome, TaskRunner
from compass.worker.gossip import Gossip
from compass.worker.membership import (
    Membership,
    MembershipOptions,
    Peer,
    advertised_address,
    default_worker_name,
)
from compass.worker.outbox import Outbox
from compass.worker.replicas import REPLICATE_EVERY_S, HotReplicas
from compass.worker.requests import describe, make_router
from compass.worker.tables import table_sizes
from compass.worker.windows import Chunks, StreamedSteps
from compass.workflow.profile import Profiles

__all__ = ["Worker"]

log = logging.getLogger("compass.worker")


class Worker:
    """A compass worker: ``async with Worker(config, app, profiles) as w: await w.wait()``."""

    def __init__(self, config: WorkerConfig, app: App, profiles: Profiles) -> None:
        self.config = config
        self.app = app
        self.profiles = profiles
        self.policy: Policy = make_policy(
            config.sched.policy,
            adjust_threshold=config.sched.adjust_threshold,
            host_lanes=config.host_lanes > 0,
            seed=worker_seed(0, config.name or f"pid{os.getpid()}"),
        )
        self.name = config.name
        #: this process's id, in every job id: peers tell a restart under the same name by it
        self.instance = secrets.token_hex(6)
        self.address = ""
        #: the adapter's own counters (the core keeps its own: :attr:`stats` is their sum)
        self.run_stats = WorkerStats()
        self.metrics = WorkerMetrics(self)
        self.started_at = time.monotonic()
        # Emulated workers live in the workload's time: a real second is 1/time_scale seconds of
        # it, so queue waits, plans and reported timings all read like the unscaled profiles.
        scale = config.time_scale
        self.clock = time.monotonic if scale == 1.0 else (lambda: time.monotonic() / scale)
        self.cache = ModelCache(
            app.models,
            config.cache,
            emulated_h2d_bytes_per_s=profiles.default_h2d_bytes_per_s if config.emulate else None,
            time_scale=config.time_scale,
        )
        self.streamed = StreamedSteps(self)  # streamed tasks' steps: to the core, in windows
        self.runner = TaskRunner(
            lookup=lambda workflow, task: self.app.get_workflow(workflow).tasks[task],
            module_of=self.cache.module,
            compute=self.cache.compute,  # the compute fence before a model is unpinned
            config=config,
            on_outcome=self._task_finished,
            on_returned=self._task_returned,
            streamed=self.streamed,
            clock=self.clock,
        )
        self.runner.workflows = app.get_workflow  # which tasks feed streamed edges
        self.router = make_router(self)
        dashboard.add_request(self.router, self)  # a peer's dashboard asks for this one's part
        #: the last answered jobs of this ingress, for benchmarks and `compass status`
        self.trace: deque[dict[str, Any]] = deque(maxlen=config.trace_jobs)
        #: traced jobs: their spans as they travel, the traces kept (compass/observe/tracing.py)
        self.tracer = Tracer(sample=config.trace_sample, keep=config.trace_keep)
        #: OpenTelemetry export of the traced jobs' spans (--otel-endpoint), else None
        self.otel: OtelExport | None = None
        if config.otel_endpoint is not None:
            self.otel = OtelExport.to_endpoint(config.otel_endpoint, instance=self.instance)
        #: plans made here for other ingresses, until :meth:`plan_for` takes them
        self._planned: dict[str, Planned] = {}
        #: the client's future of each job this worker is the ingress of
        self._answers: dict[str, asyncio.Future[Any]] = {}
        self._streams: dict[str, Chunks] = {}  # job -> its chunks' sink
        #: every background task of this worker: plan requests, dials, the loops
        self.supervisor = Supervisor(self.name or "worker", log, on_failure=self._task_failed)
        # a worker without --name is named when it binds (start)
        self._bind_name(self.name or "(unbound)")
        self._server: Server | None = None
        self.membership: Membership | None = None
        #: the core's messages to peers, sent or held a moment (made again at start, with
        #: the membership's channels)
        self.outbox = self._outbox()
        self._background: list[asyncio.Task[None]] = []
        #: hot models warmed here when the cluster's rule picks this worker (--replicate)
        self.replicas: HotReplicas | None = None
        self._stopped = asyncio.Event()
        #: set while the worker drains (see :meth:`drain`)
        self.draining = False
        self._drained = asyncio.Event()  # draining, and nothing is left to finish
        self._hurry = asyncio.Event()  # a second stop(): end the drain now
        self._closing = False
        self._events: deque[Event] = deque()  # the one being carried out, and those after it
        self.failure: BaseException | None = None  # why it stopped on its own (a loop died)

    def _bind_name(self, name: str) -> None:
        """Name the worker; its view and its core are made for that name."""
        self.name = name
        self.supervisor.owner = name
        config = self.config
        self.gossip = Gossip(
            name,
            config,
            profiles=self.profiles,
            clock=self.clock,
            tick=lambda: self.apply(Tick(self.clock())),
        )
        self.core = build_core(
            name,
            workflows=self.app.workflows,
            policy=self.policy,
            profiles=self.profiles,
            view=self.gossip.port,
            cache=self.cache.core,
            options=core_options(
                config, instance=self.instance, inbox_keep_s=INBOX_KEEP_S / config.time_scale
            ),
        )
        self.gossip.attach(self.core)
        self._job_ids = JobIds(name, self.instance)  # the ingress names its jobs
        #: this worker's queues, lanes and cache decisions (the core's)
        self.lanes: Lanes = self.core.lanes

    @property
    def jobs_in_flight(self) -> int:
        """Jobs accepted at this ingress and not answered yet."""
        return len(self.core.ingress.jobs)

    @property
    def tasks_waiting_inputs(self) -> int:
        """Tasks here that wait for their inputs."""
        return len(self.core.inbox)

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        # read the certificates before opening anything: a bad file fails the start cleanly
        server_tls = cfg.tls.server_context() if cfg.tls is not None else None
        peer_tls = cfg.tls.client_context() if cfg.tls is not None else None
        await self.metrics.start()  # first: a port taken fails the start with nothing open
        self._server = await serve(
            cfg.host,
            cfg.port,
            ChannelOptions(
                name=cfg.name or "worker",
                token=cfg.token,
                limits=cfg.limits,
                timeouts=cfg.timeouts,
                ssl=server_tls,
            ),
            role="worker",
            handler=self.router.handle_request,
            notify_handler=self.router.handle_notify,
        )
        host, port = self._server.address[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if not cfg.name:
            self._bind_name(default_worker_name(port))
        self.membership = Membership(
            # what peers are told: never a wildcard bind (0.0.0.0 advertises the host's address)
            advertised_address(host, port, cfg.advertise_address),
            MembershipOptions.of_worker(cfg, self.name, self.instance, peer_tls),
            handler=self.router.handle_request,
            notify_handler=self.router.handle_notify,
            on_join=self._peer_joined,
            on_leave=self._peer_left,
            on_failure=self._task_failed,
        )
        self.outbox = self._outbox()
        self.membership.route(self.router)  # its probes and acks
        self.membership.stamp = self.gossip.stamp(self.app.workflows, await self.cache.prepare())
        self._background = [
            self._spawn(self.gossip.run(self.membership), "heartbeats"),
            # lost peers are retried (from both sides) for as long as the worker runs
            self._spawn(self.membership.run(), "rejoin"),
        ]
        for task in self._background:
            task.add_done_callback(self._background_done)
        if cfg.replicate is not None:
            self._replicate(cfg.replicate)
        if cfg.join:
            try:
                await self.membership.join(cfg.join, timeout_s=cfg.join_timeout_s)
            except BaseException:
                # no cluster to join (or this name is taken there): a worker alone would split
                # it, so it stops, and the process exits with the error
                await self.aclose()
                raise
        self.metrics.ready = True

    def _replicate(self, config: ReplicaConfig) -> None:
        """Run the hot-model rule's rounds (:mod:`compass.worker.replicas`): supervised, a
        failed round logged and counted; its counter in the scrape."""
        self.replicas = replicas = HotReplicas.of_worker(self, config)
        self.metrics.collectors.append(replicas)
        every_s = REPLICATE_EVERY_S * self.config.time_scale
        rounds = replicas.run(
            self.clock, every_s, real=time.monotonic, serving=lambda: not self.draining,
            failed=self._round_failed,
        )  # fmt: skip
        self._spawn(rounds, "replicas")

    def _round_failed(self) -> None:
        self.run_stats.internal_errors += 1

    async def aclose(self) -> None:
        """Stop serving: in-flight requests are answered or failed, connections closed.
        Idempotent; also what follows :meth:`stop` (a signal) once :meth:`wait` returns."""
        if self._closing:
            return
        self._closing = True
        self._stopped.set()
        for job_id, future in self._answers.items():
            if not future.done():
                future.set_exception(
                    WorkerUnavailable(f"worker {self.name} is shutting down; job {job_id} lost")
                )
        await self.metrics.aclose()  # before the wire: probes fail while the rest closes
        if self.membership is not None:
            await self.outbox.send_held(self.config.timeouts.close)
            # peers re-plan its jobs at once instead of waiting for the connection to drop, and
            # retry it soon: it is most often restarting
            self.membership.leave()
        if self._server is not None:
            await self._server.aclose()
        if self.membership is not None:
            await self.membership.aclose()
        self.outbox.close()
        await self.supervisor.aclose()  # what failed is logged, not dropped
        await self.runner.aclose()
        await self.cache.aclose()
        if self.otel is not None:
            # the spans still waiting go out (in a thread: the exporter blocks), if they can
            # within the exporter's own timeout
            await asyncio.to_thread(self.otel.shutdown)

    async def wait(self) -> None:
        await self._stopped.wait()

    async def drain(self, timeout_s: float) -> bool:
        """Leave gracefully: take no new jobs (a submission gets a retryable
        :class:`~compass.errors.WorkerUnavailable`, so a client fails over), tell the peers so
        that their planners place nothing new here, and finish what this worker holds: the jobs
        it is the ingress of, and the tasks queued and running here. Returns True once that is
        done, False if ``timeout_s`` passed first or :meth:`stop` was called again (what is
        left then fails over when the worker closes: the clients' retries and the peers'
        re-plans take it)."""
        if not self.draining:
            self.draining = True
            self.metrics.ready = False  # an orchestrator stops routing clients here
            if self.membership is not None:
                self.gossip.tell_draining(self.membership)
            log.info("%s: draining for up to %g s: %d jobs in flight here, %d tasks queued, "
                     "%d running", self.name, timeout_s, self.jobs_in_flight,
                     self._tasks_held(), self.lanes.busy + self.lanes.host_busy)  # fmt: skip
            self._check_drained()
        hurry = asyncio.ensure_future(self._hurry.wait())
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            await asyncio.wait({hurry, drained}, timeout=timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            hurry.cancel()
            drained.cancel()
        if self._drained.is_set():
            log.info("%s: drained: every job and task held here is done", self.name)
            return True
        log.warning("%s: drain ended with %d jobs in flight here and %d tasks held; they fail "
                    "over", self.name, self.jobs_in_flight, self._tasks_held())  # fmt: skip
        return False

    def _tasks_held(self) -> int:
        lanes = self.lanes
        return len(lanes.queue) + len(lanes.host_queue) + self.tasks_waiting_inputs

    def _check_drained(self) -> None:
        lanes = self.lanes
        if (
            not self.core.ingress.jobs
            and not self._tasks_held()
            and lanes.busy == 0
            and lanes.host_busy == 0
        ):
            self._drained.set()

    def _background_done(self, task: asyncio.Task[None]) -> None:
        """A lane or the heartbeat loop ended before the worker stopped: unable to run tasks or
        gossip, it stops (its peers re-plan its jobs); the process exits non-zero."""
        if task.cancelled() or self._closing:
            return
        error = task.exception()
        self.failure = error or RuntimeError(f"{task.get_name()} ended")
        log.critical("%s: %s stopped (%r); stopping the worker", self.name, task.get_name(),
                     self.failure)  # fmt: skip
        self.stop()

    def _task_failed(self, task: asyncio.Task[Any], error: BaseException) -> None:
        """A background task failed (a bug; the supervisor logged its traceback): counted."""
        self.run_stats.internal_errors += 1

    def stop(self) -> None:
        """Ask the worker to stop (signal handlers do); asked again, a drain ends at once."""
        if self._stopped.is_set():
            self._hurry.set()
        self._stopped.set()

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- membership ---------------------------------------------------------------------------
    def _peer_joined(self, peer: Peer) -> None:
        self.run_stats.peers_joined += 1
        # a new instance under a drained one's name is no longer draining
        self.apply(PeerJoined(self.clock(), peer.name, peer.member.instance))
        early = self.gossip.take_early(peer.name)
        if early is not None:  # its state came first: heard now, if of this incarnation
            self.heard_rumors([early], pass_on=False)
        if peer.name in self.outbox.held:
            asyncio.get_running_loop().call_soon(self.outbox.flush, peer.name)
        self.gossip.changed()  # the newcomer needs this worker's state now, not at the next tick
        if peer.channel is not None:  # met (a handshake); one only named is not dialed for it
            self.gossip.introduce(peer.name)

    def _peer_left(self, name: str, why: str) -> None:
        log.info("%s: peer %s gone (%s); re-planning its jobs", self.name, name, why)
        self.apply(PeerLost(self.clock(), name))

    # -- what peers say (checked at the door by requests.py) -----------------------------------
    def heard_from(self, peer: str) -> None:
        """A message of ``peer`` arrived on its own channel: it runs (a suspicion of it counts
        its silence from now: :meth:`~compass.worker.membership.Membership.spoke`)."""
        membership = self.membership
        if membership is not None:
            membership.spoke(peer)

    def heard(self, heartbeat: Heartbeat) -> None:
        """A peer's heartbeat: heard as one rumor not passed on (:meth:`heard_rumors`)."""
        self.heard_rumors([heartbeat], pass_on=False)

    def heard_rumors(self, states: list[Heartbeat], *, pass_on: bool) -> None:
        """Peers' states passed on as rumors, or a peer's whole view (a bounded view's sync,
        not passed on): each one of a live peer's current incarnation is heard like its
        heartbeat."""
        membership = self.membership
        if membership is None:
            return
        for state in states:
            if state.name == self.name:
                continue
            if membership.seen(state.name, state.incarnation):
                self.apply(Heard(self.clock(), state))
                if pass_on:
                    self.gossip.rumor_heard(state)
            else:
                self.gossip.keep_early(state, membership)

    def sync_asked(self, peer: str) -> None:
        self.gossip.sync_asked(peer)  # it joined and asks for every state the view holds

    def watched_by(self, peer: str, for_ms: float) -> None:
        """``peer`` plans over this worker: it gets its state on every change for ``for_ms``."""
        self.gossip.watched_by(peer, for_ms)

    def peer_draining(self, name: str) -> None:
        """Peer ``name`` drains before it stops: nothing new is planned there."""
        membership = self.membership
        peer = None if membership is None else membership.channels.peers.get(name)
        if peer is not None:
            instance = peer.member.instance
            self.apply(PeerDraining(self.clock(), name, instance))

    def receive(self, sender: str, msg: PeerMessage, spans: Any = None) -> None:
        """A typed message of peer ``sender``: an event of the core. ``spans``: the trace
        field it carried (a traced job's spans), kept before the message is handled, as a
        result may answer the job at once."""
        if (
            spans is not None
            and isinstance(msg, TaskMsg | ResultMsg | FailedMsg)
            and not self.core.is_done(msg.job, msg.attempt)
        ):
            self.tracer.incoming(msg.job, spans)
        if isinstance(msg, TaskMsg):  # a pushed input: its transfer time and its job's age
            wall, scale, now = time.time(), self.config.time_scale, self.clock()
            transfer_s, age_s = max(0.0, wall - msg.sent) / scale, max(0.0, wall - msg.t0) / scale
            self.apply(Received(now, sender, msg, transfer_s, now - age_s))
            return
        if isinstance(msg, DoneMsg) and msg.below is None and self.tracer.jobs:
            self.tracer.forget(msg.job)
        self.apply(Received(self.clock(), sender, msg))

    # -- the core: events in, instructions out --------------------------------------------------
    def apply(self, event: Event) -> None:
        """Feed ``event`` to the core and carry out what it says, in order; an event that
        arises meanwhile (a send failed) waits for that. Whatever goes wrong is logged and
        counted: no message nor task can stop the worker. A closing one takes no events."""
        if self._closing:
            return
        self._events.append(event)
        if len(self._events) > 1:
            return  # carried out by the call under way, after the one it is carrying out
        while self._events:
            try:
                self._carry_out(self._events[0])
            except Exception:
                self.run_stats.internal_errors += 1
                log.exception("%s: handling %s failed", self.name, type(self._events[0]).__name__)
            self._events.popleft()

    def _carry_out(self, event: Event) -> None:
        version = self.lanes.version
        for step in self.core.handle(event):
            match step:
                case Send():
                    self.outbox.send(step.peer, step.msg)
                case RunTask():
                    self.runner.start(step)
                case LoadModel():
                    fetched = functools.partial(self._model_fetched, time.time(), step.prefetch)
                    self.cache.fetch(step.model, step.evict, fetched)
                case Answer():
                    self._deliver(step)
                case AskPlan():
                    self._spawn(self._ask_plan(step), name=f"plan-{step.request.job}")
                case Planned():
                    self._planned[step.job_id] = step
                case Watch():
                    for peer in self.gossip.watch(step.peers):
                        self.apply(WatchFailed(self.clock(), peer))
                case StopTask() | SuspendTask() | JoinRun():  # what happens at a step's end
                    self.runner.between_steps(step)
                case Chunk():
                    if (sink := self._streams.get(step.job_id)) is not None:
                        sink(step.job_id, step.task, step.seq, step.value)
                case Feed():
                    self.runner.feeds.apply(step)
                case Fault():
                    self.run_stats.internal_errors += 1
                    log.error("%s: handling %s failed", self.name, step.cause,
                              exc_info=step.error)  # fmt: skip
                case _:
                    assert_never(step)
        if self.lanes.version != version:
            self.gossip.changed()  # the queue, the lanes or the cache changed: gossip it
        if self.draining:
            self._check_drained()

    def _model_fetched(
        self, started: float, prefetch: bool, model: str, result: float | CompassError
    ) -> None:
        error = type(result).__name__ if isinstance(result, CompassError) else ""
        self.metrics.timeline.load_ended(model, started, prefetch, error)
        if isinstance(result, CompassError):
            self.apply(LoadFailed(self.clock(), model, result))
        else:
            self.apply(ModelLoaded(self.clock(), model, result))

    def _deliver(self, answer: Answer) -> None:
        future = self._answers.get(answer.job_id)
        if future is not None and not future.done():
            if answer.error is not None:
                _name_job(answer.error, answer.job_id)
                future.set_exception(answer.error)
            else:
                future.set_result(answer.value)
        if answer.record:
            self.trace.append(dict(answer.record))
            self.metrics.job_answered(answer.record, answer.error, waited=future is not None)
            if self.tracer.jobs:
                self._finish_trace(answer)

    def _finish_trace(self, answer: Answer) -> None:  # a traced job's: kept and exported
        record = answer.record
        workflow = self.app.workflows.get(str(record.get("workflow")))
        error = "" if answer.error is None else type(answer.error).__name__
        answered = self.tracer.finish(
            answer.job_id, record, workflow, ingress=self.name, answered=time.time(), error=error
        )
        if answered is not None and self.otel is not None:
            trace = self.tracer.trace(answer.job_id) or answered.assemble(answer.job_id)
            self.otel.job(trace, answered.tracing)

    def _note_plan(self, job_id: str) -> None:
        job = self.core.ingress.jobs.get(job_id)  # a traced job planned here: its plan is kept
        if job is not None:
            self.tracer.planned(job_id, job.attempt, job.plan, time.time())

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self.supervisor.spawn(coro, f"{self.name}-{name}")

    def _outbox(self) -> Outbox:
        channels = None if self.membership is None else self.membership.channels
        return Outbox(
            self.name, channels, self.tracer, apply=self.apply, clock=self.clock, spawn=self._spawn
        )

    async def _ask_plan(self, step: AskPlan) -> None:
        """The ``central`` policy plans at one worker: ask it; no answer, or a bug here (logged,
        counted), means plan here: no job waits for a plan that never comes."""
        assert self.membership is not None
        job = step.request.job
        plan = None
        try:
            channel = await self.membership.channels.open_channel(step.peer)
            if channel is not None:
                plan = PlanReply.from_wire(await channel.request("plan", step.request.to_wire()))
        except CompassError as exc:
            log.warning("%s: %s could not plan job %s: %s", self.name, step.peer, job, exc)
        except Exception:
            self.run_stats.internal_errors += 1
            log.exception("%s: asking %s to plan job %s failed; planning it here", self.name,
                          step.peer, job)  # fmt: skip
        self.apply(PlanReady(self.clock(), job, plan))
        if job in self.tracer.jobs:
            self._note_plan(job)

    # -- the public surface of the core ---------------------------------------------------------
    async def submit(
        self,
        workflow: str,
        inputs: Any,
        key: str | None = None,
        objective: Objective = NO_OBJECTIVE,
    ) -> Any:
        """Run a job of ``workflow`` with this worker as its ingress; its answer (raises the
        job's error). ``key``: the client's name for the job (a resubmission attaches);
        ``objective``: its deadline and priority."""
        return (await self.submit_job(workflow, inputs, key, objective))[1]

    async def submit_job(
        self,
        workflow: str,
        inputs: Any,
        key: str | None = None,
        objective: Objective = NO_OBJECTIVE,
        *,
        trace: bool = False,
        traceparent: str | None = None,
        chunks: Chunks | None = None,
    ) -> tuple[str, Any]:
        """:meth:`submit`, answering the job's id with its answer (an error names it too).
        ``trace``: trace it whatever the sampling; ``traceparent``: the caller's W3C context;
        ``chunks(job, task, seq, value)``: the job streams its sinks' partial outputs there."""
        job_id, future = self.begin_job(
            workflow, inputs, key, objective, trace=trace, traceparent=traceparent, chunks=chunks
        )
        try:
            return job_id, await future
        finally:
            del future  # else future, error, its traceback and this frame (inputs too): a cycle

    def begin_job(
        self,
        workflow: str,
        inputs: Any,
        key: str | None = None,
        objective: Objective = NO_OBJECTIVE,
        *,
        trace: bool = False,
        traceparent: str | None = None,
        chunks: Chunks | None = None,
    ) -> tuple[str, asyncio.Future[Any]]:
        """:meth:`submit_job` up to its wait, now (a request handler starts its job in the
        loop turn that read it): the job's id, and the future of its answer (its error names
        the job), which a wire submit answers from as it is set, with no task between
        (:class:`~compass.wire.handlers.Later`). Cancelling the future cancels the job; once
        answered or cancelled, the worker forgets it (a done callback)."""
        if self._stopped.is_set():
            state = "draining" if self.draining and not self._closing else "shutting down"
            raise WorkerUnavailable(
                f"worker {self.name} is {state}: it takes no new jobs; submit to another worker"
            )
        job_id = self._job_ids()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._answers[job_id] = future
        if chunks is not None:
            self._streams[job_id] = chunks
        tracing = self.tracer.start(
            job_id, forced=trace, traceparent=traceparent, received=time.time(),
            follow_caller=self.otel is not None,
        )  # fmt: skip
        future.add_done_callback(functools.partial(self._job_ended, job_id, tracing is not None))
        now, wall = self.clock(), time.time()
        size = payload_bytes(inputs)
        self.apply(Submit(now, job_id, workflow, inputs, size, wall, key, objective,
                          stream=chunks is not None))  # fmt: skip
        if tracing is not None:
            self._note_plan(job_id)
        return job_id, future

    def _job_ended(self, job_id: str, traced: bool, future: asyncio.Future[Any]) -> None:
        """Job ``job_id``'s future is done: answered, or cancelled (its caller stopped
        waiting: the job is cancelled)."""
        self._answers.pop(job_id, None)
        self._streams.pop(job_id, None)
        if future.cancelled():
            self.apply(Cancel(self.clock(), job_id))
        if traced:
            self.tracer.forget(job_id)  # answered (kept already), or never accepted

    @property
    def stats(self) -> WorkerStats:
        """Every counter, the core's, the adapter's and the membership's (a new count at each
        read)."""
        stats = self.core.stats.plus(self.run_stats)
        if self.membership is not None:
            stats.suspicions_refuted = self.membership.suspicions_refuted
            stats.deaths_refuted = self.membership.deaths_refuted
        return stats

    def status(self) -> dict[str, Any]:
        return describe(self)  # what compass status shows

    def table_sizes(self) -> dict[str, float]:
        """Entries in each table keyed by jobs, peers or time (compass.worker.tables)."""
        return table_sizes(self)

    def plan_for(self, request: PlanRequest) -> dict[str, str]:
        """Plan another ingress's job here (the ``central`` policy plans at one worker); the
        placements count in this worker's view. Raises what stopped it."""
        self.apply(PlanAsked(self.clock(), request))
        planned = self._planned.pop(request.job, None)
        if planned is None:
            raise WorkerUnavailable(f"worker {self.name} could not plan job {request.job}")
        if planned.error is not None:
            raise planned.error
        assert planned.plan is not None
        return planned.plan

    # -- carrying out tasks --------------------------------------------------------------------
    def _task_finished(self, outcome: TaskOutcome) -> None:
        self.run_stats.record(outcome)
        self.metrics.task_finished(outcome)
        entry = outcome.entry
        if self.tracer.jobs and entry.job_id in self.tracer.jobs:
            self._trace_task(outcome)
        self.apply(outcome.event(self.clock()))

    def _trace_task(self, outcome: TaskOutcome) -> None:
        """A task of a traced job ended: its span goes with the job's next messages (kept
        before the core sends them), and to OpenTelemetry."""
        entry = outcome.entry
        span = task_span(
            outcome, self.name, wall=time.time(), now=self.clock(), scale=self.config.time_scale
        )
        tracing = self.tracer.task_ended(entry.job_id, span)
        if tracing is not None and self.otel is not None:
            self.otel.task(entry.job_id, entry.workflow, span, tracing)

    def _task_returned(self, entry: QueuedTask) -> None:
        """The thread of a task abandoned past its timeout returned: its model is released."""
        self.apply(TaskReturned(self.clock(), entry))


def _name_job(error: CompassError, job_id: str) -> None:
    """Put ``job_id`` in ``error``'s detail (the client reads it as ``error.job_id``), unless
    it names a job already: a resubmitted key's answer names the job that ran."""
    if error.detail is None:
        error.detail = {"job_id": job_id}
    elif isinstance(error.detail, dict):
        error.detail.setdefault("job_id", job_id)
