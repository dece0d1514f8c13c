"""Steps and streams, seen on a real worker process: a step-wise task's trace sums up its
steps (how many, the first one's time, the time they waited for a slow caller) and the job's
gives its time to first output; ``/metrics`` counts the steps (their rate is steps per second)
and times the first output per workflow; the dashboard's JSON and ``compass_streams_in_flight``
show a stream while its caller reads it, with its partial outputs made and read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from compass.cluster import LocalCluster

from .conftest import app_environment
from .test_backpressure import PACED_APP, STEP_WINDOW, WIRE_WINDOW
from .test_metrics import http_get, scrape, value


@pytest.fixture
def paced_env(tmp_path: Path) -> dict[str, str]:
    return app_environment(tmp_path, "paced_app", PACED_APP)


ARGS = ["--app", "paced_app", "--stream-window", str(STEP_WINDOW), "--metrics-port", "0",
        "--trace-sample", "1"]  # fmt: skip


async def worker_part(address: str) -> dict[str, Any]:
    status, text = await asyncio.to_thread(http_get, f"http://{address}/api/worker")
    assert status == 200, text
    part: dict[str, Any] = json.loads(text)
    return part


@pytest.mark.asyncio
async def test_a_traced_stream_shows_its_steps_and_time_to_first_output(
    paced_env: dict[str, str],
) -> None:
    async with LocalCluster(1, args=ARGS, env=paced_env) as cluster, cluster.client() as client:
        address = (await client.status()).metrics
        assert address is not None
        steps = 12
        async for out in client.stream("make", {"n": steps}, window=WIRE_WINDOW):
            if not out.final:
                await asyncio.sleep(0.02)  # slower than the steps: they wait for it
        (trace,) = [t for t in await client.traces() if t.workflow == "make"]
        (task,) = trace.tasks
        assert task.task == "produce" and task.steps == steps
        assert task.first_step_ms is not None and 0 < task.first_step_ms <= task.exec_ms
        assert 0 < task.waited_ms < task.exec_ms  # its steps waited for the slow reader
        assert trace.first_output_ms is not None
        assert 0 < trace.first_output_ms < trace.latency_ms
        # a plain job's trace has neither
        await client.submit("make", n=0)  # a generator of no step: its final output alone
        plain = [t for t in await client.traces() if t.job != trace.job]
        assert plain and plain[-1].first_output_ms is None

        samples = await scrape(address)
        produced = value(samples, "compass_task_steps_total", workflow="make", task="produce")
        assert produced == steps
        first = "compass_time_to_first_output_seconds_count"
        assert value(samples, first, workflow="make") == 1


@pytest.mark.asyncio
async def test_the_dashboard_shows_a_stream_in_flight_with_what_was_made_and_read(
    paced_env: dict[str, str],
) -> None:
    async with LocalCluster(1, args=ARGS, env=paced_env) as cluster, cluster.client() as client:
        address = (await client.status()).metrics
        assert address is not None
        items = client.stream("make", {"n": 100_000}, window=WIRE_WINDOW)
        assert not (await items.__anext__()).final  # then the caller reads no more
        async with asyncio.timeout(30):  # the steps run up to the windows, then wait
            while True:
                part = await worker_part(address)
                (stream,) = part["streams"]
                if stream["made"] > STEP_WINDOW:
                    break
                await asyncio.sleep(0.05)
        assert part["streams_in_flight"] == 1
        assert stream["workflow"] == "make" and stream["job"]
        assert stream["first_output_ms"] is not None and stream["first_output_ms"] > 0
        assert stream["made"] - stream["read"] <= STEP_WINDOW + 1  # what the ingress holds
        assert value(await scrape(address), "compass_streams_in_flight") == 1
        await items.aclose()  # type: ignore[attr-defined]  # the caller leaves
        async with asyncio.timeout(30):
            while (await worker_part(address))["streams_in_flight"]:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert value(await scrape(address), "compass_streams_in_flight") == 0
