"""In-memory channels: the same :class:`~compass.wire.channel.Channel` as over TCP (the same
handshake, limits, errors, flow control and close paths), its bytes carried by an in-memory
transport instead of a socket, for tests of code that talks to peers (membership, the client)
without sockets.

- :func:`memory_pair`: two connected channels, handshake done.
- :class:`MemoryNetwork`: listeners by address (:meth:`~MemoryNetwork.serve`) and
  :meth:`~MemoryNetwork.connect`, with the arguments of :func:`~compass.wire.tcp.serve` and
  :func:`~compass.wire.tcp.connect` (the same :class:`~compass.wire.options.ChannelOptions`;
  so a :class:`~compass.wire.handlers.Dialer`); what it
  serves with is a real :class:`~compass.wire.tcp.Server` (connection limits, graceful close).

The transport (:class:`MemoryTransport`) does what asyncio's socket transports do wherever a
channel can tell: bytes arrive in order, in a later loop iteration, split wherever the
receiver's buffer ends; writing pauses above the high-water mark and resumes at the low one;
bytes a receiver does not read (its reading paused) stay in the sender's write buffer; ``close``
flushes, then the peer reads end-of-file; ``abort`` drops what is unsent, and the peer reads
end-of-file; ``write_eof`` half-closes. No kernel buffer sits between the two ends, so writing
pauses sooner than over TCP: the contract is the same, the amounts differ.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from compass.config import Limits, Timeouts, parse_address
from compass.errors import ConfigError, ConnectFailed
from compass.wire.channel import Channel, Handler, NotifyHandler
from compass.wire.options import ChannelOptions
from compass.wire.protocol import Connection
from compass.wire.tcp import Server, finish_handshake

__all__ = ["End", "MemoryNetwork", "MemoryTransport", "memory_pair"]

log = logging.getLogger("compass.wire")

#: asyncio's default write-buffer high-water mark, until the protocol sets its own
_DEFAULT_HIGH_WATER = 64 * 1024


class MemoryTransport(asyncio.Transport):
    """One end of an in-memory connection (made in pairs by :func:`link`)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        protocol: asyncio.BufferedProtocol,
        *,
        sockname: tuple[str, int],
        peername: tuple[str, int],
    ) -> None:
        super().__init__({"sockname": sockname, "peername": peername})
        self._loop = loop
        self._protocol = protocol
        self._peer: MemoryTransport | None = None
        self._outbox: deque[memoryview] = deque()  # written, not yet read by the peer
        self._buffered = 0
        self._high = _DEFAULT_HIGH_WATER
        self._low = _DEFAULT_HIGH_WATER // 4
        self._protocol_paused = False
        self._reading = True
        self._closing = False  # close() or abort(): reads nothing more, writes what is queued
        self._eof_written = False  # write_eof(): end-of-file once the outbox is read
        self._eof_sent = False  # the peer was told end-of-file
        self._eof_pending = False  # the peer's end-of-file, waiting for reading to resume
        self._lost = False  # connection_lost is called (or about to be)
        self._flush_scheduled = False

    # -- asyncio.Transport ------------------------------------------------------------------
    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        if not isinstance(protocol, asyncio.BufferedProtocol):
            raise TypeError("a memory transport feeds a BufferedProtocol")
        self._protocol = protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        if not self._closing:
            self._reading = False

    def resume_reading(self) -> None:
        if self._closing or self._reading:
            return
        self._reading = True
        if self._peer is not None:
            self._peer._schedule_flush()
        if self._eof_pending:
            self._loop.call_soon(self._read_eof)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = _DEFAULT_HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause_protocol()

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof_written:
            raise RuntimeError("cannot call write() after write_eof()")
        if self._closing:
            return
        chunk = bytes(data)  # the caller may reuse its buffer once write returns
        if not chunk:
            return
        self._outbox.append(memoryview(chunk))
        self._buffered += len(chunk)
        self._schedule_flush()
        self._maybe_pause_protocol()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._closing or self._eof_written:
            return
        self._eof_written = True
        self._schedule_flush()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._schedule_flush()  # what is queued goes out first; then end-of-file, then lost

    def abort(self) -> None:
        if self._lost:
            return
        self._closing = True
        self._outbox.clear()
        self._buffered = 0
        self._send_eof()
        self._connection_lost()

    # -- moving bytes -----------------------------------------------------------------------
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and not self._lost:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Hand what is queued to the peer while it reads; then the end-of-file and the end."""
        self._flush_scheduled = False
        if self._lost:
            return
        peer = self._peer
        outbox = self._outbox
        if peer is not None:
            while outbox and peer.is_reading():
                chunk = outbox[0]
                taken = peer._receive(chunk)
                if self._lost:
                    return  # reading it made the peer abort this end
                self._buffered -= taken
                if taken == len(chunk):
                    outbox.popleft()
                else:
                    outbox[0] = chunk[taken:]
            if outbox and peer._closing:
                # the peer closed: what it would have read is lost, as on a closed socket
                outbox.clear()
                self._buffered = 0
        self._maybe_resume_protocol()
        if not outbox and (self._closing or self._eof_written):
            self._send_eof()
            if self._closing:
                self._connection_lost()

    def _receive(self, chunk: memoryview) -> int:
        """Read ``chunk`` into the protocol's buffers while reading; returns the bytes taken."""
        protocol = self._protocol
        taken, size = 0, len(chunk)
        while taken < size and self._reading and not self._closing:
            try:
                buffer = memoryview(protocol.get_buffer(-1))
                n = min(len(buffer), size - taken)
                if not n:
                    raise RuntimeError("get_buffer() returned an empty buffer")
                buffer[:n] = chunk[taken : taken + n]
                taken += n
                protocol.buffer_updated(n)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException:
                log.exception("a memory transport's protocol failed reading; aborting")
                self.abort()
                break
        return taken

    def _send_eof(self) -> None:
        if not self._eof_sent:
            self._eof_sent = True
            if self._peer is not None:
                self._peer._eof_arrived()

    def _eof_arrived(self) -> None:
        if self._closing:
            return
        self._eof_pending = True
        if self._reading:
            self._loop.call_soon(self._read_eof)

    def _read_eof(self) -> None:
        if self._closing or not self._reading or not self._eof_pending:
            return
        self._eof_pending = False
        if not self._protocol.eof_received():
            self.close()

    # -- flow control and the end -----------------------------------------------------------
    def _maybe_pause_protocol(self) -> None:
        if not self._protocol_paused and self._buffered > self._high and not self._lost:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def _maybe_resume_protocol(self) -> None:
        if self._protocol_paused and self._buffered <= self._low and not self._lost:
            self._protocol_paused = False
            self._protocol.resume_writing()

    def _connection_lost(self) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self._outbox.clear()
        self._buffered = 0
        self._loop.call_soon(self._protocol.connection_lost, None)


_client_ports = itertools.count(49152)


def link(
    loop: asyncio.AbstractEventLoop,
    initiator: asyncio.BufferedProtocol,
    acceptor: asyncio.BufferedProtocol,
    *,
    initiator_address: tuple[str, int],
    acceptor_address: tuple[str, int],
) -> tuple[MemoryTransport, MemoryTransport]:
    """Connect two protocols by a pair of :class:`MemoryTransport`; each learns its transport
    (``connection_made``), the acceptor first, as an accepted socket's protocol does."""
    near = MemoryTransport(loop, initiator, sockname=initiator_address, peername=acceptor_address)
    far = MemoryTransport(loop, acceptor, sockname=acceptor_address, peername=initiator_address)
    near._peer, far._peer = far, near
    acceptor.connection_made(far)
    initiator.connection_made(near)
    return near, far


@dataclass(frozen=True, slots=True)
class End:
    """One end of a :func:`memory_pair`: its name, what it answers, its receive limits."""

    name: str
    handler: Handler | None = None
    notify_handler: NotifyHandler | None = None
    limits: Limits = field(default_factory=Limits)


async def memory_pair(
    initiator: End = End("a"),
    acceptor: End = End("b"),
    *,
    token: str | None = None,
    role: str = "worker",
    timeouts: Timeouts = Timeouts(),
) -> tuple[Channel, Channel]:
    """Two channels connected in memory, handshake done: ``(initiator's, acceptor's)``.

    ``role`` is what the initiator says it is (``"worker"`` or ``"client"``); the acceptor is
    a worker. Raises what a failed handshake raises over TCP (a wrong token on one side:
    :class:`~compass.errors.AuthenticationError`)."""
    loop = asyncio.get_running_loop()
    near = Channel(
        Connection("initiator", token=token, name=initiator.name, peer_kind=role,
                   limits=initiator.limits),
        handler=initiator.handler,
        notify_handler=initiator.notify_handler,
        timeouts=timeouts,
    )  # fmt: skip
    far = Channel(
        Connection("acceptor", token=token, name=acceptor.name, peer_kind="worker",
                   limits=acceptor.limits),
        handler=acceptor.handler,
        notify_handler=acceptor.notify_handler,
        timeouts=timeouts,
    )  # fmt: skip
    link(
        loop,
        near.protocol(),
        far.protocol(),
        initiator_address=("memory", next(_client_ports)),
        acceptor_address=(acceptor.name, 0),
    )
    await finish_handshake(near, acceptor.name, timeouts)
    await far.handshake_done()
    return near, far


class MemoryNetwork:
    """Addresses in memory: workers listen (:meth:`serve`) and others connect (:meth:`connect`)
    as over TCP, with no socket. Addresses are ``HOST:PORT`` strings, as for TCP; nothing
    resolves them, an address is just a key."""

    def __init__(self) -> None:
        self._listeners: dict[tuple[str, int], tuple[Server, Callable[[], Any]]] = {}
        self._ports = itertools.count(1)

    async def serve(
        self,
        host: str,
        port: int,
        options: ChannelOptions,
        *,
        role: str = "worker",
        handler: Handler,
        notify_handler: NotifyHandler | None = None,
        on_channel: Callable[[Channel], None] | None = None,
    ) -> Server:
        """Listen at ``host:port`` (0: a free port, see ``Server.address``), as
        :func:`~compass.wire.tcp.serve` does; :class:`ConnectFailed` if something listens
        there already."""
        _no_tls(options)
        token, name, limits = options.token, options.name, options.limits
        Connection("acceptor", token=token, name=name, peer_kind=role, limits=limits)
        if port == 0:
            port = next(p for p in self._ports if (host, p) not in self._listeners)
        taken = self._listeners.get((host, port))
        if taken is not None and not taken[0].closing:
            raise ConnectFailed(f"could not listen on {host}:{port}: address in use")
        server = Server(options.timeouts, limits, name)
        accept = server.acceptor(
            options,
            role=role,
            handler=handler,
            notify_handler=notify_handler,
            on_channel=on_channel,
        )
        server.address = (host, port)
        self._listeners[(host, port)] = (server, accept)
        return server

    async def connect(
        self,
        address: str | tuple[str, int],
        options: ChannelOptions,
        *,
        role: str = "client",
        handler: Handler | None = None,
        notify_handler: NotifyHandler | None = None,
    ) -> Channel:
        """Open an authenticated channel to ``address``, as :func:`~compass.wire.tcp.connect`
        does: :class:`ConnectFailed` if nothing listens there (or its server is closing)."""
        _no_tls(options)
        host, port = parse_address(address) if isinstance(address, str) else address
        listener = self._listeners.get((host, port))
        if listener is None or listener[0].closing:
            raise ConnectFailed(f"could not connect to {host}:{port}: nothing listens there")
        token, name, limits = options.token, options.name, options.limits
        conn = Connection("initiator", token=token, name=name, peer_kind=role, limits=limits)
        timeouts = options.timeouts
        channel = Channel(conn, handler=handler, notify_handler=notify_handler, timeouts=timeouts)
        _, accept = listener
        link(
            asyncio.get_running_loop(),
            channel.protocol(),
            accept(),
            initiator_address=("memory", next(_client_ports)),
            acceptor_address=(host, port),
        )
        await finish_handshake(channel, f"{host}:{port}", timeouts)
        return channel


def _no_tls(options: ChannelOptions) -> None:
    if options.ssl is not None:
        raise ConfigError("in-memory channels carry no TLS: give ChannelOptions ssl=None")
