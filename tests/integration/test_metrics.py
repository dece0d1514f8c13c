"""A worker's Prometheus endpoint and its JSON logs, against real worker processes: scraped
over real HTTP, parsed with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from compass.cluster import LocalCluster
from compass.errors import JobFailed, Overloaded

from .conftest import PAPER, compass_argv

#: tasks per workflow of the paper's workload, and how many of them use a model
PAPER_TASKS = {
    "translation": (5, 4),
    "question_answer": (2, 2),
    "img_to_sound": (4, 3),
    "object_detection": (4, 2),
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def scrape(address: str) -> Samples:
    """Every sample of ``/metrics``, keyed by name and labels."""
    status, text = await asyncio.to_thread(http_get, f"http://{address}/metrics")
    assert status == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``name``'s samples summed by the value of ``label``."""
    out: dict[str, float] = defaultdict(float)
    for (sample, labels), number in samples.items():
        if sample == name:
            out[dict(labels)[label]] += number
    return dict(out)


async def raw_request(address: str, data: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.asyncio
async def test_metrics_count_jobs_tasks_and_the_cache_over_http(
    worker_env: dict[str, str],
) -> None:
    port = free_port()
    # 8 GB of cache for 20.8 GB of models: the mix forces evictions; no warming, so the cache
    # is still once the jobs are done
    args = ["--workload", PAPER, "--time-scale", "0.02", "--cache-mb", "8000", "--no-warm",
            "--metrics-port", str(port)]  # fmt: skip
    names = list(PAPER_TASKS) * 3
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        address = f"127.0.0.1:{port}"
        assert (await client.status()).metrics == address
        payload = np.zeros(3000 * 1000, dtype=np.uint8)
        await asyncio.gather(*(client.submit(n, data=payload, timeout=60) for n in names))
        samples = await scrape(address)
        for _ in range(100):  # a load begun for the last tasks may still be finishing
            if value(samples, "compass_cache_loading_models") == 0:
                break
            await asyncio.sleep(0.05)
            samples = await scrape(address)

        assert by_label(samples, "compass_jobs_total", "outcome") == {
            "ok": len(names), "failed": 0, "cancelled": 0, "refused": 0
        }  # fmt: skip
        assert value(samples, "compass_jobs_in_flight") == 0
        jobs_by_workflow = by_label(samples, "compass_job_latency_seconds_count", "workflow")
        assert jobs_by_workflow == dict.fromkeys(PAPER_TASKS, 3)
        assert value(samples, "compass_job_latency_seconds_count", workflow="translation",
                     outcome="ok") == 3  # fmt: skip
        assert value(samples, "compass_job_latency_seconds_sum", workflow="translation",
                     outcome="ok") > 0  # fmt: skip
        tasks = sum(n for n, _ in PAPER_TASKS.values()) * 3
        model_tasks = sum(m for _, m in PAPER_TASKS.values()) * 3
        assert by_label(samples, "compass_tasks_total", "outcome") == {"ok": tasks, "failed": 0}
        latency = by_label(samples, "compass_task_latency_seconds_count", "workflow")
        assert latency == {name: 3 * n for name, (n, _) in PAPER_TASKS.items()}
        assert value(samples, "compass_task_latency_seconds_count", workflow="translation",
                     task="mt5_a") == 3  # fmt: skip
        assert value(samples, "compass_task_exec_seconds_count", workflow="translation",
                     task="mt5_a") == 3  # fmt: skip
        assert sum(by_label(samples, "compass_task_queue_wait_seconds_count", "workflow")
                   .values()) == tasks  # fmt: skip
        # buckets are cumulative: +Inf holds every observation
        assert value(samples, "compass_task_latency_seconds_bucket", workflow="translation",
                     task="mt5_a", le="+Inf") == 3  # fmt: skip

        hits = value(samples, "compass_cache_hits_total")
        misses = value(samples, "compass_cache_misses_total")
        assert hits + misses == model_tasks
        assert misses > 0 and value(samples, "compass_cache_evictions_total") > 0
        loaded = value(samples, "compass_cache_loaded_bytes_total")
        evicted = value(samples, "compass_cache_evicted_bytes_total")
        resident = value(samples, "compass_cache_resident_bytes")
        assert value(samples, "compass_cache_aborted_loads_total") == 0
        assert loaded == resident + evicted  # every byte loaded is resident or was evicted
        capacity = value(samples, "compass_cache_capacity_bytes")
        assert resident <= capacity - value(samples, "compass_cache_free_bytes")
        assert capacity <= 8000 * (1 << 20)
        assert value(samples, "compass_cache_loads_total") >= 1
        assert value(samples, "compass_model_load_seconds_total") > 0

        status = await client.status()  # the metrics read the same counters as `status`
        assert value(samples, "compass_cache_evictions_total") == status.cache["stats"]["evictions"]
        assert value(samples, "compass_peers") == 0
        # one idle worker: the rule wants the minimum, and status says the same
        assert value(samples, "compass_desired_workers") == 1
        assert status.desired_workers["desired"] == 1
        assert value(samples, "compass_ready") == 1
        assert value(samples, "compass_worker_info", worker="w0", version=status.version,
                     policy="compass") == 1  # fmt: skip

        assert await asyncio.to_thread(http_get, f"http://{address}/ready") == (200, "ready\n")
        assert (await asyncio.to_thread(http_get, f"http://{address}/nope"))[0] == 404
        garbage = await raw_request(address, b"hello\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 ")
        huge = await raw_request(address, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000)
        assert huge.startswith(b"HTTP/1.1 431 ")
        posted = await raw_request(address, b"POST /metrics HTTP/1.1\r\n\r\n")
        assert posted.startswith(b"HTTP/1.1 405 ")
    # the endpoint closes with the worker
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(http_get, f"http://{address}/ready")


@pytest.mark.asyncio
async def test_refused_and_cancelled_jobs_are_counted(worker_env: dict[str, str]) -> None:
    # unscaled time: a translation job runs for seconds, long enough to be refused beside
    args = ["--workload", PAPER, "--max-jobs", "1", "--metrics-port", "0", "--no-warm"]
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        address = (await client.status()).metrics
        assert address is not None  # the worker serves metrics
        payload = np.zeros(1000, dtype=np.uint8)
        running = asyncio.create_task(client.submit("translation", data=payload, timeout=60))
        for _ in range(500):
            if value(await scrape(address), "compass_jobs_in_flight") == 1:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(Overloaded):
            await client.submit("translation", data=payload, timeout=60)
        running.cancel()  # the client stops waiting: the ingress drops the job
        with pytest.raises(asyncio.CancelledError):
            await running
        for _ in range(500):
            samples = await scrape(address)
            if value(samples, "compass_jobs_in_flight") == 0:
                break
            await asyncio.sleep(0.01)
        assert by_label(samples, "compass_jobs_total", "outcome") == {
            "ok": 0, "failed": 0, "cancelled": 1, "refused": 1
        }  # fmt: skip
        assert value(samples, "compass_job_latency_seconds_count", workflow="translation",
                     outcome="cancelled") == 1  # fmt: skip


@pytest.mark.asyncio
async def test_json_logs_name_model_loads_and_failed_tasks(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["--app", "examples.vision_app", "--log-level", "info", "--log-format", "json",
            "--metrics-port", "0"]  # fmt: skip
    images = torch.zeros(2, 3, 32, 32)
    async with LocalCluster(1, args=args, env=worker_env, log_dir=tmp_path) as cluster:
        async with cluster.client() as client:
            address = (await client.status()).metrics
            assert address is not None  # the worker serves metrics
            result = await client.submit("describe", image=images, timeout=60)
            assert set(result) == {"label", "probs", "embedding"}
            with pytest.raises(JobFailed):
                await client.submit("fails", x=41, timeout=60)
            samples = await scrape(address)
        log_path = cluster.workers[0].log_path
    assert by_label(samples, "compass_jobs_total", "outcome") == {
        "ok": 1, "failed": 1, "cancelled": 0, "refused": 0
    }  # fmt: skip
    assert value(samples, "compass_tasks_total", outcome="failed") == 1
    assert value(samples, "compass_task_latency_seconds_count", workflow="fails",
                 task="explode") == 1  # fmt: skip

    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert records and all(
        {"time", "level", "logger", "message"} <= set(record) for record in records
    )
    loads = {r["model"]: r for r in records if r["message"].startswith("loaded model")}
    assert set(loads) == {"encoder", "classifier"}
    assert all(r["level"] == "info" and r["bytes"] > 0 for r in loads.values())
    assert all(r["logger"] == "compass.cache.models" for r in loads.values())
    failed = [r for r in records if r.get("task") == "explode"]
    assert len(failed) == 1
    task_line = failed[0]
    assert task_line["level"] == "warning" and task_line["worker"] == "w0"
    assert "ValueError" in task_line["message"] and "cannot handle 41" in task_line["message"]
    job_lines = [
        r for r in records if r.get("job") == task_line["job"] and r.get("outcome") == "failed"
    ]
    assert len(job_lines) == 1 and job_lines[0]["workflow"] == "fails"
    assert job_lines[0]["level"] == "warning"  # seen at the default log level
    assert any("metrics on http://" in r["message"] for r in records)


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--metrics-port", "70000"], ["--metrics-port", "70000"]),
        (["--log-format", "xml"], ["--log-format", "xml"]),
        (["--metrics-port", "0", "--metrics-host", "no.such.host.invalid"],
         ["--metrics-host", "no.such.host.invalid"]),
    ],
    ids=["port-range", "log-format", "metrics-host"],
)  # fmt: skip
def test_bad_observability_flags_are_one_line(
    worker_env: dict[str, str], flags: list[str], names: list[str]
) -> None:
    argv = compass_argv("worker", "start", "--port", "0", "--workload", PAPER, *flags)
    done = subprocess.run(argv, env=worker_env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert all(name in lines[0] for name in names), lines[0]


def test_a_metrics_port_in_use_is_one_clear_error(worker_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = compass_argv("worker", "start", "--port", "0", "--workload", PAPER,
                            "--metrics-port", str(port))  # fmt: skip
        done = subprocess.run(argv, env=worker_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "--metrics-port" in lines[0]
    assert "listening" not in done.stdout  # it never served
