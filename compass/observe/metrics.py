"""What a worker tells its operators: Prometheus metrics, a readiness probe, the log lines of
job and task ends, and JSON log records.

:class:`WorkerMetrics` belongs to one worker, of which it reads what :class:`Scraped` names.
Its registry is its own (never prometheus_client's global one), so several workers in one
process, as in tests, never share a metric. Three kinds of metric live in it:

- histograms observed where a job is answered (:meth:`WorkerMetrics.job_answered`, at its
  ingress) and where a task ends (:meth:`WorkerMetrics.task_finished`, where it ran);
- the sizes of the runs of each model's tasks (``compass_batch_size``, 1 for a task run
  alone), counted at every run's first outcome whether or not anything scrapes them, since
  ``compass status`` shows them too (:meth:`WorkerMetrics.batch_sizes`);
- everything else, read at scrape time from the counters the worker keeps anyway
  (:class:`~compass.core.stats.WorkerStats`, the cache's ``CacheStats``, the executor, the
  membership and the view) by :class:`WorkerCollector`, so the hot path pays nothing for it.

With ``--metrics-port`` the worker serves, on its own event loop (so a scrape reads a
consistent state and the socket closes with the worker), ``GET /metrics`` (the text exposition
format), ``GET /ready`` (200 once the worker serves, 503 while it starts, stops or is
degraded: a Kubernetes readiness probe), and the live dashboard: its page at ``GET /`` and the
JSON it reads, ``GET /api/cluster`` and ``GET /api/worker`` (:mod:`compass.observe.dashboard`).
The HTTP side is deliberately tiny: one request per connection, GET or HEAD, headers capped at
8 KiB and read within 5 s, at most 32 connections at once.

Every task's span and every answered job also go to :attr:`WorkerMetrics.timeline` (a
bounded ring, :mod:`compass.observe.timeline`), whether or not anything serves them: a peer's
dashboard asks for them over the peer channel.

Seconds are on the worker's clock: in emulated mode (``--workload``) that is workload time,
as in ``compass status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

import compass
from compass.elastic.live import LiveDesired, Seen
from compass.elastic.rule import Decision
from compass.elastic.table import Capacity, table_rule
from compass.errors import CompassError, ConfigError
from compass.objective import outcome_of
from compass.observe import dashboard
from compass.observe.shown import Gossiping
from compass.observe.streams import StreamsInFlight
from compass.observe.timeline import Timeline
from compass.supervisor import log_failures

if TYPE_CHECKING:
    from compass.core.outcome import TaskOutcome

__all__ = ["JsonLogFormatter", "Scraped", "WorkerCollector", "WorkerMetrics"]

#: what became of a job with a deadline, as counted per workflow and priority
SLO_OUTCOMES = ("met", "late", "unreachable", "dropped", "failed")

log = logging.getLogger("compass.worker")

#: inference tasks take from about a millisecond (a small head) to tens of seconds (generation)
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

#: tasks per run of a model: 1 is a task run alone; 8 is the default largest batch
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)  # written as 1.0, ..., as Histogram does

#: a request's line and headers; a scraper or probe sends a few hundred bytes
_MAX_HEAD_BYTES = 8192
_READ_TIMEOUT_S = 5.0
#: connections served at once; past it a new one is closed unanswered (a scraper and a
#: probe or two need a handful)
_MAX_CONNECTIONS = 32


class Scraped(dashboard.Shown, Protocol):
    """What the metrics read of a worker: what its dashboard (served here) shows, and the view
    it holds of its peers."""

    @property
    def gossip(self) -> Gossiping: ...


class WorkerMetrics:
    """The metrics of ``worker`` and the HTTP endpoint that serves them."""

    def __init__(self, worker: Scraped) -> None:
        self._worker = worker
        #: histograms are observed only when something can scrape them (``--metrics-port``):
        #: four observations per task are a tenth of a tiny task's control-plane cost
        self.enabled = worker.config.metrics_port is not None
        #: the recent task spans and answered jobs (the dashboard's task stream and latencies);
        #: the worker's clock is read through it, as it is set after this object is made
        self.timeline = Timeline(clock=lambda: worker.clock(), time_scale=worker.config.time_scale)
        #: the streamed jobs being read at this ingress (the dashboard's streams in flight)
        self.streams = StreamsInFlight()
        self.registry = CollectorRegistry()
        self.job_latency = Histogram(
            "compass_job_latency_seconds",
            "Submit to answer of the jobs this worker was the ingress of.",
            ["workflow", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.task_latency = Histogram(
            "compass_task_latency_seconds",
            "Queued to finished (queue wait + model fetch + execution) of tasks run here.",
            ["workflow", "task"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.task_exec = Histogram(
            "compass_task_exec_seconds",
            "Execution time of tasks run here.",
            ["workflow", "task"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "compass_task_queue_wait_seconds",
            "Time tasks waited in this worker's queue for a lane.",
            ["workflow"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.fetch_wait = Histogram(
            "compass_task_fetch_seconds",
            "Time tasks waited on a lane for their model to be loaded (0 on a hit).",
            ["workflow"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_output = Histogram(
            "compass_time_to_first_output_seconds",
            "Submit to the first partial output of streamed jobs this worker was the ingress of.",
            ["workflow"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.steps = Counter(
            "compass_task_steps",
            "Steps of step-wise tasks run here (their rate: steps per second).",
            ["workflow", "task"],
            registry=self.registry,
        )
        #: jobs answered at this ingress, by outcome (refusals come from WorkerStats)
        self.jobs = {"ok": 0, "failed": 0, "cancelled": 0}
        #: jobs with a deadline answered here: (workflow, priority) -> outcome -> count, the
        #: outcomes :data:`SLO_OUTCOMES`
        self.slo: dict[tuple[str, int], dict[str, int]] = {}
        #: runs of each model's tasks here, by how many tasks each took: model -> size -> runs
        self.batches: dict[str, dict[int, int]] = {}
        #: what a part of the worker counts itself, read at each scrape beside the worker's
        #: own (the HTTP front door's requests: :mod:`compass.front.metrics`)
        self.collectors: list[Collector] = []
        self._collector = WorkerCollector(worker, self)
        self.registry.register(self._collector)
        #: what a scrape serves beside the collector: what the worker observes as it goes
        self._observed = (
            self.job_latency,
            self.task_latency,
            self.task_exec,
            self.queue_wait,
            self.fetch_wait,
            self.first_output,
            self.steps,
        )
        #: the histograms of each (workflow, task), found once: ``labels`` costs a lock and a
        #: lookup per call, four times per task
        self._task_children: dict[tuple[str, str], tuple[Histogram, ...]] = {}
        #: the cluster's desired worker count as this worker computes it (compass.elastic)
        held = worker.config
        self.elastic = LiveDesired(
            table_rule(Capacity(held.capacity, held.capacity_margin)) if held.capacity else None
        )
        #: set once the worker serves (the end of Worker.start)
        self.ready = False
        self.address = ""
        #: where the worker's HTTP front door serves ("" without one): set by the door's
        #: opener (compass.worker.process.open_front_door), shown by status and the dashboard
        self.http_address = ""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    def desired_workers(self) -> Decision:
        """The rule's decision (:mod:`compass.elastic.live`) from this worker's state and its
        view's last heartbeat of each peer, sampled now."""
        w = self._worker
        now, lanes, view = w.clock(), w.lanes, w.gossip.port.view
        seen = [Seen(lanes.wait_s(now), lanes.lanes, lanes.busy)]
        for peer in view.names():
            beat = view.get(peer) if peer != w.name else None
            if beat is not None:
                seen.append(Seen(beat.wait_s, beat.lanes, beat.lanes_busy))
        return self.elastic.update(now, seen)

    # -- observations ---------------------------------------------------------------------

    def job_answered(
        self, record: Mapping[str, Any], error: CompassError | None, *, waited: bool
    ) -> None:
        """An accepted job was answered; ``waited``: its client still waited for the answer
        (an error nobody waited for is a job dropped because its client gave up)."""
        workflow = str(record.get("workflow", ""))
        job = str(record.get("job", ""))
        latency = float(record.get("latency_s", 0.0))
        if record.get("ok"):
            outcome = "ok"
        else:
            outcome = "failed" if waited else "cancelled"
        self.jobs[outcome] += 1
        deadline_s = record.get("deadline_s")
        kept = outcome
        if deadline_s is not None:
            deadline_s = float(deadline_s)
            kept = self._slo_answered(record, error, deadline_s, latency)
        priority = int(record.get("priority", 0))
        taken = (str(record.get("taken", "")), len(record.get("skipped", ())))
        self.timeline.job_answered(job, workflow, latency, deadline_s, kept, priority, taken)
        if self.enabled:
            self.job_latency.labels(workflow, outcome).observe(latency)
        if outcome == "ok" and not log.isEnabledFor(logging.DEBUG):
            return
        name = self._worker.name
        extra = {"worker": name, "job": job, "workflow": workflow, "outcome": outcome}
        if outcome == "failed":
            log.warning("%s: job %s (%s) failed after %.3f s: %s", name, job, workflow,
                        latency, error, extra=extra)  # fmt: skip
        else:
            log.debug("%s: job %s (%s) %s after %.3f s", name, job, workflow, outcome, latency,
                      extra=extra)  # fmt: skip

    def _slo_answered(
        self, record: Mapping[str, Any], error: CompassError | None, deadline_s: float,
        latency: float,
    ) -> str:  # fmt: skip
        """Count a job with a deadline; returns its outcome, one of :data:`SLO_OUTCOMES`."""
        outcome = outcome_of(error)
        if outcome == "ok":
            outcome = "met" if latency <= deadline_s else "late"
        key = (str(record.get("workflow", "")), int(record.get("priority", 0)))
        counts = self.slo.setdefault(key, dict.fromkeys(SLO_OUTCOMES, 0))
        counts[outcome] += 1
        return outcome

    def slo_summary(self) -> dict[str, dict[str, dict[str, float]]]:
        """For ``compass status``: per workflow and priority, the jobs with a deadline by
        outcome, and their attainment (met over all answered)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (workflow, priority), counts in sorted(self.slo.items()):
            total = sum(counts.values())
            row: dict[str, float] = dict(counts)
            row["attainment"] = round(counts["met"] / total, 4) if total else 0.0
            out.setdefault(workflow, {})[str(priority)] = row
        return out

    def streamed(self, workflow: str, first_output_s: float) -> None:
        """A streamed job's first partial output reached its caller ``first_output_s`` after
        its submit (seconds)."""
        if self.enabled:
            self.first_output.labels(workflow).observe(first_output_s)

    def task_finished(self, outcome: TaskOutcome) -> None:
        """A task ended on this worker (ran, failed, timed out or was refused)."""
        self.timeline.task_ended(outcome)
        if outcome.steps and self.enabled:
            self.steps.labels(outcome.entry.workflow, outcome.entry.task).inc(outcome.steps)
        entry = outcome.entry
        if outcome.first and entry.model is not None:  # a batch is one run, of its size
            runs = self.batches.setdefault(entry.model, {})
            runs[outcome.batch] = runs.get(outcome.batch, 0) + 1
        if self.enabled:
            key = (entry.workflow, entry.task)
            children = self._task_children.get(key)
            if children is None:
                children = self._task_children[key] = (
                    self.task_latency.labels(*key),
                    self.task_exec.labels(*key),
                    self.queue_wait.labels(entry.workflow),
                    self.fetch_wait.labels(entry.workflow),
                )
            latency, exec_, queue, fetch = children
            latency.observe(outcome.queue_s + outcome.fetch_s + outcome.exec_s)
            exec_.observe(outcome.exec_s)
            queue.observe(outcome.queue_s)
            fetch.observe(outcome.fetch_s)
        if outcome.error is None and not log.isEnabledFor(logging.DEBUG):
            return
        name = self._worker.name
        extra = {
            "worker": name,
            "job": entry.job_id,
            "workflow": entry.workflow,
            "task": entry.task,
        }
        error = outcome.error
        if error is None:
            log.debug("%s: task %s of job %s done: queue %.4f s, fetch %.4f s, exec %.4f s",
                      name, entry.task, entry.job_id, outcome.queue_s, outcome.fetch_s,
                      outcome.exec_s, extra=extra)  # fmt: skip
            return
        if outcome.stopped:  # its job ended elsewhere: no failure of its own
            log.info("%s: task %s of job %s stopped after %d steps (its job ended)", name,
                     entry.task, entry.job_id, outcome.steps, extra=extra)  # fmt: skip
            return
        log.warning("%s: task %s of job %s (%s) failed: %s: %s", name, entry.task,
                    entry.job_id, entry.workflow, type(error).__name__, error,
                    extra=extra)  # fmt: skip
        if outcome.error_text:
            log.debug("%s: task %s of job %s failed with\n%s", name, entry.task, entry.job_id,
                      outcome.error_text.rstrip(), extra=extra)  # fmt: skip

    def batch_sizes(self) -> dict[str, dict[str, int]]:
        """For ``compass status``: each model's runs here by batch size (``{"1": 7, "4": 2}``:
        seven tasks ran alone, two batches of four), sizes as strings as JSON keys are."""
        return {
            model: {str(size): runs[size] for size in sorted(runs)}
            for model, runs in sorted(self.batches.items())
        }

    # -- the endpoint -----------------------------------------------------------------------

    async def start(self) -> None:
        """Serve ``/metrics``, ``/ready`` and the dashboard if the worker's config asks for
        it."""
        config = self._worker.config
        if config.metrics_port is None:
            return
        host, port = config.metrics_host, config.metrics_port
        try:
            self._server = await asyncio.start_server(
                self._handle, host, port, limit=_MAX_HEAD_BYTES
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port} (--metrics-host/--metrics-port): "
                f"{exc.strerror or exc}"
            ) from exc
        bound = self._server.sockets[0].getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}"
        log.info("metrics on http://%s/metrics, readiness on /ready, dashboard on /",
                 self.address)  # fmt: skip

    async def aclose(self) -> None:
        """Stop serving (idempotent); a probe then fails, as it should for a stopping worker."""
        self.ready = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._handlers):
            task.cancel()
        results = await asyncio.gather(*self._handlers, return_exceptions=True)
        log_failures(results, log, "a metrics request at close")
        if server is not None:
            await server.wait_closed()

    def is_ready(self) -> tuple[bool, str]:
        """Whether the worker takes work now, and why not."""
        if not self.ready:
            return False, "starting, draining or stopping"
        membership = self._worker.membership
        # configured with --join, it has no peer, and its seeds are other workers: split off
        if (
            self._worker.config.join
            and membership
            and not membership.channels.peers
            and membership.table.seeds
        ):
            return False, "no peer: configured with --join, it is not in a cluster"
        if self._worker.lanes.degraded:
            return False, "degraded: too many stuck tasks"
        return True, "ready"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            if len(self._handlers) <= _MAX_CONNECTIONS:
                await self._respond(reader, writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass  # a client that went away or never finished its request: nothing to answer
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await _reply(writer, 431, b"request headers too large\n")
            return
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            await _reply(writer, 400, b"expected 'GET /metrics HTTP/1.1'\n")
            return
        method, (target, _, query) = parts[0], parts[1].partition(b"?")
        if method not in (b"GET", b"HEAD"):
            await _reply(writer, 405, b"only GET and HEAD\n", head_only=False)
            return
        head_only = method == b"HEAD"
        if target == b"/metrics":
            # the worker's state is read here, on its loop, where it is consistent; the text
            # (about 20 us a line, 15 ms for the paper's workload) is written in a thread, so a
            # scrape does not stall the loop (the histograms lock themselves)
            snapshot = _Snapshot(list(self._collector.collect()), self._observed)
            body = await asyncio.to_thread(generate_latest, snapshot)
            await _reply(writer, 200, body, CONTENT_TYPE_LATEST, head_only=head_only)
        elif target in (b"/ready", b"/readyz"):
            ok, why = self.is_ready()
            await _reply(writer, 200 if ok else 503, why.encode() + b"\n", head_only=head_only)
        elif target in (b"/", b"/index.html"):
            await _reply(writer, 200, dashboard.page(), "text/html; charset=utf-8",
                         head_only=head_only, headers=dashboard.PAGE_HEADERS)  # fmt: skip
        elif target in (b"/api/cluster", b"/api/worker"):
            await self._api(writer, target == b"/api/cluster", query, head_only)
        else:
            await _reply(writer, 404, b"try /, /metrics, /ready, /api/cluster or /api/worker\n",
                         head_only=head_only)  # fmt: skip

    async def _api(
        self, writer: asyncio.StreamWriter, cluster: bool, query: bytes, head_only: bool
    ) -> None:
        """The dashboard's JSON: every worker's part (gathered from the peers) or this one's."""
        try:
            window = dashboard.window_of(query.decode("ascii"))
        except (UnicodeDecodeError, CompassError) as exc:
            await _reply(writer, 400, f"{exc}\n".encode(), head_only=head_only)
            return
        if cluster:
            view = await dashboard.cluster_view(self._worker, window)
        else:
            view = dashboard.local_view(self._worker, window)
        # a large cluster's first read is a few MB of spans: written in a thread, as /metrics
        body = await asyncio.to_thread(dashboard.to_json, view)
        await _reply(writer, 200, body, "application/json", head_only=head_only)


class _Snapshot:
    """What one scrape exposes: the collector's families, already read, and the metrics the
    worker observes as it goes (its histograms, the steps' counter)."""

    def __init__(self, families: list[Metric], observed: tuple[Histogram | Counter, ...]) -> None:
        self._families = families
        self._observed = observed

    def collect(self) -> Iterator[Metric]:
        yield from self._families
        for metric in self._observed:
            yield from metric.collect()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


async def _reply(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    head_only: bool = False,
    headers: str = "",
) -> None:
    """Answer with ``body``; ``headers``: more header lines, each ending in CRLF."""
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nCache-Control: no-store\r\n"
        f"{headers}"
    )
    if status == 405:
        head += "Allow: GET, HEAD\r\n"
    writer.write(head.encode() + b"\r\n" + (b"" if head_only else body))
    await writer.drain()


#: counters read from the cache's CacheStats: metric name (``_total`` is added), attribute, help
_CACHE_COUNTERS = (
    ("compass_cache_hits", "hits", "Model requests of tasks found resident."),
    ("compass_cache_misses", "misses", "Model requests of tasks that needed a load."),
    ("compass_cache_loads", "loads", "Model loads begun (prefetches included)."),
    ("compass_cache_prefetches", "prefetches", "Model loads begun by prefetch or warming."),
    ("compass_cache_aborted_loads", "aborted_loads", "Model loads that failed or were cancelled."),
    ("compass_cache_evictions", "evictions", "Models evicted to make room."),
    ("compass_cache_loaded_bytes", "bytes_loaded", "Bytes of models loaded."),
    ("compass_cache_evicted_bytes", "bytes_evicted", "Bytes of models evicted."),
    ("compass_cache_waits", "waits", "Model requests that waited for pinned or loading slabs."),
    ("compass_model_load_seconds", "load_seconds", "Seconds spent loading model weights."),
)

#: counters read from WorkerStats, likewise
_WORKER_COUNTERS = (
    ("compass_peers_joined", "peers_joined", "Peers that joined (or came back)."),
    ("compass_peers_lost", "peers_lost", "Peers lost."),
    (
        "compass_suspicions_refuted",
        "suspicions_refuted",
        "Suspicions of this worker it refuted in time (it was busy, not dead).",
    ),
    (
        "compass_deaths_refuted",
        "deaths_refuted",
        "Times a peer had declared this worker dead and it rejoined.",
    ),
    ("compass_moves", "moves", "Tasks moved by dynamic adjustment."),
    ("compass_replans", "replans", "Jobs planned again after a lost peer."),
    ("compass_messages_dropped", "messages_dropped", "Peer messages dropped (bad or unsendable)."),
    ("compass_internal_errors", "internal_errors", "Events whose handling raised (logged)."),
)


class WorkerCollector(Collector):
    """Reads the worker's own counters when scraped: nothing is counted twice."""

    def __init__(self, worker: Scraped, metrics: WorkerMetrics) -> None:
        self._worker = worker
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._worker_metrics()
        yield from self._queue_metrics()
        yield from self._cache_metrics()
        yield from self._cluster_metrics()
        for part in self._metrics.collectors:
            yield from part.collect()

    def _worker_metrics(self) -> Iterator[Metric]:
        w, stats = self._worker, self._worker.stats
        info = GaugeMetricFamily(
            "compass_worker_info",
            "This worker, labelled: 1.",
            labels=["worker", "version", "policy"],
        )
        info.add_metric([w.name, compass.__version__, w.policy.name], 1.0)
        yield info
        uptime = time.monotonic() - w.started_at
        yield _gauge("compass_uptime_seconds", "Real seconds since the worker started.", uptime)
        ready = float(self._metrics.is_ready()[0])
        yield _gauge("compass_ready", "1 while /ready answers 200.", ready)
        jobs = CounterMetricFamily(
            "compass_jobs",
            "Jobs submitted to this worker as ingress, by outcome: ok, failed, cancelled (the "
            "client stopped waiting), refused (--max-jobs reached).",
            labels=["outcome"],
        )
        for outcome, count in self._metrics.jobs.items():
            jobs.add_metric([outcome], count)
        jobs.add_metric(["refused"], stats.jobs_refused)
        yield jobs
        slo = CounterMetricFamily(
            "compass_slo_jobs",
            "Jobs with a deadline answered at this ingress, by workflow, priority and outcome: "
            "met, late (answered past it), unreachable (refused at once), dropped (a task "
            "would have started too late), failed. Attainment: met over the sum.",
            labels=["workflow", "priority", "outcome"],
        )
        for (workflow, priority), counts in sorted(self._metrics.slo.items()):
            for outcome, count in counts.items():
                slo.add_metric([workflow, str(priority), outcome], count)
        yield slo
        in_flight = w.jobs_in_flight
        yield _gauge("compass_jobs_in_flight", "Jobs accepted here, not answered yet.", in_flight)
        streams = len(self._metrics.streams)
        yield _gauge("compass_streams_in_flight", "Streamed jobs being read here.", streams)
        tasks = CounterMetricFamily(
            "compass_tasks", "Tasks run here, by outcome.", labels=["outcome"]
        )
        tasks.add_metric(["ok"], stats.tasks_run - stats.tasks_failed)
        tasks.add_metric(["failed"], stats.tasks_failed)
        yield tasks
        for name, attr, text in _WORKER_COUNTERS:
            yield CounterMetricFamily(name, text, value=getattr(stats, attr))
        yield self._batch_metric()

    def _batch_metric(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            "compass_batch_size",
            "Tasks per run of each model's tasks here (1: a task run alone; more: a batch).",
            labels=["model"],
        )
        for model, runs in sorted(self._metrics.batches.items()):
            buckets = [
                (str(float(bound)), float(sum(n for size, n in runs.items() if size <= bound)))
                for bound in BATCH_BUCKETS
            ]
            buckets.append(("+Inf", float(sum(runs.values()))))
            total = float(sum(size * count for size, count in runs.items()))
            family.add_metric([model], buckets, total)
        return family

    def _queue_metrics(self) -> Iterator[Metric]:
        w, lanes = self._worker, self._worker.lanes
        for name, text, gpu, host in (
            ("compass_queue_tasks", "Tasks ready, waiting for a lane.",
             len(lanes.queue), len(lanes.host_queue)),
            ("compass_lanes_busy", "Lanes running a task.", lanes.busy, lanes.host_busy),
            ("compass_lanes", "Execution lanes.", lanes.lanes, lanes.host_lanes),
        ):  # fmt: skip
            family = GaugeMetricFamily(name, text, labels=["lane"])
            family.add_metric(["gpu"], gpu)
            family.add_metric(["host"], host)
            yield family
        yield _gauge(
            "compass_queue_wait_expected_seconds",
            "Expected seconds of queued and running work (what planners use).",
            lanes.wait_s(w.clock()),
        )
        waiting = w.tasks_waiting_inputs
        yield _gauge("compass_tasks_waiting_inputs", "Tasks waiting for their inputs.", waiting)
        yield _gauge("compass_tasks_stuck", "Task threads running past their timeout.", lanes.stuck)
        yield _gauge(
            "compass_worker_degraded",
            "1 once stuck tasks reach --max-stuck-tasks (no more GPU work here).",
            float(lanes.degraded),
        )

    def _cache_metrics(self) -> Iterator[Metric]:
        cache = self._worker.cache
        stats = cache.stats
        for name, attr, text in _CACHE_COUNTERS:
            yield CounterMetricFamily(name, text, value=getattr(stats, attr))
        resident = cache.resident()
        resident_bytes = sum(cache.size_bytes(model) for model in resident)
        for name, text, value in (
            (
                "compass_cache_capacity_bytes",
                "Bytes the model cache holds.",
                cache.capacity_bytes(),
            ),
            ("compass_cache_free_bytes", "Bytes in free slabs.", cache.free_bytes()),
            ("compass_cache_resident_bytes", "Bytes of the resident models.", resident_bytes),
            ("compass_cache_resident_models", "Models resident.", len(resident)),
            ("compass_cache_loading_models", "Models being loaded.", len(cache.loading())),
        ):
            yield _gauge(name, text, value)

    def _cluster_metrics(self) -> Iterator[Metric]:
        w = self._worker
        peers = 0 if w.membership is None else len(w.membership.channels.peers)
        yield _gauge("compass_peers", "Peers connected.", peers)
        yield _gauge(
            "compass_desired_workers",
            "Workers the cluster needs for its objective, by compass.elastic's rule (an HPA or "
            "KEDA target).",
            self._metrics.desired_workers().desired,
        )
        ages = GaugeMetricFamily(
            "compass_view_age_seconds",
            "Age of what this worker's view holds of each peer (since its last heartbeat; "
            "mesh view only: a bounded view hears a peer when it changes, so ages grow idle).",
            labels=["peer"],
        )
        if w.gossip.port.rule is None:  # the mesh: heartbeats every few ms, so age is silence
            view, now = w.gossip.port.view, w.clock()
            for peer in view.names():
                if peer != w.name:
                    ages.add_metric([peer], view.age_s(peer, now))
        yield ages


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


# -- logs ------------------------------------------------------------------------------------

#: attributes every LogRecord has; anything else on a record came in through ``extra=``
_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    then the record's ``extra`` fields (``worker``, ``job``, ``task``, ...), and ``exception``
    with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)
