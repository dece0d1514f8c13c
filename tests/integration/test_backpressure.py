"""Backpressure from a streamed job's caller to the steps that make its partial outputs, on a
real worker process (compass/worker/windows.py).

A slow caller slows the generation: the sink makes at most ``--stream-window`` partial outputs
ahead of what the caller read, on the ingress or on another worker (which the ingress tells
what was read), so every chunk arrives, in order, and each step ran only once the caller had
read far enough (each partial output carries when its step made it, on the
machine's monotonic clock, which the test and the worker share). A caller that stops reading
for good fails the job within ``--stream-stall-s`` with StreamOverrun, which says why, and the
worker made no more than the windows' worth for it; its lane serves the next job.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from compass.client import Client
from compass.cluster import LocalCluster
from compass.errors import StreamOverrun
from compass.wire.options import ChannelOptions
from compass.wire.tcp import connect
from compass.worker.windows import READ_OP

from .conftest import app_environment

PACED_APP = """
import time

import compass

app = compass.App("paced")
make = app.workflow("make", inputs=["n"])

@make.task(steps=8, step_ms=1.0)
def produce(model, n):
    for i in range(n):
        yield {"i": i, "made": time.monotonic()}  # when this step made its output
    return n
"""

#: the sink's window at the ingress (--stream-window) and the wire's (Client.stream's window)
STEP_WINDOW = 2
WIRE_WINDOW = 2
#: the most partial outputs the worker can make past what the caller read: both windows, the
#: one the ingress's reader holds as it waits for wire credit, the one its step is making
AHEAD = STEP_WINDOW + WIRE_WINDOW + 2


@pytest.fixture
def paced_env(tmp_path: Path) -> dict[str, str]:
    return app_environment(tmp_path, "paced_app", PACED_APP)


def args(*more: str) -> list[str]:
    return ["--app", "paced_app", "--stream-window", str(STEP_WINDOW), *more]


async def read_slowly(client: Client, steps: int) -> None:
    """Stream a job of ``steps`` steps, reading far slower than they run; check that every
    chunk came, in order, and that each step past the windows ran only after the caller read
    the output :data:`AHEAD` before it (without backpressure all are made before the first is
    read)."""
    made: list[float] = []
    read: list[float] = []
    final = None
    async for out in client.stream("make", {"n": steps}, window=WIRE_WINDOW):
        if out.final:
            final = out.value
            break
        read.append(time.monotonic())
        assert out.task == "produce" and out.seq == len(made) == out.value["i"]
        made.append(out.value["made"])
        await asyncio.sleep(0.02)  # a slow reader: far slower than the steps
    assert final == steps and len(made) == steps
    late = [i for i in range(steps - AHEAD) if not made[i + AHEAD] > read[i]]
    assert not late, f"steps {late} ran before the caller read far enough"


@pytest.mark.asyncio
async def test_a_slow_reader_gets_every_chunk_in_order_and_the_steps_wait_for_it(
    paced_env: dict[str, str],
) -> None:
    async with LocalCluster(1, args=args(), env=paced_env) as cluster, cluster.client() as client:
        await read_slowly(client, 30)


@pytest.mark.asyncio
@pytest.mark.timeout(180)  # two worker processes to start, on a busy machine too
async def test_a_sink_on_another_worker_waits_for_the_reads_its_ingress_tells_it(
    paced_env: dict[str, str],
) -> None:
    more = ("--policy", "round_robin")
    async with (
        LocalCluster(2, args=args(*more), env=paced_env) as cluster,
        cluster.client() as client,  # w0: the ingress
    ):
        for _ in range(2):  # round robin: one of the two runs the sink on w1
            await read_slowly(client, 30)
        records = await client.records()
        assert {r.plan["produce"] for r in records} == {"w0", "w1"}


@pytest.mark.asyncio
async def test_a_reader_that_stops_fails_its_job_within_the_bound_and_costs_its_window(
    paced_env: dict[str, str],
) -> None:
    more = ("--stream-stall-s", "1")
    async with (
        LocalCluster(1, args=args(*more), env=paced_env) as cluster,
        cluster.client() as client,
    ):
        items = client.stream("make", {"n": 100_000}, window=WIRE_WINDOW)
        first = await items.__anext__()
        assert first.value["i"] == 0
        # the reader reads no more: the step waiting for it gives up and the job fails
        async with asyncio.timeout(30):
            while not [r for r in await client.records() if not r.ok]:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        seen = [first.value["i"]]

        async def read_on() -> None:  # what was made before it failed, then why
            async for out in items:
                seen.append(out.value["i"])

        with pytest.raises(StreamOverrun, match="waited 1 s for the caller to read"):
            await read_on()
        assert seen == list(range(len(seen)))  # in order, no gap
        assert len(seen) <= 1 + AHEAD  # the worker made only the windows' worth for it
        # its lane is free: the next job runs whole
        whole = [out async for out in client.stream("make", {"n": 3}, window=WIRE_WINDOW)]
        assert [o.value["i"] for o in whole[:-1]] == [0, 1, 2] and whole[-1].value == 3
        tables = (await client.status()).tables
        assert tables["step_windows"] == 0 and tables["streams"] == 0  # nothing kept of them


@pytest.mark.asyncio
async def test_a_malformed_or_forged_read_is_dropped_and_the_worker_serves_on(
    paced_env: dict[str, str],
) -> None:
    async with LocalCluster(1, args=args(), env=paced_env) as cluster, cluster.client() as client:
        before = (await client.status()).stats["messages_dropped"]
        options = ChannelOptions(name="w9", token=cluster.token)
        async with await connect(cluster.addresses[0], options, role="worker") as peer:
            for bad in ({"job": 1, "task": "produce", "seq": 0}, {"job": "j"}, "read", None):
                peer.notify(READ_OP, bad)
            peer.notify(READ_OP, {"job": "nobody", "task": "produce", "seq": 3})  # no such task
            await peer.request("ping", None)  # notifies on one channel arrive in order
        raw = client._connected()  # a client may not send what only peers send
        raw.notify(READ_OP, {"job": "nobody", "task": "produce", "seq": 3})
        await client.ping()
        assert (await client.status()).stats["messages_dropped"] == before + 5
        await read_slowly(client, 10)
