"""Streams over real loopback TCP: items in order with their final body, errors typed, and every
limit: a slow reader holds the producer after ``window`` items; a reader that never grants (or
never reads) costs the producer at most its window; a reader that leaves, is cancelled or
disconnects closes the producer's generator (its ``finally`` runs) and frees its state; a
producer lost mid-stream is a :class:`ConnectionLost` after the items that arrived; many streams
on one channel interleave fairly, each in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from compass.config import Limits, Timeouts
from compass.errors import (
    ConfigError,
    ConnectionClosed,
    ConnectionLost,
    ProtocolError,
    RemoteError,
    UnknownOperation,
    UnknownWorkflow,
    WorkerUnavailable,
)
from compass.wire import streams as streams_module
from compass.wire.handlers import StreamResult
from compass.wire.memory import End, memory_pair
from compass.wire.protocol import Connection
from compass.wire.rpc import Router
from compass.wire.tcp import Server, connect, serve
from compass.wire.transport import Channel, ChannelOptions

TOKEN = "streams-token"
FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=1.0)


@dataclass
class Producer:
    """A server's stream handlers, and what they did."""

    produced: dict[int, int] = field(default_factory=dict)  # stream key -> items yielded
    closed: list[int] = field(default_factory=list)  # keys whose generator's finally ran
    router: Router = field(default_factory=Router)
    channels: list[Channel] = field(default_factory=list)

    def __post_init__(self) -> None:
        router = self.router

        @router.stream("count")
        async def count(channel: Channel, body: Any) -> AsyncIterator[Any]:
            key, n = body["key"], body["n"]
            self.produced[key] = 0
            try:
                for i in range(n):
                    self.produced[key] = i + 1
                    yield body.get("item", i) if "item" in body else i
                    if body.get("pause"):
                        await asyncio.sleep(0)
                if body.get("final") is not None:
                    yield StreamResult(body["final"])
            finally:
                self.closed.append(key)

        @router.stream("arrays")
        async def arrays(channel: Channel, body: Any) -> AsyncIterator[Any]:
            for i in range(body):
                yield {"i": i, "a": np.full(1000, i, dtype=np.int64)}

        @router.stream("fails")
        async def fails(channel: Channel, body: Any) -> AsyncIterator[Any]:
            yield 0
            yield 1
            if body == "typed":
                raise UnknownWorkflow("no workflow 'w'", detail={"workflow": "w"})
            if body == "unsendable":
                yield object()
            raise ValueError("the producer broke")

        @router.request("echo")
        async def echo(channel: Channel, body: Any) -> Any:
            return body

    async def until(self, check: Callable[[], bool], what: str) -> None:
        await until(check, what)


async def until(check: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(0.002)


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[tuple[Producer, Server, Channel]]:
    producer = Producer()
    server = await serve(
        "127.0.0.1", 0, ChannelOptions(name="srv", token=TOKEN, timeouts=FAST),
        handler=producer.router.handle_request, on_channel=producer.channels.append,
    )  # fmt: skip
    try:
        channel = await connect(
            server.address, ChannelOptions(name="cli", token=TOKEN, timeouts=FAST)
        )
        try:
            yield producer, server, channel
        finally:
            await channel.aclose()
    finally:
        await server.aclose()


async def collect(items: AsyncIterator[Any], into: list[Any]) -> None:
    async for item in items:
        into.append(item)


def freed(channel: Channel) -> bool:
    """Nothing of any stream left on ``channel``, either way."""
    side = channel._streams
    conn = channel._conn
    return (
        conn.streams.reading == 0
        and conn.streams.producing == 0
        and (side is None or not (side.readers or side.credit_waiters))
        and channel.in_flight == 0
    )


@pytest.mark.asyncio
async def test_items_arrive_in_order_with_their_final_body() -> None:
    async with served() as (producer, _, channel):
        async with channel.stream(
            "count", {"key": 1, "n": 100, "final": "done"}, window=4
        ) as items:
            got = [item async for item in items]
        assert got == list(range(100))
        assert items.result == "done"
        plain = channel.stream("count", {"key": 2, "n": 3})
        assert [item async for item in plain] == [0, 1, 2] and plain.result is None
        assert producer.closed == [1, 2]
        await until(lambda: freed(channel) and freed(producer.channels[0]), "streams freed")


@pytest.mark.asyncio
async def test_arrays_are_streamed_as_views_of_the_receive_buffer() -> None:
    async with served() as (_, _, channel), channel.stream("arrays", 20, window=8) as items:
        seen = 0
        async for item in items:
            array = item["a"]
            assert array.dtype == np.int64 and array.shape == (1000,)
            assert (array == item["i"]).all()
            assert not array.flags.owndata  # decoded in place, not copied
            seen += 1
        assert seen == 20


@pytest.mark.asyncio
async def test_errors_keep_their_type_after_the_items_before_them() -> None:
    async with served() as (_, _, channel):
        got: list[Any] = []
        with pytest.raises(UnknownWorkflow, match="no workflow 'w'") as typed:
            await collect(channel.stream("fails", "typed"), got)
        assert got == [0, 1] and typed.value.detail == {"workflow": "w"}
        got.clear()
        with pytest.raises(RemoteError, match=r"ValueError.*the producer broke") as other:
            await collect(channel.stream("fails", "other"), got)
        assert got == [0, 1] and "Traceback" in other.value.detail["traceback"]
        got.clear()
        with pytest.raises(ProtocolError, match="item 2 of stream 'fails' cannot be sent") as bad:
            await collect(channel.stream("fails", "unsendable"), got)
        assert got == [0, 1] and "object" in str(bad.value)
        assert await channel.request("echo", "served on") == "served on"


def test_a_stream_handler_must_be_an_async_generator() -> None:
    router = Router()

    async def not_a_generator(channel: Channel, body: Any) -> Any:
        return [1, 2]

    with pytest.raises(ConfigError, match="'listed' must be an async generator function"):
        router.stream("listed")(not_a_generator)  # type: ignore[type-var]


@pytest.mark.asyncio
async def test_a_request_op_and_a_stream_op_each_refuse_the_other_way_in() -> None:
    async with served() as (_, _, channel):
        with pytest.raises(UnknownOperation, match="'echo' on 'srv' is a request, not a stream"):
            async for _ in channel.stream("echo", 1):
                pass
        with pytest.raises(UnknownOperation, match="'count' is a stream"):
            await channel.request("count", {"key": 9, "n": 1})
        with pytest.raises(UnknownOperation, match="no handler for request 'nope'"):
            async for _ in channel.stream("nope"):
                pass
        assert await channel.request("echo", "still served") == "still served"
        assert freed(channel)


@pytest.mark.asyncio
async def test_a_slow_reader_holds_the_producer_after_window_items() -> None:
    async with served() as (producer, _, channel):
        served_channel = producer.channels[0]
        items = channel.stream("count", {"key": 1, "n": 1000, "item": "x" * 1000}, window=8)
        await until(lambda: items.buffered == 8, "a window of items arrived")
        for _ in range(20):  # the loop turns; the producer stays held
            await asyncio.sleep(0.005)
        assert producer.produced[1] == 8
        assert items.buffered == 8
        assert served_channel._conn.streams.credit(items.id) == 0
        transport = served_channel._transport
        assert transport is not None and transport.get_write_buffer_size() == 0
        # items taken are granted back, half a window at a time, when the next is asked for:
        # the producer makes exactly that many more
        for _ in range(4):
            await items.__anext__()
        await asyncio.sleep(0.02)
        assert producer.produced[1] == 8  # the reader may still be busy with the fourth
        await items.__anext__()
        await until(lambda: producer.produced[1] == 12, "the producer resumed")
        await until(lambda: items.buffered == 7, "the window refilled")
        await asyncio.sleep(0.02)
        assert producer.produced[1] == 12
        await items.aclose()
        await until(lambda: producer.closed == [1], "the producer's generator closed")


async def raw_reader(
    server: Server,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Connection]:
    """A hand-driven client over a plain socket: does only what the test makes it do."""
    conn = Connection("initiator", token=TOKEN, name="raw", peer_kind="client", limits=Limits())
    reader, writer = await asyncio.open_connection(*server.address)
    writer.writelines(conn.initiate())
    while conn.state.value != "ready":
        conn.receive_data(await reader.read(65536))
        while conn.next_event() is not None:
            pass
        writer.writelines(conn.data_to_send())
    return reader, writer, conn


@pytest.mark.asyncio
async def test_a_reader_that_never_reads_costs_the_producer_at_most_its_window() -> None:
    async with served() as (producer, server, _):
        _, writer, conn = await raw_reader(server)
        try:
            item = "y" * (64 << 10)
            sid = conn.send_stream_open("count", {"key": 7, "n": 10_000, "item": item}, 16)
            writer.writelines(conn.data_to_send())
            await until(lambda: producer.produced.get(7) == 16, "a window produced")
            await asyncio.sleep(0.1)
            assert producer.produced[7] == 16  # never more, though nothing is read
            served_channel = producer.channels[-1]
            assert served_channel._conn.streams.credit(sid) == 0
            transport = served_channel._transport
            assert transport is not None
            assert transport.get_write_buffer_size() <= 16 * (len(item) + 64)
        finally:
            writer.close()
        await until(lambda: producer.closed == [7], "the generator closed on disconnect")
        await until(lambda: freed(producer.channels[-1]), "the producer's state freed")


@pytest.mark.asyncio
async def test_a_reader_granting_beyond_its_window_loses_its_connection_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "compass.wire")
    async with served() as (producer, server, channel):
        reader, writer, conn = await raw_reader(server)
        try:
            sid = conn.send_stream_open("count", {"key": 3, "n": 10_000, "pause": True}, 4)
            writer.writelines(conn.data_to_send())
            await until(lambda: producer.produced.get(3) == 4, "a window produced")
            conn.streams._reading[sid][1] = 1000  # lie to itself, then grant past the window
            conn.send_credit(sid, 100)
            writer.writelines(conn.data_to_send())
            await until(lambda: producer.closed == [3], "the hostile reader's producer closed")
            assert any("beyond its window" in r.getMessage() for r in caplog.records)
            told = await asyncio.wait_for(reader.read(), 10)  # until the server closes
            assert b"beyond its window" in told  # told why first (a REFUSE)
        finally:
            writer.close()
        async for _ in channel.stream("count", {"key": 4, "n": 5}):  # everyone else served on
            pass
        assert producer.produced[4] == 5


@pytest.mark.asyncio
async def test_a_reader_that_disconnects_mid_stream_closes_the_generator() -> None:
    async with served() as (producer, server, _):
        other = await connect(
            server.address, ChannelOptions(name="leaver", token=TOKEN, timeouts=FAST)
        )
        items = other.stream("count", {"key": 5, "n": 10_000}, window=4)
        assert await items.__anext__() == 0
        other.abort()
        with pytest.raises(ConnectionLost):
            async for _ in items:
                pass
        await until(lambda: producer.closed == [5], "the producer's generator closed")
        await until(lambda: freed(producer.channels[-1]), "the producer's state freed")


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["break", "aclose", "cancel"])
async def test_a_reader_that_leaves_stops_the_producer_at_its_next_yield(how: str) -> None:
    async with served() as (producer, _, channel):
        body = {"key": 6, "n": 100_000, "pause": True}
        if how == "break":
            async with channel.stream("count", body, window=4) as items:
                async for item in items:
                    if item == 10:
                        break
        elif how == "aclose":
            items = channel.stream("count", body, window=4)
            assert [await items.__anext__() for _ in range(3)] == [0, 1, 2]
            await items.aclose()
        else:
            items = channel.stream("count", body, window=4)

            async def read_all() -> None:
                async for _ in items:
                    pass

            task = asyncio.create_task(read_all())
            await until(lambda: producer.produced.get(6, 0) > 20, "some items read")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await until(lambda: producer.closed == [6], "the producer's generator closed")
        stopped_at = producer.produced[6]
        assert stopped_at < 1000
        await until(lambda: freed(channel) and freed(producer.channels[0]), "both sides freed")
        assert producer.produced[6] == stopped_at
        with pytest.raises(StopAsyncIteration):
            await items.__anext__()
        assert await channel.request("echo", "after") == "after"


@pytest.mark.asyncio
async def test_a_producer_lost_mid_stream_is_connection_lost_after_its_items() -> None:
    async with served() as (producer, _, channel):
        items = channel.stream("count", {"key": 8, "n": 100_000, "pause": True}, window=16)
        got = [await items.__anext__() for _ in range(5)]
        producer.channels[0].abort()
        with pytest.raises(ConnectionLost):
            await collect(items, got)
        assert got == list(range(len(got)))  # no gap, no duplicate, then the typed error
        with pytest.raises(ConnectionLost):
            await items.__anext__()


@pytest.mark.asyncio
async def test_closing_the_reading_channel_fails_its_streams_as_closed() -> None:
    async with served() as (_, _, channel):
        items = channel.stream("count", {"key": 9, "n": 100_000, "pause": True}, window=2)
        await items.__anext__()
        await channel.aclose()
        with pytest.raises(ConnectionClosed):
            async for _ in items:
                pass
        with pytest.raises(ConnectionClosed):
            channel.stream("count", {"key": 10, "n": 1})


@pytest.mark.asyncio
async def test_a_closing_server_ends_its_held_streams_with_worker_unavailable() -> None:
    async with served() as (producer, _, channel):
        items = channel.stream("count", {"key": 11, "n": 100_000}, window=2)
        await until(lambda: producer.produced.get(11) == 2, "the producer is held")
        await producer.channels[0].finish_handlers(0.05)
        with pytest.raises(WorkerUnavailable, match="shutting down"):
            async for _ in items:
                pass
        assert producer.closed == [11]


@pytest.mark.asyncio
async def test_streams_past_the_limit_per_channel_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streams_module, "MAX_PRODUCING", 3)
    async with served() as (producer, _, channel):
        held = [
            channel.stream("count", {"key": k, "n": 100, "pause": True}, window=1) for k in range(3)
        ]
        await until(lambda: len(producer.produced) == 3, "three producers started")
        with pytest.raises(WorkerUnavailable, match="already serves 3 streams"):
            async for _ in channel.stream("count", {"key": 99, "n": 1}):
                pass
        for items in held:
            await items.aclose()
        await until(lambda: sorted(producer.closed) == [0, 1, 2], "the held producers closed")
        assert [item async for item in channel.stream("count", {"key": 4, "n": 2})] == [0, 1]


@pytest.mark.asyncio
async def test_many_streams_on_one_channel_interleave_fairly_each_in_order() -> None:
    streams, per_stream = 12, 300
    async with served() as (_, _, channel):
        arrivals: list[int] = []
        got: dict[int, list[int]] = {k: [] for k in range(streams)}

        async def read(key: int) -> None:
            async with channel.stream("count", {"key": key, "n": per_stream}, window=8) as items:
                async for item in items:
                    got[key].append(item)
                    arrivals.append(key)

        await asyncio.gather(*(read(k) for k in range(streams)))
        assert all(got[k] == list(range(per_stream)) for k in range(streams))
        # when the first stream was done, every other one was well under way: no stream waited
        # for another to finish
        first_done = min(
            max(i for i, key in enumerate(arrivals) if key == k) for k in range(streams)
        )
        progress = [arrivals[: first_done + 1].count(k) for k in range(streams)]
        assert min(progress) >= per_stream // 2, progress


@pytest.mark.asyncio
async def test_streams_work_over_the_in_memory_transport_too() -> None:
    producer = Producer()
    router = producer.router
    near, far = await memory_pair(
        End("near"), End("far", handler=router.handle_request), token=TOKEN, timeouts=FAST
    )
    try:
        async with near.stream("count", {"key": 1, "n": 50, "final": 7}, window=4) as items:
            assert [item async for item in items] == list(range(50))
        assert items.result == 7 and producer.closed == [1]
        async with near.stream("count", {"key": 2, "n": 1000, "pause": True}, window=4) as items:
            assert await items.__anext__() == 0
        await until(lambda: producer.closed == [1, 2], "the left stream's producer closed")
    finally:
        await near.aclose()
        await far.aclose()
