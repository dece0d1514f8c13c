"""Job traces on real workers: a crafted job with a known plan, a cache miss and a batch, its
trace from the client, ``compass status``, the dashboard and ``compass submit --trace``; and
its OpenTelemetry spans, in memory and exported by worker processes over OTLP/HTTP to a
receiver in the test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass import Client, JobOptions, JobTrace, SyncClient
from compass.cluster import LocalCluster
from compass.config import WorkerConfig
from compass.errors import InvalidInputs
from compass.trace import BREAKDOWN, parse_traceparent
from compass.worker.process import build_worker

from .chromium import CHROMIUM, Chromium, chromium_path
from .conftest import compass_argv
from .test_metrics import http_get

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def pair_workload(tmp_path: Path) -> str:
    """``pair``: ``embed`` (model ``small``, 160 MB: 40 ms to load at 4 GB/s; 60 ms; batches
    of up to 4, each item past the first a quarter of a run) then ``decode`` (model
    ``large``, 320 MB: 80 ms to load; 40 ms)."""
    spec = {
        "name": "traced",
        "cluster": {"workers": 2, "gpu_memory_mb": 1000, "h2d_gbps": 4, "d2h_gbps": 4,
                    "net_gbps": 1, "net_fixed_us": 5},
        "models": {"small": {"size_mb": 160}, "large": {"size_mb": 320}},
        "workflows": {"pair": {"tasks": {
            "embed": {"model": "small", "exec_ms": 60, "input_kb": 100, "output_kb": 100,
                      "after": [], "batch": 4, "batch_item": 0.25},
            "decode": {"model": "large", "exec_ms": 40, "output_kb": 1, "after": ["embed"]},
        }}},
    }  # fmt: skip
    path = tmp_path / "traced.json"
    path.write_text(json.dumps(spec))
    return str(path)


def args(spec: str, *more: str) -> list[str]:
    # round robin deals a job's tasks to the workers in name order, job after job: every
    # job's plan is embed on w0, decode on w1. No warming: the first job meets cold caches.
    # No sampling: only the jobs the client asks for are traced
    return ["--workload", spec, "--policy", "round_robin", "--no-warm", "--trace-sample", "0",
            "--drain-timeout", "0", *more]  # fmt: skip


DATA = np.zeros(100_000, dtype=np.uint8)
TRACED = JobOptions(trace=True)


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_trace_shows_the_plan_a_cache_miss_and_a_batch(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    spec = pair_workload(tmp_path)
    async with (
        LocalCluster(2, args=args(spec, "--metrics-port", "0"), env=worker_env) as cluster,
        cluster.client() as client,
    ):
        first = await client.submit_job("pair", data=DATA, options=TRACED, timeout=30)
        # four at once: the first runs alone, the three queued behind it batch on its lane
        many = await asyncio.gather(
            *(client.submit_job("pair", data=DATA, options=TRACED, timeout=30) for _ in range(4))
        )
        untraced = await client.submit_job("pair", data=DATA, timeout=30)
        status = await client.status()
        kept = await client.trace(first.job_id)
        recent = await client.traces(3)
        with pytest.raises(InvalidInputs, match="keeps no trace of job"):
            await client.trace(untraced.job_id)

        view = json.loads((await asyncio.to_thread(
            http_get, f"http://{status.metrics}/api/cluster"))[1])  # fmt: skip

        def synchronously() -> tuple[JobTrace, JobTrace | None]:
            with SyncClient(cluster.addresses[0], token=cluster.token) as sync:
                return sync.trace(first.job_id), sync.submit_job(
                    "pair", data=DATA, options=TRACED
                ).trace

        by_sync, sync_trace = await asyncio.to_thread(synchronously)
        env = {**worker_env, "COMPASS_TOKEN": cluster.token}
        out = tmp_path / "trace.json"
        submitted = await asyncio.to_thread(subprocess.run, compass_argv(
            "submit", cluster.addresses[0], "pair", "-i", "data=[0, 0, 0]", "--trace",
            "--trace-json", str(out),
        ), env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        cli_job = json.loads(out.read_text())["job"] if out.exists() else ""
        shown = await asyncio.to_thread(subprocess.run, compass_argv(
            "status", cluster.addresses[0], "--trace", cli_job,
        ), env=env, capture_output=True, text=True, timeout=60)  # fmt: skip

    trace = first.trace
    assert trace is not None and untraced.trace is None
    assert (trace.job, trace.workflow, trace.ingress) == (first.job_id, "pair", "w0")
    assert (trace.ok, trace.attempts, trace.retries) == (True, 1, 0)
    parent = parse_traceparent(f"00-{trace.trace_id}-00f067aa0ba902b7-01")
    assert parent is not None  # 32 hex digits: the id its OpenTelemetry spans carry
    embed, decode = trace.tasks  # in the order they started
    # the known plan, and where they ran
    assert (embed.task, embed.worker, embed.planned_worker) == ("embed", "w0", "w0")
    assert (decode.task, decode.worker, decode.planned_worker) == ("decode", "w1", "w1")
    # cold caches: each model missed and was loaded (bytes over the emulated 4 GB/s)
    assert (embed.model, embed.cache_hit, decode.model, decode.cache_hit) == (
        "small", False, "large", False
    )  # fmt: skip
    assert 38 <= embed.load_ms < 80 and 78 <= decode.load_ms < 140
    assert 59 <= embed.exec_ms < 90 and 39 <= decode.exec_ms < 70
    # the root ran where the job arrived; decode's input crossed the wire
    assert embed.transfer_ms == 0 and decode.transfer_ms > 0
    assert (embed.batch, embed.mates) == (1, ())
    assert trace.start <= embed.start < embed.end <= decode.start < decode.end <= trace.end
    # its latency, split: the parts add up to it, and what no part names is a few percent
    parts = trace.breakdown_ms
    assert list(parts) == list(BREAKDOWN) and trace.critical_path == ("embed", "decode")
    assert sum(parts.values()) == pytest.approx(trace.latency_ms)
    assert all(parts[p] >= 0 for p in BREAKDOWN if p != "other")
    assert abs(parts["other"]) <= 0.05 * trace.latency_ms, parts
    named = (
        parts["client"]
        + parts["import"]
        + parts["planning"]
        + parts["result"]
        + sum(t.transfer_ms + t.queued_ms + t.load_ms + t.exec_ms for t in trace.tasks)
    )
    assert named == pytest.approx(trace.latency_ms, rel=0.05)

    # the batch: every embed ran on w0 with its model resident; those that ran together name
    # each other as mates
    ids = {r.job_id for r in many}
    embeds = {r.job_id: r.trace.tasks[0] for r in many if r.trace is not None}
    assert embeds.keys() == ids
    assert all(e.worker == "w0" and e.cache_hit is True and e.load_ms == 0 for e in embeds.values())
    batched = {job: e for job, e in embeds.items() if e.batch > 1}
    assert batched, [e.batch for e in embeds.values()]
    for job, e in batched.items():
        assert len(e.mates) == e.batch - 1 and set(e.mates) <= ids - {job}
        for mate in e.mates:  # its mates ran with it: each names the same run
            assert set(embeds[mate].mates) == {job, *e.mates} - {mate}
        assert e.exec_ms > 60  # a batch runs longer than one item
    queued = [r.trace for r in many if r.trace is not None and r.trace.breakdown_ms["queue"] > 20]
    assert queued  # the batch waited behind the job that ran alone

    # the ingress keeps them: status, the traces request, the dashboard
    assert status.traces["traced"] == 5 and status.traces["sample"] == 0
    assert [b["job"] for b in status.traces["recent"]] == [
        first.job_id, *(r.job_id for r in many)
    ]  # fmt: skip
    assert kept.tasks == trace.tasks and kept.latency_ms <= trace.latency_ms
    assert by_sync == kept and sync_trace is not None and len(sync_trace.tasks) == 2
    assert [t.job for t in recent] == [r.job_id for r in many[-3:]]
    parts_by_worker = {part["name"]: part for part in view["workers"]}
    assert [t["job"] for t in parts_by_worker["w0"]["traces"]][-1] == many[-1].job_id
    assert parts_by_worker["w1"]["traces"] == []

    # compass submit --trace: the result on stdout, the table on stderr, the JSON in the file
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout) is not None
    document = json.loads(out.read_text())
    assert {"job", "workflow", "latency_ms", "tasks"} <= set(document)
    assert [t["task"] for t in document["tasks"]] == ["embed", "decode"]
    for task in document["tasks"]:
        assert {"task", "worker", "planned_worker", "queued_ms", "transfer_ms", "load_ms",
                "cache_hit", "exec_ms", "batch", "start", "end"} <= set(task)  # fmt: skip
    assert JobTrace.from_json(document).job == cli_job
    table = submitted.stderr.splitlines()
    assert table[0].startswith(f"job {cli_job} (pair) at w0:")
    assert table[2].split() == ["task", "worker", "planned", "transfer", "queued", "load",
                                "cache", "exec", "batch", "start", "end"]  # fmt: skip
    assert table[3].split()[:3] == ["*embed", "w0", "w0"]
    assert table[4].split()[:3] == ["*decode", "w1", "w1"]
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[3:5] == table[3:5]  # the same tasks, as the ingress kept


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_the_dashboard_page_lists_the_recent_traces(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    if chromium_path() is None:
        pytest.skip(f"no chromium at {CHROMIUM} nor on PATH (apt-get install chromium)")
    spec = pair_workload(tmp_path)
    async with contextlib.AsyncExitStack() as stack:
        cluster = LocalCluster(1, args=args(spec, "--metrics-port", "0"), env=worker_env)
        await stack.enter_async_context(cluster)
        client = await stack.enter_async_context(cluster.client())
        results = [await client.submit_job("pair", data=DATA, options=TRACED) for _ in range(2)]
        address = (await client.status()).metrics
        assert address is not None  # the worker serves metrics
        page = await asyncio.to_thread(Chromium, tmp_path / "chromium")
        stack.push_async_callback(asyncio.to_thread, page.close)
        await asyncio.to_thread(page.start)
        await asyncio.to_thread(page.open, f"http://{address}/")
        await asyncio.to_thread(
            page.wait_for, "document.querySelectorAll('#traces tr[data-job]').length === 2"
        )
        rows = json.loads(await asyncio.to_thread(page.evaluate, """JSON.stringify(
          [...document.querySelectorAll('#traces tr[data-job]')].map((tr) => ({
            job: tr.dataset.job,
            tasks: [...tr.querySelectorAll('g.task')].map((g) => g.dataset.task),
            parts: tr.querySelectorAll('svg.breakdown rect').length,
          })))"""))  # fmt: skip
        await asyncio.to_thread(page.screenshot, tmp_path / "traces.png")
    # newest first, each with its tasks' waterfall and its latency's breakdown
    assert [row["job"] for row in rows] == [r.job_id for r in reversed(results)]
    assert all(row["tasks"] == ["embed", "decode"] and row["parts"] >= 3 for row in rows)


# -- OpenTelemetry -------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_callers_span_is_the_parent_of_the_job_span_and_it_of_the_task_spans(
    tmp_path: Path,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, StatusCode

    from compass.observe.otel import OtelExport

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("web app")
    config = WorkerConfig(workload=pair_workload(tmp_path), name="w0", trace_sample=0.0)
    worker = build_worker(config)
    async with worker, Client(worker.address) as client:
        # the worker exports into the same in-memory exporter as the caller's spans
        worker.otel = OtelExport(exporter, instance=worker.instance, batch=False)
        with tracer.start_as_current_span("POST /describe") as request:
            answered = await client.submit_job("pair", data=DATA)  # no trace asked for
        untraced = await client.submit_job("pair", data=DATA)  # no caller span, no sampling
        forced = await client.submit_job("pair", data=DATA, options=TRACED)
    provider.shutdown()
    spans = exporter.get_finished_spans()
    by_job: dict[str, list[Any]] = {}
    for span in spans:
        by_job.setdefault(str((span.attributes or {}).get("compass.job", "")), []).append(span)
    assert untraced.job_id not in by_job  # neither sampled nor traced by its caller
    assert answered.trace is None  # traced for OpenTelemetry, not answered with its trace
    (caller,) = by_job[""]
    assert caller.name == "POST /describe"
    mine = {span.name: span for span in by_job[answered.job_id]}
    assert set(mine) == {"job pair", "task embed", "task decode"}
    job_span = mine["job pair"]
    context = request.get_span_context()
    assert job_span.context.trace_id == context.trace_id
    assert job_span.parent is not None and job_span.parent.span_id == context.span_id
    assert job_span.kind == SpanKind.SERVER and job_span.status.status_code == StatusCode.OK
    assert job_span.resource.attributes["service.instance.id"] == worker.instance
    for name in ("task embed", "task decode"):
        task = mine[name]
        assert task.context.trace_id == context.trace_id
        assert task.parent is not None and task.parent.span_id == job_span.context.span_id
        assert task.start_time >= job_span.start_time and task.end_time <= job_span.end_time
    embed = mine["task embed"].attributes or {}
    assert embed["compass.worker"] == embed["compass.planned_worker"] == "w0"
    assert embed["compass.cache_hit"] is False and embed["compass.load_ms"] > 30
    assert embed["compass.batch"] == 1 and embed["compass.exec_ms"] > 50
    job_attrs = job_span.attributes or {}
    assert list(job_attrs["compass.critical_path"]) == ["embed", "decode"]
    assert job_attrs["compass.latency_ms"] > 100
    # a job traced without a caller starts a trace of its own
    (own,) = [s for s in by_job[forced.job_id] if s.name == "job pair"]
    assert own.parent is None and forced.trace is not None
    assert f"{own.context.trace_id:032x}" == forced.trace.trace_id


class OtlpReceiver:
    """A tiny OTLP/HTTP collector: POST /v1/traces, protobuf bodies, kept decoded."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.arrived = asyncio.Event()
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/traces"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """Every span received, with its resource's attributes."""
        out = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    out += [(resource, span) for span in scope.spans]
        return out

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:  # the exporter keeps its connection open
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {
                    k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                assert lines[0].startswith("POST /v1/traces ")
                assert headers["content-type"] == "application/x-protobuf"
                self.requests.append(ExportTraceServiceRequest.FromString(body))
                self.arrived.set()
                reply = ExportTraceServiceResponse().SerializeToString()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(reply), reply))  # fmt: skip
                await writer.drain()
        writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[OtlpReceiver]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield self
        finally:
            self.server.close()
            await self.server.wait_closed()


def attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        value = getattr(pair.value, kind)
        if kind == "array_value":
            value = [item.string_value for item in value.values]
        out[pair.key] = value
    return out


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_worker_processes_export_spans_by_otlp_http(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    spec = pair_workload(tmp_path)
    async with OtlpReceiver().running() as receiver:
        cluster = LocalCluster(2, args=args(spec, "--otel-endpoint", receiver.url), env=worker_env)
        async with cluster, cluster.client() as client:
            answered = await client.submit_job(
                "pair", data=DATA, options=JobOptions(traceparent=CALLER)
            )
            instances = {}
            for i, address in enumerate(cluster.addresses):
                async with Client(address, token=cluster.token) as each:
                    instances[f"w{i}"] = (await each.status()).instance
            # each worker exports in batches (every 0.5 s) and what is left when it stops
        spans = receiver.spans()
    caller = parse_traceparent(CALLER)
    assert caller is not None
    mine = {span.name: (resource, span) for resource, span in spans}
    assert set(mine) == {"job pair", "task embed", "task decode"}, [s.name for _, s in spans]
    job_resource, job_span = mine["job pair"]
    assert job_span.trace_id == caller.trace_id.to_bytes(16, "big")
    assert job_span.parent_span_id == caller.span_id.to_bytes(8, "big")
    assert attributes(job_span.attributes)["compass.job"] == answered.job_id
    for name, worker in (("task embed", "w0"), ("task decode", "w1")):
        resource, span = mine[name]
        assert span.trace_id == job_span.trace_id and span.parent_span_id == job_span.span_id
        assert attributes(span.attributes)["compass.worker"] == worker
        # exported by the worker that ran it
        assert resource["service.instance.id"] == instances[worker]
        assert resource["service.name"] == "compass"
    assert job_resource["service.instance.id"] == instances["w0"]  # the ingress


def test_an_otel_endpoint_without_the_extra_is_a_one_line_config_error(tmp_path: Path) -> None:
    # the exporter cannot be imported, as where compass[otel] is not installed
    code = (
        "import sys; sys.modules['opentelemetry'] = None; "
        "from compass._cli.main import main; main(sys.argv[1:])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "worker", "start", "--port", "0", "--workload",
         pair_workload(tmp_path), "--otel-endpoint", "http://127.0.0.1:4318/v1/traces"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--otel-endpoint needs OpenTelemetry" in lines[0]
    assert "pip install 'compass[otel]'" in lines[0]
    assert "listening" not in done.stdout
