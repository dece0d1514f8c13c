"""The worker process: serves clients and peers, plans the jobs it receives, runs tasks, and
pushes outputs on to where the plan says.

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
import itertools
import logging
import os
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import compass
from compass.app import App
from compass.cache.models import ModelCache
from compass.config import WorkerConfig
from compass.errors import (
    CompassError,
    InvalidInputs,
    JobFailed,
    Overloaded,
    ProtocolError,
    WorkerUnavailable,
)
from compass.sched import JobInfo, Policy, adjust_successors, make_policy, record_plan
from compass.sched.policies import worker_seed
from compass.sched.replicas import model_demand, warm_order
from compass.sched.view import ClusterView, WorkerState
from compass.wire.rpc import Router
from compass.wire.transport import Channel, Server, serve
from compass.worker.executor import Executor, TaskOutcome
from compass.worker.jobs import JOB_INPUTS, Inbox, IngressJob
from compass.worker.membership import Membership, Peer, gossip_gap_s
from compass.worker.queue import QueuedTask
from compass.worker.stats import WorkerStats, payload_bytes
from compass.workflow.dag import Task
from compass.workflow.profile import Profiles

__all__ = ["Worker"]

log = logging.getLogger("compass.worker")

#: how many finished job ids a worker remembers, to drop late messages of those jobs
_FORGET_AFTER = 4096
PeerHandler = Callable[[Channel, Any], None]

#: pushes at least this large feed the measured network bandwidth
_MEASURED_TRANSFER_BYTES = 1 << 20

#: a peer's gossiped host-to-device bandwidth is adopted when it differs by more than this
_H2D_TOLERANCE = 0.02


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
        )
        self.cache.on_change = self._state_changed
        #: set when the queue or the cache changed since the last heartbeat
        self._changed = asyncio.Event()
        self.view = self._new_view()
        self.router = self._make_router()
        #: one-way messages to this worker itself skip the wire
        self._local: dict[str, Callable[[Channel | None, Any], None]] = {
            "result": self._on_result,
            "failed": self._on_failed,
            "placed": self._on_placed,
            "done": self._on_done,
            "task": self._on_task,
        }
        self._warms = (
            config.sched.warm and self.policy.warms_cache and config.cache.prefetch_depth > 0
        )
        self.inbox = Inbox()
        self.jobs: dict[str, tuple[IngressJob, asyncio.Future[Any]]] = {}
        self._finished: OrderedDict[str, int] = OrderedDict()  # job id -> last attempt seen done
        #: the last answered jobs of this ingress, for benchmarks and `compass status`
        self.trace: deque[dict[str, Any]] = deque(maxlen=config.trace_jobs)
        self._job_ids = itertools.count(1)
        self._hb_seq = itertools.count(1)
        self._server: Server | None = None
        self.membership: Membership | None = None
        self._background: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._closing = False
        self._h2d_measured = False  # this worker's own host-to-device copies were timed
        #: why the worker stopped on its own (a background loop died), else None
        self.failure: BaseException | None = None

    def _new_view(self) -> ClusterView:
        gap = self._gossip_gap_s(0)
        # a worker without --name is named when it binds (start); until then its view is unused
        return ClusterView(
            self.name or "(unbound)",
            heartbeat_s=gap / self.config.time_scale,
            settle_s=self._settle_s(gap),
        )

    def _gossip_gap_s(self, peers: int) -> float:
        """Real seconds at least between two heartbeats with ``peers`` peers."""
        sched = self.config.sched
        return gossip_gap_s(sched.heartbeat_min_ms / 1000.0, peers, sched.heartbeat_max_rate)

    def _settle_s(self, gap_s: float) -> float:
        """How long the view counts a placement: changes are gossiped within ``gap_s``, so a
        heartbeat received two gaps after a placement reflects it (in the view's clock)."""
        return 2.0 * gap_s / self.config.time_scale

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        self._server = await serve(
            cfg.host,
            cfg.port,
            token=cfg.token,
            name=self.name or "worker",
            role="worker",
            handler=self.router.handle_request,
            notify_handler=self.router.handle_notify,
            limits=cfg.limits,
            timeouts=cfg.timeouts,
        )
        host, port = self._server.address[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if not self.name:
            self.name = default_worker_name(port)
            self.view = self._new_view()
        self.membership = Membership(
            name=self.name,
            address=self.address,
            token=cfg.token,
            limits=cfg.limits,
            timeouts=cfg.timeouts,
            handler=self.router.handle_request,
            notify_handler=self.router.handle_notify,
            on_join=self._peer_joined,
            on_leave=self._peer_left,
        )
        self.view.update_self(self._state())
        await self.cache.prepare()
        self._background = [
            asyncio.create_task(self.executor.run(), name=f"{self.name}-lanes"),
            asyncio.create_task(self._heartbeats(), name=f"{self.name}-heartbeats"),
        ]
        for task in self._background:
            task.add_done_callback(self._background_done)
        if cfg.join:
            try:
                await self.membership.join(list(cfg.join))
            except CompassError as exc:
                log.warning("%s: could not join %s: %s", self.name, ", ".join(cfg.join), exc)

    async def aclose(self) -> None:
        """Stop serving: in-flight requests are answered or failed, connections closed.
        Idempotent; also what follows :meth:`stop` (a signal) once :meth:`wait` returns."""
        if self._closing:
            return
        self._closing = True
        self._stopped.set()
        for job, future in self.jobs.values():
            if not future.done():
                future.set_exception(
                    WorkerUnavailable(f"worker {self.name} is shutting down; job {job.job_id} lost")
                )
        if self._server is not None:
            await self._server.aclose()
        if self.membership is not None:
            await self.membership.aclose()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
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
        router.notify("task")(self._from_peers(self._on_task))
        router.notify("result")(self._from_peers(self._on_result))
        router.notify("failed")(self._from_peers(self._on_failed))
        router.notify("placed")(self._from_peers(self._on_placed))
        router.notify("done")(self._from_peers(self._on_done))
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
            "peers": [] if self.membership is None else self.membership.describe(),
            # the workers this one can place tasks on (itself and every peer it has heard from)
            # and what its planner currently believes of each
            "cluster": self._view_status(),
            "workflows": sorted(self.app.workflows),
            "queue": {
                "ready": len(self.executor.queue),
                "waiting_inputs": len(self.inbox),
                "running": self.executor.busy,
                "lanes": self.executor.lanes,
                "wait_ms": round(self.executor.queue.wait_s() * 1000, 3),
                "host_ready": len(self.executor.host_queue),
                "host_running": self.executor.host_busy,
                "host_lanes": self.executor.host_lanes,
            },
            "jobs_in_flight": len(self.jobs),
            "cache": self.cache.snapshot(),
            "stats": self.stats.to_wire(),
        }

    def _view_status(self) -> list[dict[str, Any]]:
        """Each worker's state as this worker's view holds it; ages and waits are in this
        worker's clock (workload time for an emulated worker)."""
        now = self.clock()
        rows = []
        for name in self.view.names():
            state = self.view.get(name)
            assert state is not None
            rows.append(
                {
                    "name": name,
                    "wait_ms": round(state.wait_s * 1000, 3),
                    "models": sorted(state.models),
                    "loading": sorted(state.loading),
                    "free_bytes": state.free_bytes,
                    "h2d_gbps": round(self.profiles.h2d_bytes_per_s(name) / 1e9, 4),
                    "age_ms": round(self.view.age_s(name, now) * 1000, 3),
                    "placements_counted": self.view.pending(name),
                }
            )
        return rows

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
    def _state(self) -> WorkerState:
        return WorkerState(
            name=self.name,
            wait_s=self.executor.queue.wait_s(),
            models=self.cache.resident(),
            free_bytes=self.cache.free_bytes(),
            capacity_bytes=self.cache.capacity_bytes(),
            lanes=self.executor.lanes,
            lanes_busy=self.executor.busy,
            seq=next(self._hb_seq),
            loading=self.cache.loading(),
            h2d_bytes_per_s=self.profiles.h2d_bytes_per_s(self.name) if self._h2d_measured else 0.0,
        )

    def _state_changed(self) -> None:
        self._changed.set()

    async def _heartbeats(self) -> None:
        """Send this worker's state to every peer when it changes (at most once per
        ``heartbeat_min_ms``, spaced further in a large cluster, see :func:`gossip_gap_s`), and
        every ``heartbeat_ms`` regardless (liveness)."""
        sched = self.config.sched
        timeout = sched.peer_timeout_ms / 1000.0
        assert self.membership is not None
        loop = asyncio.get_running_loop()
        loads_seen = (0, 0.0)
        demand = model_demand(self.app.workflows.values(), self.profiles)
        while True:
            self._changed.clear()
            if not self.config.emulate:
                loads_seen = self._measure_h2d(loads_seen)
            state = self._state()
            self.view.update_self(state)
            if self._warms and not self.executor.busy and not len(self.executor.queue):
                # idle: fill free cache space with the models the cluster is shortest of
                self.cache.warm(warm_order(self.view.snapshot(self.clock()), self.name, demand))
            peers = len(self.membership.peers)
            if peers:
                self.membership.broadcast("heartbeat", state.to_wire())
                self.membership.expire(timeout)
            min_gap = self._gossip_gap_s(peers)
            interval = max(sched.heartbeat_ms / 1000.0, min_gap)
            self.view.settle_s = self._settle_s(min_gap)
            await asyncio.sleep(min_gap)
            if not self._changed.is_set() and interval > min_gap:
                timer = loop.call_later(interval - min_gap, self._changed.set)
                try:
                    await self._changed.wait()
                finally:
                    timer.cancel()

    def _measure_h2d(self, seen: tuple[int, float]) -> tuple[int, float]:
        """Fold the model loads since the last call into this worker's host-to-device bandwidth."""
        stats = self.cache.stats
        nbytes, seconds = stats.bytes_loaded - seen[0], stats.load_seconds - seen[1]
        if nbytes > 0 and seconds > 0:
            self.profiles.observe_h2d(self.name, nbytes, seconds)
            self._h2d_measured = True
        return stats.bytes_loaded, stats.load_seconds

    def _on_heartbeat(self, channel: Channel, body: Any) -> None:
        state = WorkerState.from_wire(body)
        assert self.membership is not None
        if state.name in self.membership.peers:
            self.membership.seen(state.name)
            if self.view.apply_heartbeat(state, self.clock()):
                self._learn_h2d(state)

    def _learn_h2d(self, state: WorkerState) -> None:
        """Adopt a peer's measured host-to-device bandwidth when it differs by more than 2%
        from what this worker assumes (smaller moves would only rebuild the cost tables)."""
        measured = state.h2d_bytes_per_s
        if measured > 0:
            assumed = self.profiles.h2d_bytes_per_s(state.name)
            if abs(measured - assumed) > _H2D_TOLERANCE * assumed:
                self.profiles.set_h2d(state.name, measured)

    def _peer_joined(self, peer: Peer) -> None:
        self.stats.peers_joined += 1
        self._state_changed()  # the newcomer needs this worker's state now, not at the next tick

    def _peer_left(self, name: str, why: str) -> None:
        self.view.remove(name)
        self.stats.peers_lost += 1
        for job, future in list(self.jobs.values()):
            if not future.done() and job.involves(name):
                log.warning("%s: re-planning job %s: worker %s lost", self.name, job.job_id, name)
                self.stats.replans += 1
                self._start_attempt(job, cancel_previous=True)

    # -- ingress: submit, plan, answer ---------------------------------------------------------
    async def _on_submit(self, channel: Channel, body: Any) -> Any:
        if self._stopped.is_set():
            raise WorkerUnavailable(f"worker {self.name} is shutting down")
        if len(self.jobs) >= self.config.max_jobs:
            self.stats.jobs_refused += 1
            raise Overloaded(
                f"worker {self.name} already has {len(self.jobs)} jobs in flight (its --max-jobs); "
                "retry later or submit to another worker",
                detail={"jobs_in_flight": len(self.jobs), "max_jobs": self.config.max_jobs},
            )
        if not isinstance(body, dict) or not isinstance(body.get("workflow"), str):
            raise InvalidInputs("submit needs {workflow: str, inputs: {name: value}}")
        workflow = self.app.get_workflow(body["workflow"])
        inputs = body.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise InvalidInputs(f"inputs of {workflow.name!r} must be a mapping of name to value")
        workflow.check_inputs(inputs)
        job = IngressJob(
            job_id=f"{self.name}-{next(self._job_ids)}",
            workflow=workflow,
            inputs=inputs,
            input_bytes=sum(payload_bytes(v) for v in inputs.values()),
            submitted_at=self.clock(),
            t0=time.time(),
        )
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.jobs[job.job_id] = (job, future)
        self.stats.jobs_submitted += 1
        try:
            plan = await self._plan(job)
            job.plan = plan
            self._start_attempt(job, cancel_previous=False, plan=plan)
            return await future
        finally:
            self.jobs.pop(job.job_id, None)
            self._finish_job(job)
            self.trace.append(
                {
                    "job": job.job_id,
                    "workflow": job.workflow.name,
                    "plan": job.plan,
                    "attempts": job.attempt + 1,
                    "ok": future.done() and not future.cancelled() and future.exception() is None,
                    "latency_s": self.clock() - job.submitted_at,
                }
            )

    async def _plan(self, job: IngressJob) -> dict[str, str]:
        now = self.clock()
        info = JobInfo(job.job_id, job.workflow, self.name, job.input_bytes)
        planner = getattr(self.policy, "planner", None)
        central = planner(self.view.snapshot(now)) if planner is not None else None
        if central is not None and central != self.name:
            assert self.membership is not None
            channel = self.membership.channel(central)
            if channel is not None:
                reply = await channel.request(
                    "plan",
                    {
                        "job": job.job_id,
                        "workflow": job.workflow.name,
                        "ingress": self.name,
                        "input_bytes": job.input_bytes,
                    },
                )
                return {str(k): str(v) for k, v in reply.items()}
        return self._plan_here(info, now)

    def _plan_here(self, info: JobInfo, now: float) -> dict[str, str]:
        self.view.update_self(self._state())
        plan = self.policy.plan(info, self.view.snapshot(now), self.profiles, now)
        record_plan(self.view, info, plan, self.profiles, now, host_lanes=self._host_lanes)
        return plan

    async def _on_plan(self, channel: Channel, body: Any) -> dict[str, str]:
        """Plan a job for another ingress (the ``central`` policy plans at one worker)."""
        self._require_peer(channel, "plan")
        workflow = self.app.get_workflow(body["workflow"])
        info = JobInfo(str(body["job"]), workflow, str(body["ingress"]), int(body["input_bytes"]))
        return self._plan_here(info, self.clock())

    def _start_attempt(
        self, job: IngressJob, *, cancel_previous: bool, plan: dict[str, str] | None = None
    ) -> None:
        if cancel_previous:
            old_workers = job.workers()
            job.attempt += 1
            job.outputs.clear()
            self._send_done(job, old_workers, below_attempt=job.attempt)
            plan = self._plan_here(
                JobInfo(job.job_id, job.workflow, self.name, job.input_bytes), self.clock()
            )
            job.plan = plan
        assert plan is not None
        sent = time.time()
        for root in job.workflow.roots:
            self._push(
                plan[root],
                {
                    "job": job.job_id,
                    "att": job.attempt,
                    "wf": job.workflow.name,
                    "task": root,
                    "from": JOB_INPUTS,
                    "value": job.inputs,
                    "plan": plan,
                    "ingress": self.name,
                    "sent": sent,
                    "t0": job.t0,
                },
            )

    def _finish_job(self, job: IngressJob) -> None:
        self._send_done(job, job.workers(), below_attempt=None)

    def _send_done(self, job: IngressJob, workers: set[str], below_attempt: int | None) -> None:
        body = {"job": job.job_id, "below": below_attempt}
        for worker in workers:
            if worker == self.name:
                self._drop_job(job.job_id, below_attempt)
            else:
                self._notify(worker, "done", body)

    def _live_job(self, body: Any) -> tuple[IngressJob, asyncio.Future[Any]] | None:
        """The unanswered job a report is about, if it is about its current attempt."""
        record = self.jobs.get(body["job"])
        if record is None or body["att"] != record[0].attempt or record[1].done():
            return None
        return record

    def _on_result(self, channel: Channel | None, body: Any) -> None:
        record = self._live_job(body)
        if record is None:
            return
        job, future = record
        job.outputs[body["task"]] = body["value"]
        sinks = job.workflow.sinks
        if all(s in job.outputs for s in sinks):
            self.stats.jobs_completed += 1
            value = job.outputs[sinks[0]] if len(sinks) == 1 else dict(job.outputs)
            future.set_result(value)

    def _on_failed(self, channel: Channel | None, body: Any) -> None:
        record = self._live_job(body)
        if record is None:
            return
        job, future = record
        self.stats.jobs_failed += 1
        detail = {
            "job_id": job.job_id,
            "workflow": job.workflow.name,
            "task": body["task"],
            "worker": body.get("worker"),
            "traceback": body.get("traceback", ""),
        }
        future.set_exception(
            JobFailed(
                f"task {body['task']!r} of workflow {job.workflow.name!r} failed on "
                f"{body.get('worker')}: {body.get('message')}",
                detail=detail,
            )
        )

    def _on_placed(self, channel: Channel | None, body: Any) -> None:
        record = self._live_job(body)
        if record is not None:
            record[0].plan[body["task"]] = body["worker"]

    # -- every worker: tasks in, outputs out ---------------------------------------------------
    def _task(self, workflow: str, task: str) -> Task:
        return self.app.get_workflow(workflow).tasks[task]

    def _on_task(self, channel: Channel | None, body: Any) -> None:
        job_id, attempt = body["job"], body["att"]
        if self._finished.get(job_id, -1) >= attempt:
            return  # a late message of a job already done or re-planned
        try:
            workflow = self.app.get_workflow(body["wf"])
        except CompassError as exc:
            self._notify(
                body["ingress"],
                "failed",
                {
                    "job": job_id,
                    "att": attempt,
                    "task": body["task"],
                    "worker": self.name,
                    "message": str(exc),
                    "traceback": "",
                },
            )
            return
        transfer_s = (
            max(0.0, time.time() - body["sent"]) / self.config.time_scale
            if channel is not None
            else 0.0
        )
        now = self.clock()
        if channel is not None and not self.config.emulate and transfer_s > 0:
            nbytes = payload_bytes(body["value"])
            if nbytes >= _MEASURED_TRANSFER_BYTES:  # small pushes measure latency, not bandwidth
                self.profiles.observe_transfer(channel.peer_name, self.name, nbytes, transfer_s)
        entry = self.inbox.add(
            job_id=job_id,
            attempt=attempt,
            workflow=workflow,
            task=body["task"],
            source=body["from"],
            value=body["value"],
            plan=body["plan"],
            ingress=body["ingress"],
            transfer_s=transfer_s,
            now=now,
        )
        if entry is None:
            return
        task = workflow.tasks[body["task"]]
        t0 = float(body["t0"])
        # the job's arrival on this worker's clock: the queue runs oldest jobs first
        arrival = now - max(0.0, time.time() - t0) / self.config.time_scale
        self.executor.submit(
            QueuedTask(
                job_id=job_id,
                attempt=attempt,
                workflow=workflow.name,
                task=task.name,
                model=task.model,
                expected_s=self.profiles.exec_s(workflow.name, task.name, self.name),
                inputs=entry.inputs,
                plan=entry.plan,
                ingress=entry.ingress,
                enqueued_at=now,
                transfer_s=entry.transfer_s,
                priority=arrival if self.policy.oldest_job_first else None,
                t0=t0,
            )
        )

    def _task_finished(self, outcome: TaskOutcome) -> None:
        entry = outcome.entry
        self.stats.record(outcome)
        if self._finished.get(entry.job_id, -1) >= entry.attempt:
            return
        if outcome.error is not None:
            self._notify(
                entry.ingress,
                "failed",
                {
                    "job": entry.job_id,
                    "att": entry.attempt,
                    "task": entry.task,
                    "worker": self.name,
                    "message": f"{type(outcome.error).__name__}: {outcome.error}",
                    "traceback": outcome.error_text,
                },
            )
            return
        workflow = self.app.get_workflow(entry.workflow)
        if not self.config.emulate:
            self.profiles.observe_exec(workflow.name, entry.task, self.name, outcome.exec_s)
            self.profiles.observe_output(workflow.name, entry.task, payload_bytes(outcome.output))
        succs = workflow.succs(entry.task)
        if not succs:
            self._notify(
                entry.ingress,
                "result",
                {
                    "job": entry.job_id,
                    "att": entry.attempt,
                    "task": entry.task,
                    "value": outcome.output,
                },
            )
            return
        now = self.clock()
        plan = entry.plan
        if self.policy.dynamic:
            self.view.update_self(self._state())
            info = JobInfo(entry.job_id, workflow, entry.ingress, 0)
            adjusted = adjust_successors(
                self.policy, info, entry.task, plan, self.view.snapshot(now), self.profiles, now
            )
            moved = [t for t in workflow.order if adjusted[t] != plan[t]]
            if moved:
                plan = adjusted
                self.stats.moves += len(moved)
                for name in moved:
                    self._notify(
                        entry.ingress,
                        "placed",
                        {
                            "job": entry.job_id,
                            "att": entry.attempt,
                            "task": name,
                            "worker": plan[name],
                        },
                    )
                    if plan[name] != self.name:
                        record_plan(
                            self.view,
                            info,
                            {name: plan[name]},
                            self.profiles,
                            now,
                            host_lanes=self._host_lanes,
                        )
        sent = time.time()
        for succ in succs:
            self._push(
                plan[succ],
                {
                    "job": entry.job_id,
                    "att": entry.attempt,
                    "wf": workflow.name,
                    "task": succ,
                    "from": entry.task,
                    "value": outcome.output,
                    "plan": plan,
                    "ingress": entry.ingress,
                    "sent": sent,
                    "t0": entry.t0,
                },
            )

    def _push(self, worker: str, body: dict[str, Any]) -> None:
        if worker == self.name:
            self._on_task(None, body)
        else:
            self._notify(worker, "task", body)

    def _notify(self, worker: str, op: str, body: dict[str, Any]) -> None:
        """Send a one-way message to a worker, this one included (no wire then)."""
        if worker == self.name:
            self._local[op](None, body)
            return
        channel = None if self.membership is None else self.membership.channel(worker)
        if channel is None or channel.closed:
            # the peer is gone: its jobs' ingresses re-plan them (see _peer_left)
            self.stats.messages_dropped += 1
            return
        channel.notify(op, body)

    def _on_done(self, channel: Channel | None, body: Any) -> None:
        self._drop_job(str(body["job"]), body.get("below"))

    def _drop_job(self, job_id: str, below_attempt: int | None) -> None:
        mark = (below_attempt - 1) if below_attempt is not None else 1 << 30
        self._finished[job_id] = max(self._finished.get(job_id, -1), mark)
        self._finished.move_to_end(job_id)
        while len(self._finished) > _FORGET_AFTER:
            self._finished.popitem(last=False)
        self.inbox.drop_job(job_id, below_attempt)
        self.executor.drop_job(job_id, below_attempt)
