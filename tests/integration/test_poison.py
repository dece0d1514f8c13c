"""Poison tasks against real worker processes: an output the wire cannot encode, ``sys.exit``,
a hang. Each fails its own job with a typed error; every worker keeps serving."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from compass.cluster import LocalCluster
from compass.errors import CompassError, CompassTimeout, JobFailed, WorkerUnavailable

from .conftest import app_environment, status_when

POISON_APP = """
import sys
import time

import torch
from torch import nn

import compass

app = compass.App("poison")
app.model("tiny", lambda: nn.Linear(2, 2))

# round_robin places the two tasks on two workers: the set must cross the wire
unencodable = app.workflow("unencodable", inputs=["x"])

@unencodable.task(expected_ms=1)
def make_set(model, x):
    return {1, 2, 3}

@unencodable.task(after=["make_set"], expected_ms=1)
def count(model, make_set):
    return len(make_set)

exits = app.workflow("exits", inputs=["x"])

@exits.task(expected_ms=1)
def leave(model, x):
    sys.exit(3)

hangs = app.workflow("hangs", inputs=["x"])

hangs_host = app.workflow("hangs_host", inputs=["x"])

@hangs_host.task(expected_ms=1, timeout_ms=300)
def hang_host(model, x):
    time.sleep(30)
    return x

@hangs.task(model="tiny", expected_ms=1, timeout_ms=300)
def hang(model, x):
    time.sleep(30)
    return x

gpu = app.workflow("gpu", inputs=["x"])

@gpu.task(model="tiny", expected_ms=1)
def linear(model, x):
    return model(torch.ones(2)).shape[0] + x

echo = app.workflow("echo", inputs=["x"])

@echo.task(expected_ms=1)
def same(model, x):
    return x
"""


@pytest.fixture
def poison_env(tmp_path: Path) -> dict[str, str]:
    return app_environment(tmp_path, "poison_app", POISON_APP)


@pytest.mark.asyncio
async def test_unencodable_outputs_and_sys_exit_fail_their_jobs_and_no_worker(
    poison_env: dict[str, str],
) -> None:
    args = ["--app", "poison_app", "--policy", "round_robin", "--host-lanes", "0"]
    async with LocalCluster(3, args=args, env=poison_env) as cluster:
        await cluster.wait_joined()
        clients = [cluster.client(i) for i in range(3)]
        try:
            for round_ in range(3):
                for client in clients:
                    with pytest.raises(CompassError) as info:
                        await client.submit("unencodable", x=round_, timeout=20)
                    assert "set" in str(info.value)
                    with pytest.raises(JobFailed) as failed:
                        await client.submit("exits", x=round_, timeout=20)
                    assert failed.value.task == "leave" and "SystemExit" in str(failed.value)
            assert all(w.running for w in cluster.workers)
            for i, client in enumerate(clients):  # every worker still runs jobs
                assert await client.submit("echo", x=i, timeout=20) == i
                status = await client.status()
                assert len(status.peers) == 2
        finally:
            for client in clients:
                await client.aclose()


@pytest.mark.asyncio
async def test_a_hung_task_times_out_frees_its_lane_and_sigterm_still_stops_the_worker(
    poison_env: dict[str, str],
) -> None:
    args = ["--app", "poison_app", "--host-lanes", "0", "--max-stuck-tasks", "2"]
    async with LocalCluster(1, args=args, env=poison_env) as cluster, cluster.client() as client:
        with pytest.raises(CompassTimeout) as info:
            await client.submit("hangs", x=1, timeout=20)
        assert "hang" in str(info.value)
        # the lane moved on: a GPU job and another job run at once
        assert await client.submit("gpu", x=1, timeout=20) == 3
        status = await client.status()
        assert status.queue["stuck"] == 1 and not status.queue["degraded"]
        # a second stuck thread reaches --max-stuck-tasks: no more GPU work here
        with pytest.raises(CompassTimeout):
            await client.submit("hangs", x=2, timeout=20)
        status = await status_when(client, lambda s: s.queue["degraded"])
        assert status.queue["stuck"] == 2
        with pytest.raises(WorkerUnavailable):
            await client.submit("gpu", x=1, timeout=20)
        with pytest.raises(WorkerUnavailable):  # model-less work would take a thread too
            await client.submit("echo", x=5, timeout=20)
        worker = cluster.workers[0]
        worker.process.send_signal(signal.SIGTERM)
        # its two task threads are stuck for 30 s more: the worker exits without them
        assert await asyncio.wait_for(worker.process.wait(), 15) == 0


@pytest.mark.asyncio
async def test_stuck_host_lane_threads_are_bounded_and_said(poison_env: dict[str, str]) -> None:
    """Model-less tasks run on host lanes, each in a thread: hung ones count towards
    --max-stuck-tasks like GPU lanes', and past it the worker starts no thread for any task
    (it would pile up hung threads without limit), says so, and serves again once one
    returns."""
    from cli.format import status_lines

    args = ["--app", "poison_app", "--host-lanes", "1", "--max-stuck-tasks", "2"]
    async with LocalCluster(1, args=args, env=poison_env) as cluster, cluster.client() as client:
        worker = cluster.workers[0]
        for i in range(2):
            with pytest.raises(CompassTimeout):
                await client.submit("hangs_host", x=i, timeout=20)
        status = await status_when(client, lambda s: s.queue["degraded"])
        assert status.queue["stuck"] == 2
        assert any("DEGRADED" in line for line in status_lines(status.to_json()))
        threads = _threads(worker.process.pid)
        for i in range(4):  # neither hung nor plain model-less work takes a thread now
            with pytest.raises(WorkerUnavailable) as info:
                await client.submit("hangs_host" if i % 2 else "echo", x=i, timeout=20)
            assert "stuck" in str(info.value)
        assert _threads(worker.process.pid) == threads
        status = await client.status()
        assert status.queue["stuck"] == 2 and status.queue["host_running"] == 0


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no thread count")
