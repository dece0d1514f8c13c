"""OpenTelemetry export of traced jobs: a span per job and per task, by OTLP/HTTP.

Optional: it needs the ``compass[otel]`` extra (``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http``), imported only when a worker is started with
``--otel-endpoint``; without the extra that flag is a one-line
:class:`~compass.errors.ConfigError`, and nothing else in compass imports OpenTelemetry.

Which jobs: the traced ones (:mod:`compass.observe.tracing`: sampled by ``--trace-sample``,
asked for by the client, or sampled by the caller's own tracing). Who exports what: the
ingress exports the job's span when it answers it; every worker exports the spans of the tasks
it ran as they end. The ids come from the job's trace context, which travels with its
messages: the job span's trace id is the caller's (the ``traceparent`` its client sent, so a
web request's span is the job's parent) and every task span is the job span's child, whichever
worker exports it.

Spans are built from what the worker recorded anyway (wall-clock times, the fields of a
trace) as finished ``ReadableSpan`` objects and handed to a batch span processor, whose thread
does the exporting: the event loop never waits for the collector.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import compass
from compass.errors import ConfigError

if TYPE_CHECKING:
    from compass.observe.tracing import JobTracing

__all__ = ["MISSING_EXTRA", "OtelExport"]

#: what a worker says when ``--otel-endpoint`` is given without the extra installed
MISSING_EXTRA = (
    "--otel-endpoint needs OpenTelemetry, which is not installed: pip install 'compass[otel]' "
    "(opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)"
)

#: seconds between the batch processor's exports; and how long one export may take
EXPORT_DELAY_S = 0.5
EXPORT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class _Span:
    """One finished span to export: its ids (``parent_id`` None: a root), wall-clock
    ``start`` and ``end`` (seconds), ``error`` ("" if it succeeded), timestamped ``events``,
    and whether it is a ``server`` span (a job answered) or an internal one (a task)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start: float
    end: float
    attributes: Mapping[str, Any]
    error: str
    events: Sequence[tuple[str, float]] = ()
    server: bool = False


class OtelExport:
    """Exports the spans of traced jobs through ``exporter`` (an OpenTelemetry
    ``SpanExporter``): in batches from a thread, or (``batch=False``, for tests with an
    in-memory exporter) at once. ``instance`` is the worker process's id (its resource's
    ``service.instance.id``)."""

    def __init__(self, exporter: Any, *, instance: str, batch: bool = True) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        except ImportError as exc:
            raise ConfigError(MISSING_EXTRA) from exc
        self._resource = Resource.create(
            {
                "service.name": "compass",
                "service.version": compass.__version__,
                "service.instance.id": instance,
            }
        )
        self._processor: Any = (
            BatchSpanProcessor(
                exporter,
                schedule_delay_millis=EXPORT_DELAY_S * 1000,
                export_timeout_millis=EXPORT_TIMEOUT_S * 1000,
            )
            if batch
            else SimpleSpanProcessor(exporter)
        )
        self._ids = random.Random()
        self.exported = 0

    @classmethod
    def to_endpoint(cls, url: str, *, instance: str) -> OtelExport:
        """Export by OTLP/HTTP (protobuf) to ``url`` (a collector's ``/v1/traces``)."""
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError(MISSING_EXTRA) from exc
        return cls(OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S), instance=instance)

    def task(self, job: str, workflow: str, span: Mapping[str, Any], tracing: JobTracing) -> None:
        """Export the span of a task of ``job`` that ended on this worker (``span`` as
        :func:`~compass.observe.tracing.task_span` made it), a child of the job's span."""
        task = span["task"]
        attributes: dict[str, Any] = {
            "compass.job": job,
            "compass.workflow": workflow,
            "compass.task": task,
            "compass.worker": span["worker"],
            "compass.planned_worker": tracing.planned.get(task, ""),
            "compass.attempt": span["att"],
            "compass.transfer_ms": span["transfer_s"] * 1000.0,
            "compass.queued_ms": (span["start"] - span["queued"]) * 1000.0,
            "compass.load_ms": span["load_s"] * 1000.0,
            "compass.exec_ms": span["exec_s"] * 1000.0,
            "compass.batch": span["batch"],
            "compass.batch_mates": list(span["mates"]),
            "compass.lane": span["lane"],
            # the worker core's event that made a lane take it (compass.trace.TaskTrace.cause)
            "compass.cause": span["cause"],
        }
        if span["model"] is not None:
            attributes["compass.model"] = span["model"]
            attributes["compass.cache_hit"] = span["hit"]
        events = [("lane", span["start"])]
        if span["load_s"] > 0:
            events.append(("model loaded", span["start"] + span["load_s"]))
        if span.get("steps"):  # a step-wise task: its steps in summary, its first step's end
            attributes["compass.steps"] = span["steps"]
            attributes["compass.first_step_ms"] = span["first_s"] * 1000.0
            attributes["compass.waited_ms"] = span["waited_s"] * 1000.0
            events.append(("first step", span["end"] - span["exec_s"] + span["first_s"]))
        self._export(
            _Span(
                f"task {task}",
                tracing.parent.trace_id,
                self._ids.getrandbits(64) or 1,
                tracing.parent.span_id,
                start=span["queued"],
                end=span["end"],
                attributes=attributes,
                error=span["error"],
                events=events,
            )
        )

    def job(self, trace: Mapping[str, Any], tracing: JobTracing) -> None:
        """Export the span of a job this ingress answered (``trace``: its JSON form), the
        child of its caller's span when it came with one."""
        attributes: dict[str, Any] = {
            "compass.job": trace["job"],
            "compass.workflow": trace["workflow"],
            "compass.ingress": trace["ingress"],
            "compass.ok": trace["ok"],
            "compass.attempts": trace["attempts"],
            "compass.latency_ms": trace["latency_ms"],
            "compass.critical_path": list(trace["critical_path"]),
            "compass.tasks": len(trace["tasks"]),
        }
        for part, ms in trace["breakdown_ms"].items():
            attributes[f"compass.{part}_ms"] = ms
        if trace.get("first_output_ms") is not None:
            attributes["compass.first_output_ms"] = trace["first_output_ms"]
        planned = {t["task"]: t["planned_worker"] for t in trace["tasks"]}
        attributes["compass.plan"] = [f"{task}={worker}" for task, worker in planned.items()]
        caller = tracing.caller
        self._export(
            _Span(
                f"job {trace['workflow']}",
                tracing.parent.trace_id,
                tracing.parent.span_id,
                None if caller is None else caller.span_id,
                start=trace["start"],
                end=trace["end"],
                attributes=attributes,
                error=trace["error"],
                server=True,
            )
        )

    def _export(self, done: _Span) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
        from opentelemetry.trace.status import Status, StatusCode

        trace_id, error, start = done.trace_id, done.error, done.start
        flags = TraceFlags(TraceFlags.SAMPLED)
        context = SpanContext(trace_id, done.span_id, is_remote=False, trace_flags=flags)
        parent = (
            None
            if done.parent_id is None
            else SpanContext(trace_id, done.parent_id, is_remote=True, trace_flags=flags)
        )
        status = Status(StatusCode.ERROR, error) if error else Status(StatusCode.OK)
        span = ReadableSpan(
            done.name,
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=dict(done.attributes),
            events=[Event(label, timestamp=_ns(at)) for label, at in done.events],
            kind=SpanKind.SERVER if done.server else SpanKind.INTERNAL,
            status=status,
            start_time=_ns(start),
            end_time=_ns(max(start, done.end)),
            instrumentation_scope=InstrumentationScope("compass", compass.__version__),
        )
        self._processor.on_end(span)
        self.exported += 1

    def flush(self, timeout_s: float = EXPORT_TIMEOUT_S) -> bool:
        """Export what is waiting now; False if that took longer than ``timeout_s``."""
        return bool(self._processor.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        """Export what is waiting and stop (blocks: call it from a thread)."""
        self._processor.shutdown()


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
