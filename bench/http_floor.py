"""What receiving a large body costs over HTTP, apart from compass: the floor under
``binary_over_native_p50`` in ``compass bench http``.

Three servers, each a process of its own, answer a POST of ``BODY_BYTES`` once the whole body
is in one buffer: aiohttp's low-level server reading the body as the front door does
(:func:`compass.front.body.read_body`: past what came with its head, the body is received
straight into its buffer); the same server reading it through aiohttp's reader (``readchunk``
into ``numpy.empty``'s buffer, the reader holding up to 2 MiB: how the front door read before);
and a raw :class:`asyncio.BufferedProtocol` into which the kernel writes the body directly, as
the native wire receives a frame. All run on uvloop; one lean client
(:class:`bench.front.LeanClient`) alternates between them.

Run by ``compass bench http`` (its ``body_floor`` figures); ``python -m compass._bench.http_floor
aiohttp|chunks|raw PORT`` serves one side until killed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BODY_BYTES", "serve", "servers"]

ROOT = Path(__file__).resolve().parents[1]
BODY_BYTES = 3 * 1000 * 1000
_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class _Raw(asyncio.BufferedProtocol):
    """A request head into a small buffer, then its body straight into its own buffer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.scratch = bytearray(64 * 1024)
        self.body: memoryview | None = None
        self.filled = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is not None:
            return self.body[self.filled :]
        return memoryview(self.scratch)

    def buffer_updated(self, nbytes: int) -> None:
        if self.body is None:
            self.head += self.scratch[:nbytes]
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            rest = self.head[end + 4 :]
            self.body = np.empty(BODY_BYTES, dtype=np.uint8).data
            self.body[: len(rest)] = rest
            self.filled = len(rest)
        else:
            self.filled += nbytes
        if self.filled >= BODY_BYTES:
            self.body, self.head = None, bytearray()
            assert self.transport is not None
            self.transport.write(_ANSWER)


async def _front_door_handler(request: Any) -> Any:
    from aiohttp import web

    from compass.front.body import read_body

    await read_body(request, request.content_length)
    return web.Response(body=b"ok")


async def _chunks_handler(request: Any) -> Any:
    from aiohttp import web

    view = np.empty(request.content_length, dtype=np.uint8).data
    filled = 0
    while filled < len(view):
        chunk, _ = await request.content.readchunk()
        view[filled : filled + len(chunk)] = chunk
        filled += len(chunk)
    return web.Response(body=b"ok")


async def serve(side: str, port: int) -> None:
    """Serve ``side`` (``aiohttp``, ``chunks`` or ``raw``) on ``port`` until cancelled."""
    loop = asyncio.get_running_loop()
    factory: Callable[[], asyncio.BaseProtocol] = _Raw
    if side != "raw":
        from aiohttp import web

        from compass.front.body import BodyConnection
        from compass.front.server import READ_BUFFER

        class _Server(web.Server):
            def __call__(self) -> BodyConnection:
                return BodyConnection(self, loop=self._loop, **self._kwargs)

        if side == "aiohttp":
            factory = _Server(_front_door_handler, read_bufsize=READ_BUFFER, access_log=None)
        else:  # as the front door read before: aiohttp pausing at 2 MiB, not 128 KiB
            factory = _Server(_chunks_handler, read_bufsize=1024 * 1024, access_log=None)
    server = await loop.create_server(factory, "127.0.0.1", port)
    print("serving", flush=True)
    async with server:
        await asyncio.Event().wait()


def servers(ports: dict[str, int]) -> list[subprocess.Popen[str]]:
    """One process per side, each serving when this returns (the caller kills them)."""
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path).rstrip(os.pathsep)}
    started = []
    for side, port in ports.items():
        process = subprocess.Popen(
            [sys.executable, "-m", f"{__package__}.http_floor", side, str(port)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        started.append(process)
        assert process.stdout is not None
        if process.stdout.readline().strip() != "serving":
            for each in started:
                each.kill()
            raise RuntimeError(f"the {side} floor server did not start")
    return started


if __name__ == "__main__":
    from compass.wire.transport import new_event_loop

    new_event_loop().run_until_complete(serve(sys.argv[1], int(sys.argv[2])))
