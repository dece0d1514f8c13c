"""A channel: one authenticated connection, driven by asyncio, that both ends use alike.

It drives the sans-IO :class:`~compass.wire.protocol.Connection` from an
:class:`asyncio.BufferedProtocol`, so received bytes land in the framer's buffers (a large
payload straight in its own), and adds what needs a loop: one waiter per request with a single
timer for the earliest deadline, a tracked task per incoming request, cancellation both ways,
write flow control and the close paths. Write batching is :class:`~.writes.WriteBatcher`'s.

Errors, as trio separates them: using a channel *you* closed raises :class:`ConnectionClosed`;
a channel the peer broke (or that broke the protocol) fails with :class:`ConnectionLost`; a
request with no answer in time raises :class:`CompassTimeout` and its late answer is dropped.
A peer that sends garbage, fails the handshake or exceeds a limit loses its connection, with
one WARNING line on the ``compass.wire`` logger, after being told why (an ERROR for its request
and a REFUSE, see :mod:`~compass.wire.protocol`); everyone else is served on.

Write back-pressure. While the transport's write buffer is above ``limits.write_high_water``
(until it drains below a quarter of it), requests the peer sends are not started but queued;
past :data:`MAX_DEFERRED` of them, the channel stops reading from the peer until the buffer
drains. A peer that asks and never reads the answers is thus held to a bounded amount of this
side's memory. Everything else (answers to our requests, notifies) is read on: those never add
to what this side writes on the channel, and two peers pushing bulk notifies at each other
while both are over the mark must keep reading each other, or neither buffer would ever drain.

Admission at the loop's pace. At most :data:`MAX_STARTS_PER_PASS` requests are started in one
pass of the event loop; the rest are queued the same way and started on the next passes, and
past :data:`MAX_DEFERRED` queued the channel stops reading. A burst (a client submitting 2,000
jobs at once) is thus taken in at the pace the loop can plan it, waiting in the socket rather
than in memory, while the loop goes on serving everything else between passes: a worker whose
loop spent a second starting 2,000 handlers in one pass answered no probe meanwhile, and its
peers declared it dead.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final, cast

from compass.config import Timeouts
from compass.errors import (
    CompassError,
    CompassTimeout,
    ConnectionClosed,
    ConnectionLost,
    UnknownOperation,
    WorkerUnavailable,
    error_from_wire,
)
from compass.supervisor import log_failures
from compass.wire.adapter import ChannelProtocol
from compass.wire.handlers import Immediate, Later, exception_to_wire
from compass.wire.protocol import (
    Connection,
    ErrorResponse,
    HandshakeComplete,
    Notify,
    Request,
    Response,
)
from compass.wire.streams import ItemStream, StreamSide, open_stream, stream_event
from compass.wire.writes import WriteBatcher

__all__ = [
    "CANCEL_OP",
    "DEFAULT",
    "MAX_DEFERRED",
    "Channel",
    "CloseCallback",
    "Handler",
    "NotifyHandler",
]

log = logging.getLogger("compass.wire")

#: ``handler(channel, op, body)``: an awaitable of the answer (run in a task of its own), or an
#: :class:`Immediate`, or a :class:`Later` (a future the answer will be); raising before any
#: await answers with that error
Handler = Callable[["Channel", str, Any], "Awaitable[Any] | Immediate | Later"]
#: ``notify_handler(channel, op, body)``: runs inline, in order of arrival
NotifyHandler = Callable[["Channel", str, Any], None]
#: ``callback(channel, None)`` when this side closed the channel, else ``(channel, ConnectionLost)``
CloseCallback = Callable[["Channel", BaseException | None], None]

#: the one-way message a requester sends when it stops waiting for an answer (its timeout
#: passed, or its caller was cancelled): the peer cancels the handler still working on it, so
#: abandoned work (a job nobody awaits) is dropped instead of running to the end
CANCEL_OP = "$cancel"

#: requests queued, not started, while the write buffer is over its high-water mark; one more
#: and the channel stops reading from the peer until the buffer drains
MAX_DEFERRED = 32
#: requests started in one pass of the event loop; more wait for the next pass (queued as
#: above), so that one pass stays short whatever a peer sends at once
MAX_STARTS_PER_PASS = 32
#: requests started while reading one batch before what they answered goes to the transport
#: (so that its flow control sees it): many answers held for one write would bypass it
_SPILL_EVERY = 32
#: bytes a faulty peer may still send, discarded, after being told why it is dropped
LINGER_BYTES = 64 << 20


class _Default:
    """Type of :data:`DEFAULT`: "use the channel's configured timeout"."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()


def _consume_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Channel:
    """One authenticated connection; both ends may send requests and notifies.

    Made by :func:`~compass.wire.tcp.connect` or handed to :func:`~compass.wire.tcp.serve`'s
    ``on_channel``; not built directly. ``on_ready`` is called once the handshake completes.
    """

    def __init__(
        self,
        conn: Connection,
        *,
        handler: Handler | None,
        notify_handler: NotifyHandler | None,
        timeouts: Timeouts,
        on_ready: Callable[[Channel], None] | None = None,
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
        #: requests being answered: a handler's task, or the future a :class:`Later` answer
        #: waits for
        self._handler_tasks: dict[int, asyncio.Future[Any]] = {}
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
        # requests not started while writing is paused, and whether reading is paused for them
        self._deferred: deque[Request] = deque()
        self._reading_paused = False
        # requests started in this pass of the loop, and whether the next pass is called to
        # start those deferred meanwhile (see MAX_STARTS_PER_PASS)
        self._starts = 0
        self._next_pass: asyncio.Handle | None = None
        self._rejection: CompassError | None = None  # refused by the server before its handshake
        self._streams: StreamSide | None = None  # streams either way, made by the first

        self._writes = WriteBatcher(self._loop, conn.data_to_send, self._in_flight)
        # bound once: called for every message sent
        self._write_out = self._writes.write_out
        # request timeouts: one timer for the earliest deadline, a heap of (deadline, id, op,
        # timeout) behind it; answered requests leave their entry to be dropped lazily
        self._deadlines: list[tuple[float, int, str, float]] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_timer_at = math.inf
        self._on_ready = on_ready
        #: when a message last went either way (the loop's clock): who pools channels closes
        #: the idle ones by it
        self.last_active = self._loop.time()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Channel {self.local_name!r} <-> {self.peer_name!r} {self.peername} {state}>"

    # -- public API -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the channel was closed by this side or lost."""
        return self._failure is not None

    @property
    def in_flight(self) -> int:
        """Requests under way either way: this side's awaiting an answer, and the peer's
        being handled here."""
        return len(self._waiters) + len(self._handler_tasks)

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
        self.last_active = self._loop.time()
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
            # an error raised here holds this frame in its traceback, and the future holds the
            # error: without this the pair (and the request's body) waits for the cyclic
            # collector, which a large heap runs seldom
            del future

    def _send_cancel(self, request_id: int) -> None:
        if self._failure is None:
            self._conn.send_notify(CANCEL_OP, request_id)
            self._write_out()

    def stream(self, op: str, body: Any = None, *, window: int = 16) -> ItemStream:
        """Open stream ``op`` at the peer: its items in order, ``window`` at most ahead of the
        reader (an async iterator and context manager; see :mod:`compass.wire.streams`)."""
        return open_stream(self, op, body, window)

    def notify(self, op: str, body: Any = None) -> None:
        """Send one-way message ``op``; buffered, never blocks (see :meth:`drain`)."""
        if self._failure is not None:
            raise self._use_error()
        self._conn.send_notify(op, body)
        self._write_out()
        self.last_active = self._loop.time()

    async def drain(self) -> None:
        """Wait while the write buffer is above ``limits.write_high_water``."""
        if self._failure is not None:
            raise self._use_error()
        self._writes.flush()
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
            # answers given inline in a batch being read are still in the connection
            if not self._writes.close() and not self._ended.done():
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
            await self._handlers_ended(list(self._handler_tasks.values()))

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- for serve() and connect() ----------------------------------------------------------

    def protocol(self) -> asyncio.BufferedProtocol:
        """A new asyncio protocol feeding this channel (a ``create_connection`` factory)."""
        return ChannelProtocol(self)

    async def handshake_done(self) -> None:
        """Wait until the handshake has completed; raises why it failed."""
        await asyncio.shield(self._handshake)

    def abort(self) -> None:
        """Drop the connection now, without flushing; the channel then fails as lost."""
        if self._transport is not None:
            self._transport.abort()

    def reject(self, error: CompassError) -> None:
        """Refuse this connection before its handshake: the peer gets a REFUSE with ``error``'s
        code and message, then the connection closes (see :class:`~compass.wire.tcp.Server`)."""
        if self._failure is not None:
            return
        if self._transport is None:
            self._rejection = error  # not connected yet: refused in _connection_made
            return
        self._conn.refuse(error)
        if not self._handshake.done():
            self._handshake.set_exception(error)
        self._fail(ConnectionLost, f"connection from {self._describe()} refused: {error}")
        self._writes.close()

    def refuse_requests(self) -> None:
        """Answer requests that arrive from now on with :class:`WorkerUnavailable`."""
        self._refusing = True

    async def finish_handlers(self, timeout: float) -> None:
        """Let running request handlers finish for up to ``timeout`` seconds, then cancel the
        rest, which answers their callers with :class:`WorkerUnavailable`."""
        tasks = list(self._handler_tasks.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            await self._handlers_ended(tasks)

    async def _handlers_ended(self, tasks: list[asyncio.Future[Any]]) -> None:
        """Wait for request handler ``tasks`` to end. A handler answers its own errors, so
        one that ends in an error (not a cancellation) failed answering: it is logged. (A
        :class:`Later` answer's future ends in the request's own error, answered already.)"""
        results = await asyncio.gather(*tasks, return_exceptions=True)
        handlers = [(r, t.get_name()) for r, t in zip(results, tasks, strict=True)
                    if isinstance(t, asyncio.Task)]  # fmt: skip
        log_failures([r for r, _ in handlers], log, f"{self.local_name!r}: a request handler on "
                     f"the channel to {self._describe()}", [n for _, n in handlers])  # fmt: skip

    # -- sending ----------------------------------------------------------------------------

    def _in_flight(self) -> int:
        return len(self._waiters) + len(self._handler_tasks)

    def _resume_writing(self) -> None:
        self._write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._admit()

    def _pass_over(self) -> None:
        """A new pass of the loop: start what waited for it."""
        self._next_pass = None
        self._starts = 0
        self._admit()

    def _admit(self) -> None:
        """Start deferred requests while writing is not paused and this pass may start more;
        read on once none waits."""
        if self._failure is not None:
            self._deferred.clear()
            return
        deferred = self._deferred
        while deferred and not self._write_paused and self._starts < MAX_STARTS_PER_PASS:
            self._start_handler(deferred.popleft())
            self._count_start()
        if self._reading_paused and not deferred and not self._write_paused:
            self._reading_paused = False
            if self._transport is not None:
                self._transport.resume_reading()
            self._buffer_updated(0)  # frames that arrived before reading paused

    def _count_start(self) -> None:
        """One more request started in this pass: the first calls the next pass, which
        counts again from zero and starts what was deferred meanwhile."""
        self._starts += 1
        if self._next_pass is None:
            self._next_pass = self._loop.call_soon(self._pass_over)

    def _defer(self, event: Request) -> None:
        """Writing is paused, or this pass started its share: queue ``event``; stop reading
        once the queue is full."""
        self._deferred.append(event)
        if len(self._deferred) >= MAX_DEFERRED and not self._reading_paused:
            self._reading_paused = True
            if self._transport is not None:
                self._transport.pause_reading()

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
        self._writes.attach(transport)
        high = self._conn.limits.write_high_water
        transport.set_write_buffer_limits(high=high, low=high // 4)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peername = (str(peer[0]), int(peer[1]))
        if self._rejection is not None:
            self.reject(self._rejection)
            return
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
            # bytes that raced with closing, or a dropped peer still sending: discarded
            decoder.drop_received()
            if decoder.discarded > LINGER_BYTES and self._transport is not None:
                self._transport.abort()
            return
        if self._reading_paused:
            return  # the rest is read when writing resumes (see _resume_writing)
        self.last_active = self._loop.time()
        waiters = self._waiters
        writes = self._writes
        writes.start_batch()
        started = 0
        try:
            while True:
                event = conn.next_event()
                kind = type(event)
                if kind is Response:
                    future = waiters.pop(event.id, None)  # type: ignore[union-attr]
                    if future is not None and not future.done():
                        future.set_result(event.body)  # type: ignore[union-attr]
                elif kind is Request:
                    if self._write_paused or self._starts >= MAX_STARTS_PER_PASS:
                        self._defer(event)  # type: ignore[arg-type]
                        if self._reading_paused:
                            break
                    else:
                        self._start_handler(event)  # type: ignore[arg-type]
                        self._count_start()
                        started += 1
                        if started == _SPILL_EVERY:
                            started = 0
                            writes.spill()
                elif kind is Notify:
                    self._dispatch_notify(event)  # type: ignore[arg-type]
                elif kind is ErrorResponse:
                    self._dispatch_error(event)  # type: ignore[arg-type]
                elif kind is HandshakeComplete:
                    self._handshake_complete(event)  # type: ignore[arg-type]
                elif event is None:
                    break
                else:
                    stream_event(self, event)  # type: ignore[arg-type]
                if decoder.drained:
                    break  # every received byte consumed: no further frame, skip asking
        except CompassError as exc:
            writes.end_batch(flush=False)
            self._peer_fault(exc)
        except Exception as exc:  # a bug here must not reach asyncio's fatal-error path
            writes.end_batch(flush=False)
            log.exception("closing connection %s after an internal error", self._describe())
            self._peer_fault(exc)
        else:
            # handshake replies, and answers given inline during the batch, in one write
            writes.end_batch(flush=True)

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
        except CompassError as exc:  # the handler refused the message (a malformed body)
            log.warning("dropped notify %r from %r: %s", event.op, self.peer_name, exc)
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
        self._serial_of[event.id] = serial
        if type(outcome) is Later:  # answered from its future's done callback: no task
            future = self._handler_tasks[serial] = outcome.future
            future.add_done_callback(partial(self._answer_later, serial, event.id, event.op))
            return
        self._handler_tasks[serial] = self._loop.create_task(
            self._run_handler(serial, event.id, event.op, cast(Awaitable[Any], outcome))
        )
        self._writes.hold()

    async def _run_handler(
        self, serial: int, request_id: int, op: str, outcome: Awaitable[Any]
    ) -> None:
        self._writes.release()
        try:
            result = await outcome
        except asyncio.CancelledError:
            self._handler_cancelled(serial, request_id, op)
            raise
        except Exception as exc:
            self._answer_error(request_id, op, exc)
        else:
            self._answer_checked(request_id, op, result)
        finally:
            self._handler_ended(serial, request_id)

    def _answer_later(
        self, serial: int, request_id: int, op: str, future: asyncio.Future[Any]
    ) -> None:
        """A :class:`Later` answer's ``future`` is done: answered as by :meth:`_run_handler`."""
        if future.cancelled():
            self._handler_cancelled(serial, request_id, op)
        elif (error := future.exception()) is not None:
            bug = error if isinstance(error, Exception) else RuntimeError(repr(error))
            self._answer_error(request_id, op, bug)
        else:
            self._answer_checked(request_id, op, future.result())
        self._handler_ended(serial, request_id)

    def _handler_cancelled(self, serial: int, request_id: int, op: str) -> None:
        """Cancelled for the peer (it no longer waits), or as this side shuts down: say so."""
        if self._failure is None and serial not in self._peer_cancelled:
            cancelled = WorkerUnavailable(
                f"request {op!r} was cancelled: {self.local_name!r} is shutting down"
            )
            self._conn.send_error(request_id, *exception_to_wire(cancelled))
            self._write_out()

    def _handler_ended(self, serial: int, request_id: int) -> None:
        self._handler_tasks.pop(serial, None)
        if self._serial_of.get(request_id) == serial:
            del self._serial_of[request_id]
        self._peer_cancelled.discard(serial)

    def _answer_checked(self, request_id: int, op: str, result: Any) -> None:
        try:
            self._answer(request_id, op, result)
        except Exception as exc:  # a bug: logged, and the caller told rather than left waiting
            log.exception("%r: answering %r from %s failed", self.local_name, op,
                          self._describe())  # fmt: skip
            self._answer_error(request_id, op, exc)

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
        if not self._writes.reading:
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
        # kept by the handshake future and the connection: the traceback's frames would tie
        # this channel into reference cycles that only the cycle collector frees
        exc.__traceback__ = None
        if self._conn.role == "acceptor" or self._handshake.done():
            log.warning("closing connection %s: %s", self._describe(), exc)
        if not self._handshake.done():
            self._handshake.set_exception(exc)
        self._fail(ConnectionLost, f"connection to {self._describe()} lost: {exc}")
        # the connection may owe the peer a REFUSE saying why; write it before closing
        self._linger()

    def _linger(self) -> None:
        """Write what is owed to the peer, then close the writing side only, and read on,
        discarding, until the peer closes (at most ``timeouts.close`` and
        :data:`LINGER_BYTES`). Closing at once while the peer still sends (the rest of an
        oversized frame) would reset the connection, and the reset can destroy the reason in
        flight: the peer would see a bare "connection reset"."""
        transport = self._transport
        if transport is None or not transport.can_write_eof():
            self._writes.close()
            return
        self._writes.end_batch(flush=True)
        self._writes.flush()
        self._decoder.release()  # what arrives from now on is discarded (see _buffer_updated)
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        transport.write_eof()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        # the one timer left to run on this channel: cancelled when the connection ends
        self._handshake_timer = self._loop.call_later(self._timeouts.close, transport.abort)

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
        # free the receive buffers now, and break the cycles through the transport, the write
        # batcher and the timers, so that nothing waits for the cycle collector
        self._decoder.release()
        self._writes.detach()
        self._transport = None
        self._handshake_timer = None
        self._deadline_timer = None
        self._on_ready = None

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
        if self._streams is not None:
            self._streams.fail(kind, message)
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
