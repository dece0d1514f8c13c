"""``compass bench http``: the HTTP front door against the native client, in the same run.

Two worker processes of one small app (its ``noop`` workflow answers 0, its ``nbytes`` the
size of its input): one with the front door on (``--http-port``), one without. The clients run
in this process on uvloop: the native :class:`~compass.client.Client`, and aiohttp's client
session (keep-alive; the Open Inference Protocol as tritonclient speaks it, in JSON and with the
binary tensor data extension). Each comparison alternates its sides in blocks, so both see the
same background noise:

- **no-op, sequential**: one call at a time; p50 and p99 per side (native; HTTP JSON; HTTP
  binary; HTTP JSON from a lean client, :class:`LeanClient`, which tells the front door's share
  of a round trip from aiohttp's client's), and an HTTP request that is no job
  (``/v2/health/live``: the HTTP stack's own round trip, client and server);
- **no-op, concurrent**: ``CONCURRENCY`` calls in flight; jobs per second per side;
- **3 MB tensor** (float32) into ``nbytes``: native against binary HTTP;
- **front door on against off**: the native client's no-op p50 at the worker serving HTTP (idle)
  and at the one that does not.

JSON: ``http_over_native_p50`` (JSON no-op), ``binary_noop_over_native_p50``,
``lean_client_over_native_p50`` (JSON no-op, the lean client), ``binary_over_native_p50``
(3 MB tensor), ``native_p50_us`` (front door off),
``native_p50_us_front_door_on`` and ``native_front_door_on_over_off``, with every side's figures.
Targets (issue 36): HTTP no-op p50 within 1.5x of native; binary tensors within 1.3x; the native
figures unchanged with the front door on.

Run: ``compass bench http [--quick] [--json results/http.json]``.
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
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from compass.client import Client
from compass.cluster import LocalCluster
from compass.errors import CompassError
from compass.wire.transport import new_event_loop

from .report import machine, print_table, write_json

__all__ = ["run"]

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
"""
TENSOR_BYTES = 3 * 1000 * 1000
CONCURRENCY = 16
TARGETS = {"http_over_native_p50": 1.5, "binary_over_native_p50": 1.3,
           "native_front_door_on_over_off": 1.1}  # fmt: skip

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


class LeanClient:
    """What wrk does: one keep-alive connection, the request's bytes made once, the answer
    read by its Content-Length. Not a general HTTP client (it knows the front door answers
    with a Content-Length and no chunking): the least a client can cost, so the front door's
    share of a round trip shows apart from aiohttp's client's."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> LeanClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    @staticmethod
    def request(path: str, body: bytes, token: str) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def send(self, request: bytes) -> bytes:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise CompassError(f"HTTP answered {head[:40]!r}")
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return await self.reader.readexactly(length)

    async def aclose(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


class Sides:
    """The calls each side makes, checked: a wrong answer fails the benchmark."""

    def __init__(self, on: LocalCluster, off: LocalCluster, port: int) -> None:
        self.native_on = Client(on.addresses[0], token=on.token)
        self.native_off = Client(off.addresses[0], token=off.token)
        self.session = aiohttp.ClientSession(
            f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {on.token}"},
            connector=aiohttp.TCPConnector(limit=CONCURRENCY),
        )
        self.json_noop = json.dumps(
            {"inputs": [{"name": "x", "datatype": "INT64", "shape": [], "data": [1]}]}
        ).encode()
        # shape []: the job's x is the int 1, as the native client sends it
        self.binary_noop = _binary_body(np.array(1, dtype=np.int64), "INT64")
        self.tensor = np.ones(TENSOR_BYTES // 4, dtype=np.float32)
        self.binary_tensor = _binary_body(self.tensor, "FP32")

    lean: LeanClient | None = None

    async def connect(self, port: int, token: str) -> None:
        self.lean = await LeanClient.open(port)
        self.lean_noop = LeanClient.request("/v2/models/noop/infer", self.json_noop, token)
        body, header = self.binary_tensor
        tensor = LeanClient.request("/v2/models/nbytes/infer", body, token)
        marker = b"\r\nContent-Length:"  # the binary extension's header goes beside it
        self.lean_tensor = tensor.replace(
            marker, b"\r\nInference-Header-Content-Length: %d%s" % (header, marker), 1
        )

    async def aclose(self) -> None:
        await self.session.close()
        await self.native_on.aclose()
        await self.native_off.aclose()
        if self.lean is not None:
            await self.lean.aclose()

    async def native_noop_on(self) -> None:
        if await self.native_on.submit("noop", x=1) != 0:
            raise CompassError("noop answered something other than 0")

    async def native_noop_off(self) -> None:
        if await self.native_off.submit("noop", x=1) != 0:
            raise CompassError("noop answered something other than 0")

    async def native_tensor(self) -> None:
        if await self.native_on.submit("nbytes", x=self.tensor) != TENSOR_BYTES:
            raise CompassError("nbytes answered the wrong size")

    async def _post(self, workflow: str, body: bytes, header: int | None) -> bytes:
        headers = {} if header is None else {"Inference-Header-Content-Length": str(header)}
        async with self.session.post(
            f"/v2/models/{workflow}/infer", data=body, headers=headers
        ) as response:
            answer = await response.read()
            if response.status != 200:
                raise CompassError(f"HTTP {response.status}: {answer[:200]!r}")
            length = response.headers.get("Inference-Header-Content-Length")
            return answer if length is None else answer[int(length) :]

    async def http_live(self) -> None:
        async with self.session.get("/v2/health/live") as response:
            await response.read()
            if response.status != 200:
                raise CompassError(f"HTTP {response.status} from /v2/health/live")

    async def http_json_noop(self) -> None:
        answer = await self._post("noop", self.json_noop, None)
        if json.loads(answer)["outputs"][0]["data"] != [0]:
            raise CompassError("noop over HTTP answered something other than 0")

    async def http_lean_noop(self) -> None:
        assert self.lean is not None
        answer = await self.lean.send(self.lean_noop)
        if json.loads(answer)["outputs"][0]["data"] != [0]:
            raise CompassError("noop over HTTP answered something other than 0")

    async def http_lean_tensor(self) -> None:
        assert self.lean is not None
        answer = await self.lean.send(self.lean_tensor)
        length = json.loads(answer[: answer.index(b"}]}") + 3])  # the JSON header
        if struct.unpack("<q", answer[-8:]) != (TENSOR_BYTES,) or not length["outputs"]:
            raise CompassError("nbytes over binary HTTP answered the wrong size")

    async def http_binary_noop(self) -> None:
        answer = await self._post("noop", *self.binary_noop)
        if struct.unpack("<q", answer) != (0,):
            raise CompassError("noop over binary HTTP answered something other than 0")

    async def http_binary_tensor(self) -> None:
        answer = await self._post("nbytes", *self.binary_tensor)
        if struct.unpack("<q", answer) != (TENSOR_BYTES,):
            raise CompassError("nbytes over binary HTTP answered the wrong size")


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


async def _throughput(call: Call, calls: int) -> float:
    """Jobs per second with :data:`CONCURRENCY` calls in flight."""
    left = calls

    async def one_lane() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    t0 = time.perf_counter()
    await asyncio.gather(*(one_lane() for _ in range(CONCURRENCY)))
    return calls / (time.perf_counter() - t0)


def _us(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e6, q))


async def _measure(quick: bool) -> dict[str, Any]:
    calls, tensor_calls, rate_calls = (300, 30, 600) if quick else (2000, 200, 4000)
    with tempfile.TemporaryDirectory(prefix="compass-bench-http-") as folder:
        Path(folder, "bench_http_app.py").write_text(APP)  # noqa: ASYNC240 (before any load)
        env = dict(os.environ)
        env.pop("COMPASS_TOKEN", None)
        path = [folder, str(ROOT), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(path).rstrip(os.pathsep)
        port = _free_port()
        app = ["--app", "bench_http_app"]
        on = LocalCluster(1, args=[*app, "--http-port", str(port)], env=env)
        off = LocalCluster(1, args=app, env=env)
        async with on, off:
            sides = Sides(on, off, port)
            try:
                assert on.token is not None
                await sides.connect(port, on.token)
                noop = {"native": sides.native_noop_on, "http json": sides.http_json_noop,
                        "http binary": sides.http_binary_noop,
                        "http json, lean client": sides.http_lean_noop}  # fmt: skip
                for call in [*noop.values(), sides.native_noop_off]:  # warm up
                    for _ in range(50):
                        await call()
                await sides.native_tensor()
                await sides.http_binary_tensor()
                latencies = await _latencies({**noop, "http, no job": sides.http_live}, calls, 10)
                rated = {k: v for k, v in noop.items() if k != "http json, lean client"}  # one conn
                rates = {name: await _throughput(call, rate_calls) for name, call in rated.items()}
                rates["http, no job"] = await _throughput(sides.http_live, rate_calls)
                tensors = await _latencies(
                    {
                        "native": sides.native_tensor,
                        "http binary": sides.http_binary_tensor,
                        "http binary, lean client": sides.http_lean_tensor,
                    },
                    tensor_calls,
                    blocks=10,
                )
                door = await _latencies(
                    {"front door on": sides.native_noop_on,
                     "front door off": sides.native_noop_off},
                    calls,
                    blocks=10,
                )  # fmt: skip
            finally:
                await sides.aclose()
    return {"noop": latencies, "rates": rates, "tensor": tensors, "door": door, "calls": calls,
            "tensor_calls": tensor_calls, "rate_calls": rate_calls}  # fmt: skip


def run(quick: bool = False, json_path: str | None = None) -> dict[str, Any]:
    loop = new_event_loop()
    try:
        raw = loop.run_until_complete(_measure(quick))
    finally:
        loop.close()
    noop, tensors, door = raw["noop"], raw["tensor"], raw["door"]
    p50 = {name: _us(v, 50) for name, v in noop.items()}
    tensor_p50 = {name: _us(v, 50) for name, v in tensors.items()}
    door_p50 = {name: _us(v, 50) for name, v in door.items()}
    rows: list[list[Any]] = []
    for name, values in noop.items():
        label = "health route, no job" if name == "http, no job" else f"no-op, {name}"
        ratio = p50[name] / p50["native"]
        rows.append([label, p50[name], _us(values, 99), raw["rates"].get(name), ratio])
    for name, values in tensors.items():
        ratio = tensor_p50[name] / tensor_p50["native"]
        rows.append([f"3 MB tensor, {name}", tensor_p50[name], _us(values, 99), None, ratio])
    for name, values in door.items():
        ratio = door_p50[name] / door_p50["front door off"]
        rows.append([f"native no-op, {name}", door_p50[name], _us(values, 99), None, ratio])
    print_table(
        f"HTTP front door against the native client: µs, one worker, {raw['calls']} no-op calls "
        f"and {raw['tensor_calls']} tensor calls per side; jobs/s at {CONCURRENCY} in flight",
        ["side", "p50 µs", "p99 µs", "jobs/s", "p50 / native"],
        rows,
    )
    noop_figures = {
        name: {"p50_us": p50[name], "p99_us": _us(values, 99), "jobs_per_s": raw["rates"].get(name)}
        for name, values in noop.items()
    }
    tensor_figures = {
        name: {"p50_us": tensor_p50[name], "p99_us": _us(values, 99)}
        for name, values in tensors.items()
    }
    native_tensor = tensor_p50["native"]
    result: dict[str, Any] = {
        "http_over_native_p50": p50["http json"] / p50["native"],
        "binary_noop_over_native_p50": p50["http binary"] / p50["native"],
        "lean_client_over_native_p50": p50["http json, lean client"] / p50["native"],
        "binary_over_native_p50": tensor_p50["http binary"] / tensor_p50["native"],
        "lean_binary_over_native_p50": tensor_p50["http binary, lean client"] / native_tensor,
        "native_p50_us": door_p50["front door off"],
        "native_p50_us_front_door_on": door_p50["front door on"],
        "native_front_door_on_over_off": door_p50["front door on"] / door_p50["front door off"],
        "http_no_job_p50_us": p50["http, no job"],
        "noop": noop_figures,
        "tensor_3mb": tensor_figures,
        "calls": raw["calls"],
        "tensor_calls": raw["tensor_calls"],
        "concurrency": CONCURRENCY,
        "targets": TARGETS,
    }
    result["meets_targets"] = {k: result[k] <= target for k, target in TARGETS.items()}
    print(
        f"HTTP JSON no-op p50 / native: {result['http_over_native_p50']:.2f}x (target <= 1.5); "
        f"3 MB binary / native: {result['binary_over_native_p50']:.2f}x (target <= 1.3); native "
        f"with the front door on / off: {result['native_front_door_on_over_off']:.2f}x"
    )
    result["machine"] = machine()
    write_json(json_path, result)
    return result
