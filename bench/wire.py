"""Wire micro-benchmark: compass request/response against a raw asyncio floor, side by side.

Both servers run in processes of their own on loopback (uvloop), the clients in this one:

- **raw**: a minimal length-prefixed protocol written straight on asyncio. The server is a
  :class:`asyncio.BufferedProtocol` that echoes small frames inline and receives a bulk frame
  into one preallocated (reused) buffer before a 4-byte acknowledgement; the client keeps one
  future per request, matched in order. No serialization, no ids, no tasks: the floor.
- **compass**: :func:`compass.wire.transport.serve` / :func:`connect` with a
  :class:`~compass.wire.rpc.Router`: msgpack, request ids, one task per incoming request,
  a timer per request, handshake-authenticated channel.

Measured: a 64-byte round trip with one request in flight (p50/p99 microseconds), throughput
with 64 requests in flight (messages per second), and one 64 MiB ndarray sent and acknowledged
(GB/s, 1e9 bytes). Ratios are compass / raw. Streams (:mod:`compass.wire.streams`), against
compass's own requests in the same run: 64-byte items per second over one stream with a window
of 64, against 64 requests in flight; the time per item (one over that rate) against the round
trip; the first item of a stream against a round trip (p50, 1 CPU, both with an async
handler); and one item at a time (window 1, so each item waits for its credit: p50 from item to
item) against a round trip. The two sides alternate for a few
rounds and each keeps its best figure, since background noise only ever makes a side slower.

Placement is fixed where the OS allows it, the same for both sides: for round trips the client
and the servers share one CPU; throughput and bulk run both with one shared CPU and with a CPU
each, and each side keeps its better placement. On a small VM a wake-up across CPUs costs tens
of microseconds and, left alone, the scheduler places processes as it likes, which would swamp
and randomise what is being compared. The unpinned round trip is in the table too.

Run: ``compass bench wire [--quick] [--json results/wire.json]`` or
``python -m compass._bench.wire``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from compass.wire.rpc import Router
from compass.wire.transport import Channel, ChannelOptions, connect, new_event_loop, serve

from .report import machine, print_table, write_json

__all__ = ["run"]

MiB = 1 << 20
SMALL = 64
BULK_BYTES = 64 * MiB
IN_FLIGHT = 64
TOKEN = "bench-wire"
_LENGTH = struct.Struct("<I")
_ACK = _LENGTH.pack(0)
#: raw frames at least this large are bulk: received into the preallocated buffer, then acked
_RAW_BULK = 64 * 1024
ROOT = Path(__file__).resolve().parents[1]


# -- raw floor: server --------------------------------------------------------------------


class _RawServerProtocol(asyncio.BufferedProtocol):
    """Echo small length-prefixed frames; receive bulk frames in place and acknowledge."""

    def __init__(self) -> None:
        self.staging = bytearray(256 * 1024)
        self.view = memoryview(self.staging)
        self.read = self.write = 0
        self.bulk = np.empty(BULK_BYTES, dtype=np.uint8)  # preallocated, reused every time
        self.bulk_view = self.bulk.data
        self.bulk_left = 0
        self.bulk_filled = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.bulk_left:
            return self.bulk_view[self.bulk_filled : self.bulk_filled + self.bulk_left]
        if self.write == len(self.staging):
            unread = self.write - self.read
            self.staging[:unread] = self.staging[self.read : self.write]
            self.read, self.write = 0, unread
        return self.view[self.write :]

    def buffer_updated(self, nbytes: int) -> None:
        assert self.transport is not None
        if self.bulk_left:
            self.bulk_filled += nbytes
            self.bulk_left -= nbytes
            if not self.bulk_left:
                self.transport.write(_ACK)
            return
        self.write += nbytes
        start = pos = self.read
        while self.write - pos >= 4:
            (length,) = _LENGTH.unpack_from(self.staging, pos)
            if length >= _RAW_BULK:
                # echo what came before, then land the bulk payload in the reused buffer
                if pos > start:
                    self.transport.write(bytes(self.view[start:pos]))
                staged = min(self.write - pos - 4, length)
                self.bulk_view[:staged] = self.view[pos + 4 : pos + 4 + staged]
                self.bulk_filled, self.bulk_left = staged, length - staged
                self.read = self.write = 0
                if not self.bulk_left:
                    self.transport.write(_ACK)
                return
            if self.write - pos < 4 + length:
                break
            pos += 4 + length
        if pos > start:
            self.transport.write(bytes(self.view[start:pos]))  # echo every complete frame
        self.read = pos
        if self.read == self.write:
            self.read = self.write = 0


# -- raw floor: client --------------------------------------------------------------------


class _RawClientProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiters: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        pos = 0
        while len(buffer) - pos >= 4:
            (length,) = _LENGTH.unpack_from(buffer, pos)
            if len(buffer) - pos < 4 + length:
                break
            body = bytes(buffer[pos + 4 : pos + 4 + length])
            pos += 4 + length
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(body)
        del buffer[:pos]


class _RawClient:
    def __init__(self, protocol: _RawClientProtocol) -> None:
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()

    async def request(self, payload: bytes) -> bytes:
        assert self.protocol.transport is not None
        self.protocol.transport.write(_LENGTH.pack(len(payload)) + payload)
        future: asyncio.Future[bytes] = self.loop.create_future()
        self.protocol.waiters.append(future)
        return await future

    async def bulk(self, array: np.ndarray) -> bytes:
        assert self.protocol.transport is not None
        self.protocol.transport.writelines([_LENGTH.pack(array.nbytes), array.data])
        future: asyncio.Future[bytes] = self.loop.create_future()
        self.protocol.waiters.append(future)
        return await future

    def close(self) -> None:
        if self.protocol.transport is not None:
            self.protocol.transport.close()


# -- servers (run as their own processes) --------------------------------------------------


async def _serve_raw(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_RawServerProtocol, "127.0.0.1", port)
    print(server.sockets[0].getsockname()[1], flush=True)
    await _until_terminated()
    server.close()


async def _serve_compass(port: int) -> None:
    router = Router()

    @router.inline("echo")
    def echo(channel: Channel, body: Any) -> Any:
        return body

    @router.request("echo_task")
    async def echo_task(channel: Channel, body: Any) -> Any:
        return body

    @router.stream("items")
    async def items(channel: Channel, body: Any) -> Any:
        payload = body["payload"]
        for _ in range(body["n"]):
            yield payload

    @router.request("bulk")
    async def bulk(channel: Channel, body: Any) -> Any:
        return int(body.nbytes)

    options = ChannelOptions(name="bench-server", token=TOKEN)
    server = await serve("127.0.0.1", port, options, handler=router.handle_request)
    print(server.address[1], flush=True)
    await _until_terminated()
    await server.aclose()


async def _until_terminated() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


class _ServerProcess:
    """``python -m compass._bench.wire serve-...`` on a free port; ended when the bench is done."""

    def __init__(self, kind: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "compass._bench.wire", f"serve-{kind}", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"the {kind} bench server did not start (said {line!r})")
        self.port = int(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


# -- measurements --------------------------------------------------------------------------

Call = Callable[[], Awaitable[Any]]


async def _round_trips(call: Call, count: int) -> list[int]:
    for _ in range(max(100, count // 10)):  # warm up
        await call()
    clock = time.perf_counter_ns
    samples = []
    for _ in range(count):
        started = clock()
        await call()
        samples.append(clock() - started)
    return samples


async def _pipelined(call: Call, total: int) -> float:
    per_worker = total // IN_FLIGHT

    async def worker(count: int) -> None:
        for _ in range(count):
            await call()

    await asyncio.gather(*(worker(per_worker // 10) for _ in range(IN_FLIGHT)))  # warm up
    started = time.perf_counter()
    await asyncio.gather(*(worker(per_worker) for _ in range(IN_FLIGHT)))
    return per_worker * IN_FLIGHT / (time.perf_counter() - started)


async def _bulk(call: Call, repeat: int) -> float:
    await call()  # warm up: first-touch of the receive buffer
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return BULK_BYTES / sorted(times)[len(times) // 2] / 1e9


async def _streamed(channel: Channel, payload: bytes, total: int, window: int) -> float:
    """Items per second over one stream of ``total`` items, ``window`` ahead."""
    body = {"payload": payload, "n": total}
    async with channel.stream("items", {**body, "n": max(100, total // 10)}, window=window) as it:
        async for _ in it:  # warm up
            pass
    started = time.perf_counter()
    async with channel.stream("items", body, window=window) as it:
        async for _ in it:
            pass
    return total / (time.perf_counter() - started)


async def _first_items(channel: Channel, payload: bytes, count: int) -> list[int]:
    """Nanoseconds from opening a stream to its first item, ``count`` times (the stream goes
    on, held by its window of 1, while that item is timed; the rest is read to the end before
    the next is opened)."""
    body = {"payload": payload, "n": 2}
    clock = time.perf_counter_ns
    samples = []
    warm = max(100, count // 10)
    for i in range(warm + count):
        started = clock()
        async with channel.stream("items", body, window=1) as it:
            await it.__anext__()
            elapsed = clock() - started
            async for _ in it:  # the second item, then the end: the server is done with it
                pass
        if i >= warm:
            samples.append(elapsed)
    return samples


async def _item_gaps(channel: Channel, payload: bytes, count: int, window: int) -> list[int]:
    """Nanoseconds between consecutive items of one stream of ``count`` items."""
    clock = time.perf_counter_ns
    samples = []
    async with channel.stream("items", {"payload": payload, "n": count}, window=window) as it:
        last = clock()
        async for _ in it:
            now = clock()
            samples.append(now - last)
            last = now
    return samples[max(100, count // 10) :]


def _percentile(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e3


def _pin(pids: list[int], cpus: set[int]) -> bool:
    """Restrict ``pids`` (0: this process) to ``cpus``; False where the OS does not allow it."""
    if not hasattr(os, "sched_setaffinity") or not cpus:
        return False
    try:
        for pid in pids:
            os.sched_setaffinity(pid, cpus)
    except OSError:
        return False
    return True


async def _measure(
    raw_port: int, compass_port: int, quick: bool, pids: list[int]
) -> dict[str, float]:
    rtt_count = 2_000 if quick else 20_000
    pipelined_total = 20_000 if quick else 200_000
    bulk_repeat = 3 if quick else 10
    rounds = 1 if quick else 3
    payload = bytes(range(SMALL))
    array = np.random.default_rng(0).integers(0, 255, BULK_BYTES, dtype=np.uint8)

    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(_RawClientProtocol, "127.0.0.1", raw_port)
    raw = _RawClient(protocol)
    channel = await connect(
        ("127.0.0.1", compass_port), ChannelOptions(name="bench-client", token=TOKEN)
    )
    assert await raw.request(payload) == payload
    assert await channel.request("echo", payload) == payload
    assert await raw.bulk(array) == b""
    assert await channel.request("bulk", array) == BULK_BYTES

    async def raw_small() -> Any:
        return await raw.request(payload)

    async def compass_small() -> Any:
        return await channel.request("echo", payload)

    async def compass_task_small() -> Any:
        return await channel.request("echo_task", payload)

    async def raw_bulk() -> Any:
        return await raw.bulk(array)

    async def compass_bulk() -> Any:
        return await channel.request("bulk", array)

    # alternate the two sides, several rounds, and keep each side's best: background noise on
    # a small VM only ever makes a side slower
    best: dict[str, float] = {}

    def keep(key: str, value: float, higher_is_better: bool) -> None:
        if key not in best:
            best[key] = value
        else:
            best[key] = max(best[key], value) if higher_is_better else min(best[key], value)

    sides = (("raw_", raw_small, raw_bulk), ("", compass_small, compass_bulk))
    # the echo above is an inline handler, answered in the read callback like the raw echo;
    # an async handler (one task per request) is measured too
    rtt_sides = (*sides, ("task_", compass_task_small, compass_bulk))
    allowed = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    cpus = sorted(allowed)
    try:
        for _ in range(rounds):
            _pin([0, *pids], allowed)
            for prefix, small, _ in rtt_sides:
                samples = await _round_trips(small, rtt_count)
                keep(f"{prefix}rtt_unpinned_p50_us", _percentile(samples, 0.50), False)
            best["rtt_pinned"] = float(bool(cpus) and _pin([0, *pids], {cpus[0]}))
            for prefix, small, _ in rtt_sides:
                samples = await _round_trips(small, rtt_count)
                keep(f"{prefix}rtt_p50_us", _percentile(samples, 0.50), False)
                keep(f"{prefix}rtt_p99_us", _percentile(samples, 0.99), False)
            first = await _first_items(channel, payload, rtt_count // 4)
            keep("stream_first_item_p50_us", _percentile(first, 0.50), False)
            gaps = await _item_gaps(channel, payload, rtt_count, 1)
            keep("stream_window1_item_p50_us", _percentile(gaps, 0.50), False)
            # both placements, each side keeping its better one: a cheap server gains from
            # sharing the client's CPU (no cross-CPU wake-ups), a busy one from a CPU of its own
            for shared in (True, False):
                if not cpus:
                    placed = shared  # no control over placement: one pass as the OS likes
                elif shared:
                    placed = _pin([0, *pids], {cpus[0]})
                else:
                    placed = len(cpus) > 1 and _pin([0], {cpus[0]}) and _pin(pids, {cpus[1]})
                if not placed:
                    continue
                for prefix, small, bulk in sides:
                    rate = await _pipelined(small, pipelined_total)
                    keep(f"{prefix}pipelined_msgs_per_s", rate, True)
                    keep(f"{prefix}bulk_gbps", await _bulk(bulk, bulk_repeat), True)
                rate = await _streamed(channel, payload, pipelined_total, IN_FLIGHT)
                keep("stream_items_per_s", rate, True)
    finally:
        _pin([0, *pids], allowed)
        raw.close()
        await channel.aclose()
    best["rtt_ratio"] = best["rtt_p50_us"] / best["raw_rtt_p50_us"]
    best["rtt_p99_ratio"] = best["rtt_p99_us"] / best["raw_rtt_p99_us"]
    best["rtt_unpinned_ratio"] = best["rtt_unpinned_p50_us"] / best["raw_rtt_unpinned_p50_us"]
    best["rtt_task_ratio"] = best["task_rtt_p50_us"] / best["raw_rtt_p50_us"]
    best["pipelined_ratio"] = best["pipelined_msgs_per_s"] / best["raw_pipelined_msgs_per_s"]
    best["bulk_ratio"] = best["bulk_gbps"] / best["raw_bulk_gbps"]
    best["request_us"] = 1e6 / best["pipelined_msgs_per_s"]
    best["stream_item_us"] = 1e6 / best["stream_items_per_s"]
    best["stream_over_pipelined"] = best["stream_items_per_s"] / best["pipelined_msgs_per_s"]
    best["stream_item_over_request"] = best["stream_item_us"] / best["request_us"]
    best["stream_first_over_rtt"] = best["stream_first_item_p50_us"] / best["task_rtt_p50_us"]
    best["stream_window1_over_rtt"] = best["stream_window1_item_p50_us"] / best["task_rtt_p50_us"]
    return best


_TABLE = [
    ("64 B round trip p50 (us, 1 CPU)", "rtt_p50_us", "rtt_ratio", "<= 1.25"),
    ("64 B round trip p99 (us, 1 CPU)", "rtt_p99_us", "rtt_p99_ratio", ""),
    ("64 B round trip p50 (us, unpinned)", "rtt_unpinned_p50_us", "rtt_unpinned_ratio", ""),
    ("  same, async handler (us, 1 CPU)", "task_rtt_p50_us", "rtt_task_ratio", ""),
    (f"{IN_FLIGHT} in flight (msg/s)", "pipelined_msgs_per_s", "pipelined_ratio", ">= 0.75"),
    ("64 MiB ndarray (GB/s)", "bulk_gbps", "bulk_ratio", ">= 0.5"),
]


#: (label, request figure, stream figure, ratio): streams against compass's own requests
_STREAM_TABLE = [
    (f"64 B items/s (window {IN_FLIGHT} vs {IN_FLIGHT} in flight)", "pipelined_msgs_per_s",
     "stream_items_per_s", "stream_over_pipelined"),
    ("  per item (us)", "request_us", "stream_item_us", "stream_item_over_request"),
    ("first item p50 (us) vs round trip p50", "task_rtt_p50_us", "stream_first_item_p50_us",
     "stream_first_over_rtt"),
    ("window 1: item to item p50 (us) vs round trip", "task_rtt_p50_us",
     "stream_window1_item_p50_us", "stream_window1_over_rtt"),
]  # fmt: skip


def run(quick: bool = False, json_path: str | None = None) -> dict[str, float]:
    """Run the benchmark; print a table, write JSON to ``json_path`` if given, return figures."""
    servers = [_ServerProcess("raw")]
    try:
        servers.append(_ServerProcess("compass"))
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            pids = [server.process.pid for server in servers]
            result = runner.run(_measure(servers[0].port, servers[1].port, quick, pids))
    finally:
        for server in servers:
            server.close()
    rows = [
        [label, result[f"raw_{key.removeprefix('task_')}"], result[key], result[ratio], target]
        for label, key, ratio, target in _TABLE
    ]
    columns = ["", "raw", "compass", "ratio", "target"]
    print_table("wire: compass vs raw asyncio (uvloop, loopback)", columns, rows)
    rows = [[label, result[a], result[b], result[r]] for label, a, b, r in _STREAM_TABLE]
    columns = ["", "request", "stream", "ratio"]
    print_table("wire: streamed items vs requests (compass, same run)", columns, rows)
    write_json(json_path, {**result, "quick": quick, "machine": machine()})
    return result


def _main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m compass._bench.wire", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "serve-raw", "serve-compass"]
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    if args.mode == "run":
        run(quick=args.quick, json_path=args.json_path)
        return
    server = _serve_raw if args.mode == "serve-raw" else _serve_compass
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(server(args.port))


if __name__ == "__main__":
    _main()
