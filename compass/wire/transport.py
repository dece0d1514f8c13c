"""The asyncio side of the wire: channels over TCP (optionally TLS), a server, and connect().

The only module of :mod:`compass.wire` that imports asyncio. It drives the sans-IO
:class:`~compass.wire.protocol.Connection` from an :class:`asyncio.BufferedProtocol`, so
received bytes land in the framer's buffers (a large payload straight in its own), and adds
what needs a loop: one waiter (future plus timer handle) per request, a tracked task per
incoming request, write flow control and the close paths.

Errors, as trio separates them: using a channel *you* closed raises :class:`ConnectionClosed`;
a channel the peer broke (or that broke the protocol) fails with :class:`ConnectionLost`; a
request with no answer in time raises :class:`CompassTimeout` and its late answer is dropped.
A peer that sends garbage, fails the handshake or exceeds a limit loses its connection, with
one WARNING line on the ``compass.wire`` logger; everyone else is served on.

Writes: the first write in a loop iteration goes out at once (lowest latency for a lone
request); later ones in the same iteration are gathered and written together at the start of
the next, so 64 pipelined answers cost one system call, not 64.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import ssl as _ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

from compass.config import Limits, Timeouts, parse_address
from compass.errors import (
    CompassError,
    CompassTimeout,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    UnknownOperation,
    WorkerUnavailable,
    error_from_wire,
)
from compass.wire.protocol import (
    Connection,
    ErrorResponse,
    HandshakeComplete,
    Notify,
    Request,
    Response,
)
from compass.wire.rpc import Immediate, exception_to_wire

__all__ = [
    "CANCEL_OP",
    "DEFAULT",
    "Channel",
    "CloseCallback",
    "Handler",
    "Immediate",
    "NotifyHandler",
    "Server",
    "connect",
    "install_event_loop_policy",
    "new_event_loop",
    "serve",
]

log = logging.getLogger("compass.wire")

#: the one-way message a requester sends when it stops waiting for an answer (its timeout
#: passed, or its caller was cancelled): the peer cancels the handler still working on it, so
#: abandoned work (a job nobody awaits) is dropped instead of running to the end
CANCEL_OP = "$cancel"

#: small writes held back within one loop iteration before they go out together; a few, not
#: all: the peer starts on the first ones while this side prepares the rest (measured on
#: loopback: 4-8 doubles pipelined throughput over writing each message; 32 loses half of it)
_HELD_WRITES = 6


Handler = Callable[["Channel", str, Any], "Awaitable[Any] | Immediate"]
NotifyHandler = Callable[["Channel", str, Any], None]
CloseCallback = Callable[["Channel", BaseException | None], None]


class _Default:
    """Type of :data:`DEFAULT`: "use the channel's configured timeout"."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()


def install_event_loop_policy() -> bool:
    """Make uvloop the event loop of this process if installed; returns whether it is."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop loop if uvloop is installed, else a new default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _consume_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _ChannelProtocol(asyncio.BufferedProtocol):
    """Forwards transport callbacks to its :class:`Channel`."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        # straight to the framer and the channel: called once per read
        self.get_buffer = channel._conn.decoder.get_buffer  # type: ignore[method-assign]
        self.buffer_updated = channel._buffer_updated  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.channel._connection_made(cast(asyncio.Transport, transport))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.channel._conn.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.channel._buffer_updated(nbytes)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel._connection_lost(exc)

    def pause_writing(self) -> None:
        self.channel._write_paused = True

    def resume_writing(self) -> None:
        self.channel._resume_writing()


class Channel:
    """One authenticated connection; both ends may send requests and notifies.

    Made by :func:`connect` or handed to :func:`serve`'s ``on_channel``; not built directly.
    """

    def __init__(
        self,
        conn: Connection,
        *,
        handler: Handler | None,
        notify_handler: NotifyHandler | None,
        timeouts: Timeouts,
    ) -> None:
        self.peer_name = ""
        self.peer_role = ""
        self.local_name = conn.name
        #: remote socket address
        self.peername: tuple[str, int] | None = None
        #: called once, when the channel ends: ``(channel, None)`` if closed by this side,
        #: ``(channel, ConnectionLost)`` otherwise
        self.on_close: list[CloseCallback] = []
        self._conn = conn
        self._decoder = conn.decoder
        self._loop = asyncio.get_running_loop()
        self._handler = handler
        self._notify_handler = notify_handler
        self._timeouts = timeouts
        self._transport: asyncio.Transport | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        # running request handlers by a serial of ours (peer ids may repeat), so a handler can
        # remove itself without looking up its task
        self._handler_tasks: dict[int, asyncio.Task[None]] = {}
        self._handler_serial = 0
        self._serial_of: dict[int, int] = {}  # peer's request id -> serial of its handler
        self._peer_cancelled: set[int] = set()  # serials the peer gave up on
        self._handshake: asyncio.Future[None] = self._loop.create_future()
        # an acceptor's handshake outcome has no awaiter; mark its exception as seen
        self._handshake.add_done_callback(_consume_exception)
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._ended: asyncio.Future[None] = self._loop.create_future()
        # set once the channel is unusable: (error class, message) for a fresh error per use
        self._failure: tuple[type[CompassError], str] | None = None
        self._closed_by_us = False
        self._refusing = False  # answer new requests with WorkerUnavailable (server closing)
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # small writes held back until the end of the loop iteration (see _write_out)
        self._pending: list[bytes | memoryview] = []
        self._flush_scheduled = False
        self._unstarted_handlers = 0
        self._reading = False
        # request timeouts: one timer for the earliest deadline, a heap of (deadline, id, op,
        # timeout) behind it; answered requests leave their entry to be dropped lazily
        self._deadlines: list[tuple[float, int, str, float]] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_timer_at = math.inf
        self._on_ready: Callable[[Channel], None] | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Channel {self.local_name!r} <-> {self.peer_name!r} {self.peername} {state}>"

    # -- public API -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the channel was closed by this side or lost."""
        return self._failure is not None

    async def request(
        self,
        op: str,
        body: Any = None,
        *,
        timeout: float | _Default | None = DEFAULT,
    ) -> Any:
        """Send request ``op`` and wait for its answer.

        ``timeout`` in seconds (``None``: wait forever; default: ``timeouts.request``). Raises
        :class:`CompassTimeout` when it passes, the peer's typed error when the handler
        failed, :class:`ConnectionLost` if the channel breaks meanwhile, and
        :class:`ConnectionClosed` if this side closed it.
        """
        if self._failure is not None:
            raise self._use_error()
        request_id = self._conn.send_request(op, body)
        self._write_out()
        future = self._loop.create_future()
        waiters = self._waiters
        waiters[request_id] = future
        seconds = self._timeouts.request if timeout is DEFAULT else cast("float | None", timeout)
        if seconds is not None:
            # one heap entry instead of a timer per request (see _on_deadline)
            deadline = self._loop.time() + seconds
            deadlines = self._deadlines
            if len(deadlines) > 2 * len(waiters) + 64:
                deadlines = self._prune_deadlines()
            heapq.heappush(deadlines, (deadline, request_id, op, seconds))
            if deadline < self._deadline_timer_at:
                self._arm_deadline_timer(deadline)
        try:
            return await future
        except asyncio.CancelledError:
            if request_id in waiters:  # no answer yet: the peer can stop working on it
                self._send_cancel(request_id)
            raise
        finally:
            waiters.pop(request_id, None)

    def _send_cancel(self, request_id: int) -> None:
        if self._failure is None:
            self._conn.send_notify(CANCEL_OP, request_id)
            self._write_out()

    def notify(self, op: str, body: Any = None) -> None:
        """Send one-way message ``op``; buffered, never blocks (see :meth:`drain`)."""
        if self._failure is not None:
            raise self._use_error()
        self._conn.send_notify(op, body)
        self._write_out()

    async def drain(self) -> None:
        """Wait while the write buffer is above ``limits.write_high_water``."""
        if self._failure is not None:
            raise self._use_error()
        self._flush_pending()
        if not self._write_paused:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    async def aclose(self) -> None:
        """Close the channel; idempotent.

        Pending requests fail with :class:`ConnectionClosed`; handlers still running for the
        peer are cancelled. Buffered writes are flushed (for at most ``timeouts.close``).
        """
        if self._failure is None:
            self._closed_by_us = True
            self._fail(ConnectionClosed, f"channel to {self._describe()} was closed by this side")
            transport = self._transport
            if transport is not None:
                # answers given inline in a batch being read are still in the connection
                self._pending.extend(self._conn.data_to_send())
                self._flush_pending()
                transport.close()
            elif not self._ended.done():
                self._ended.set_result(None)
        await self._closing_finished()

    async def _closing_finished(self) -> None:
        """Wait for a closing transport to end, for at most ``timeouts.close``."""
        try:
            await asyncio.wait_for(asyncio.shield(self._ended), self._timeouts.close)
        except TimeoutError:
            # the peer does not read what is left to flush; do not wait for it forever
            if self._transport is not None:
                self._transport.abort()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Wait until the channel has ended (closed or lost) and its handler tasks are done."""
        await asyncio.shield(self._ended)
        if self._handler_tasks:
            await asyncio.gather(*self._handler_tasks.values(), return_exceptions=True)

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- sending ----------------------------------------------------------------------------

    def _write_out(self) -> None:
        """Write what the connection queued, a few messages per system call.

        The first write of a loop iteration goes out at once, so a lone request waits for
        nothing. While other requests are in flight, later writes in the same iteration are
        held until :data:`_HELD_WRITES` pieces have gathered or the iteration ends; answers to
        a batch of requests read together are held until every handler of the batch has had
        its first step.
        """
        data = self._conn.data_to_send()
        if not data:
            return
        if self._reading:
            # answered inline while reading a batch of requests: one write when the batch ends
            self._pending.extend(data)
            return
        if self._unstarted_handlers or (
            self._flush_scheduled and len(self._pending) < _HELD_WRITES
        ):
            self._pending.extend(data)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._scheduled_flush)
            return
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if not self._flush_scheduled and len(self._waiters) + len(self._handler_tasks) > 1:
            # other requests are in flight, so more writes are likely in this iteration: hold
            # them until it is over (a lone request skips this bookkeeping)
            self._flush_scheduled = True
            self._loop.call_soon(self._scheduled_flush)
        if self._pending:
            data = self._pending + data
            self._pending = []
        if len(data) == 1:
            transport.write(data[0])
        else:
            transport.writelines(data)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self._flush_pending()

    def _flush_pending(self) -> None:
        pending = self._pending
        if pending:
            self._pending = []
            transport = self._transport
            if transport is not None and not transport.is_closing():
                if len(pending) == 1:
                    transport.write(pending[0])
                else:
                    transport.writelines(pending)

    def _resume_writing(self) -> None:
        self._write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _prune_deadlines(self) -> list[tuple[float, int, str, float]]:
        """Mostly answered requests in the heap: rebuild it from the pending ones.

        Runs when the heap is twice the size of the pending set, so amortised O(1) a request.
        """
        waiters = self._waiters
        deadlines = [entry for entry in self._deadlines if entry[1] in waiters]
        heapq.heapify(deadlines)
        self._deadlines = deadlines
        return deadlines

    def _arm_deadline_timer(self, when: float) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_timer = self._loop.call_at(when, self._on_deadline)
        self._deadline_timer_at = when

    def _on_deadline(self) -> None:
        self._deadline_timer, self._deadline_timer_at = None, math.inf
        # loop timers have millisecond resolution; do not re-arm for a sliver of time
        horizon = self._loop.time() + 0.001
        deadlines, waiters = self._deadlines, self._waiters
        while deadlines:
            deadline, request_id, op, timeout = deadlines[0]
            future = waiters.get(request_id)
            if future is not None and deadline > horizon:
                self._arm_deadline_timer(deadline)
                return
            heapq.heappop(deadlines)
            if future is not None:
                del waiters[request_id]
                if not future.done():
                    future.set_exception(
                        CompassTimeout(
                            f"request {op!r} to {self._describe()} got no answer within "
                            f"{timeout} s",
                            detail={"op": op, "timeout": timeout},
                        )
                    )
                self._send_cancel(request_id)

    # -- receiving --------------------------------------------------------------------------

    def _connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        high = self._conn.limits.write_high_water
        transport.set_write_buffer_limits(high=high, low=high // 4)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peername = (str(peer[0]), int(peer[1]))
        if self._conn.role == "initiator":
            transport.writelines(self._conn.initiate())
        else:
            self._handshake_timer = self._loop.call_later(
                self._timeouts.handshake, self._handshake_expired
            )

    def _buffer_updated(self, nbytes: int) -> None:
        conn = self._conn
        decoder = self._decoder
        decoder.buffer_updated(nbytes)
        if self._failure is not None:
            return  # bytes that raced with closing: nobody is left to act on them
        waiters = self._waiters
        self._reading = True
        try:
            while True:
                event = conn.next_event()
                kind = type(event)
                if kind is Response:
                    future = waiters.pop(event.id, None)  # type: ignore[union-attr]
                    if future is not None and not future.done():
                        future.set_result(event.body)  # type: ignore[union-attr]
                elif kind is Request:
                    self._start_handler(event)  # type: ignore[arg-type]
                elif kind is Notify:
                    self._dispatch_notify(event)  # type: ignore[arg-type]
                elif kind is ErrorResponse:
                    self._dispatch_error(event)  # type: ignore[arg-type]
                elif kind is HandshakeComplete:
                    self._handshake_complete(event)  # type: ignore[arg-type]
                else:
                    break
                if not decoder._write and decoder._payload is None:
                    # every received byte consumed (the framer rewinds an empty staging area
                    # to 0): no further frame, skip asking for one
                    break
        except CompassError as exc:
            self._peer_fault(exc)
        except Exception as exc:  # a bug here must not reach asyncio's fatal-error path
            log.exception("closing connection %s after an internal error", self._describe())
            self._peer_fault(exc)
        else:
            self._reading = False
            if not self._handshake.done():
                self._write_out()  # handshake replies
            else:
                # answers given inline during the batch stay queued in the connection
                data = conn.data_to_send()
                if data:
                    if self._pending:
                        self._pending.extend(data)
                    else:
                        self._pending = data
                if self._pending and not self._flush_scheduled:
                    self._flush_pending()
        finally:
            self._reading = False

    def _dispatch_error(self, event: ErrorResponse) -> None:
        future = self._waiters.pop(event.id, None)
        if future is not None and not future.done():
            future.set_exception(error_from_wire(event.code, event.message, event.detail))

    def _dispatch_notify(self, event: Notify) -> None:
        if event.op == CANCEL_OP:
            self._cancel_handler(event.body)
            return
        notify_handler = self._notify_handler
        if notify_handler is None:
            log.debug("dropping notify %r from %r: no notify handler", event.op, self.peer_name)
            return
        try:
            notify_handler(self, event.op, event.body)
        except Exception:
            log.exception("notify handler for %r from %r failed", event.op, self.peer_name)

    def _cancel_handler(self, request_id: Any) -> None:
        """The peer stopped waiting for ``request_id``: cancel its handler if still running."""
        serial = self._serial_of.get(request_id) if type(request_id) is int else None
        task = None if serial is None else self._handler_tasks.get(serial)
        if task is not None and serial is not None:
            self._peer_cancelled.add(serial)
            # on the next iteration: a handler started in this one has had its first step by
            # then, so its own clean-up (finally clauses, bookkeeping) runs when it is cancelled
            self._loop.call_soon(task.cancel)

    def _start_handler(self, event: Request) -> None:
        if self._handler is None or self._refusing:
            error: CompassError = (
                WorkerUnavailable(f"{self.local_name!r} is shutting down")
                if self._refusing
                else UnknownOperation(
                    f"{self.local_name!r} serves no requests (op {event.op!r})",
                    detail={"op": event.op},
                )
            )
            self._conn.send_error(event.id, *exception_to_wire(error))
            self._write_out()
            return
        try:
            outcome = self._handler(self, event.op, event.body)
        except Exception as exc:  # raised before any await: an unknown op, a bad body
            self._answer_error(event.id, event.op, exc)
            return
        if type(outcome) is Immediate:
            self._answer(event.id, event.op, outcome.value)
            return
        serial = self._handler_serial = self._handler_serial + 1
        self._handler_tasks[serial] = self._loop.create_task(
            self._run_handler(serial, event.id, event.op, cast(Awaitable[Any], outcome))
        )
        self._serial_of[event.id] = serial
        self._unstarted_handlers += 1

    async def _run_handler(
        self, serial: int, request_id: int, op: str, outcome: Awaitable[Any]
    ) -> None:
        self._unstarted_handlers -= 1
        try:
            result = await outcome
        except asyncio.CancelledError:
            # cancelled for the peer, which no longer waits: nothing to answer
            if self._failure is None and serial not in self._peer_cancelled:
                cancelled = WorkerUnavailable(
                    f"request {op!r} was cancelled: {self.local_name!r} is shutting down"
                )
                self._conn.send_error(request_id, *exception_to_wire(cancelled))
                self._write_out()
            raise
        except Exception as exc:
            self._answer_error(request_id, op, exc)
        else:
            self._answer(request_id, op, result)
        finally:
            self._handler_tasks.pop(serial, None)
            if self._serial_of.get(request_id) == serial:
                del self._serial_of[request_id]
            self._peer_cancelled.discard(serial)

    def _answer(self, request_id: int, op: str, result: Any) -> None:
        if self._failure is not None:
            return
        try:
            self._conn.send_response(request_id, result)
        except CompassError as exc:
            code, text, detail = exception_to_wire(exc)
            self._conn.send_error(
                request_id, code, f"the answer to {op!r} cannot be sent: {text}", detail
            )
        if not self._reading:
            # while reading a batch the answer stays queued in the connection, in order, and
            # goes out with the batch (see _buffer_updated)
            self._write_out()

    def _answer_error(self, request_id: int, op: str, exc: Exception) -> None:
        if self._failure is not None:
            return
        code, text, detail = exception_to_wire(
            exc, context=f"handling {op!r} on {self.local_name!r}"
        )
        self._conn.send_error(request_id, code, text, detail)
        self._write_out()

    def _handshake_complete(self, event: HandshakeComplete) -> None:
        self.peer_name, self.peer_role = event.peer_name, event.peer_role
        self._write_out()  # the acceptor's READY, before anything else is sent
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if not self._handshake.done():
            self._handshake.set_result(None)
        if self._on_ready is not None:
            self._on_ready(self)

    def _handshake_expired(self) -> None:
        if not self._handshake.done() and self._failure is None:
            self._peer_fault(
                CompassTimeout(f"handshake did not finish within {self._timeouts.handshake} s")
            )

    # -- ending -----------------------------------------------------------------------------

    def _peer_fault(self, exc: Exception) -> None:
        """The peer broke the protocol (or the handshake failed): drop its connection."""
        if self._failure is not None:
            return
        if self._conn.role == "acceptor" or self._handshake.done():
            log.warning("closing connection %s: %s", self._describe(), exc)
        if not self._handshake.done():
            self._handshake.set_exception(exc)
        self._fail(ConnectionLost, f"connection to {self._describe()} lost: {exc}")
        transport = self._transport
        if transport is not None:
            # the connection may owe the peer a REFUSE saying why; write it before closing
            self._flush_pending()
            for data in self._conn.data_to_send():
                transport.write(data)
            transport.close()

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._failure is None:
            reason = f": {exc}" if exc else ""
            self._fail(ConnectionLost, f"connection to {self._describe()} lost{reason}")
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if not self._handshake.done():
            self._handshake.set_exception(
                ConnectionLost(
                    f"{self._describe()} closed the connection during the handshake (not a "
                    "compass peer, or TLS on one side only?)"
                )
            )
        self._resume_writing()
        if not self._ended.done():
            self._ended.set_result(None)
        failure = None if self._closed_by_us else self._use_error()
        for callback in self.on_close:
            try:
                callback(self, failure)
            except Exception:
                log.exception("on_close callback of %r failed", self)

    def _fail(self, kind: type[CompassError], message: str) -> None:
        self._failure = (kind, message)
        waiters, self._waiters = self._waiters, {}
        for future in waiters.values():
            if not future.done():
                future.set_exception(kind(message))
        drains, self._drain_waiters = self._drain_waiters, []
        for waiter in drains:
            if not waiter.done():
                waiter.set_exception(kind(message))
        for task in self._handler_tasks.values():
            task.cancel()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadlines = []

    def _use_error(self) -> CompassError:
        assert self._failure is not None
        kind, message = self._failure
        return kind(message)

    def _describe(self) -> str:
        address = f"{self.peername[0]}:{self.peername[1]}" if self.peername else "?"
        return f"{self.peer_name!r} ({address})" if self.peer_name else address


async def connect(
    address: str | tuple[str, int],
    *,
    token: str | None,
    name: str,
    role: str = "client",
    limits: Limits = Limits(),
    timeouts: Timeouts = Timeouts(),
    handler: Handler | None = None,
    notify_handler: NotifyHandler | None = None,
    ssl: _ssl.SSLContext | None = None,
) -> Channel:
    """Open an authenticated channel to ``address`` (``"host:port"`` or ``(host, port)``).

    Raises :class:`ConnectFailed` if the address cannot be reached, the handshake's
    :class:`AuthenticationError` / :class:`VersionMismatch`, or :class:`CompassTimeout` if the
    handshake takes longer than ``timeouts.handshake``.
    """
    host, port = parse_address(address) if isinstance(address, str) else address
    loop = asyncio.get_running_loop()
    conn = Connection("initiator", token=token, name=name, peer_kind=role, limits=limits)
    channel = Channel(conn, handler=handler, notify_handler=notify_handler, timeouts=timeouts)
    try:
        async with asyncio.timeout(timeouts.connect):
            await loop.create_connection(lambda: _ChannelProtocol(channel), host, port, ssl=ssl)
    except TimeoutError as exc:
        raise ConnectFailed(
            f"could not connect to {host}:{port}: no answer within {timeouts.connect} s"
        ) from exc
    except OSError as exc:
        raise ConnectFailed(f"could not connect to {host}:{port}: {exc}") from exc
    try:
        async with asyncio.timeout(timeouts.handshake):
            await asyncio.shield(channel._handshake)
    except TimeoutError:
        await channel.aclose()
        raise CompassTimeout(
            f"handshake with {host}:{port} did not finish within {timeouts.handshake} s"
        ) from None
    except BaseException:
        if channel.closed:
            # failed handshake: the transport is already closing after telling the peer why
            await channel._closing_finished()
        elif channel._transport is not None:
            channel._transport.abort()
        raise
    return channel


class Server:
    """A listening socket whose connections become channels. Made by :func:`serve`."""

    def __init__(self, timeouts: Timeouts) -> None:
        #: the bound address (port resolved when 0 was asked for)
        self.address: tuple[str, int] = ("", 0)
        #: authenticated channels currently open
        self.channels: set[Channel] = set()
        self._timeouts = timeouts
        self._server: asyncio.Server | None = None
        self._accepted: set[Channel] = set()  # every live channel, handshake done or not
        self._closing = False

    def __repr__(self) -> str:
        return f"<Server {self.address[0]}:{self.address[1]} channels={len(self.channels)}>"

    async def aclose(self) -> None:
        """Stop accepting; let running request handlers finish (up to ``timeouts.close``,
        then cancel them, which answers their callers with :class:`WorkerUnavailable`); close
        every channel. Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        channels = list(self._accepted)
        for channel in channels:
            channel._refusing = True
        tasks = [task for channel in channels for task in channel._handler_tasks.values()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self._timeouts.close)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await asyncio.gather(*(channel.aclose() for channel in channels))
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def serve(
    host: str,
    port: int,
    *,
    token: str | None,
    name: str,
    role: str = "worker",
    handler: Handler,
    notify_handler: NotifyHandler | None = None,
    on_channel: Callable[[Channel], None] | None = None,
    limits: Limits = Limits(),
    timeouts: Timeouts = Timeouts(),
    ssl: _ssl.SSLContext | None = None,
) -> Server:
    """Listen on ``host:port`` (0: any free port, see ``Server.address``).

    Each connection is authenticated first; ``on_channel`` is called with the channel once
    its handshake is complete. Requests run ``handler`` in a task of their own; notifies run
    ``notify_handler`` inline, in order of arrival.
    """
    # validates role and name now rather than on the first connection
    Connection("acceptor", token=token, name=name, peer_kind=role, limits=limits)
    server = Server(timeouts)

    def channel_ready(channel: Channel) -> None:
        server.channels.add(channel)
        if on_channel is not None:
            try:
                on_channel(channel)
            except Exception:
                log.exception("on_channel callback failed for %r", channel)

    def channel_ended(channel: Channel, _: BaseException | None) -> None:
        server.channels.discard(channel)
        server._accepted.discard(channel)

    def accept() -> _ChannelProtocol:
        conn = Connection("acceptor", token=token, name=name, peer_kind=role, limits=limits)
        channel = Channel(conn, handler=handler, notify_handler=notify_handler, timeouts=timeouts)
        channel._on_ready = channel_ready
        channel.on_close.append(channel_ended)
        if server._closing:
            channel._refusing = True
        server._accepted.add(channel)
        return _ChannelProtocol(channel)

    loop = asyncio.get_running_loop()
    try:
        listener = await loop.create_server(accept, host, port, ssl=ssl)
    except OSError as exc:
        raise ConnectFailed(f"could not listen on {host}:{port}: {exc}") from exc
    server._server = listener
    bound = listener.sockets[0].getsockname()
    server.address = (str(bound[0]), int(bound[1]))
    return server
