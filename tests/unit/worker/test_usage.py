"""What ``compass status`` says a worker process holds: its memory, descriptors, threads and
tasks, and the sizes of its tables (compass/observe/usage.py), without a socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from compass.config import WorkerConfig
from compass.observe.usage import process_usage
from compass.worker.process import build_worker
from compass.worker.requests import describe
from compass.worker.server import Worker

PAPER = str(Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json")


@pytest.fixture
def worker() -> Worker:
    return build_worker(WorkerConfig(name="w0", workload=PAPER))


def test_status_says_what_the_process_holds(worker: Worker) -> None:
    process = describe(worker)["process"]
    assert set(process) == {"rss_mb", "open_fds", "asyncio_tasks", "threads"}
    assert 10 < process["rss_mb"] < 100_000  # MB: an interpreter with numpy loaded
    assert process["open_fds"] >= 3  # stdin, stdout, stderr at least
    assert process["threads"] >= 1
    assert process["asyncio_tasks"] is None  # no loop runs here


def test_the_tasks_of_the_running_loop_are_counted() -> None:
    async def counted() -> int | None:
        async def idle() -> None:
            await asyncio.sleep(1)

        tasks = [asyncio.create_task(idle()) for _ in range(3)]
        try:
            count: int | None = process_usage()["asyncio_tasks"]
            return count
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    assert asyncio.run(counted()) == 4  # three, and the one that asks


def test_status_gives_the_size_of_each_table(worker: Worker) -> None:
    tables = describe(worker)["tables"]
    for name in ("jobs", "inbox", "finished", "keys", "answered_keys", "links_sent", "answers",
                 "tasks", "held", "trace", "tracer_kept", "timeline_spans", "view",
                 "handler_tasks"):  # fmt: skip
        assert tables[name] == 0, name  # nothing happened yet
    assert "members" not in tables  # not started: no membership yet
    worker.trace.append({"job": "w0-1"})
    worker.core.ingress.answered.put("k", b"v" * (1 << 20), None, now=0.0)
    tables = describe(worker)["tables"]
    assert (tables["trace"], tables["answered_keys"], tables["answered_values"]) == (1, 1, 1)
    assert tables["answered_mb"] == 1.0
    assert all(isinstance(size, int | float) and size >= 0 for size in tables.values())
