"""OpenTelemetry export, with the SDK's in-memory exporter: spans built from a trace, their ids
from the job's trace context; and compass without the ``otel`` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compass.observe.tracing import Tracer, task_span
from compass.workflow import Task, TaskProfile, Workflow

REPO = Path(__file__).resolve().parents[3]
CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CHAIN = Workflow(
    "chain",
    [
        Task("a", "m", (), TaskProfile(exec_ms=10, output_bytes=8)),
        Task("b", None, ("a",), TaskProfile(exec_ms=10, output_bytes=8)),
    ],
)


def test_job_and_task_spans_carry_the_trace_and_its_fields() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    from compass.observe.otel import OtelExport

    exporter = InMemorySpanExporter()
    otel = OtelExport(exporter, instance="abc123", batch=False)
    tracer = Tracer()
    tracing = tracer.start("j", forced=False, traceparent=CALLER, received=10.0,
                           follow_caller=True)  # fmt: skip
    assert tracing is not None
    tracer.planned("j", 0, {"a": "w0", "b": "w1"}, 10.001)
    a = {"task": "a", "att": 0, "worker": "w0", "model": "m", "queued": 10.001,
         "start": 10.002, "end": 10.020, "transfer_s": 0.0, "load_s": 0.008, "exec_s": 0.01,
         "hit": False, "batch": 2, "mates": ["k"], "lane": 0, "error": "",
         "cause": "received:j/a<JOB_INPUTS#1"}  # fmt: skip
    b = {**a, "task": "b", "worker": "w2", "model": None, "hit": None, "batch": 1, "mates": [],
         "queued": 10.021, "start": 10.021, "end": 10.030, "load_s": 0.0,
         "error": "JobFailed"}  # fmt: skip
    for span in (a, b):
        tracer.task_ended("j", span)
        otel.task("j", "chain", span, tracing)
    record = {"workflow": "chain", "plan": {"a": "w0", "b": "w2"}, "attempts": 1, "ok": False}
    done = tracer.finish("j", record, CHAIN, ingress="w0", answered=10.031, error="JobFailed")
    assert done is not None
    trace = tracer.trace("j")
    assert trace is not None
    otel.job(trace, done.tracing)
    task_a, task_b, job = exporter.get_finished_spans()
    assert job.name == "job chain" and (task_a.name, task_b.name) == ("task a", "task b")
    assert {s.context.trace_id for s in (task_a, task_b, job)} == {tracing.parent.trace_id}
    assert job.context.span_id == tracing.parent.span_id
    assert job.parent is not None and job.parent.span_id == 0x00F067AA0BA902B7
    assert task_a.parent is not None and task_a.parent.span_id == job.context.span_id
    assert task_a.context.span_id != task_b.context.span_id
    assert (task_a.start_time, task_a.end_time) == (10_001_000_000, 10_020_000_000)
    assert dict(task_a.attributes or {}) == {
        "compass.job": "j", "compass.workflow": "chain", "compass.task": "a",
        "compass.worker": "w0", "compass.planned_worker": "w0", "compass.attempt": 0,
        "compass.transfer_ms": 0.0, "compass.queued_ms": pytest.approx(1.0),
        "compass.load_ms": pytest.approx(8.0), "compass.exec_ms": pytest.approx(10.0),
        "compass.batch": 2, "compass.batch_mates": ["k"], "compass.lane": 0,
        "compass.cause": "received:j/a<JOB_INPUTS#1",
        "compass.model": "m", "compass.cache_hit": False,
    }  # fmt: skip
    assert [e.name for e in task_a.events] == ["lane", "model loaded"]
    assert (task_b.attributes or {})["compass.planned_worker"] == "w1"  # moved to w2
    assert "compass.cache_hit" not in (task_b.attributes or {})
    assert task_b.status.status_code == StatusCode.ERROR == job.status.status_code
    plan = (job.attributes or {})["compass.plan"]
    assert isinstance(plan, list | tuple) and list(plan) == ["a=w0", "b=w1"]
    assert job.resource.attributes["service.instance.id"] == "abc123"
    assert otel.exported == 3
    assert task_span is not None  # the spans above are shaped as task_span makes them


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_compass_works_without_the_extra_and_says_what_to_install() -> None:
    # OpenTelemetry made unimportable, as where compass[otel] is not installed: the worker,
    # the client and a trace work; only an OTel endpoint is refused, in one line
    done = run_python(
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "from compass.config import WorkerConfig\n"
        "from compass.errors import ConfigError\n"
        "import compass.client, compass.worker.server, compass.observe.otel\n"
        "from compass.observe.tracing import Tracer\n"
        "t = Tracer(sample=1.0)\n"
        "assert t.start('j', forced=False, traceparent=None, received=0.0) is not None\n"
        "try:\n"
        "    compass.observe.otel.OtelExport.to_endpoint('http://x:4318/v1/traces', instance='i')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("--otel-endpoint needs OpenTelemetry, which is not installed")
    assert "pip install 'compass[otel]'" in line


def test_nothing_imports_opentelemetry_unless_an_endpoint_is_given() -> None:
    done = run_python(
        "import sys, compass.client, compass.worker.server, compass.observe.otel\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
