"""A request body of known length, read into one buffer: what a binary tensor becomes a view of.

aiohttp's connection is an :class:`asyncio.Protocol`: each read of the socket becomes a bytes,
its parser (llhttp) copies the body's part of it into another bytes for the request's
``StreamReader``, and the handler, woken once per read, copies that into the tensor's buffer:
three copies of every byte and a wake-up per 256 KB read, where the native wire's
:class:`asyncio.BufferedProtocol` has the kernel write a frame into its buffer (measured on a
3 MB body: ``body_floor`` in ``compass bench http``).

So a body of at least :data:`DIRECT_MIN` bytes, once aiohttp's parser has read the request's
head (and whatever of the body came with it), has the rest of its bytes received straight into
the buffer: the transport's protocol is, for as long as those bytes take, a
:class:`_Receiver` whose ``get_buffer`` is the unfilled rest of the buffer, so the socket reads
no byte past the body. Then the connection gets its transport back with a fresh parser (aiohttp's
own, made as the connection made its first: the old one is still inside the body it never saw
the rest of), and the request's ``StreamReader`` is ended. Nothing of HTTP is parsed here: a
body with a ``Content-Length`` is that many bytes, and any other (chunked, compressed) is read
through aiohttp as before. What follows the body (a pipelined request) is parsed by aiohttp.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from aiohttp import web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from compass.front.errors import HttpError

__all__ = ["DIRECT_MIN", "BodyConnection", "read_body"]

#: bytes of a body, past what arrived with its head, from which they are received straight
#: into its buffer (below it, aiohttp's copies cost less than switching the protocol twice)
DIRECT_MIN = 256 * 1024


class BodyConnection(RequestHandler):
    """aiohttp's connection, which :func:`read_body` can take a body's bytes past."""

    def fresh_parser(self) -> Any:
        """A new parser for this connection, made as aiohttp made its first (its limits);
        None where this aiohttp's parser is not made so (the body is then read through it)."""
        parser = self._parser
        if parser is None:
            return None
        options: dict[str, Any] = {
            "max_line_size": self.max_line_size,
            "max_field_size": self.max_field_size,
            "max_headers": self.max_headers,
            "payload_exception": RequestPayloadError,
        }
        queue = getattr(self, "_max_msg_queue_size", None)
        if queue is not None:
            options["max_msg_queue_size"] = queue
        try:
            return type(parser)(self, self._loop, self._read_bufsize, **options)
        except TypeError:  # another aiohttp's signature
            return None


class _Receiver(asyncio.BufferedProtocol):
    """The transport's protocol while the rest of a body arrives: the kernel writes it into
    ``view``; then the connection is given its transport back, with ``parser``."""

    def __init__(
        self, connection: BodyConnection, transport: Any, view: memoryview, filled: int,
        parser: Any,
    ) -> None:  # fmt: skip
        self.connection = connection
        self.transport = transport
        self.view = view
        self.filled = filled
        self.parser = parser
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled >= len(self.view):
            self.give_back(whole=True)
            if not self.done.done():
                self.done.set_result(None)

    def eof_received(self) -> bool:
        """The client stopped sending before the body's end: answered 400, then closed."""
        self.give_back(whole=False)
        self.connection.close()  # once answered
        if not self.done.done():
            self.done.set_exception(
                HttpError(400, f"the body ended after {self.filled} of its {len(self.view)} bytes")
            )
        return True  # the answer is still to be written

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.cancel()  # the handler is cancelled with the connection
        self.connection.connection_lost(exc)

    def pause_writing(self) -> None:
        self.connection.pause_writing()

    def resume_writing(self) -> None:
        self.connection.resume_writing()

    def give_back(self, *, whole: bool) -> None:
        """The transport back to the connection: with the new parser where the body came
        whole (the old one is inside it), else with the old one (the connection is closed
        after its answer: what else the client sends is read as aiohttp reads a body's rest)."""
        connection = self.connection
        if self.transport.get_protocol() is self and not self.transport.is_closing():
            if whole:
                connection._parser = self.parser
            self.transport.set_protocol(connection)


def _direct(request: web.BaseRequest, left: int) -> tuple[BodyConnection, Any, Any] | None:
    """The connection, transport and fresh parser with which ``left`` bytes of ``request``'s
    body can be received straight into its buffer; None where they cannot."""
    connection = request.protocol
    transport = request.transport
    if (
        left < DIRECT_MIN
        or not isinstance(connection, BodyConnection)
        or transport is None
        or transport.is_closing()
        or not transport.is_reading()  # paused: aiohttp's parser may hold body bytes not fed
        or "Content-Encoding" in request.headers  # aiohttp decompresses it
        or "Transfer-Encoding" in request.headers
    ):
        return None
    parser = connection.fresh_parser()
    return None if parser is None else (connection, transport, parser)


def _buffered(content: Any) -> bool:
    """Whether aiohttp's reader holds body bytes not read yet (True where it cannot say)."""
    return bool(getattr(content, "_buffer", True))


async def read_body(request: web.BaseRequest, length: int) -> memoryview:
    """The body's ``length`` bytes in one buffer (a tensor's array is then a view of it,
    writable as a native job's is): what has arrived copied from aiohttp's reader, the rest
    received into the buffer directly where it is large (:data:`DIRECT_MIN`), else copied
    from aiohttp's chunks as they come.

    ``readchunk``, not ``readany``: ``readany`` joins the chunks buffered so far into a new
    bytes first, a second copy. The buffer is ``numpy.empty``'s, not ``bytearray(length)``,
    which zeroes every byte before the copy writes it; every byte is written or the request
    is refused (400: the body ended early)."""
    view = np.empty(length, dtype=np.uint8).data
    content = request.content
    filled = 0
    while filled < length:
        if not content.is_eof() and not _buffered(content):
            direct = _direct(request, length - filled)
            if direct is not None:
                connection, transport, parser = direct
                receiver = _Receiver(connection, transport, view, filled, parser)
                transport.set_protocol(receiver)
                try:
                    await receiver.done
                except HttpError:
                    content.feed_eof()  # no more of it comes: answered, then closed at once
                    raise
                finally:
                    receiver.give_back(whole=False)  # cancelled (a timeout): as it was
                content.feed_eof()
                return view
        chunk, _ = await content.readchunk()
        if not chunk:
            raise HttpError(400, f"the body ended after {filled} of its {length} bytes")
        end = min(filled + len(chunk), length)
        view[filled:end] = chunk[: end - filled]
        filled = end
    return view
