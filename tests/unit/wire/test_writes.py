"""Write batching over a real socket pair: what reaches the peer, and when."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from compass.wire.writes import HELD_WRITES, WriteBatcher


@dataclass
class Side:
    """The connection's queue (what ``data_to_send`` would return) and the peer's socket."""

    peer: socket.socket
    queued: list[bytes | memoryview] = field(default_factory=list)
    in_flight: int = 0

    def take(self) -> list[bytes | memoryview]:
        out, self.queued = self.queued, []
        return out

    def send(self, *pieces: bytes) -> None:
        self.queued.extend(pieces)

    def received(self) -> bytes:
        """Everything the peer can read right now, without waiting."""
        chunks = []
        while True:
            try:
                chunk = self.peer.recv(65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@contextlib.asynccontextmanager
async def batcher() -> AsyncIterator[tuple[WriteBatcher, Side, asyncio.Transport]]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    side = Side(theirs)
    writes = WriteBatcher(loop, side.take, lambda: side.in_flight)
    writes.attach(transport)
    try:
        yield writes, side, transport
    finally:
        transport.abort()
        theirs.close()


async def next_iteration() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_lone_writer_writes_at_once() -> None:
    async with batcher() as (writes, side, _):
        side.send(b"a")
        writes.write_out()
        assert side.received() == b"a"
        side.send(b"b", b"c")
        writes.write_out()
        assert side.received() == b"bc"
        writes.write_out()  # nothing queued: nothing written
        assert side.received() == b""


@pytest.mark.asyncio
async def test_with_others_in_flight_later_writes_wait_for_the_next_iteration() -> None:
    async with batcher() as (writes, side, _):
        side.in_flight = 2
        side.send(b"first")
        writes.write_out()
        assert side.received() == b"first"
        side.send(b"-second")
        writes.write_out()
        side.send(b"-third")
        writes.write_out()
        assert side.received() == b""
        await next_iteration()
        assert side.received() == b"-second-third"


@pytest.mark.asyncio
async def test_held_writes_go_out_in_order_once_enough_have_gathered() -> None:
    async with batcher() as (writes, side, _):
        side.in_flight = 2
        side.send(b"0")
        writes.write_out()
        for i in range(1, HELD_WRITES + 1):
            side.send(str(i).encode())
            writes.write_out()
        assert side.received() == b"0"
        # the write after HELD_WRITES held pieces takes them all with it, in order
        side.send(b"+")
        writes.write_out()
        held = "".join(str(i) for i in range(1, HELD_WRITES + 1)).encode()
        assert side.received() == held + b"+"
        side.send(b"x")
        writes.write_out()
        await next_iteration()
        assert side.received() == b"x"


@pytest.mark.asyncio
async def test_a_batch_goes_out_in_one_piece_when_it_ends() -> None:
    async with batcher() as (writes, side, _):
        writes.start_batch()
        assert writes.reading
        side.send(b"a")
        writes.write_out()
        side.send(b"b")  # queued, never written out during the batch
        assert side.received() == b""
        writes.end_batch(flush=True)
        assert not writes.reading
        assert side.received() == b"ab"


@pytest.mark.asyncio
async def test_a_broken_batch_leaves_its_writes_for_close() -> None:
    async with batcher() as (writes, side, transport):
        writes.start_batch()
        side.send(b"answer")
        writes.write_out()
        writes.end_batch(flush=False)
        assert not writes.reading
        assert side.received() == b""
        side.send(b"-refuse")
        assert writes.close()
        assert transport.is_closing()
        await next_iteration()
        assert side.received() == b"answer-refuse"


@pytest.mark.asyncio
async def test_writes_wait_for_held_handlers_to_take_their_first_step() -> None:
    async with batcher() as (writes, side, _):
        writes.hold()
        side.send(b"early")
        writes.write_out()
        assert side.received() == b""
        writes.release()
        await next_iteration()
        assert side.received() == b"early"
        side.send(b"late")
        writes.write_out()
        assert side.received() == b"late"


@pytest.mark.asyncio
async def test_close_flushes_held_and_queued_writes_then_closes() -> None:
    async with batcher() as (writes, side, transport):
        side.in_flight = 2
        side.send(b"1")
        writes.write_out()
        side.send(b"2")
        writes.write_out()  # held for the next iteration
        side.send(b"3")  # still in the connection
        assert writes.close()
        assert transport.is_closing()
        await next_iteration()
        assert side.received() == b"123"
        # the flush scheduled before close finds nothing left and a closed transport
        await next_iteration()
        assert side.received() == b""


@pytest.mark.asyncio
async def test_without_a_transport_nothing_is_written_and_close_says_so() -> None:
    loop = asyncio.get_running_loop()
    queued: list[bytes | memoryview] = [b"x"]
    writes = WriteBatcher(loop, lambda: queued, lambda: 0)
    writes.write_out()
    writes.flush()
    assert writes.close() is False
