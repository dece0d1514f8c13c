"""The worker's request table: what clients and peers may ask of a worker, checked at the door.

Clients may ``ping``, ask for ``status``, ``trace`` (the records of answered jobs),
``traces`` (the traces of traced jobs), ``timeline`` (task spans and model loads, for a
benchmark's timeline) and ``story`` (what the worker's cores logged of a job, a peer or a
cause id), and ``submit`` jobs. Peers (channels
that authenticated as workers) may also ``join``, ask for a ``plan``, and send one-way
heartbeats, ``leave`` notices and the typed peer messages of :mod:`compass.core.messages`. A
peer-only request from a client is refused with a :class:`~compass.errors.ProtocolError`; a
peer-only notification from a client, or a malformed one from a peer, is counted as dropped and
logged: it never raises inside the worker. What passes becomes an event of the worker core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import compass
from compass.core.messages import PEER_MESSAGES, PeerMessage, PlanRequest, decode
from compass.errors import (
    CompassError,
    ConfigError,
    InvalidInputs,
    ProtocolError,
    WorkerUnavailable,
)
from compass.gossip.spread import MAX_RUMORS
from compass.objective import NO_OBJECTIVE, Objective
from compass.observe.shown import Holdings, Identity, Records, queue_status
from compass.observe.timeline import JobEnd
from compass.observe.tracing import TRACE_FIELD
from compass.observe.usage import process_usage
from compass.sched.heartbeat import Heartbeat
from compass.wire.handlers import Later, StreamResult
from compass.wire.rpc import Router
from compass.wire.transport import Channel
from compass.worker.streaming import stream_job
from compass.worker.windows import READ_OP, Chunks, StreamedSteps

if TYPE_CHECKING:
    from compass.app import App
    from compass.core.state import WorkerCore
    from compass.core.stats import WorkerStats
    from compass.elastic.rule import Decision
    from compass.worker.gossip import Gossip
    from compass.worker.membership import Membership
    from compass.worker.replicas import HotReplicas

__all__ = [
    "Described",
    "Holdings",
    "Identity",
    "Records",
    "Served",
    "describe",
    "make_router",
    "queue_status",
]

log = logging.getLogger("compass.worker")

PeerHandler = Callable[[Channel, Any], None]

#: the longest job key a client may give
MAX_KEY_CHARS = 128

#: the longest key a ``story`` request may name
MAX_STORY_KEY_CHARS = 256

#: traces one ``traces`` answer holds at most, and task spans one ``timeline`` answer
MAX_TRACES = 100
MAX_TIMELINE_SPANS = 2000
#: the most recent traces ``compass status`` lists
STATUS_TRACES = 5


# What this module needs of a worker, by concern (compass.worker.server.Worker is each of them):
# who it is, what it holds and what it records are compass.observe.shown's, which the dashboard
# and the metrics read too.


class Described(Identity, Holdings, Records, Protocol):
    """What ``compass status`` reads of a worker: the above, its peers and view of them, and
    the workflows it serves."""

    @property
    def membership(self) -> Membership | None: ...

    @property
    def gossip(self) -> Gossip: ...

    @property
    def app(self) -> App: ...

    @property
    def replicas(self) -> HotReplicas | None:
        """Its hot-model replication (``--replicate``), or None."""

    def table_sizes(self) -> dict[str, float]:
        """Entries in each of its tables keyed by jobs, peers or time, by name."""


class Served(Described, Protocol):
    """What the request handlers read (``status``, ``story``) and what they ask the worker to
    do."""

    @property
    def core(self) -> WorkerCore:
        """Its rules (their stimulus log answers ``story``)."""

    @property
    def trace(self) -> deque[dict[str, Any]]:
        """The records of the last jobs answered here."""

    @property
    def run_stats(self) -> WorkerStats:
        """The adapter's own counters: messages refused at the door count there."""

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
    ) -> tuple[str, Any]: ...

    def begin_job(
        self,
        workflow: str,
        inputs: Any,
        key: str | None = None,
        objective: Objective = NO_OBJECTIVE,
        *,
        trace: bool = False,
        traceparent: str | None = None,
    ) -> tuple[str, asyncio.Future[Any]]: ...

    @property
    def streamed(self) -> StreamedSteps:
        """The windows of its streamed sinks: what a reader took moves them on."""

    def plan_for(self, request: PlanRequest) -> dict[str, str]: ...

    def heard(self, heartbeat: Heartbeat) -> None: ...

    def heard_from(self, peer: str) -> None: ...

    def heard_rumors(self, states: list[Heartbeat], *, pass_on: bool) -> None: ...

    def watched_by(self, peer: str, for_ms: float) -> None: ...

    def sync_asked(self, peer: str) -> None: ...

    def peer_draining(self, name: str) -> None: ...

    def receive(self, sender: str, msg: PeerMessage, spans: Any = None) -> None: ...


def make_router(worker: Served) -> Router:
    """The request table of ``worker``."""
    router = Router()
    requests = _Requests(worker)
    router.inline("ping")(requests.ping)
    router.inline("status")(requests.status)
    router.inline("trace")(requests.trace)
    router.inline("traces")(requests.traces)
    router.inline("timeline")(requests.timeline)
    router.inline("story")(requests.story)
    router.request("submit")(requests.submit)
    router.stream("stream")(requests.stream)
    router.request("join")(requests.join)
    router.request("plan")(requests.plan)
    router.notify("heartbeat")(requests.from_peers("heartbeat", requests.heartbeat))
    router.notify("rumors")(requests.from_peers("rumors", requests.rumors))
    router.notify("watch")(requests.from_peers("watch", requests.watch))
    router.notify("leave")(requests.from_peers("leave", requests.leave))
    router.notify("drain")(requests.from_peers("drain", requests.drain))
    router.notify(READ_OP)(requests.from_peers(READ_OP, requests.read))
    for message in PEER_MESSAGES:
        handler = requests.peer_message(message.op)
        router.notify(message.op)(requests.from_peers(message.op, handler))
    return router


def _desired(decision: Decision) -> dict[str, Any]:
    return {"desired": decision.desired, "reason": decision.reason, "pressure": decision.pressure}


def _replicas(worker: Described) -> dict[str, Any]:
    if worker.replicas is None:
        return {}
    resident, loading = worker.lanes.cache.residency()
    return worker.replicas.describe(resident | loading, time.monotonic())


def describe(worker: Described) -> dict[str, Any]:
    """``compass status``: the worker, its peers, its queues, cache and counters."""
    membership = worker.membership
    return {
        "name": worker.name,
        "address": worker.address,
        "version": compass.__version__,
        "uptime_s": round(time.monotonic() - worker.started_at, 3),
        "policy": worker.policy.name,
        "emulate": worker.config.emulate,
        "instance": worker.instance,
        "draining": worker.draining,
        "advertised": "" if membership is None else membership.table.address,
        "peers": [] if membership is None else membership.describe(),
        # channels to peers open now (opened on demand, closed when idle)
        "peer_channels": 0 if membership is None else membership.channels.open_channels,
        # join handshakes this worker made: joining through a seed, and redials of known peers
        "peer_handshakes": {} if membership is None else dict(membership.handshakes),
        # peers lost and being retried (with backoff) until they answer again
        "lost": [] if membership is None else membership.describe_lost(),
        # the workers this one can place tasks on (itself and every peer it has heard from)
        # and what its planner currently believes of each
        "cluster": worker.gossip.describe(),
        # the view's kind; in a bounded one, who watches this worker's load and whom it watches
        "view": worker.gossip.summary(),
        "workflows": sorted(worker.app.workflows),
        "queue": queue_status(worker),
        "jobs_in_flight": worker.jobs_in_flight,
        "cache": worker.cache.snapshot(),
        "stats": worker.stats.to_wire(),
        "batches": worker.metrics.batch_sizes(),  # model -> {batch size: runs}
        # jobs with a deadline: workflow -> priority -> outcome counts and attainment
        "slo": worker.metrics.slo_summary(),
        "metrics": worker.metrics.address or None,
        # its HTTP front door (--http-port): the Open Inference Protocol and OpenAI's API
        "http": worker.metrics.http_address or None,
        # the cluster's desired worker count by compass.elastic's rule, and why
        "desired_workers": _desired(worker.metrics.desired_workers()),
        # hot models warmed here ahead of need (--replicate): counts by model, those still held
        "replicas": _replicas(worker),
        # jobs traced at this ingress: the sampling, and the last few traces in brief
        "traces": {
            "sample": worker.tracer.sample,
            "traced": worker.tracer.traced,
            "kept": len(worker.tracer.kept),
            "recent": [_brief(t) for t in worker.tracer.recent(STATUS_TRACES)],
        },
        # the last jobs of workflows decided at run time answered here: the choices they made
        "taken": [_taken(j) for j in worker.metrics.timeline.recent_taken(STATUS_TRACES)],
        # what the process holds (rss_mb, open_fds, asyncio_tasks, threads), and the entries
        # of each table keyed by jobs, peers or time: a soak watches both stay flat
        "process": process_usage(),
        "tables": worker.table_sizes(),
    }


def _taken(job: JobEnd) -> dict[str, Any]:
    """A job of a workflow decided at run time, as ``compass status`` lists it."""
    return {
        "job": job.job, "workflow": job.workflow, "outcome": job.outcome, "taken": job.taken,
        "skipped": job.skipped,
    }  # fmt: skip


def _brief(trace: dict[str, Any]) -> dict[str, Any]:
    """A kept trace in one line's worth of fields."""
    return {
        "job": trace["job"],
        "workflow": trace["workflow"],
        "latency_ms": trace["latency_ms"],
        "ok": trace["ok"],
        "tasks": len(trace["tasks"]),
        "end": trace["end"],
    }


class _Requests:
    """The handlers, over one worker."""

    def __init__(self, worker: Served) -> None:
        self.worker = worker

    # -- anyone --------------------------------------------------------------------------------
    def ping(self, channel: Channel, body: Any) -> Any:
        return body

    def status(self, channel: Channel, body: Any) -> dict[str, Any]:
        return describe(self.worker)

    def trace(self, channel: Channel, body: Any) -> list[dict[str, Any]]:
        """The records of recently answered jobs; ``{"clear": true}`` empties the log."""
        trace = self.worker.trace
        records = list(trace)
        if isinstance(body, dict) and body.get("clear"):
            trace.clear()
        return records

    def traces(self, channel: Channel, body: Any) -> Any:
        """``{"job": id}``: the trace this ingress kept of that job; ``{"limit": n}`` (or
        nothing): its last ``n`` traces (at most :data:`MAX_TRACES`), oldest first."""
        body = {} if body is None else body
        if not isinstance(body, dict):
            raise InvalidInputs("a traces request is {job: id} or {limit: n}")
        tracer = self.worker.tracer
        job = body.get("job")
        if job is not None:
            if not isinstance(job, str):
                raise InvalidInputs("a traces request's job must be a job id")
            trace = tracer.trace(job)
            if trace is None:
                raise InvalidInputs(
                    f"worker {self.worker.name} keeps no trace of job {job}: it was not traced "
                    f"(sampled with --trace-sample {tracer.sample:g}, or asked for with "
                    f"trace=True), another worker was its ingress, or it is older than the "
                    f"last {len(tracer.kept)} traces",
                    detail={"job_id": job},
                )
            return trace
        limit = body.get("limit", MAX_TRACES)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidInputs("a traces request's limit must be a count")
        return tracer.recent(min(limit, MAX_TRACES))

    def timeline(self, channel: Channel, body: Any) -> dict[str, Any]:
        """The task spans after ``{"after": seq}`` (at most :data:`MAX_TIMELINE_SPANS`) and
        every model load this worker keeps: :meth:`Timeline.export
        <compass.observe.timeline.Timeline.export>`, with the worker's name and time scale."""
        after = body.get("after", 0) if isinstance(body, dict) else None
        if isinstance(after, bool) or not isinstance(after, int):
            raise InvalidInputs("a timeline request is {after: span seq}")
        worker = self.worker
        part = worker.metrics.timeline.export(after, MAX_TIMELINE_SPANS)
        part.update(
            name=worker.name, instance=worker.instance, time_scale=worker.config.time_scale,
            lanes=worker.lanes.lanes, host_lanes=worker.lanes.host_lanes,
        )  # fmt: skip
        return part

    def _submission(self, body: Any, op: str) -> tuple[str | None, str | None, Objective]:
        """A submission's key, traceparent and objective, checked; its workflow too."""
        if not isinstance(body, dict) or not isinstance(body.get("workflow"), str):
            raise InvalidInputs(f"{op} needs {{workflow: str, inputs: {{name: value}}}}")
        key = body.get("key")
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS):
            raise InvalidInputs(f"a job key must be a string of 1 to {MAX_KEY_CHARS} characters")
        traceparent = body.get("tp")
        if traceparent is not None and not isinstance(traceparent, str):
            raise InvalidInputs("a submission's tp must be a W3C traceparent string")
        return key, traceparent, Objective.from_wire(body, self.worker.config.time_scale)

    def submit(self, channel: Channel, body: Any) -> Awaitable[Any] | Later:
        """Start the job now, in the loop turn that read it (:meth:`Worker.begin_job
        <compass.worker.server.Worker.begin_job>`); its answer is answered as the job's future
        is set (a :class:`Later`: no task), or with ``reply: job`` by a task that adds the
        job's id (and trace)."""
        key, traceparent, objective = self._submission(body, "submit")
        traced = body.get("trace") is True
        job_id, future = self.worker.begin_job(
            body["workflow"], body.get("inputs") or {}, key, objective,
            trace=traced, traceparent=traceparent,
        )  # fmt: skip
        if body.get("reply") == "job":  # Client.submit_job: the job's id with its answer
            return self._replied(job_id, future, traced)
        return Later(future)

    async def _replied(self, job_id: str, answer: Awaitable[Any], traced: bool) -> Any:
        reply = {"job": job_id, "value": await answer}
        if traced:  # its trace too (None: a resubmitted key's job, traced or not)
            reply["trace"] = self.worker.tracer.trace(job_id)
        return reply

    async def stream(self, channel: Channel, body: Any) -> AsyncIterator[Any]:
        """``submit``, streaming: each partial output of the job's step-wise sinks as
        ``{task, seq, value}``, as it is made, then its final output as the stream's end."""
        key, _, objective = self._submission(body, "stream")
        if key is not None:
            raise InvalidInputs("a streamed job takes no key (its partial outputs are not kept)")
        outputs = stream_job(self.worker, body["workflow"], body.get("inputs") or {}, objective,
                             trace=body.get("trace") is True)  # fmt: skip
        async with contextlib.aclosing(outputs):  # closed with this stream, not when collected
            async for out in outputs:
                if out.final:
                    yield StreamResult(out.value)
                else:
                    yield {"task": out.task, "seq": out.seq, "value": out.value}

    def story(self, channel: Channel, body: Any) -> dict[str, Any]:
        """``{"key": k}``: what this worker's core and member table logged lately about ``k`` (a
        job id, a peer's name, a model, a cause id), oldest first: their stimulus logs'
        entries (:meth:`~compass.stimuli.StimulusLog.story`)."""
        key = body.get("key") if isinstance(body, dict) else None
        if not isinstance(key, str) or not 0 < len(key) <= MAX_STORY_KEY_CHARS:
            raise InvalidInputs(
                "a story request is {key: a job id, a peer's name or a cause id} (a non-empty "
                f"string of at most {MAX_STORY_KEY_CHARS} characters), got {key!r:.80}"
            )
        worker = self.worker
        membership = worker.membership
        members = [] if membership is None else membership.table.story(key)
        return {
            "worker": worker.name,
            "key": key,
            "core": [s.to_wire() for s in worker.core.story(key)],
            "members": [s.to_wire() for s in members],
        }

    # -- peers ---------------------------------------------------------------------------------
    async def join(self, channel: Channel, body: Any) -> dict[str, Any]:
        membership = self._membership(channel, "join")
        try:
            return membership.accept_join(channel, body)
        except ConfigError as exc:  # a name taken, another app: the joiner stops with it too
            log.warning("%s: refused a join: %s", self.worker.name, exc)
            raise

    async def plan(self, channel: Channel, body: Any) -> dict[str, str]:
        """Plan a job for another ingress (the ``central`` policy plans at one worker)."""
        self._require_peer(channel, "plan")
        if not isinstance(body, dict):
            raise ProtocolError("a plan request must be a map")
        return self.worker.plan_for(PlanRequest.from_wire(body))

    def from_peers(self, op: str, handler: PeerHandler) -> PeerHandler:
        """A one-way handler only workers may trigger: from a client, ``op`` is dropped. A
        worker's message on its own channel shows it runs (:meth:`Worker.heard_from`)."""
        worker = self.worker
        stats, name = worker.run_stats, worker.name

        def guarded(channel: Channel, body: Any) -> None:
            if channel.peer_role != "worker":
                stats.messages_dropped += 1
                log.warning("%s: dropped %r from a %s", name, op, channel.peer_role)
                return
            worker.heard_from(channel.peer_name)
            handler(channel, body)

        return guarded

    def read(self, channel: Channel, body: Any) -> None:
        """A job's ingress says its caller read partial output ``seq`` of sink ``task``
        (:mod:`compass.worker.windows`); a malformed one is dropped like any bad message."""
        worker = self.worker
        fields = body if isinstance(body, dict) else {}
        job, task, seq = fields.get("job"), fields.get("task"), fields.get("seq")
        if not (isinstance(job, str) and isinstance(task, str) and type(seq) is int):
            worker.run_stats.messages_dropped += 1
            log.warning("%s: dropped a malformed read from %s: %r", worker.name,
                        channel.peer_name, body)  # fmt: skip
            return
        worker.streamed.heard_read(job, task, seq)

    def heartbeat(self, channel: Channel, body: Any) -> None:
        # a malformed one is dropped like any bad peer message; the worker judges the rest
        worker = self.worker
        try:
            heartbeat = Heartbeat.from_wire(body)
        except CompassError as exc:
            worker.run_stats.messages_dropped += 1
            log.warning("%s: dropped a malformed heartbeat from %s: %s", worker.name,
                        channel.peer_name, exc)  # fmt: skip
            return
        worker.heard(heartbeat)

    def rumors(self, channel: Channel, body: Any) -> None:
        """Workers' states passed on (a bounded view's rumors): a malformed message is dropped
        whole, like any bad peer message."""
        worker = self.worker
        try:
            if not isinstance(body, dict) or not isinstance(body.get("s"), list):
                raise ProtocolError("rumors: expected a map with a list 's' of worker states")
            if len(body["s"]) > MAX_RUMORS:
                raise ProtocolError(f"rumors: {len(body['s'])} states, at most {MAX_RUMORS}")
            states = [Heartbeat.from_wire(state) for state in body["s"]]
        except CompassError as exc:
            worker.run_stats.messages_dropped += 1
            log.warning("%s: dropped malformed rumors from %s: %s", worker.name,
                        channel.peer_name, exc)  # fmt: skip
            return
        worker.heard_rumors(states, pass_on=body.get("sync") is not True)
        if body.get("ask") is True and channel.peer_name:  # a joining peer's first sync
            worker.sync_asked(channel.peer_name)

    def watch(self, channel: Channel, body: Any) -> None:
        """A peer plans over this worker: it watches its load for ``for_ms``."""
        worker = self.worker
        for_ms = body.get("for_ms") if isinstance(body, dict) else None
        if (
            not isinstance(for_ms, int | float)
            or isinstance(for_ms, bool)
            or not 0 < for_ms < float("inf")
            or not channel.peer_name
        ):
            worker.run_stats.messages_dropped += 1
            log.warning("%s: dropped a malformed watch from %s: %r", worker.name,
                        channel.peer_name, body)  # fmt: skip
            return
        worker.watched_by(channel.peer_name, float(for_ms))

    def leave(self, channel: Channel, body: Any) -> None:
        """A peer stopped on purpose: its jobs are re-planned, and it is retried soon (it is
        most often restarting)."""
        membership = self.worker.membership
        if membership is not None and isinstance(body, dict) and isinstance(body.get("name"), str):
            membership.left(body["name"], "it left the cluster")

    def drain(self, channel: Channel, body: Any) -> None:
        """A peer drains before it stops: plan nothing new there."""
        name = body.get("name") if isinstance(body, dict) else None
        if isinstance(name, str):
            self.worker.peer_draining(name)

    def peer_message(self, op: str) -> PeerHandler:
        """The handler of the typed peer message ``op``: decoded and checked, then the
        worker's."""
        worker = self.worker

        def handle(channel: Channel, body: Any) -> None:
            try:
                msg = decode(op, body)
            except ProtocolError as exc:
                worker.run_stats.messages_dropped += 1
                log.warning("%s: dropped a malformed %r from %s: %s", worker.name, op,
                            channel.peer_name, exc)  # fmt: skip
                return
            worker.receive(channel.peer_name, msg, body.get(TRACE_FIELD))

        return handle

    # -- checks --------------------------------------------------------------------------------
    def _require_peer(self, channel: Channel, op: str) -> None:
        if channel.peer_role != "worker":
            raise ProtocolError(f"{op!r} is for workers; a {channel.peer_role} sent it")

    def _membership(self, channel: Channel, op: str) -> Membership:
        self._require_peer(channel, op)
        membership = self.worker.membership
        if membership is None:
            raise WorkerUnavailable(f"worker {self.worker.name} is not serving yet")
        return membership
