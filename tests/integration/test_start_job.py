"""A submitted job starts in the loop turn that read it (``Worker.begin_job``): its answer is a
future of its own, and the worker forgets it once it is answered or cancelled, whether it was
awaited, cancelled (the job is cancelled) or never awaited (a wire submit answers from its
done callback)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from compass import Client
from compass.config import WorkerConfig
from compass.errors import CompassError
from compass.worker.process import build_worker
from compass.worker.server import Worker

APP = "compass._bench.apps"


async def _settled(worker: Worker) -> None:
    """Wait until ``worker`` holds no job's future."""
    for _ in range(500):
        if not worker.table_sizes()["answers"]:
            return
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_job_starts_at_once_and_its_future_goes_however_its_wait_ends() -> None:
    worker = build_worker(WorkerConfig(name="w0", app=APP, token=secrets.token_hex(16)))
    async with worker:
        job_id, answer = worker.begin_job("noop", {"x": 7})
        # planned and its task started before anything awaited
        assert worker.core.ingress.jobs[job_id].plan == {"nothing": "w0"}
        assert [e.job_id for e in worker.core.lanes.running()] == [job_id]
        assert await answer == 7
        await _settled(worker)
        assert worker.table_sizes()["answers"] == 0

        never_awaited, answer = worker.begin_job("noop", {"x": 8})
        del answer  # nobody awaits it
        await _settled(worker)  # the job ran on, and was answered to nobody
        assert worker.table_sizes()["answers"] == 0
        assert never_awaited not in worker.core.ingress.jobs

        steps = {"steps": 50, "step_ms": 20.0, "chunk": 8}
        long_job, answer = worker.begin_job("generation", steps)
        await asyncio.sleep(0.05)
        answer.cancel()  # its caller stops waiting: the job is cancelled
        with pytest.raises(asyncio.CancelledError):
            await answer
        await _settled(worker)
        assert worker.table_sizes()["answers"] == 0
        assert long_job not in worker.core.ingress.jobs

        with pytest.raises(CompassError) as failed:
            await worker.begin_job("no-such-workflow", {})[1]
        assert failed.value.detail is not None and "job_id" in failed.value.detail


@pytest.mark.asyncio
async def test_a_client_submits_through_it_and_its_reply_names_the_job() -> None:
    token = secrets.token_hex(16)
    worker = build_worker(WorkerConfig(name="w0", app=APP, token=token))
    async with worker, Client(worker.address, token=token) as client:
        assert await client.submit("noop", x=3) == 3
        result = await client.submit_job("noop", x=4)
        assert result.value == 4 and result.job_id.startswith("w0")
        await _settled(worker)
        assert worker.table_sizes()["answers"] == 0
