"""``compass bench http``: the HTTP front door against the native client, in the same run.

Two worker processes of one small app (its ``noop`` workflow answers 0, its ``nbytes`` the
size of its input, its ``words`` streams ``n`` words a step at a time, served as the OpenAI
model ``bench-chat``): one with the front door on (``--http-port``), one without. The clients
run in this process on uvloop. The HTTP side is measured as load generators (wrk, h2load)
measure a server: with a :class:`LeanClient`, one keep-alive connection per lane whose
request bytes are made once; aiohttp's client session is measured beside it (the
``aiohttp client`` rows), since its own cost is most of what it adds. Each comparison
alternates its sides in blocks, and a ratio is the median of the blocks' ratios (:func:`_paired`),
so both sides see the same background noise:

- **no-op, sequential**: one call at a time; p50 and p99 per side (native; HTTP JSON; HTTP
  binary; both from aiohttp's client), and an HTTP request that is no job
  (``/v2/health/live``: the HTTP stack's own round trip, client and server);
- **no-op, concurrent**: ``CONCURRENCY`` calls in flight (as many lean connections, or
  aiohttp's pool of as many); jobs per second per side;
- **3 MB tensor** (float32) into ``nbytes``: native against binary HTTP;
- **streamed**: a job of ``STREAM_WORDS`` steps, read as the native client's stream and as
  ``stream: true`` server-sent events from ``/v1/chat/completions``: chunks per second;
- **front door on against off**: the native client's no-op p50 at the worker serving HTTP (idle)
  and at the one that does not.

``--before PATH`` adds a third worker, with the front door, run from another checkout (its
``PYTHONPATH``): the same no-op and tensor sides against it, each a ratio to its own native
client, in the same run (a before/after of a change to the front door).

JSON: ``http_over_native_p50`` (JSON no-op), ``binary_noop_over_native_p50``,
``binary_over_native_p50`` (3 MB tensor), ``aiohttp_over_native_p50`` and
``aiohttp_binary_over_native_p50`` (the same through aiohttp's client),
``sse_over_native_chunks_per_s``, ``native_p50_us`` (front door off),
``native_p50_us_front_door_on`` and ``native_front_door_on_over_off``, with every side's
figures (and ``before`` with ``--before``). Targets (issue 36): HTTP no-op p50 within 1.5x of
native; binary tensors within 1.3x; the native figures unchanged with the front door on.

Run: ``compass bench http [--quick] [--before PATH] [--json results/http.json]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import aiohttp
import numpy as np

from compass.client import Client
from compass.cluster import LocalCluster
from compass.errors import CompassError
from compass.wire.transport import new_event_loop

from . import http_floor
from .report import machine, print_table, write_json

__all__ = ["LeanClient", "run"]

ROOT = Path(__file__).resolve().parents[1]
APP = """
import compass

app = compass.App("bench-http")
noop = app.workflow("noop", inputs=["x"])

@noop.task(expected_ms=0.1)
def nothing(model, x):
    return 0

nbytes = app.workflow("nbytes", inputs=["x"])

@nbytes.task(expected_ms=1)
def size(model, x):
    return int(x.nbytes)

words = app.workflow("words", inputs=["messages", "options"])

@words.task(expected_ms=1, steps=100)
def say(model, messages, options):
    for _ in range(options["max_tokens"]):
        yield "w "
    return {"text": "done", "finish_reason": "length"}

app.openai(model="bench-chat", workflow="words")
"""
TENSOR_BYTES = 3 * 1000 * 1000
CONCURRENCY = 16
#: the streamed job's steps (chunks)
STREAM_WORDS = 200
TARGETS = {"http_over_native_p50": 1.5, "binary_over_native_p50": 1.3,
           "native_front_door_on_over_off": 1.1}  # fmt: skip

#: blocks each sequential comparison alternates its sides in; a ratio is the median of the
#: blocks' (each side's p50 in a block over its base's), so that the load of other processes,
#: which drifts over seconds on a shared machine, weighs on both sides of each
BLOCKS = 20

Call = Callable[[], Awaitable[None]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _binary_body(array: np.ndarray[Any, Any], datatype: str) -> tuple[bytes, int]:
    raw = array.tobytes()
    tensor: dict[str, Any] = {"name": "x", "datatype": datatype, "shape": list(array.shape)}
    tensor["parameters"] = {"binary_data_size": len(raw)}
    doc = {"inputs": [tensor], "parameters": {"binary_data_output": True}}
    header = json.dumps(doc).encode()
    return header + raw, len(header)


class LeanClient(asyncio.Protocol):
    """What wrk does: one keep-alive connection, the request's bytes made once, the answer
    read into one buffer and cut at its head's end plus its Content-Length (a stream's: at its
    last chunk), no stream reader. Not a general HTTP client: the least a client can cost, so
    that the front door's share of a round trip shows, apart from a client library's."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[bytes] | None = None

    @classmethod
    async def open(cls, port: int) -> LeanClient:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(cls, "127.0.0.1", port)
        return client

    @staticmethod
    def request(path: str, body: bytes, token: str, headers: dict[str, str] | None = None) -> bytes:
        """The request's bytes: a POST of ``body`` (a GET where it is empty)."""
        method = "POST" if body else "GET"
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self._waiter is not None:
            self._complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("the front door closed the connection"))

    def _complete(self) -> None:
        """Hand the waiter the whole answer once it is in: head and body."""
        buffer = self.buffer
        head_end = buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        at = buffer.find(b"\r\nContent-Length: ", 0, head_end)
        if at >= 0:
            start = at + len(b"\r\nContent-Length: ")
            end = head_end + 4 + int(buffer[start : buffer.index(b"\r\n", start)])
        else:  # chunked (a stream): to its last, empty chunk
            last = buffer.find(b"\r\n0\r\n\r\n", head_end)
            if last < 0:
                return
            end = last + len(b"\r\n0\r\n\r\n")
        if len(buffer) < end:
            return
        answer = bytes(buffer[:end])
        del buffer[:end]
        waiter, self._waiter = self._waiter, None
        assert waiter is not None
        if not answer.startswith(b"HTTP/1.1 200"):
            waiter.set_exception(CompassError(f"HTTP answered {answer[:40]!r}"))
        else:
            waiter.set_result(answer)

    async def _exchange(self, request: bytes) -> bytes:
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._waiter

    async def send(self, request: bytes) -> bytes:
        """The answer's body."""
        answer = await self._exchange(request)
        return answer[answer.index(b"\r\n\r\n") + 4 :]

    async def stream(self, request: bytes) -> int:
        """Server-sent events to ``data: [DONE]``: how many events came before it."""
        answer = await self._exchange(request)
        return answer.count(b"data: ") - answer.count(b"data: [DONE]")

    async def aclose(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Requests:
    """The bodies every HTTP side sends, made once."""

    def __init__(self) -> None:
        self.json_noop = json.dumps(
            {"inputs": [{"name": "x", "datatype": "INT64", "shape": [], "data": [1]}]}
        ).encode()
        # shape []: the job's x is the int 1, as the native client sends it
        self.binary_noop = _binary_body(np.array(1, dtype=np.int64), "INT64")
        self.tensor = np.ones(TENSOR_BYTES // 4, dtype=np.float32)
        self.binary_tensor = _binary_body(self.tensor, "FP32")
        self.chat = json.dumps(
            {"model": "bench-chat", "messages": [{"role": "user", "content": "go"}],
             "max_tokens": STREAM_WORDS, "stream": True}
        ).encode()  # fmt: skip

    def lean(self, token: str) -> dict[str, bytes]:
        """The lean client's requests, by name."""
        noop_binary, noop_header = self.binary_noop
        tensor, tensor_header = self.binary_tensor

        def infer(workflow: str, body: bytes, header: int | None = None) -> bytes:
            extra = {} if header is None else {"Inference-Header-Content-Length": str(header)}
            return LeanClient.request(f"/v2/models/{workflow}/infer", body, token, extra)

        return {
            "json": infer("noop", self.json_noop),
            "binary": infer("noop", noop_binary, noop_header),
            "tensor": infer("nbytes", tensor, tensor_header),
            "live": LeanClient.request("/v2/health/live", b"", token),
            "chat": LeanClient.request("/v1/chat/completions", self.chat, token),
        }


def _json_zero(answer: bytes) -> None:
    if json.loads(answer)["outputs"][0]["data"] != [0]:
        raise CompassError("noop over HTTP answered something other than 0")


def _binary_int(answer: bytes, expected: int) -> None:
    if struct.unpack("<q", answer[-8:]) != (expected,):
        raise CompassError(f"binary HTTP answered something other than {expected}")


class Door:
    """The calls made to one worker with the front door: native, lean and aiohttp's; each
    checked (a wrong answer fails the benchmark). Lean connections are opened as lanes ask."""

    def __init__(self, cluster: LocalCluster, port: int, requests: Requests) -> None:
        assert cluster.token is not None
        self.port = port
        self.native = Client(cluster.addresses[0], token=cluster.token)
        self.requests = requests
        self.lean_requests = requests.lean(cluster.token)
        self.session = aiohttp.ClientSession(
            f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {cluster.token}"},
            connector=aiohttp.TCPConnector(limit=CONCURRENCY),
        )
        self._lean: list[LeanClient] = []

    async def lanes(self, count: int) -> list[LeanClient]:
        """``count`` lean connections (opened once, kept alive)."""
        while len(self._lean) < count:
            self._lean.append(await LeanClient.open(self.port))
        return self._lean[:count]

    async def aclose(self) -> None:
        await self.session.close()
        await self.native.aclose()
        for lean in self._lean:
            await lean.aclose()

    # -- native -----------------------------------------------------------------------------
    async def native_noop(self) -> None:
        if await self.native.submit("noop", x=1) != 0:
            raise CompassError("noop answered something other than 0")

    async def native_ping(self) -> None:
        await self.native.ping()

    async def native_tensor(self) -> None:
        if await self.native.submit("nbytes", x=self.requests.tensor) != TENSOR_BYTES:
            raise CompassError("nbytes answered the wrong size")

    async def native_stream(self) -> None:
        options = {"max_tokens": STREAM_WORDS}
        chunks = [out async for out in self.native.stream("words", messages=[], options=options)]
        if len(chunks) != STREAM_WORDS + 1:  # the words, then the final answer
            raise CompassError(f"the native stream gave {len(chunks)} outputs")

    # -- lean HTTP --------------------------------------------------------------------------
    def lean(self, name: str, lane: LeanClient) -> Call:
        request = self.lean_requests[name]

        async def call() -> None:
            if name == "chat":
                if await lane.stream(request) != STREAM_WORDS + 1:  # the words, then the end
                    raise CompassError("the stream over HTTP lost chunks")
                return
            answer = await lane.send(request)
            if name == "json":
                _json_zero(answer)
            elif name in ("binary", "tensor"):
                _binary_int(answer, 0 if name == "binary" else TENSOR_BYTES)

        return call

    # -- aiohttp's client -------------------------------------------------------------------
    async def _post(self, workflow: str, body: bytes, header: int | None) -> bytes:
        headers = {} if header is None else {"Inference-Header-Content-Length": str(header)}
        async with self.session.post(
            f"/v2/models/{workflow}/infer", data=body, headers=headers
        ) as response:
            answer = await response.read()
            if response.status != 200:
                raise CompassError(f"HTTP {response.status}: {answer[:200]!r}")
            return answer

    async def aiohttp_json(self) -> None:
        _json_zero(await self._post("noop", self.requests.json_noop, None))

    async def aiohttp_binary(self) -> None:
        _binary_int(await self._post("noop", *self.requests.binary_noop), 0)

    async def aiohttp_tensor(self) -> None:
        _binary_int(await self._post("nbytes", *self.requests.binary_tensor), TENSOR_BYTES)


async def _latencies(sides: dict[str, Call], calls: int, blocks: int) -> dict[str, list[float]]:
    """``calls`` sequential calls per side, in ``blocks`` alternating blocks: seconds each."""
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    per_block = max(1, calls // blocks)
    for _ in range(blocks):
        for name, call in sides.items():
            for _ in range(per_block):
                t0 = time.perf_counter()
                await call()
                seconds[name].append(time.perf_counter() - t0)
    return seconds


async def _throughput(lanes: list[Call], calls: int) -> float:
    """Jobs per second with one call in flight per lane, ``calls`` in all."""
    left = calls

    async def one_lane(call: Call) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    t0 = time.perf_counter()
    await asyncio.gather(*(one_lane(call) for call in lanes))
    return calls / (time.perf_counter() - t0)


def _us(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e6, q))


#: what names the sides of the ``--before`` worker
BEFORE = "before: "


async def _noop_and_tensor(doors: dict[str, Door], calls: int, tensor_calls: int) -> dict[str, Any]:
    """The sequential no-op and 3 MB sides at each door's worker, its name before each side's
    (all the doors' sides alternate in the same blocks)."""
    noop: dict[str, Call] = {}
    tensor: dict[str, Call] = {}
    for prefix, door in doors.items():
        (lane,) = await door.lanes(1)
        noop |= {
            f"{prefix}native": door.native_noop,
            f"{prefix}http json": door.lean("json", lane),
            f"{prefix}http binary": door.lean("binary", lane),
            f"{prefix}http json, aiohttp client": door.aiohttp_json,
            f"{prefix}http binary, aiohttp client": door.aiohttp_binary,
            f"{prefix}http, no job": door.lean("live", lane),
            f"{prefix}native, no job": door.native_ping,
        }
        tensor |= {
            f"{prefix}native": door.native_tensor,
            f"{prefix}http binary": door.lean("tensor", lane),
            f"{prefix}http binary, aiohttp client": door.aiohttp_tensor,
        }
    for call in [*noop.values(), *tensor.values()]:  # warm up
        for _ in range(20):
            await call()
    return {
        "noop": await _latencies(noop, calls, BLOCKS),
        "tensor": await _latencies(tensor, tensor_calls, BLOCKS),
    }


def _split(sides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """This checkout's sides, and the ``--before`` worker's (their prefix taken off)."""
    after = {k: v for k, v in sides.items() if not k.startswith(BEFORE)}
    before = {k[len(BEFORE) :]: v for k, v in sides.items() if k.startswith(BEFORE)}
    return after, before


async def _rates(door: Door, calls: int, blocks: int = 4) -> dict[str, float]:
    """Jobs per second with :data:`CONCURRENCY` in flight: the median of ``blocks`` rounds,
    the sides alternating."""
    lanes = await door.lanes(CONCURRENCY)
    sides: dict[str, list[Call]] = {
        "native": [door.native_noop] * CONCURRENCY,
        "http json": [door.lean("json", lane) for lane in lanes],
        "http binary": [door.lean("binary", lane) for lane in lanes],
        "http json, aiohttp client": [door.aiohttp_json] * CONCURRENCY,
        "http binary, aiohttp client": [door.aiohttp_binary] * CONCURRENCY,
        "http, no job": [door.lean("live", lane) for lane in lanes],
    }
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(blocks):
        for name, lanes_of in sides.items():
            rates[name].append(await _throughput(lanes_of, calls // blocks))
    return {name: float(np.median(values)) for name, values in rates.items()}


async def _streams(door: Door, jobs: int) -> dict[str, float]:
    """Chunks per second of a streamed job, native and server-sent events, alternating."""
    (lane,) = await door.lanes(1)
    sides = {"native": door.native_stream, "http sse": door.lean("chat", lane)}
    for call in sides.values():
        await call()
    seconds = await _latencies(sides, jobs, blocks=5)
    return {name: STREAM_WORDS / float(np.median(v)) for name, v in seconds.items()}


async def _body_floor(calls: int) -> dict[str, list[float]]:
    """A 3 MB POST's round trip to aiohttp's server alone (read as the front door reads, and
    through aiohttp's reader) and to a raw BufferedProtocol (:mod:`bench.http_floor`),
    alternating: what aiohttp's read path costs."""
    ports = {"aiohttp": _free_port(), "chunks": _free_port(), "raw": _free_port()}
    processes = http_floor.servers(ports)
    lanes: list[LeanClient] = []
    try:
        request = LeanClient.request("/", bytes(http_floor.BODY_BYTES), "-")
        sides: dict[str, Call] = {}
        for side, port in ports.items():
            lane = await LeanClient.open(port)
            lanes.append(lane)

            async def post(lane: LeanClient = lane) -> None:
                if await lane.send(request) != b"ok":
                    raise CompassError("the floor server answered something other than ok")

            sides[side] = post
        for call in sides.values():
            for _ in range(10):
                await call()
        return await _latencies(sides, calls, BLOCKS)
    finally:
        for lane in lanes:
            await lane.aclose()
        for process in processes:
            process.kill()
            process.wait()


async def _measure(quick: bool, before: str | None) -> dict[str, Any]:
    calls, tensor_calls, rate_calls, streams = (
        (300, 30, 600, 10) if quick else (2000, 200, 4000, 50)
    )
    with tempfile.TemporaryDirectory(prefix="compass-bench-http-") as folder:
        Path(folder, "bench_http_app.py").write_text(APP)  # noqa: ASYNC240 (before any load)
        env = dict(os.environ)
        env.pop("COMPASS_TOKEN", None)

        def pythonpath(tree: Path) -> dict[str, str]:
            """A worker's environment: ``tree``'s compass. PYTHONSAFEPATH, else ``python -m``
            puts the working directory first on sys.path, and a bench run from a checkout's
            root ran that checkout's compass in the ``--before`` worker too."""
            path = [folder, str(tree), env.get("PYTHONPATH", "")]
            joined = os.pathsep.join(path).rstrip(os.pathsep)
            return {**env, "PYTHONPATH": joined, "PYTHONSAFEPATH": "1"}

        app = ["--app", "bench_http_app"]
        port = _free_port()
        on = LocalCluster(1, args=[*app, "--http-port", str(port)], env=pythonpath(ROOT))
        off = LocalCluster(1, args=app, env=pythonpath(ROOT))
        raw: dict[str, Any] = {}
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(on)
            await stack.enter_async_context(off)
            requests = Requests()
            door = Door(on, port, requests)
            stack.push_async_callback(door.aclose)
            native_off = Client(off.addresses[0], token=off.token)
            stack.push_async_callback(native_off.aclose)
            doors = {"": door}
            if before is not None:  # a worker of the other checkout, its sides among these
                before_port = _free_port()
                old = LocalCluster(1, args=[*app, "--http-port", str(before_port)],
                                   env=pythonpath(Path(before)))  # fmt: skip
                await stack.enter_async_context(old)
                doors[BEFORE] = Door(old, before_port, requests)
                stack.push_async_callback(doors[BEFORE].aclose)
            raw.update(await _noop_and_tensor(doors, calls, tensor_calls))
            raw["rates"] = await _rates(door, rate_calls)
            raw["streams"] = await _streams(door, streams)

            async def native_noop_off() -> None:
                if await native_off.submit("noop", x=1) != 0:
                    raise CompassError("noop answered something other than 0")

            for _ in range(50):
                await native_noop_off()
            raw["door"] = await _latencies(
                {"front door on": door.native_noop, "front door off": native_noop_off},
                calls,
                BLOCKS,
            )
    raw["floor"] = await _body_floor(tensor_calls)
    return {**raw, "calls": calls, "tensor_calls": tensor_calls, "rate_calls": rate_calls,
            "stream_jobs": streams}  # fmt: skip


def _paired(side: list[float], base: list[float]) -> float:
    """``side``'s p50 over ``base``'s: the median of the :data:`BLOCKS` blocks' ratios (both
    measured in the same blocks, in order)."""
    ratios = [
        float(np.median(a) / np.median(b))
        for a, b in zip(np.array_split(side, BLOCKS), np.array_split(base, BLOCKS), strict=True)
    ]
    return float(np.median(ratios))


def _ratios(noop: dict[str, list[float]], tensor: dict[str, list[float]]) -> dict[str, float]:
    """Each HTTP side's p50 over the native client's (:func:`_paired`), as the JSON names
    them."""
    return {
        "http_over_native_p50": _paired(noop["http json"], noop["native"]),
        "binary_noop_over_native_p50": _paired(noop["http binary"], noop["native"]),
        "aiohttp_over_native_p50": _paired(noop["http json, aiohttp client"], noop["native"]),
        "aiohttp_binary_noop_over_native_p50": _paired(
            noop["http binary, aiohttp client"], noop["native"]
        ),
        "binary_over_native_p50": _paired(tensor["http binary"], tensor["native"]),
        "aiohttp_binary_over_native_p50": _paired(
            tensor["http binary, aiohttp client"], tensor["native"]
        ),
    }


_NO_JOB = {"http, no job": "health route, no job", "native, no job": "native ping, no job"}


def _rows(raw: dict[str, Any]) -> list[list[Any]]:
    noop, tensors, door = raw["noop"], raw["tensor"], raw["door"]
    rows: list[list[Any]] = []
    for group, sides, base in (("no-op", noop, "native"), ("3 MB tensor", tensors, "native"),
                               ("native no-op", door, "front door off")):  # fmt: skip
        for name, values in sides.items():
            label = _NO_JOB.get(name, f"{group}, {name}")
            rate = raw["rates"].get(name) if group == "no-op" else None
            ratio = _paired(values, sides[base])
            rows.append([label, _us(values, 50), _us(values, 99), rate, ratio])
    return rows


def run(
    quick: bool = False, json_path: str | None = None, before: str | None = None
) -> dict[str, Any]:
    loop = new_event_loop()
    try:
        raw = loop.run_until_complete(_measure(quick, before))
    finally:
        loop.close()
    (noop, noop_before), (tensors, tensors_before) = _split(raw["noop"]), _split(raw["tensor"])
    raw["noop"], raw["tensor"] = noop, tensors
    door, streams = raw["door"], raw["streams"]
    print_table(
        f"HTTP front door against the native client: µs, one worker, {raw['calls']} no-op calls "
        f"and {raw['tensor_calls']} tensor calls per side; HTTP from a lean keep-alive client "
        f"(and aiohttp's); jobs/s at {CONCURRENCY} in flight",
        ["side", "p50 µs", "p99 µs", "jobs/s", "p50 / native"],
        _rows(raw),
    )
    print_table(
        f"a job streamed in {STREAM_WORDS} chunks: chunks per second, median of "
        f"{raw['stream_jobs']} jobs per side",
        ["side", "chunks/s", "/ native"],
        [[name, rate, rate / streams["native"]] for name, rate in streams.items()],
    )
    result: dict[str, Any] = {
        **_ratios(noop, tensors),
        "sse_over_native_chunks_per_s": streams["http sse"] / streams["native"],
        "chunks_per_s": streams,
        "native_p50_us": _us(door["front door off"], 50),
        "native_p50_us_front_door_on": _us(door["front door on"], 50),
        "http_no_job_p50_us": _us(noop["http, no job"], 50),
        "native_no_job_p50_us": _us(noop["native, no job"], 50),
        "noop": {
            name: {"p50_us": _us(v, 50), "p99_us": _us(v, 99), "jobs_per_s": raw["rates"].get(name)}
            for name, v in noop.items()
        },
        "tensor_3mb": {
            name: {"p50_us": _us(v, 50), "p99_us": _us(v, 99)} for name, v in tensors.items()
        },
        "calls": raw["calls"],
        "tensor_calls": raw["tensor_calls"],
        "concurrency": CONCURRENCY,
        "client": "lean: one keep-alive connection per lane, request bytes made once (as wrk)",
        "targets": TARGETS,
    }
    result["native_front_door_on_over_off"] = _paired(door["front door on"], door["front door off"])
    result["meets_targets"] = {k: result[k] <= target for k, target in TARGETS.items()}
    floor = raw["floor"]
    result["body_floor"] = {
        "aiohttp_p50_us": _us(floor["aiohttp"], 50),
        "raw_p50_us": _us(floor["raw"], 50),
        "aiohttp_over_raw_p50": _paired(floor["aiohttp"], floor["raw"]),
        "chunks_p50_us": _us(floor["chunks"], 50),
        "chunks_over_raw_p50": _paired(floor["chunks"], floor["raw"]),
    }
    print_table(
        "what bounds the 3 MB case: a 3 MB POST to aiohttp's server alone (aiohttp: read as "
        "the front door reads; chunks: through aiohttp's reader) and to a raw "
        "asyncio.BufferedProtocol (the kernel writes into the body's buffer, as the native "
        "wire's)",
        ["server", "p50 µs", "p99 µs", "/ raw"],
        [[side, _us(v, 50), _us(v, 99), _paired(v, floor["raw"])] for side, v in floor.items()],
    )
    if before is not None:
        compared = {"before": _ratios(noop_before, tensors_before), "after": _ratios(noop, tensors)}
        print_table(
            f"before ({before}) and after (this checkout), the same run: p50 over each worker's "
            "own native client",
            ["ratio", "before", "after", "after / before"],
            [[key, compared["before"][key], value, value / compared["before"][key]]
             for key, value in compared["after"].items()],
        )  # fmt: skip
        result["before_after"] = {"before": before, **compared}
    print(
        f"HTTP JSON no-op p50 / native: {result['http_over_native_p50']:.2f}x (target <= 1.5); "
        f"3 MB binary / native: {result['binary_over_native_p50']:.2f}x (target <= 1.3); native "
        f"with the front door on / off: {result['native_front_door_on_over_off']:.2f}x"
    )
    result["machine"] = machine()
    write_json(json_path, result)
    return result
