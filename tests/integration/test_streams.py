"""Streams when a real process dies mid-stream (SIGKILL): the reader of a dead producer gets
:class:`ConnectionLost` after the items that arrived, in order, none twice; the producer of a
dead reader closes its generator (its ``finally`` runs) and frees the stream's state."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest

from compass.config import Timeouts
from compass.errors import ConnectionLost
from compass.wire.rpc import Router
from compass.wire.transport import Channel, ChannelOptions, connect, serve

from .conftest import worker_environment

TOKEN = "streams-secret"
FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=1.0)

PRODUCER = textwrap.dedent(
    """
    import asyncio, sys
    from compass.wire.rpc import Router
    from compass.wire.transport import ChannelOptions, serve

    router = Router()

    @router.stream("forever")
    async def forever(channel, body):
        i = 0
        while True:
            yield i
            i += 1
            await asyncio.sleep(0.001)

    async def main():
        options = ChannelOptions(name="doomed", token=sys.argv[1])
        server = await serve("127.0.0.1", 0, options, handler=router.handle_request)
        print(server.address[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)

READER = textwrap.dedent(
    """
    import asyncio, sys
    from compass.wire.transport import ChannelOptions, connect

    async def main():
        options = ChannelOptions(name="reader", token=sys.argv[1])
        channel = await connect(("127.0.0.1", int(sys.argv[2])), options)
        items = channel.stream("forever", None, window=4)
        for _ in range(3):
            await items.__anext__()
        print("read", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def start(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, TOKEN, *args],
        stdout=subprocess.PIPE,
        text=True,
        env=worker_environment(),
    )


def stop(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


async def collect(items: AsyncIterator[Any], into: list[Any]) -> None:
    async for item in items:
        into.append(item)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_producer_killed_mid_stream_is_connection_lost_after_its_items() -> None:
    producer = start(PRODUCER)
    try:
        assert producer.stdout is not None
        port = int(await asyncio.to_thread(producer.stdout.readline))
        channel = await connect(("127.0.0.1", port), ChannelOptions(name="cli", token=TOKEN))
        try:
            items = channel.stream("forever", None, window=8)
            got = [await items.__anext__() for _ in range(20)]
            producer.kill()
            with pytest.raises(ConnectionLost, match="'doomed'"):
                await asyncio.wait_for(collect(items, got), 20)
            assert got == list(range(len(got)))  # every item once, in order, then the error
            with pytest.raises(ConnectionLost):
                await items.__anext__()
        finally:
            await channel.aclose()
    finally:
        stop(producer)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_reader_killed_mid_stream_closes_the_producers_generator() -> None:
    router = Router()
    produced: list[int] = []
    closed = asyncio.Event()
    channels: list[Channel] = []

    @router.stream("forever")
    async def forever(channel: Channel, body: Any) -> AsyncIterator[int]:
        try:
            i = 0
            while True:
                produced.append(i)
                yield i
                i += 1
        finally:
            closed.set()

    options = ChannelOptions(name="producer", token=TOKEN, timeouts=FAST)
    server = await serve(
        "127.0.0.1", 0, options, handler=router.handle_request, on_channel=channels.append
    )
    async with server:
        reader = start(READER, str(server.address[1]))
        try:
            assert reader.stdout is not None
            assert (await asyncio.to_thread(reader.stdout.readline)).strip() == "read"
            # it took 3 of a window of 4 and granted 2 (half a window) back: never more made
            assert len(produced) <= 4 + 2
            reader.kill()
            await asyncio.wait_for(closed.wait(), 20)
            (channel,) = channels
            await asyncio.wait_for(channel.wait_closed(), 20)
            assert channel.in_flight == 0 and channel._conn.streams.producing == 0
            assert len(produced) <= 4 + 2  # nothing more made for the dead reader
        finally:
            stop(reader)
