"""Streamed jobs across two real workers on loopback TCP: a step-wise sink's partial outputs
reach the ingress in order, as they are made, then the final output; a reader that leaves
early cancels the job, and its generator stops at its next step; a reader too slow for the
ingress's bound gets StreamOverrun and the job is cancelled, never a silent gap.

The workers run in this process (each its own sockets, threads and core), with ``round_robin``
placement so that the generating task runs on the other worker as often as on the ingress.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator

import pytest

import compass
from compass.config import CacheConfig, SchedConfig, WorkerConfig
from compass.errors import InvalidInputs, StreamOverrun, UnknownWorkflow
from compass.wire.options import ChannelOptions
from compass.wire.tcp import connect
from compass.worker import streaming
from compass.worker.process import build_worker
from compass.worker.server import Worker
from compass.worker.streaming import Output, stream_job

app = compass.App("streaming")
tell = app.workflow("tell", inputs=["n"])
#: job -> steps its generator took when it ended (its finally ran)
ENDED: dict[int, int] = {}
#: job -> what its generator waits on before each step past the first (the test lets it go)
PACE: dict[int, threading.Semaphore] = {}


@tell.task(expected_ms=1.0)
def prompt(model: None, n: int) -> int:
    return n


@tell.task(after=["prompt"], steps=8, step_ms=2.0)
def words(model: None, prompt: int) -> Generator[str, None, str]:
    """Word i of job ``prompt`` (a number); the whole text at the end."""
    made = []
    try:
        for i in range(8 if prompt >= 0 else 10_000):
            if prompt < 0 and i > 0:  # a slow job: a step when the test says
                PACE.setdefault(prompt, threading.Semaphore(0)).acquire(timeout=10)
            made.append(f"w{i}")
            yield made[-1]
        return " ".join(made)
    finally:
        ENDED[prompt] = len(made)


def config(name: str, join: tuple[str, ...] = ()) -> WorkerConfig:
    return WorkerConfig(
        name=name,
        app=__name__,
        join=join,
        lanes=2,
        host_lanes=2,
        cache=CacheConfig(backend="host"),
        sched=SchedConfig(policy="round_robin"),
        metrics_port=0,  # the time to first output and steps are observed
    )


async def two_workers() -> tuple[Worker, Worker]:
    w0 = build_worker(config("w0"))
    await w0.start()
    w1 = build_worker(config("w1", join=(w0.address,)))
    await w1.start()
    async with asyncio.timeout(30):
        while not all(w.membership and w.membership.channels.peers for w in (w0, w1)):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return w0, w1


async def collect(worker: Worker, n: int) -> list[Output]:
    return [item async for item in stream_job(worker, "tell", {"n": n})]


@pytest.mark.asyncio
async def test_partial_outputs_reach_the_caller_in_order_then_the_final_output() -> None:
    w0, w1 = await two_workers()
    try:
        for n in range(6):  # round robin: the sink runs on one worker, then the other
            outputs = await asyncio.wait_for(collect(w0, n), 30)
            partial, final = outputs[:-1], outputs[-1]
            assert [(o.task, o.seq, o.value) for o in partial] == [
                ("words", i, f"w{i}") for i in range(8)
            ]
            assert final.final and final.value == " ".join(f"w{i}" for i in range(8))
        assert w1.stats.tasks_run > 0, "the generating task ran on the other worker too"
        first = w0.metrics.registry.get_sample_value(
            "compass_time_to_first_output_seconds_count", {"workflow": "tell"}
        )
        steps = [
            w.metrics.registry.get_sample_value(
                "compass_task_steps_total", {"workflow": "tell", "task": "words"}
            )
            or 0.0
            for w in (w0, w1)
        ]
        assert first == 6 and sum(steps) == 6 * 8
    finally:
        await w1.aclose()
        await w0.aclose()


@pytest.mark.asyncio
async def test_a_reader_that_leaves_early_cancels_the_job_at_its_next_step() -> None:
    w0, w1 = await two_workers()
    try:
        for job in (-1, -2):  # one on each worker
            items = stream_job(w0, "tell", {"n": job})
            first = await asyncio.wait_for(items.__anext__(), 30)
            assert (first.task, first.seq, first.value) == ("words", 0, "w0")
            (job_id,) = w0.core.ingress.jobs
            await items.aclose()  # the reader leaves
            async with asyncio.timeout(30):  # both workers dropped the job: its task stops
                while not all(w.core.is_done(job_id, 0) for w in (w0, w1)):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            PACE.setdefault(job, threading.Semaphore(0)).release()  # its step 1 may end now
            async with asyncio.timeout(30):
                while job not in ENDED:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert 1 <= ENDED[job] <= 2  # at the end of a step under way, of its 10,000
        # both lanes are free again: a whole job runs
        assert (await asyncio.wait_for(collect(w0, 3), 30))[-1].final
    finally:
        await w1.aclose()
        await w0.aclose()


@pytest.mark.asyncio
async def test_a_reader_too_slow_gets_stream_overrun_and_the_job_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streaming, "MAX_BEHIND", 4)
    w0, w1 = await two_workers()
    try:
        items = stream_job(w0, "tell", {"n": -3})
        assert (await asyncio.wait_for(items.__anext__(), 30)).seq == 0
        for _ in range(12):  # the generator runs ahead while the reader reads nothing
            PACE.setdefault(-3, threading.Semaphore(0)).release()

        async def read_slowly() -> None:
            async for _item in items:
                await asyncio.sleep(0.2)  # slower than the steps

        with pytest.raises(StreamOverrun, match="4 partial outputs behind"):
            await asyncio.wait_for(read_slowly(), 30)
        async with asyncio.timeout(30):
            while -3 not in ENDED:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert ENDED[-3] < 20
    finally:
        for _ in range(20):
            PACE.setdefault(-3, threading.Semaphore(0)).release()
        await w1.aclose()
        await w0.aclose()


@pytest.mark.asyncio
async def test_a_remote_caller_reads_a_streamed_job_over_the_wire() -> None:
    w0, w1 = await two_workers()
    channel = await connect(w0.address, ChannelOptions(name="reader", token=w0.config.token))
    try:
        for n in range(2):
            async with channel.stream("stream", {"workflow": "tell", "inputs": {"n": n}}) as items:
                got = [item async for item in items]
            assert got == [{"task": "words", "seq": i, "value": f"w{i}"} for i in range(8)]
            assert items.result == " ".join(f"w{i}" for i in range(8))
        with pytest.raises(InvalidInputs, match="takes no key"):
            async with channel.stream("stream", {"workflow": "tell", "key": "k"}) as items:
                [item async for item in items]
        with pytest.raises(UnknownWorkflow):
            async with channel.stream("stream", {"workflow": "nope", "inputs": {}}) as items:
                [item async for item in items]
    finally:
        await channel.aclose()
        await w1.aclose()
        await w0.aclose()


@pytest.mark.asyncio
async def test_the_clients_stream_a_job_and_leaving_the_loop_cancels_it() -> None:
    w0, w1 = await two_workers()
    client = compass.Client(w0.address)
    sync = compass.SyncClient(w0.address)
    try:
        got = [out async for out in client.stream("tell", {"n": 4})]
        assert [(o.task, o.seq, o.value, o.final) for o in got[:-1]] == [
            ("words", i, f"w{i}", False) for i in range(8)
        ]
        assert got[-1].final and got[-1].value == " ".join(f"w{i}" for i in range(8))
        # the blocking client, from a thread of its own
        same = await asyncio.to_thread(lambda: list(sync.stream("tell", n=5)))
        assert [o.value for o in same] == [o.value for o in got]
        # leaving the loop early: the job is cancelled, its generator stops at a step
        items = client.stream("tell", {"n": -4})
        async for out in items:
            assert out.seq == 0
            break
        (job_id,) = w0.core.ingress.jobs
        await items.aclose()  # type: ignore[attr-defined]
        async with asyncio.timeout(30):  # both workers dropped the job: its task stops
            while not all(w.core.is_done(job_id, 0) for w in (w0, w1)):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        PACE.setdefault(-4, threading.Semaphore(0)).release()
        async with asyncio.timeout(30):
            while -4 not in ENDED:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert ENDED[-4] <= 2
    finally:
        await asyncio.to_thread(sync.close)
        await client.aclose()
        await w1.aclose()
        await w0.aclose()
