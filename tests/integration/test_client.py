"""The clients against real workers: a bulk connection for large payloads, event loops, SyncClient.

Head-of-line blocking is shown without timing anything: a loopback proxy holds a connection's
upload once it passes a byte count, so a large request stays stuck mid-frame for as long as the
test wants, and a small call either gets through beside it or cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from compass import Client, SyncClient
from compass.cluster import LocalCluster
from compass.errors import (
    ConfigError,
    ConnectionClosed,
    ConnectionLost,
    JobFailed,
    UnknownWorkflow,
)
from compass.wire.transport import new_event_loop

from .conftest import VISION_APP

MiB = 1 << 20
BIG = 4 * MiB  # above the client's 1 MiB bulk threshold
HOLD_AFTER = 256 * 1024  # the proxy holds an upload once it has passed this many bytes
WAIT = 30.0  # a hang detector only: every wait below ends as soon as its event happens


class HoldingProxy:
    """A TCP proxy on 127.0.0.1 to one worker.

    While ``holding``, a connection that has uploaded ``HOLD_AFTER`` bytes stops forwarding its
    upload (``held`` is set) until ``release`` is set; with ``cut`` set as well the connection is
    aborted at both ends instead, as a network failure would. Downloads flow freely.
    """

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.address = ""
        self.holding = True
        self.cut = False
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> HoldingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers.add(up_writer)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, writer, hold=True),
                self._pipe(up_reader, writer, up_writer, hold=False),
            )
        finally:
            for w in (writer, up_writer):
                w.transport.abort()
                self._writers.discard(w)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        other: asyncio.StreamWriter,
        *,
        hold: bool,
    ) -> None:
        forwarded = 0
        while data := await src.read(1 << 16):
            if hold and self.holding and forwarded + len(data) > HOLD_AFTER:
                keep = max(0, HOLD_AFTER - forwarded)
                dst.write(data[:keep])
                forwarded += keep
                data = data[keep:]
                self.held.set()
                await self.release.wait()
                if self.cut:
                    dst.transport.abort()
                    other.transport.abort()
                    return
            dst.write(data)
            forwarded += len(data)
            await dst.drain()
        dst.transport.abort()
        other.transport.abort()


@contextlib.asynccontextmanager
async def proxied_worker(
    cluster: LocalCluster,
) -> AsyncIterator[tuple[LocalCluster, HoldingProxy]]:
    """The module's worker, and a holding proxy of this test's in front of it."""
    async with HoldingProxy(cluster.addresses[0]) as proxy:
        yield cluster, proxy


def big_array(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=BIG, dtype=np.uint8)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_small_call_passes_a_large_one_stuck_mid_frame(
    vision_worker: LocalCluster,
) -> None:
    async with (
        proxied_worker(vision_worker) as (cluster, proxy),
        Client(proxy.address, token=cluster.token) as client,
    ):
        assert await client.submit("echo", x=1) == 1
        assert client._bulk_channel is None  # opened only when a payload needs it
        big = big_array(1)
        stuck = asyncio.create_task(client.submit("echo", x=big))
        await asyncio.wait_for(proxy.held.wait(), WAIT)
        for i in range(5):  # they travel beside the stuck frame, not behind it
            assert await asyncio.wait_for(client.submit("echo", x=i), WAIT) == i
        assert await asyncio.wait_for(client.ping(), WAIT) > 0
        assert not stuck.done()
        bulk = client._bulk_channel
        assert bulk is not None and bulk is not client._connected()
        assert bulk.peer_name == client._connected().peer_name == "w0"
        assert proxy.connections == 2
        proxy.release.set()
        assert np.array_equal(await asyncio.wait_for(stuck, WAIT), big)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_with_one_connection_a_small_call_waits_behind_a_large_one(
    vision_worker: LocalCluster,
) -> None:
    """The proxy test above can fail: without the bulk connection the small call is stuck."""
    async with proxied_worker(vision_worker) as (cluster, proxy):
        client = Client(proxy.address, token=cluster.token, bulk_threshold=None)
        async with client:
            big = big_array(2)
            stuck = asyncio.create_task(client.submit("echo", x=big))
            await asyncio.wait_for(proxy.held.wait(), WAIT)
            small = asyncio.create_task(client.submit("echo", x=3))
            # while the proxy holds the stream, nothing after the held bytes can arrive
            done, _ = await asyncio.wait({small}, timeout=0.5)
            assert not done
            proxy.release.set()
            assert np.array_equal(await asyncio.wait_for(stuck, WAIT), big)
            assert await asyncio.wait_for(small, WAIT) == 3
            assert client._bulk_channel is None and proxy.connections == 1


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_lost_bulk_connection_is_reopened_to_the_same_worker(
    vision_worker: LocalCluster,
) -> None:
    async with (
        proxied_worker(vision_worker) as (cluster, proxy),
        Client(proxy.address, token=cluster.token, retries=0) as client,
    ):
        control = client._connected()
        stuck = asyncio.create_task(client.submit("echo", x=big_array(3)))
        await asyncio.wait_for(proxy.held.wait(), WAIT)
        lost = client._bulk_channel
        proxy.cut = True
        proxy.release.set()
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(stuck, WAIT)
        assert lost is not None and lost.closed
        assert client._connected() is control and not control.closed  # untouched
        assert await client.submit("echo", x=4) == 4
        proxy.holding = False
        again = big_array(4)
        assert np.array_equal(await client.submit("echo", x=again), again)
        assert client._bulk_channel is not None and client._bulk_channel is not lost
        assert client._connected() is control
        assert proxy.connections == 3


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_both_connections_fail_over_together(worker_env: dict[str, str]) -> None:
    async with (
        LocalCluster(2, args=VISION_APP, env=worker_env) as cluster,
        Client(cluster.addresses, token=cluster.token) as client,
    ):
        big = big_array(5)
        assert np.array_equal(await client.submit("echo", x=big), big)
        assert client._bulk_channel is not None
        assert client._bulk_channel.peer_name == client._connected().peer_name == "w0"
        cluster.workers[0].kill()
        await cluster.workers[0].process.wait()
        answered = None
        for _ in range(50):
            try:  # a large call first: the bulk path must notice the lost worker too
                answered = await client.submit("echo", x=big)
                break
            except ConnectionLost:  # a call already on its way to the dead worker
                await asyncio.sleep(0.05)
        assert answered is not None and np.array_equal(answered, big)
        assert client.address == cluster.addresses[1]
        assert client._connected().peer_name == "w1"
        assert client._bulk_channel is not None and client._bulk_channel.peer_name == "w1"
        assert (await client.status()).name == "w1"


def test_bulk_threshold_is_validated() -> None:
    for bad in (-1, 1.5, True, "1MiB"):
        with pytest.raises(ConfigError, match="bulk_threshold"):
            Client("127.0.0.1:1", bulk_threshold=bad)  # type: ignore[arg-type]


# -- event loops and the synchronous client ---------------------------------------------------


@pytest.fixture
def cluster(vision_worker: LocalCluster) -> LocalCluster:
    """The module's worker: started on a loop of its own, so each test can run loops of its own."""
    return vision_worker


LOOPS: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop, new_event_loop]


@pytest.mark.timeout(120)
def test_a_closed_client_is_used_again_on_another_loop(cluster: LocalCluster) -> None:
    client = Client(cluster.addresses[0], token=cluster.token)

    async def session(first: int) -> list[int]:
        # concurrent connects contend for the client's connection lock on this loop
        await asyncio.gather(*(client.connect() for _ in range(4)))
        try:
            big = big_array(first)
            echoed, *small = await asyncio.gather(
                client.submit("echo", x=big),
                *(client.submit("echo", x=first + i) for i in range(20)),
            )
            assert np.array_equal(echoed, big)
            return small
        finally:
            await client.aclose()

    for n, make_loop in enumerate(LOOPS * 2):  # plain asyncio and uvloop, in turn
        loop = make_loop()
        try:
            assert loop.run_until_complete(session(100 * n)) == [100 * n + i for i in range(20)]
        finally:
            loop.close()
        with pytest.raises(ConnectionClosed, match="was closed"):
            asyncio.run(client.ping())  # closed by the caller: no silent reconnect


@pytest.mark.timeout(120)
def test_a_client_open_on_one_loop_refuses_another(cluster: LocalCluster) -> None:
    client = Client(cluster.addresses[0], token=cluster.token)
    first, second = new_event_loop(), asyncio.new_event_loop()
    try:
        first.run_until_complete(client.connect())
        for call in (client.ping, client.status, client.aclose):
            with pytest.raises(ConfigError, match="open on another event loop"):
                second.run_until_complete(call())
        with pytest.raises(ConfigError, match="open on another event loop"):
            second.run_until_complete(client.submit("echo", x=big_array(6)))
        assert first.run_until_complete(client.submit("echo", x=1)) == 1  # still fine there
        first.run_until_complete(client.aclose())
        assert second.run_until_complete(client.connect()) is client
        assert second.run_until_complete(client.submit("echo", x=2)) == 2
        second.run_until_complete(client.aclose())
    finally:
        first.close()
        second.close()


@pytest.mark.timeout(120)
def test_sync_client_runs_every_call_on_its_own_loop(cluster: LocalCluster) -> None:
    with SyncClient(cluster.addresses[0], token=cluster.token) as client:
        assert client.ping() > 0
        assert client.status().name == "w0"
        assert client.submit("echo", x=[1, "two", {"three": 3.0}]) == [1, "two", {"three": 3.0}]
        big = big_array(7)
        assert np.array_equal(client.submit("echo", x=big), big)
        assert client.submit_many("echo", [{"x": i} for i in range(30)]) == list(range(30))
        with pytest.raises(UnknownWorkflow):
            client.submit("no-such-workflow", x=1)
        with pytest.raises(JobFailed) as failed:
            client.submit("fails", x=5)
        assert failed.value.task == "explode"

        results: dict[int, object] = {}

        def worker_thread(k: int) -> None:
            results[k] = client.submit("echo", x=k)

        threads = [threading.Thread(target=worker_thread, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert results == {k: k for k in range(8)}
    with pytest.raises(ConnectionClosed, match="was closed"):
        client.ping()
    assert not client_threads()
    assert client.connect() is client  # a fresh loop and thread, the same client
    try:
        assert client.submit("echo", x="again") == "again"
        assert len(client_threads()) == 1
    finally:
        client.close()
    assert not client_threads()


@pytest.mark.timeout(120)
def test_a_dropped_sync_client_ends_its_thread(cluster: LocalCluster) -> None:
    client = SyncClient(cluster.addresses[0], token=cluster.token)
    assert client.submit("echo", x=1) == 1  # connects on first use
    (thread,) = client_threads()
    del client
    gc.collect()
    thread.join(WAIT)
    assert not thread.is_alive()


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("compass-client-")]
