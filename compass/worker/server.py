"""The worker process: the asyncio adapter around the worker core.

The rules (admission, planning, the inbox, attempts, adjustment, one answer per job) live in
the sans-IO :class:`~compass.worker.state.WorkerCore`; this module owns the sockets, the
threads and the timers. It turns what arrives (a client's submit, a peer's message, a task's
outcome, a lost peer) into the core's events and carries out the instructions the core
returns (send a message, queue a task, drop a job's tasks, answer a client).

One job's way through (see docs/ARCHITECTURE.md):

1. a client sends ``submit``; this worker becomes the job's *ingress*, validates the inputs and
   plans the whole job from its view of the cluster;
2. each root task gets the job's inputs and the plan, pushed straight to its planned worker;
3. a worker gathers a task's inputs (a join waits for all), queues it, runs it on a lane;
4. when a task finishes, each successor's placement is re-checked (dynamic adjustment) and the
   output pushed there; a sink's output goes back to the ingress;
5. the ingress answers the client once, then tells the workers involved to drop the job's data.

If a peer is lost, every unanswered job that involved it is planned again from the inputs the
ingress kept (a new *attempt*; messages of older attempts are ignored), so each job is answered
exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import compass
from compass.app import App
from compass.cache.models import ModelCache
from compass.config import WorkerConfig
from compass.errors import (
    CompassError,
    CompassTimeout,
    InvalidInputs,
    JobFailed,
    ProtocolError,
    WorkerUnavailable,
)
from compass.sched import Policy, make_policy
from compass.sched.policies import worker_seed
from compass.wire.rpc import Router
from compass.wire.transport import Channel, Server, serve
from compass.worker.executor import Executor, TaskOutcome
from compass.worker.gossip import Gossip
from compass.worker.membership import Membership, Peer, advertised_address
from compass.worker.messages import (
    DoneMsg,
    FailedMsg,
    PeerMessage,
    PlacedMsg,
    PlanReply,
    PlanRequest,
    ResultMsg,
    TaskMsg,
    decode,
)
from compass.worker.metrics import WorkerMetrics
from compass.worker.state import (
    Answer,
    AskPlan,
    Cancel,
    Drop,
    DropIngress,
    Enqueue,
    Event,
    PeerLost,
    PlanReady,
    Received,
    Send,
    Submit,
    TaskDone,
    TaskFailed,
    Undeliverable,
    WorkerCore,
)
from compass.worker.stats import WorkerStats, payload_bytes
from compass.workflow.dag import Task
from compass.workflow.profile import Profiles

__all__ = ["Worker"]

log = logging.getLogger("compass.worker")

PeerHandler = Callable[[Channel, Any], None]

#: pushes at least this large feed the measured network bandwidth
_MEASURED_TRANSFER_BYTES = 1 << 20


def default_worker_name(port: int) -> str:
    """A worker started without ``--name`` is ``<host>-<port>``: unique wherever hosts are."""
    return f"{socket.gethostname().split('.')[0] or 'worker'}-{port}"


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
        self._host_lanes = config.host_lanes > 0
        self.name = config.name
        self.address = ""
        self.stats = WorkerStats()
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
        self.executor = Executor(
            lanes=config.lanes,
            cache=self.cache,
            lookup=self._task,
            emulate=config.emulate,
            time_scale=config.time_scale,
            on_outcome=self._task_finished,
            clock=self.clock,
            on_change=self._state_changed,
            host_lanes=config.host_lanes,
            task_timeout_s=config.task_timeout_s,
            max_stuck=config.max_stuck_tasks,
        )
        self.cache.on_change = self._state_changed
        self.router = self._make_router()
        self._warms = (
            config.sched.warm and self.policy.warms_cache and config.cache.prefetch_depth > 0
        )
        #: the last answered jobs of this ingress, for benchmarks and `compass status`
        self.trace: deque[dict[str, Any]] = deque(maxlen=config.trace_jobs)
        #: the client's future of each job this worker is the ingress of
        self._answers: dict[str, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # a worker without --name is named when it binds (start)
        self._bind_name(self.name or "(unbound)")
        self._server: Server | None = None
        self.membership: Membership | None = None
        self._background: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._closing = False
        #: why the worker stopped on its own (a background loop died), else None
        self.failure: BaseException | None = None

    def _bind_name(self, name: str) -> None:
        """Name the worker; its view and its core are made for that name."""
        self.name = name
        self.gossip = Gossip(
            name,
            self.config,
            profiles=self.profiles,
            executor=self.executor,
            cache=self.cache,
            workflows=lambda: list(self.app.workflows.values()),
            clock=self.clock,
            warms=self._warms,
        )
        self.core = WorkerCore(
            name,
            workflow=self.app.get_workflow,
            policy=self.policy,
            profiles=self.profiles,
            view=self.gossip,
            host_lanes=self._host_lanes,
            max_jobs=self.config.max_jobs,
            max_job_bytes=self.config.max_job_bytes,
            stats=self.stats,
        )

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
            token=cfg.token,
            name=cfg.name or "worker",
            role="worker",
            handler=self.router.handle_request,
            notify_handler=self.router.handle_notify,
            limits=cfg.limits,
            timeouts=cfg.timeouts,
            ssl=server_tls,
        )
        host, port = self._server.address[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if not cfg.name:
            self._bind_name(default_worker_name(port))
        self.membership = Membership(
            name=self.name,
            # what peers are told: never a wildcard bind (0.0.0.0 advertises the host's address)
            address=advertised_address(host, port, cfg.advertise_address),
            token=cfg.token,
            limits=cfg.limits,
            timeouts=cfg.timeouts,
            handler=self.router.handle_request,
            notify_handler=self.router.handle_notify,
            on_join=self._peer_joined,
            on_leave=self._peer_left,
            ssl=peer_tls,
        )
        await self.cache.prepare()
        self._background = [
            asyncio.create_task(self.executor.run(), name=f"{self.name}-lanes"),
            asyncio.create_task(self.gossip.run(self.membership), name=f"{self.name}-heartbeats"),
        ]
        for task in self._background:
            task.add_done_callback(self._background_done)
        # lost peers are retried (from both sides) for as long as the worker runs
        rejoin = asyncio.create_task(self.membership.run(), name=f"{self.name}-rejoin")
        rejoin.add_done_callback(self._background_done)
        self._background.append(rejoin)
        if cfg.join:
            try:
                await self.membership.join(cfg.join, timeout_s=cfg.join_timeout_s)
            except BaseException:
                # no cluster to join (or this name is taken there): a worker alone would split
                # it, so it stops, and the process exits with the error
                await self.aclose()
                raise
        self.metrics.ready = True

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
            # peers forget a worker that leaves on purpose instead of retrying it for a day
            self.membership.broadcast("leave", {"name": self.name})
        if self._server is not None:
            await self._server.aclose()
        if self.membership is not None:
            await self.membership.aclose()
        for task in [*self._background, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._background, *self._tasks, return_exceptions=True)
        await self.cache.aclose()

    async def wait(self) -> None:
        await self._stopped.wait()

    def _background_done(self, task: asyncio.Task[None]) -> None:
        """A lane or the heartbeat loop ended before the worker stopped: a worker that can no
        longer run tasks or gossip must not keep accepting them, so it stops (its peers then
        drop it and re-plan its jobs) and the process exits non-zero."""
        if task.cancelled() or self._closing:
            return
        error = task.exception()
        self.failure = error or RuntimeError(f"{task.get_name()} ended")
        log.critical(
            "%s: %s stopped (%r); stopping the worker",
            self.name,
            task.get_name(),
            self.failure,
            exc_info=error,
        )
        self.stop()

    def stop(self) -> None:
        """Ask the worker to stop (signal handlers call this)."""
        self._stopped.set()

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the request table ---------------------------------------------------------------------
    def _make_router(self) -> Router:
        router = Router()
        router.inline("ping")(self._on_ping)
        router.inline("status")(self._on_status)
        router.inline("trace")(self._on_trace)
        router.request("submit")(self._on_submit)
        router.request("join")(self._on_join)
        router.request("plan")(self._on_plan)
        router.notify("heartbeat")(self._from_peers(self._on_heartbeat))
        router.notify("leave")(self._from_peers(self._on_leave))
        for message in (TaskMsg, ResultMsg, FailedMsg, PlacedMsg, DoneMsg):
            router.notify(message.op)(self._on_peer_message(message.op))
        return router

    def _on_ping(self, channel: Channel, body: Any) -> Any:
        return body

    def _on_status(self, channel: Channel, body: Any) -> dict[str, Any]:
        return self.status()

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "version": compass.__version__,
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "policy": self.policy.name,
            "emulate": self.config.emulate,
            "advertised": "" if self.membership is None else self.membership.address,
            "peers": [] if self.membership is None else self.membership.describe(),
            # peers lost and being retried (with backoff) until they answer again
            "lost": [] if self.membership is None else self.membership.describe_lost(),
            # the workers this one can place tasks on (itself and every peer it has heard from)
            # and what its planner currently believes of each
            "cluster": self.gossip.describe(),
            "workflows": sorted(self.app.workflows),
            "queue": {
                "ready": len(self.executor.queue),
                "waiting_inputs": len(self.core.inbox),
                "running": self.executor.busy,
                "lanes": self.executor.lanes,
                "wait_ms": round(self.executor.queue.wait_s() * 1000, 3),
                "host_ready": len(self.executor.host_queue),
                "host_running": self.executor.host_busy,
                "host_lanes": self.executor.host_lanes,
                "stuck": self.executor.stuck,
                "degraded": self.executor.degraded,
            },
            "jobs_in_flight": len(self.core.jobs),
            "cache": self.cache.snapshot(),
            "stats": self.stats.to_wire(),
            "metrics": self.metrics.address or None,
        }

    def _on_trace(self, channel: Channel, body: Any) -> list[dict[str, Any]]:
        """The records of recently answered jobs; ``{"clear": true}`` empties the log."""
        records = list(self.trace)
        if isinstance(body, dict) and body.get("clear"):
            self.trace.clear()
        return records

    async def _on_join(self, channel: Channel, body: Any) -> dict[str, Any]:
        self._require_peer(channel, "join")
        assert self.membership is not None
        return self.membership.accept_join(channel, body)

    def _from_peers(self, handler: PeerHandler) -> PeerHandler:
        """A one-way handler that only workers may trigger; from a client it is dropped."""

        def guarded(channel: Channel, body: Any) -> None:
            if channel.peer_role != "worker":
                self.stats.messages_dropped += 1
                log.warning("%s: dropped a peer message from %s", self.name, channel.peer_role)
                return
            handler(channel, body)

        return guarded

    def _require_peer(self, channel: Channel, op: str) -> None:
        if channel.peer_role != "worker":
            raise ProtocolError(f"{op!r} is for workers; a {channel.peer_role} sent it")

    # -- membership and the view ---------------------------------------------------------------
    def _state_changed(self) -> None:
        self.gossip.changed()

    def _on_heartbeat(self, channel: Channel, body: Any) -> None:
        # one of a peer that joined, of its current incarnation, counts (not one naming this
        # worker, nor a stranger); a malformed one is dropped like any bad peer message
        assert self.membership is not None
        try:
            self.gossip.on_heartbeat(channel, body, self.membership)
        except CompassError as exc:
            self.stats.messages_dropped += 1
            log.warning("%s: dropped a malformed heartbeat from %s: %s", self.name,
                        channel.peer_name, exc)  # fmt: skip

    def _on_leave(self, channel: Channel, body: Any) -> None:
        """A peer stopped on purpose: forget it (no retries), re-plan what it held."""
        assert self.membership is not None
        if isinstance(body, dict) and isinstance(body.get("name"), str):
            self.membership.forget(body["name"], "it left the cluster")

    def _peer_joined(self, peer: Peer) -> None:
        self.stats.peers_joined += 1
        self._state_changed()  # the newcomer needs this worker's state now, not at the next tick

    def _peer_left(self, name: str, why: str) -> None:
        log.warning("%s: peer %s lost (%s); re-planning its jobs", self.name, name, why)
        self._apply(PeerLost(self.clock(), name))

    # -- the core: events in, instructions out --------------------------------------------------
    def _apply(self, event: Event) -> None:
        """Feed ``event`` to the core and carry out what it says, in order. Whatever goes
        wrong here is logged and counted: no message and no task can stop the worker."""
        try:
            self._carry_out(event)
        except Exception:
            self.stats.internal_errors += 1
            log.exception("%s: handling %s failed", self.name, type(event).__name__)

    def _carry_out(self, event: Event) -> None:
        for step in self.core.handle(event):
            match step:
                case Send():
                    self._send(step.peer, step.msg)
                case Enqueue():
                    self.executor.submit(step.entry)
                case Drop():
                    self.executor.drop_job(step.job_id, step.below)
                case DropIngress():
                    self.executor.drop_ingress(step.ingress)
                case Answer():
                    self._deliver(step)
                case AskPlan():
                    self._spawn(self._ask_plan(step), name=f"plan-{step.request.job}")

    def _send(self, worker: str, msg: PeerMessage) -> None:
        channel = None if self.membership is None else self.membership.channel(worker)
        if channel is None or channel.closed:
            # the peer is gone: its jobs' ingresses re-plan them (PeerLost)
            self.stats.messages_dropped += 1
            return
        body = msg.to_wire()
        if isinstance(msg, TaskMsg):
            body["sent"] = time.time()  # the receiver derives the push's transfer time
        try:
            channel.notify(msg.op, body)
        except Exception as exc:  # an output the wire cannot encode, or a channel just closed
            why = f"{type(exc).__name__}: {exc}"
            log.warning("%s: could not send %r to %s: %s", self.name, msg.op, worker, why)
            self._apply(Undeliverable(self.clock(), worker, msg, why))

    def _deliver(self, answer: Answer) -> None:
        future = self._answers.get(answer.job_id)
        if future is not None and not future.done():
            if answer.error is not None:
                future.set_exception(answer.error)
            else:
                future.set_result(answer.value)
        if answer.record:
            self.trace.append(dict(answer.record))
            self.metrics.job_answered(answer.record, answer.error, waited=future is not None)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=f"{self.name}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask_plan(self, step: AskPlan) -> None:
        """The ``central`` policy plans at one worker: ask it; no answer means plan here."""
        assert self.membership is not None
        channel = self.membership.channel(step.peer)
        plan = None
        if channel is not None:
            try:
                plan = PlanReply.from_wire(await channel.request("plan", step.request.to_wire()))
            except CompassError as exc:
                log.warning("%s: %s could not plan job %s: %s", self.name, step.peer,
                            step.request.job, exc)  # fmt: skip
        self._apply(PlanReady(self.clock(), step.request.job, plan))

    # -- ingress: submit, answer ---------------------------------------------------------------
    async def _on_submit(self, channel: Channel, body: Any) -> Any:
        if self._stopped.is_set():
            raise WorkerUnavailable(f"worker {self.name} is shutting down")
        if not isinstance(body, dict) or not isinstance(body.get("workflow"), str):
            raise InvalidInputs("submit needs {workflow: str, inputs: {name: value}}")
        inputs = body.get("inputs") or {}
        key = body.get("key")
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= 128):
            raise InvalidInputs("a job key must be a string of 1 to 128 characters")
        job_id = self.core.new_job_id()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._answers[job_id] = future
        try:
            self._apply(
                Submit(
                    self.clock(),
                    job_id,
                    body["workflow"],
                    inputs,
                    payload_bytes(inputs),
                    time.time(),
                )
            )
            return await future
        finally:
            self._answers.pop(job_id, None)
            if not future.done() or future.cancelled():  # the client stopped waiting
                self._apply(Cancel(self.clock(), job_id))

    async def _on_plan(self, channel: Channel, body: Any) -> dict[str, str]:
        """Plan a job for another ingress (the ``central`` policy plans at one worker)."""
        self._require_peer(channel, "plan")
        if not isinstance(body, dict):
            raise ProtocolError("a plan request must be a map")
        return self.core.plan_for(PlanRequest.from_wire(body), self.clock())

    # -- every worker: messages and tasks ------------------------------------------------------
    def _task(self, workflow: str, task: str) -> Task:
        return self.app.get_workflow(workflow).tasks[task]

    def _on_peer_message(self, op: str) -> PeerHandler:
        """The one-way handler of ``op``: only workers may send it; a malformed message is
        counted and dropped, never raised inside the worker."""

        def handle(channel: Channel, body: Any) -> None:
            if channel.peer_role != "worker":
                self.stats.messages_dropped += 1
                log.warning("%s: dropped %r from a %s", self.name, op, channel.peer_role)
                return
            try:
                msg = decode(op, body)
            except ProtocolError as exc:
                self.stats.messages_dropped += 1
                log.warning("%s: dropped a malformed %r from %s: %s", self.name, op,
                            channel.peer_name, exc)  # fmt: skip
                return
            if isinstance(msg, TaskMsg):
                self._apply(self._task_arrived(channel, msg))
            else:
                self._apply(Received(self.clock(), channel.peer_name, msg))

        return handle

    def _task_arrived(self, channel: Channel, msg: TaskMsg) -> Received:
        """A pushed task input: its transfer time and its job's age, from the wall clock."""
        scale = self.config.time_scale
        wall = time.time()
        transfer_s = max(0.0, wall - msg.sent) / scale
        now = self.clock()
        if not self.config.emulate and transfer_s > 0:
            nbytes = payload_bytes(msg.value)
            if nbytes >= _MEASURED_TRANSFER_BYTES:  # small pushes measure latency, not bandwidth
                self.profiles.observe_transfer(channel.peer_name, self.name, nbytes, transfer_s)
        arrival = now - max(0.0, wall - msg.t0) / scale
        return Received(now, channel.peer_name, msg, transfer_s, arrival)

    def _task_finished(self, outcome: TaskOutcome) -> None:
        entry = outcome.entry
        self.stats.record(outcome)
        self.metrics.task_finished(outcome)
        now = self.clock()
        if outcome.error is not None:
            error = outcome.error
            # compass's own verdicts keep their type for the client; a task's error is JobFailed
            code = error.code if isinstance(error, CompassTimeout | WorkerUnavailable) else ""
            text = f"{type(error).__name__}: {error}"
            self._apply(TaskFailed(now, entry, text, outcome.error_text, code or JobFailed.code))
            return
        if not self.config.emulate:
            self.profiles.observe_exec(entry.workflow, entry.task, self.name, outcome.exec_s)
            self.profiles.observe_output(entry.workflow, entry.task, payload_bytes(outcome.output))
        self._apply(TaskDone(now, entry, outcome.output))
