"""The typed client surface against a real worker on loopback: inputs named like options
reach the task while the options reach the worker, the status, answered-job records and
timeline come back typed, and the old spellings still work while they warn."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from compass import JobOptions, JobRecord, SyncClient, WorkerStatus
from compass.cluster import LocalCluster

from .conftest import app_environment, cluster_on_its_own_loop

SURFACE_APP = """
import asyncio
import threading

import compass

app = compass.App("surface")
wf = app.workflow("echo", inputs=["x", "priority", "timeout", "trace"])


@wf.task
def echo(model, x, priority, timeout, trace):
    return {"x": x, "priority": priority, "timeout": timeout, "trace": trace}


later = app.workflow("later", inputs=["x"])


@later.task
async def awaits(model, x):
    await asyncio.sleep(0.01)
    return {"x": x + 1, "thread": threading.current_thread().name}


looped = app.workflow("looped", inputs=["x"])


@looped.task(on_loop=True)
async def on_the_loop(model, x):
    await asyncio.sleep(0.01)
    return {"x": x + 1, "thread": threading.current_thread().name}
"""

#: a job's inputs whose names are also options of the submission methods
INPUTS = {"x": 1, "priority": "high", "timeout": "never", "trace": "on"}


@pytest.fixture(scope="module")
def surface_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    env = app_environment(tmp_path_factory.mktemp("surface"), "surface_app", SURFACE_APP)
    with cluster_on_its_own_loop(1, ["--app", "surface_app"], env=env) as cluster:
        yield cluster


@pytest.mark.asyncio
async def test_inputs_named_like_options_reach_the_task_and_the_options_the_worker(
    surface_worker: LocalCluster,
) -> None:
    async with surface_worker.client() as client:
        await client.records(clear=True)
        assert await client.submit("echo", INPUTS, priority=3, timeout=30) == INPUTS
        # a mapping and keywords together: the keyword is an input too
        rest = {k: v for k, v in INPUTS.items() if k != "x"}
        assert await client.submit("echo", rest, x=5, deadline_ms=60000) == {**INPUTS, "x": 5}
        job = await client.submit_job(
            "echo", inputs=INPUTS, options=JobOptions(priority=1, trace=True)
        )
        assert job.value == INPUTS and job.trace is not None  # the option, and the input
        many = await client.submit_many("echo", [INPUTS, {**INPUTS, "x": 2}], priority=2)
        assert many == [INPUTS, {**INPUTS, "x": 2}]
        submitted = (await client.status()).stats["jobs_submitted"]
        with pytest.raises(TypeError, match=r"inputs=\{'trace': \.\.\.\}"):
            await client.submit("echo", x=1, priority=0, trace="on")
        assert (await client.status()).stats["jobs_submitted"] == submitted  # nothing sent
        records = await client.records()
    assert all(isinstance(r, JobRecord) and r.ok for r in records)
    assert [r.priority for r in records] == [3, 0, 1, 2, 2]
    assert records[1].deadline_s == pytest.approx(60.0)
    assert records[0].deadline_s is None
    assert all(r.plan == {"echo": "w0"} and r.workflow == "echo" for r in records)
    assert records[2].job == job.job_id
    assert len({r.key for r in records}) == 5  # one key a job, the client's


@pytest.mark.asyncio
async def test_status_records_and_timeline_come_back_typed(surface_worker: LocalCluster) -> None:
    async with surface_worker.client() as client:
        await client.submit("echo", INPUTS)
        status = await client.status()
        assert isinstance(status, WorkerStatus)
        assert status.name == "w0" and status.address == surface_worker.addresses[0]
        assert status.workflows == ("echo", "later", "looped")
        assert status.peers == () and not status.draining
        assert status.to_json()["queue"] == status.queue
        with pytest.warns(DeprecationWarning, match=r"status\.name"):
            assert status["name"] == "w0"
        timeline = await client.timeline()
        assert timeline.name == "w0" and timeline.instance == status.instance
        assert any(
            s.task == "echo" and s.workflow == "echo" and not s.error for s in timeline.spans
        )
        seqs = [s.seq for s in timeline.spans]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert await client.records(clear=True)  # read, then emptied
        assert await client.records() == []
        # the old spelling of the transport still works, and says it is deprecated
        with pytest.warns(DeprecationWarning, match="Client.channel"):
            channel = client.channel
        assert await channel.request("ping", 7) == 7


def test_the_sync_client_has_the_same_typed_surface(surface_worker: LocalCluster) -> None:
    address, token = surface_worker.addresses[0], surface_worker.token
    with SyncClient(address, token=token) as client:
        client.records(clear=True)
        assert client.submit("echo", INPUTS, priority=4) == INPUTS
        rest = {k: v for k, v in INPUTS.items() if k != "x"}
        assert client.submit_job("echo", rest, x=None).value == {**INPUTS, "x": None}
        with pytest.raises(TypeError, match="'x' twice"):
            client.submit("echo", INPUTS, x=3)
        assert [r.priority for r in client.records()] == [4, 0]
        assert client.status().name == "w0"
        assert any(s.task == "echo" for s in client.timeline().spans)


@pytest.mark.asyncio
async def test_an_async_task_is_awaited_in_its_task_thread(surface_worker: LocalCluster) -> None:
    async with surface_worker.client() as client:
        answer = await client.submit("later", x=1)
    assert answer["x"] == 2
    assert answer["thread"].startswith("compass-task-"), answer  # not the worker's loop


@pytest.mark.asyncio
async def test_an_on_loop_task_is_awaited_on_the_workers_own_loop(
    surface_worker: LocalCluster,
) -> None:
    async with surface_worker.client() as client:
        answer = await client.submit("looped", x=1)
    assert answer == {"x": 2, "thread": "MainThread"}  # the worker's loop, no task thread
