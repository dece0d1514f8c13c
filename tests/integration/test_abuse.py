"""Bounded under abuse: connection caps, idle sockets, peers that never read, decoding bombs.

In-process servers where the test needs to see inside; a real worker process (and its RSS)
where the question is what an operator would see.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import struct
import weakref
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from compass import Client
from compass._bench.fuzz import RawPeer, idle_sockets, raise_file_limit, rss_bytes
from compass.cluster import LocalCluster
from compass.config import Limits, Timeouts
from compass.errors import JobTooLarge, ProtocolError, WorkerUnavailable
from compass.wire.frames import PREFIX
from compass.wire.protocol import ErrorResponse, Response
from compass.wire.rpc import Router
from compass.wire.transport import Channel, ChannelOptions, Server, connect, serve

TOKEN = "cluster-secret"
APP = ["--app", "compass._bench.apps"]
MB = 1_000_000
#: how long a blocked send waits before the test concludes the worker stopped reading
BLOCKED_S = 2.0


@contextlib.asynccontextmanager
async def running(limits: Limits, timeouts: Timeouts) -> AsyncIterator[Server]:
    router = Router()

    @router.request("echo")
    async def echo(channel: Channel, body: Any) -> Any:
        return body

    options = ChannelOptions(name="srv", token=TOKEN, limits=limits, timeouts=timeouts)
    server = await serve("127.0.0.1", 0, options, handler=router.handle_request)
    async with server:
        yield server


async def client(server: Server) -> Channel:
    timeouts = Timeouts(connect=10.0, handshake=10.0, request=10.0, close=2.0)
    return await connect(server.address, ChannelOptions(name="cli", token=TOKEN, timeouts=timeouts))


async def closed_by_peer(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent before it closed."""
    return await asyncio.wait_for(reader.read(), 10)


@pytest.mark.asyncio
async def test_idle_unauthenticated_sockets_cannot_keep_a_real_client_out():
    # a handshake deadline of an hour: only eviction can let the real client in
    limits = Limits(max_unauthenticated=16)
    async with running(limits, Timeouts(handshake=3600.0, close=1.0)) as server:
        idle = [await asyncio.open_connection(*server.address) for _ in range(40)]
        async with await client(server) as channel:
            assert await channel.request("echo", "in") == "in"
        # the oldest idle sockets were closed, each told why
        told = await closed_by_peer(idle[0][0])
        assert b"max_unauthenticated=16" in told
        assert server.evicted >= 24
        for _, writer in idle:
            writer.close()


@pytest.mark.asyncio
async def test_past_max_connections_a_new_connection_is_refused_with_the_reason():
    async with running(Limits(max_connections=3), Timeouts(close=1.0)) as server:
        channels = [await client(server) for _ in range(3)]
        with pytest.raises(WorkerUnavailable, match="max_connections=3"):
            await client(server)
        assert server.refused == 1
        await channels.pop().aclose()
        for _ in range(100):  # the server counts the closed one out when it sees it go
            if len(server.channels) < 3:
                break
            await asyncio.sleep(0.01)
        channels.append(await client(server))
        assert await channels[-1].request("echo", 1) == 1
        for channel in channels:
            await channel.aclose()


@pytest.mark.asyncio
async def test_a_closed_connection_is_freed_without_the_cycle_collector():
    async with running(Limits(), Timeouts(close=1.0)) as server:
        gc.collect()
        gc.disable()
        try:
            _, writer = await asyncio.open_connection(*server.address)
            channel = await client(server)
            await channel.request("echo", 1)
            accepted = list(server._accepted)
            assert len(accepted) == 2
            refs = [weakref.ref(c) for c in accepted]
            decoders = [weakref.ref(c._decoder) for c in accepted]
            del accepted
            writer.close()
            await channel.aclose()
            for _ in range(200):
                if not server._accepted:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the loop's own references to the callbacks go
            assert [r() for r in refs] == [None, None]
            assert [d() for d in decoders] == [None, None]
        finally:
            gc.enable()


# -- a real worker process -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_more_idle_sockets_than_the_cap_and_a_client_still_gets_in():
    raise_file_limit(1024)
    async with LocalCluster(1, args=APP) as cluster:
        sockets = await idle_sockets(cluster.addresses[0], 300)  # the default cap is 256
        try:
            async with cluster.client() as late:
                await late.ping()
                assert await late.submit("noop", x=3) == 3
        finally:
            for sock in sockets:
                sock.close()


def flood_without_reading(peer: RawPeer, budget: int) -> int:
    """Send ``ping`` requests with 32 KiB bodies (each answered with as much) until the worker
    stops taking them (a send blocked for ``BLOCKED_S``) or ``budget`` bytes went out; never
    read. Returns the bytes sent."""
    for _ in range(64):
        peer.conn.send_request("ping", bytes(32 * 1024))
    chunk = b"".join(peer.conn.data_to_send())
    peer.sock.settimeout(BLOCKED_S)
    sent = 0
    while sent < budget:
        view = memoryview(chunk)
        try:
            while view:
                count = peer.sock.send(view)
                sent += count
                view = view[count:]
        except TimeoutError:
            return sent
    return sent


@pytest.mark.asyncio
async def test_a_client_that_never_reads_holds_bounded_worker_memory():
    budget = 96 << 20
    async with LocalCluster(1, args=APP) as cluster, cluster.client() as other:
        pid = cluster.workers[0].process.pid
        assert await other.submit("noop", x=1) == 1  # imports and caches of a first job
        before = rss_bytes(pid)
        with RawPeer(cluster.addresses[0], cluster.token, name="never-reads") as peer:
            peer.handshake()
            sent = await asyncio.to_thread(flood_without_reading, peer, budget)
            grown = rss_bytes(pid) - before
            # the worker stopped reading long before the budget; without back-pressure it
            # reads it all and holds an answer as large for each request (about +96 MB)
            assert sent < budget // 4
            assert grown < 32 * MB
            # and everyone else is served meanwhile
            await other.ping()
            assert await other.submit("noop", x=5) == 5
        await other.ping()


def bomb(request_id: int, nbytes: int) -> bytes:
    """A framed REQUEST whose body is ``nbytes`` of empty msgpack arrays."""
    head = b"\x94\x04" + bytes([request_id]) + b"\xa4echo"
    count = nbytes - len(head) - 5
    header = head + b"\xdd" + struct.pack(">I", count) + b"\x90" * count
    return PREFIX.pack(PREFIX.size + len(header), len(header), 0) + header


@pytest.mark.parametrize(
    ("nbytes", "limit"),
    [(4 << 20, "max_header_bytes=1048576"), ((1 << 20) - 64, "max_elements=131072")],
)
@pytest.mark.asyncio
async def test_a_frame_of_empty_arrays_is_refused_and_the_worker_serves_on(nbytes, limit):
    async with LocalCluster(1, args=APP) as cluster, cluster.client() as other:
        pid = cluster.workers[0].process.pid
        assert await other.submit("noop", x=1) == 1  # imports and caches of a first job
        before = rss_bytes(pid)
        with RawPeer(cluster.addresses[0], cluster.token, name="bomber") as peer:
            peer.handshake()
            peer.send(bomb(7, nbytes))
            answer = await asyncio.to_thread(peer.answer, 7)
            assert isinstance(answer, ErrorResponse)
            assert answer.code == "protocol" and limit in answer.message
            with pytest.raises(ProtocolError, match=f"closed the connection: .*{limit}"):
                await asyncio.to_thread(peer.receive)
        await other.ping()
        assert await other.submit("noop", x=9) == 9
        # decoding would have allocated 80 times the frame; refusing it, next to nothing
        assert rss_bytes(pid) - before < 16 * MB


@pytest.mark.asyncio
async def test_an_oversized_request_gets_a_protocol_error_naming_the_limit():
    async with LocalCluster(1, args=[*APP, "--max-frame-mb", "1"]) as cluster:
        big = np.zeros(2 << 20, dtype=np.uint8)
        async with Client(cluster.addresses[0], token=cluster.token) as client:
            # the client learnt the worker's limit in the handshake: refused before sending,
            # naming the flag
            with pytest.raises(JobTooLarge, match="the worker's --max-frame-mb is 1 MiB"):
                await client.submit("noop", x=big)
            assert await client.submit("noop", x=1) == 1
        # a sender that ignores the limit is told which limit, then disconnected
        with RawPeer(cluster.addresses[0], cluster.token, name="ignores-limits") as peer:
            peer.handshake()
            peer.conn.send_limits = Limits()
            request_id = peer.conn.send_request("noop", {"x": big})
            await asyncio.to_thread(peer.send, b"".join(peer.conn.data_to_send()))
            answer = await asyncio.to_thread(peer.answer, request_id)
            assert isinstance(answer, ErrorResponse) and "max_frame_bytes=1048576" in answer.message
        async with Client(cluster.addresses[0], token=cluster.token) as client:
            await client.ping()


@pytest.mark.asyncio
async def test_a_raw_peer_is_answered_like_a_client():
    """The RawPeer the tests above rely on speaks the protocol (checked against a server)."""
    async with running(Limits(), Timeouts(close=1.0)) as server:
        host, port = server.address

        def talk() -> Any:
            with RawPeer(f"{host}:{port}", TOKEN) as peer:
                peer.handshake()
                return peer.answer(peer.request("echo", [1, "two"]))

        answer = await asyncio.to_thread(talk)
    assert isinstance(answer, Response) and answer.body == [1, "two"]
