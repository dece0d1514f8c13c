"""Streams on a channel, the asyncio side: items in order, with credit-based flow control.

The reading side::

    async with channel.stream("count", 100, window=16) as items:
        async for item in items:
            ...                       # leaving the block early cancels the producer
    items.result                      # the final body (None unless the producer gave one)

The serving side registers an async generator (:meth:`Router.stream
<compass.wire.rpc.Router.stream>`); the channel sends each item when it is produced and
resumes the generator only while the reader has credit, so a slow reader holds the producer
after ``window`` items (backpressure, not buffering), and a reader that never grants credit
costs the producing side at most its window. The producer also waits while the channel's
write buffer is over its high-water mark. Frames and windows are :mod:`compass.wire.flow`.

How a stream ends, seen by the reader: the producer's generator ends (``StopAsyncIteration``,
:attr:`ItemStream.result` is the final body, ``None`` unless it yielded a
:class:`~compass.wire.handlers.StreamResult`); it raised (the same :class:`CompassError`
subclass, or :class:`RemoteError`); the channel broke (:class:`ConnectionLost`, after the
items that had arrived: never a silent end, never an item twice); this side closed the
channel (:class:`ConnectionClosed`). Leaving early (``aclose``, the ``async with`` block, or
the task awaiting an item being cancelled) sends ``$cancel`` as for a request: the producer's
generator is closed at its next ``yield`` (its ``finally`` runs) and the producer ends the
stream, which frees the reader's window. A producer whose channel is lost is cancelled and
its generator closed likewise. Producers run as the channel's request handlers do (counted
in ``in_flight``, waited for by ``wait_closed``, cancelled by ``finish_handlers``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from compass.errors import (
    CompassError,
    ProtocolError,
    UnknownOperation,
    WorkerUnavailable,
    error_from_wire,
)
from compass.wire.flow import (
    StreamCredit,
    StreamEnd,
    StreamFailed,
    StreamItem,
    StreamOpen,
)
from compass.wire.handlers import Streamed, StreamResult, exception_to_wire
from compass.wire.protocol import Connection
from compass.wire.writes import WriteBatcher

__all__ = [
    "DEFAULT_WINDOW",
    "MAX_PRODUCING",
    "ItemStream",
    "StreamEvent",
    "StreamHost",
    "StreamSide",
    "open_stream",
    "stream_event",
]

log = logging.getLogger("compass.wire")

#: items a reader lets the producer send ahead when it names no window
DEFAULT_WINDOW = 16
#: streams a peer may have open on one channel at once, served here; one more is refused
#: with :class:`WorkerUnavailable` (so a reader costs at most this many windows)
MAX_PRODUCING = 1024

#: items a producer sends in one write at most (when it makes them faster than the loop turns)
_FLUSH_EVERY = 16

StreamEvent = StreamOpen | StreamItem | StreamEnd | StreamFailed | StreamCredit

_OPEN, _ENDED, _FAILED, _LEFT = 0, 1, 2, 3


class StreamHost(Protocol):
    """What streams use of their channel: :class:`compass.wire.channel.Channel`, which calls
    into this module (so it is described here, not imported). Its request handlers, their
    task table and cancellation are shared with the producers."""

    local_name: str
    last_active: float
    _streams: StreamSide | None
    _handler_serial: int

    @property
    def _conn(self) -> Connection: ...
    @property
    def _loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def _writes(self) -> WriteBatcher: ...
    @property
    def _failure(self) -> tuple[type[CompassError], str] | None: ...
    @property
    def _handler(self) -> Callable[[Any, str, Any], Any] | None: ...
    @property
    def _refusing(self) -> bool: ...
    @property
    def _write_paused(self) -> bool: ...
    @property
    def _handler_tasks(self) -> dict[int, asyncio.Future[Any]]: ...
    @property
    def _serial_of(self) -> dict[int, int]: ...
    @property
    def _peer_cancelled(self) -> set[int]: ...
    @property
    def _write_out(self) -> Callable[[], None]: ...
    def _send_cancel(self, request_id: int) -> None: ...
    def _use_error(self) -> CompassError: ...
    async def drain(self) -> None: ...


class ItemStream:
    """The items of one stream this side opened (:meth:`Channel.stream
    <compass.wire.channel.Channel.stream>`), in order: an async iterator and an async context
    manager. It holds at most ``window`` items not yet taken, and grants the producer more
    credit for the items taken when the next is asked for (half a window at a time)."""

    __slots__ = (
        "_channel",
        "_consumed",
        "_error",
        "_grant_at",
        "_items",
        "_state",
        "_waiter",
        "id",
        "op",
        "result",
        "window",
    )

    def __init__(self, channel: StreamHost, stream_id: int, op: str, window: int) -> None:
        self._channel = channel
        #: the stream's id (the request id of its OPEN)
        self.id = stream_id
        self.op = op
        self.window = window
        #: the final body, once the stream has ended (``None`` until then, and by default)
        self.result: Any = None
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._state = _OPEN
        self._error: CompassError | None = None
        self._consumed = 0  # items taken since credit was last granted
        self._grant_at = max(1, window // 2)

    def __repr__(self) -> str:
        state = ("open", "ended", "failed", "left")[self._state]
        return f"<ItemStream {self.op!r} #{self.id} {state}, {len(self._items)} buffered>"

    @property
    def buffered(self) -> int:
        """Items received and not yet taken (at most ``window``)."""
        return len(self._items)

    def __aiter__(self) -> ItemStream:
        return self

    async def __anext__(self) -> Any:
        if self._consumed >= self._grant_at and self._state == _OPEN:
            # the items taken before are done with: credit for them now, not as they were
            # handed out (a reader busy with an item holds the producer back by one more)
            self._grant()
        items = self._items
        if not items:
            if self._state != _OPEN:
                self._stop()
            waiter = self._waiter = self._channel._loop.create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                self._leave()
                raise
            finally:
                self._waiter = None
            if not items:
                self._stop()
        self._consumed += 1
        return items.popleft()

    def _stop(self) -> None:
        """Nothing left to take: end the iteration the way the stream ended."""
        if self._error is not None:
            raise self._error
        raise StopAsyncIteration

    def _grant(self) -> None:
        channel = self._channel
        if channel._failure is None:
            channel._conn.send_credit(self.id, self._consumed)
            channel._write_out()
        self._consumed = 0

    async def __aenter__(self) -> ItemStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop reading: a stream still open is cancelled at the producer; idempotent."""
        self._leave()

    def _leave(self) -> None:
        if self._state != _OPEN:
            return
        self._state = _LEFT
        self._items.clear()
        # the stream stays known (its window counted) until the producer's END or FAIL
        self._channel._send_cancel(self.id)

    # -- from the channel -----------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _item(self, body: Any) -> None:
        if self._state == _OPEN:
            self._items.append(body)
            self._wake()

    def _end(self, body: Any) -> None:
        if self._state == _OPEN:
            self._state, self.result = _ENDED, body
            self._wake()

    def _fail(self, error: CompassError) -> None:
        if self._state == _OPEN:
            self._state, self._error = _FAILED, error
            self._wake()


class StreamSide:
    """A channel's streams: those it reads, and the credit waits of those it produces."""

    __slots__ = ("credit_waiters", "readers")

    def __init__(self) -> None:
        self.readers: dict[int, ItemStream] = {}
        self.credit_waiters: dict[int, asyncio.Future[None]] = {}

    def fail(self, error: type[CompassError], message: str) -> None:
        """The channel ended: every stream read here fails with ``error(message)``."""
        readers, self.readers = self.readers, {}
        for reader in readers.values():
            reader._fail(error(message))


def _side(channel: StreamHost) -> StreamSide:
    side = channel._streams
    if side is None:
        side = channel._streams = StreamSide()
    return side


def open_stream(channel: StreamHost, op: str, body: Any, window: int) -> ItemStream:
    """Open stream ``op`` on ``channel`` (see :meth:`Channel.stream
    <compass.wire.channel.Channel.stream>`)."""
    if channel._failure is not None:
        raise channel._use_error()
    stream_id = channel._conn.send_stream_open(op, body, window)
    channel._write_out()
    channel.last_active = channel._loop.time()
    reader = _side(channel).readers[stream_id] = ItemStream(channel, stream_id, op, window)
    return reader


def stream_event(channel: StreamHost, event: StreamEvent) -> None:
    """Deliver a stream frame the channel read (the connection has checked its window)."""
    side = _side(channel)
    kind = type(event)
    if kind is StreamItem:
        reader = side.readers.get(event.id)
        if reader is not None:
            reader._item(event.body)  # type: ignore[union-attr]
    elif kind is StreamCredit:
        waiter = side.credit_waiters.pop(event.id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
    elif kind is StreamEnd:
        reader = side.readers.pop(event.id, None)
        if reader is not None:
            reader._end(event.body)  # type: ignore[union-attr]
    elif kind is StreamFailed:
        reader = side.readers.pop(event.id, None)
        if reader is not None:
            failed: StreamFailed = event  # type: ignore[assignment]
            reader._fail(error_from_wire(failed.code, failed.message, failed.detail))
    elif kind is StreamOpen:
        _start_producer(channel, side, event)  # type: ignore[arg-type]


def _refuse(channel: StreamHost, stream_id: int, exc: BaseException, op: str) -> None:
    where = f"streaming {op!r} on {channel.local_name!r}"
    code, text, detail = exception_to_wire(exc, context=where)
    channel._conn.send_stream_error(stream_id, code, text, detail)
    channel._write_out()


def _start_producer(channel: StreamHost, side: StreamSide, event: StreamOpen) -> None:
    handler = channel._handler
    name, op = channel.local_name, event.op
    if handler is None:
        refusal: CompassError | None = UnknownOperation(
            f"{name!r} serves no streams (op {op!r})", detail={"op": op}
        )
    elif channel._refusing:
        refusal = WorkerUnavailable(f"{name!r} is shutting down")
    elif channel._conn.streams.producing > MAX_PRODUCING:
        refusal = WorkerUnavailable(f"{name!r} already serves {MAX_PRODUCING} streams to this peer")
    else:
        refusal = None
    if refusal is not None or handler is None:
        _refuse(channel, event.id, refusal or UnknownOperation(op), op)
        return
    try:
        outcome = handler(channel, event.op, event.body)
    except Exception as exc:  # an unknown op, a bad body
        _refuse(channel, event.id, exc, event.op)
        return
    if type(outcome) is not Streamed:
        close = getattr(outcome, "close", None)  # an un-awaited coroutine: no warning
        if close is not None:
            close()
        refusal = UnknownOperation(
            f"{op!r} on {name!r} is a request, not a stream: call it with Channel.request",
            detail={"op": op},
        )
        _refuse(channel, event.id, refusal, op)
        return
    serial = channel._handler_serial = channel._handler_serial + 1
    task = channel._loop.create_task(
        _produce(channel, side, serial, event.id, event.op, outcome.items)
    )
    channel._handler_tasks[serial] = task
    channel._serial_of[event.id] = serial


async def _produce(
    channel: StreamHost,
    side: StreamSide,
    serial: int,
    stream_id: int,
    op: str,
    items: AsyncIterator[Any],
) -> None:
    """Send ``items`` as credit allows; end the stream the way they end."""
    conn = channel._conn
    windows = conn.streams
    writes = channel._writes
    loop = channel._loop
    sent = 0
    try:
        while True:
            if windows.credit(stream_id) <= 0:
                # the reader's window is full: the generator is not resumed until it grants
                waiter = side.credit_waiters[stream_id] = loop.create_future()
                await waiter
                continue
            if channel._write_paused:
                await channel.drain()
                continue
            item = await items.__anext__()
            if channel._failure is not None:
                raise channel._use_error()
            if type(item) is StreamResult:
                conn.send_stream_end(stream_id, item.value)
                channel._write_out()
                return
            try:
                conn.send_stream_item(stream_id, item)
            except CompassError as exc:  # too large, or not encodable
                raise ProtocolError(f"item {sent} of stream {op!r} cannot be sent: {exc}") from None
            sent += 1
            # the first item of a pass of the loop goes out at once, the next ones together at
            # its end (one system call, not one each), or when the window is used up, or every
            # few items
            writes.write_gathered()
            if sent % _FLUSH_EVERY == 0 or windows.credit(stream_id) == 0:
                writes.flush()
    except StopAsyncIteration:
        if channel._failure is None:
            conn.send_stream_end(stream_id, None)
            channel._write_out()
    except asyncio.CancelledError:
        if channel._failure is None:
            if serial in channel._peer_cancelled:
                conn.send_stream_end(stream_id, None)  # the reader left: free its window
                channel._write_out()
            else:
                closing = f"stream {op!r} was cancelled: {channel.local_name!r} is shutting down"
                _refuse(channel, stream_id, WorkerUnavailable(closing), op)
        raise
    except Exception as exc:
        if channel._failure is None:
            _refuse(channel, stream_id, exc, op)
    finally:
        side.credit_waiters.pop(stream_id, None)
        windows.finished(stream_id)
        channel._handler_tasks.pop(serial, None)
        if channel._serial_of.get(stream_id) == serial:
            del channel._serial_of[stream_id]
        channel._peer_cancelled.discard(serial)
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                log.exception("%r: closing stream %r failed", channel.local_name, op)
