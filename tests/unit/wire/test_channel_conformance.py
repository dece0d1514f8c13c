"""One suite, every transport: a channel over loopback TCP and over memory (a
:class:`MemoryNetwork`, and :func:`memory_pair`) keeps order, closes and breaks with the same
errors, holds the same frame limits and the same flow control (trio's habit: one conformance
suite runs against every transport)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from compass.config import Limits, Timeouts
from compass.errors import (
    AuthenticationError,
    CompassTimeout,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    ProtocolError,
    WorkerUnavailable,
)
from compass.wire import tcp
from compass.wire.channel import Channel
from compass.wire.memory import End, MemoryNetwork, memory_pair
from compass.wire.options import ChannelOptions
from compass.wire.rpc import Router
from compass.wire.tcp import Server

TOKEN = "conformance-token"
FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=2.0)
MiB = 1 << 20
#: a plain client's side: no handler, the default limits
CLIENT = ChannelOptions(name="cli", token=TOKEN, timeouts=FAST)


@dataclass
class Peer:
    """One end's handlers and what they saw."""

    name: str
    limits: Limits = field(default_factory=Limits)
    notes: list[Any] = field(default_factory=list)
    cancelled: list[Any] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    router: Router = field(default_factory=Router)

    def __post_init__(self) -> None:
        router = self.router

        @router.request("echo")
        async def echo(channel: Channel, body: Any) -> Any:
            return body

        @router.request("sleep_echo")
        async def sleep_echo(channel: Channel, body: Any) -> Any:
            await asyncio.sleep(body["delay"])
            return body["value"]

        @router.request("hold")
        async def hold(channel: Channel, body: Any) -> Any:
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(body)
                raise
            return body

        @router.notify("note")
        def note(channel: Channel, body: Any) -> None:
            self.notes.append(body)

    def end(self) -> End:
        return End(self.name, self.router.handle_request, self.router.handle_notify, self.limits)

    def options(self) -> ChannelOptions:
        return ChannelOptions(name=self.name, token=TOKEN, limits=self.limits, timeouts=FAST)


class Net:
    """Listen and connect over one transport; everything opened is closed at the end."""

    kind = ""

    def __init__(self) -> None:
        self.servers: list[Server] = []
        self.channels: list[Channel] = []

    async def serve(self, peer: Peer, **kwargs: Any) -> Server:
        raise NotImplementedError

    async def connect(
        self, server: Server, options: ChannelOptions = CLIENT, **kwargs: Any
    ) -> Channel:
        raise NotImplementedError

    async def pair(self, near: Peer, far: Peer) -> tuple[Channel, Channel]:
        """Two connected channels: ``near``'s (it dialed) and ``far``'s (it accepted)."""
        accepted: list[Channel] = []
        server = await self.serve(far, on_channel=accepted.append)
        channel = await self.connect(
            server,
            near.options(),
            handler=near.router.handle_request,
            notify_handler=near.router.handle_notify,
        )
        await until(lambda: bool(accepted), "the acceptor has its channel")
        return channel, accepted[0]

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.channels), return_exceptions=True)
        await asyncio.gather(*(s.aclose() for s in self.servers), return_exceptions=True)


class TcpNet(Net):
    kind = "tcp"

    async def serve(self, peer: Peer, **kwargs: Any) -> Server:
        server = await tcp.serve(
            "127.0.0.1", 0, peer.options(), handler=peer.router.handle_request,
            notify_handler=peer.router.handle_notify, **kwargs,
        )  # fmt: skip
        self.servers.append(server)
        return server

    async def connect(
        self, server: Server, options: ChannelOptions = CLIENT, **kwargs: Any
    ) -> Channel:
        channel = await tcp.connect(server.address, options, **kwargs)
        self.channels.append(channel)
        return channel


class MemoryNet(Net):
    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.network = MemoryNetwork()

    async def serve(self, peer: Peer, **kwargs: Any) -> Server:
        server = await self.network.serve(
            peer.name, 0, peer.options(), handler=peer.router.handle_request,
            notify_handler=peer.router.handle_notify, **kwargs,
        )  # fmt: skip
        self.servers.append(server)
        return server

    async def connect(
        self, server: Server, options: ChannelOptions = CLIENT, **kwargs: Any
    ) -> Channel:
        host, port = server.address
        channel = await self.network.connect(f"{host}:{port}", options, **kwargs)
        self.channels.append(channel)
        return channel


class PairNet(MemoryNet):
    """Pairs from :func:`memory_pair` (no server in between); listening as :class:`MemoryNet`."""

    kind = "memory_pair"

    async def pair(self, near: Peer, far: Peer) -> tuple[Channel, Channel]:
        channels = await memory_pair(near.end(), far.end(), token=TOKEN, timeouts=FAST)
        self.channels.extend(channels)
        return channels


async def until(check: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(0.002)


@contextlib.asynccontextmanager
async def opened(kind: str) -> AsyncIterator[Net]:
    net: Net = {"tcp": TcpNet, "memory": MemoryNet, "memory_pair": PairNet}[kind]()
    try:
        yield net
    finally:
        await net.aclose()


PAIRS = ["tcp", "memory", "memory_pair"]
NETS = ["tcp", "memory"]


# -- order ---------------------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_messages_keep_their_order_both_ways(kind: str) -> None:
    a, b = Peer("a"), Peer("b")
    async with opened(kind) as net:
        near, far = await net.pair(a, b)
        assert (near.peer_name, far.peer_name) == ("b", "a")
        answers = []
        for i in range(200):
            near.notify("note", i)
            far.notify("note", -i)
            if i % 20 == 0:
                answers.append(asyncio.ensure_future(near.request("echo", i)))
        assert await asyncio.gather(*answers) == list(range(0, 200, 20))
        assert await far.request("echo", "last") == "last"
        assert b.notes == list(range(200))
        assert a.notes == [-i for i in range(200)]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_concurrent_requests_are_matched_to_their_answers(kind: str) -> None:
    async with opened(kind) as net:
        near, _ = await net.pair(Peer("a"), Peer("b"))
        delays = [0.05, 0.01, 0.03, 0.0, 0.02]
        got = await asyncio.gather(
            *(near.request("sleep_echo", {"delay": d, "value": i}) for i, d in enumerate(delays))
        )
        assert got == list(range(len(delays)))


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_a_large_array_arrives_bit_exact(kind: str) -> None:
    async with opened(kind) as net:
        near, _ = await net.pair(Peer("a"), Peer("b"))
        array = np.random.default_rng(3).standard_normal(MiB)  # 8 MiB
        back = await near.request("echo", array)
        assert back.dtype == array.dtype and np.array_equal(back, array)


# -- closing and breaking ------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
@pytest.mark.parametrize("closer", ["dialer", "acceptor"])
async def test_closed_by_you_is_not_broken_by_the_peer(kind: str, closer: str) -> None:
    a, b = Peer("a"), Peer("b")
    async with opened(kind) as net:
        near, far = await net.pair(a, b)
        mine, theirs = (near, far) if closer == "dialer" else (far, near)
        answers_mine, answers_theirs = (b, a) if closer == "dialer" else (a, b)
        ended: dict[str, list[BaseException | None]] = {"mine": [], "theirs": []}
        mine.on_close.append(lambda ch, exc: ended["mine"].append(exc))
        theirs.on_close.append(lambda ch, exc: ended["theirs"].append(exc))
        my_wait = asyncio.ensure_future(mine.request("hold", "mine"))
        their_wait = asyncio.ensure_future(theirs.request("hold", "theirs"))
        await asyncio.sleep(0.05)  # both handlers are holding

        mine.notify("note", "flushed on close")
        await mine.aclose()
        await mine.aclose()  # idempotent
        with pytest.raises(ConnectionClosed, match="closed by this side"):
            await my_wait
        with pytest.raises(ConnectionLost):
            await their_wait
        await theirs.wait_closed()
        assert ended["mine"] == [None]
        assert len(ended["theirs"]) == 1 and isinstance(ended["theirs"][0], ConnectionLost)
        assert "flushed on close" in answers_mine.notes
        # the handler still working for the side that closed was cancelled
        await until(lambda: answers_mine.cancelled == ["mine"], "the held handler is cancelled")
        assert answers_theirs.cancelled == ["theirs"]
        with pytest.raises(ConnectionClosed):
            await mine.request("echo")
        with pytest.raises(ConnectionClosed):
            mine.notify("note")
        with pytest.raises(ConnectionLost):
            await theirs.request("echo")
        with pytest.raises(ConnectionLost):
            theirs.notify("note")


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_a_broken_peer_fails_what_waits_with_connection_lost(kind: str) -> None:
    async with opened(kind) as net:
        near, far = await net.pair(Peer("a"), Peer("b"))
        ended: list[BaseException | None] = []
        near.on_close.append(lambda ch, exc: ended.append(exc))
        pending = [asyncio.ensure_future(near.request("hold", i)) for i in range(5)]
        await asyncio.sleep(0.05)
        far.abort()  # the peer's process dies: no goodbye
        for task in pending:
            with pytest.raises(ConnectionLost, match="'b'"):
                await task
        await near.wait_closed()
        assert near.closed and len(ended) == 1 and isinstance(ended[0], ConnectionLost)
        with pytest.raises(ConnectionLost):
            await near.request("echo")
        await far.wait_closed()
        assert far.closed


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_garbage_from_an_authenticated_peer_loses_the_connection(kind: str) -> None:
    async with opened(kind) as net:
        near, far = await net.pair(Peer("a"), Peer("b"))
        pending = asyncio.ensure_future(near.request("hold", 0))
        await asyncio.sleep(0.02)
        transport = near._transport
        assert transport is not None
        transport.write(b"\xff" * 64)  # not a frame
        with pytest.raises(ConnectionLost):
            await pending
        await far.wait_closed()
        assert far.closed


# -- limits --------------------------------------------------------------------------------------
SMALL = Limits(max_frame_bytes=MiB, max_header_bytes=1 << 16)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_a_frame_beyond_the_peers_limits_is_refused_before_it_is_sent(kind: str) -> None:
    async with opened(kind) as net:
        near, _ = await net.pair(Peer("a"), Peer("b", limits=SMALL))
        with pytest.raises(ProtocolError, match="the peer's max_frame_bytes=1048576"):
            await near.request("echo", np.zeros(1 << 18))
        with pytest.raises(ProtocolError, match="the peer's max_header_bytes=65536"):
            await near.request("echo", "x" * (1 << 17))
        assert await near.request("echo", 1) == 1  # nothing was sent: still connected


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_a_frame_beyond_the_limits_is_answered_with_the_limit_then_closed(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with opened(kind) as net:
        near, far = await net.pair(Peer("a"), Peer("b", limits=SMALL))
        near._conn.send_limits = Limits()  # a sender that ignores the peer's limits
        pending = asyncio.ensure_future(near.request("hold", 0))
        await asyncio.sleep(0.02)
        with (
            caplog.at_level(logging.WARNING, logger="compass.wire"),
            pytest.raises(ProtocolError, match="exceeds max_frame_bytes=1048576"),
        ):
            await near.request("echo", np.zeros(MiB))  # 8 MiB
        with pytest.raises(ConnectionLost, match="max_frame_bytes=1048576"):
            await pending
        await far.wait_closed()
        assert "exceeds max_frame_bytes=1048576" in caplog.text


# -- flow control --------------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_drain_applies_backpressure_and_returns(kind: str) -> None:
    b = Peer("b")
    async with opened(kind) as net:
        near, _ = await net.pair(Peer("a", limits=Limits(write_high_water=64 * 1024)), b)
        chunk = np.ones(256 * 1024, dtype=np.uint8)
        for i in range(16):
            near.notify("note", {"i": i, "data": chunk})
            await near.drain()
        await near.request("echo")
        assert [n["i"] for n in b.notes] == list(range(16))
        assert all(int(n["data"].sum()) == chunk.size for n in b.notes)


async def _blocks(wait: Awaitable[None], seconds: float = 0.05) -> bool:
    task = asyncio.ensure_future(wait)
    done, _ = await asyncio.wait([task], timeout=seconds)
    if done:
        task.result()
        return False
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return True


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_a_peer_that_stops_reading_holds_the_writer_until_it_reads_again(kind: str) -> None:
    b = Peer("b")
    async with opened(kind) as net:
        near, far = await net.pair(Peer("a", limits=Limits(write_high_water=256 * 1024)), b)
        reader = far._transport
        assert reader is not None
        reader.pause_reading()
        chunk = np.ones(MiB, dtype=np.uint8)
        sent = 0
        # over TCP the kernel's buffers take some first (tens of MiB at most on loopback)
        while not await _blocks(near.drain()):
            near.notify("note", {"i": sent, "data": chunk})
            sent += 1
            assert sent < 256, "the writer was never held back"
        assert b.notes == [] or len(b.notes) < sent
        reader.resume_reading()
        await asyncio.wait_for(near.drain(), 10)
        assert await near.request("echo", "after") == "after"
        assert [n["i"] for n in b.notes] == list(range(sent))


# -- timeouts and cancellation -------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_a_request_given_up_on_is_cancelled_at_the_peer(kind: str) -> None:
    b = Peer("b")
    async with opened(kind) as net:
        near, _ = await net.pair(Peer("a"), b)
        with pytest.raises(CompassTimeout, match="'hold'"):
            await near.request("hold", "late", timeout=0.05)
        await until(lambda: b.cancelled == ["late"], "the peer cancels the handler")
        assert await near.request("echo", 2) == 2


# -- listening and connecting --------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("kind", NETS)
async def test_connecting_where_nobody_listens_or_with_the_wrong_token_fails(kind: str) -> None:
    async with opened(kind) as net:
        server = await net.serve(Peer("b"))
        with pytest.raises(AuthenticationError):
            await net.connect(server, replace(CLIENT, token="another-token"))
        channel = await net.connect(server)
        assert await channel.request("echo", 1) == 1
        assert len(server.channels) == 1
        await server.aclose()
        await channel.wait_closed()
        with pytest.raises(ConnectFailed):
            await net.connect(server)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", NETS)
async def test_a_full_server_refuses_the_next_connection(kind: str) -> None:
    async with opened(kind) as net:
        server = await net.serve(Peer("b", limits=Limits(max_connections=1)))
        first = await net.connect(server)
        with pytest.raises(WorkerUnavailable, match="max_connections=1"):
            await net.connect(server)
        assert await first.request("echo", 1) == 1
