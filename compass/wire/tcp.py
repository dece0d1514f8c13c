"""TCP (optionally TLS) endpoints: :func:`serve` and its :class:`Server`, and :func:`connect`.

Each connection becomes a :class:`~compass.wire.channel.Channel` once its handshake is done; a
server closes gracefully (running handlers get ``timeouts.close`` to finish).

A server holds at most ``limits.max_connections`` connections (fewer if the process may not
open that many files) and at most ``limits.max_unauthenticated`` of them in the handshake.
Past the first, a new connection is refused at once with a REFUSE saying so
(:class:`WorkerUnavailable` at the client): the ones already in are serving someone. Past the
second, the *oldest* connection still in the handshake is closed to make room. Refusing the
newest instead would let anyone who opens that many idle sockets lock every real client out
until the handshake deadline, and again after it; evicting the oldest lets a real client, whose
handshake takes one round trip, in unless the attacker opens ``max_unauthenticated``
connections within that round trip, over and over.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from typing import Protocol

from compass.config import Limits, Timeouts, parse_address
from compass.errors import CompassTimeout, ConnectFailed, WorkerUnavailable
from compass.wire.channel import Channel, Handler, NotifyHandler
from compass.wire.options import ChannelOptions
from compass.wire.protocol import Connection

__all__ = ["Dialer", "Server", "connect", "finish_handshake", "send_limits", "serve"]

log = logging.getLogger("compass.wire")

#: file descriptors left to the rest of the process when the file limit caps connections
_SPARE_FILES = 64


def _file_limit() -> int | None:
    """The process's soft limit on open files, ``None`` if unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


async def connect(
    address: str | tuple[str, int],
    options: ChannelOptions,
    *,
    role: str = "client",
    handler: Handler | None = None,
    notify_handler: NotifyHandler | None = None,
) -> Channel:
    """Open an authenticated channel to ``address`` (``"host:port"`` or ``(host, port)``) as
    ``options`` say (name, token, limits, timeouts, TLS), this side being a ``role``.

    Raises :class:`ConnectFailed` if the address cannot be reached, the handshake's
    :class:`AuthenticationError` / :class:`VersionMismatch`, or :class:`CompassTimeout` if the
    handshake takes longer than ``options.timeouts.handshake``.
    """
    host, port = parse_address(address) if isinstance(address, str) else address
    token, name, limits, timeouts = options.token, options.name, options.limits, options.timeouts
    loop = asyncio.get_running_loop()
    conn = Connection("initiator", token=token, name=name, peer_kind=role, limits=limits)
    channel = Channel(conn, handler=handler, notify_handler=notify_handler, timeouts=timeouts)
    try:
        async with asyncio.timeout(timeouts.connect):
            await loop.create_connection(channel.protocol, host, port, ssl=options.ssl)
    except TimeoutError as exc:
        raise ConnectFailed(
            f"could not connect to {host}:{port}: no answer within {timeouts.connect} s"
        ) from exc
    except OSError as exc:
        raise ConnectFailed(f"could not connect to {host}:{port}: {exc}") from exc
    await finish_handshake(channel, f"{host}:{port}", timeouts)
    return channel


async def finish_handshake(channel: Channel, where: str, timeouts: Timeouts) -> None:
    """Wait for a connected initiator's handshake with ``where``; on failure, close or abort
    the channel and raise why (:class:`CompassTimeout` after ``timeouts.handshake``)."""
    try:
        async with asyncio.timeout(timeouts.handshake):
            await channel.handshake_done()
    except TimeoutError:
        await channel.aclose()
        raise CompassTimeout(
            f"handshake with {where} did not finish within {timeouts.handshake} s"
        ) from None
    except BaseException:
        if channel.closed:
            # failed handshake: the transport is already closing after telling the peer why;
            # aclose waits for it (at most timeouts.close)
            await channel.aclose()
        else:
            channel.abort()
        raise


def send_limits(channel: Channel) -> Limits:
    """What a message on ``channel`` must keep to once its handshake is done: the tighter of
    this side's limits and those its peer announced, so that a caller can check a large message
    before building it and say in its own terms what is too large."""
    return channel._conn.send_limits


class Server:
    """A listening socket whose connections become channels. Made by :func:`serve`."""

    def __init__(self, timeouts: Timeouts, limits: Limits = Limits(), name: str = "") -> None:
        #: the bound address (port resolved when 0 was asked for)
        self.address: tuple[str, int] = ("", 0)
        #: authenticated channels currently open
        self.channels: set[Channel] = set()
        files = _file_limit()
        #: connections held at most: ``limits.max_connections``, or fewer to stay below the
        #: process's limit on open files (an ``accept`` failing for want of a descriptor would
        #: stall every client, not just the newest)
        self.max_connections = limits.max_connections
        if files is not None:
            self.max_connections = max(1, min(self.max_connections, files - _SPARE_FILES))
        #: connections still in the handshake held at most
        self.max_unauthenticated = min(limits.max_unauthenticated, self.max_connections)
        #: connections refused for ``max_connections``, and closed in the handshake to make room
        self.refused = 0
        self.evicted = 0
        self._name = name
        self._timeouts = timeouts
        self._server: asyncio.Server | None = None
        self._accepted: set[Channel] = set()  # every live channel, handshake done or not
        # channels in the handshake, oldest first (a dict keeps insertion order)
        self._handshaking: dict[Channel, None] = {}
        self._closing = False

    @property
    def closing(self) -> bool:
        """True once :meth:`aclose` has begun: it takes no new connection."""
        return self._closing

    def acceptor(
        self,
        options: ChannelOptions,
        *,
        role: str,
        handler: Handler,
        notify_handler: NotifyHandler | None,
        on_channel: Callable[[Channel], None] | None,
    ) -> Callable[[], asyncio.BufferedProtocol]:
        """The protocol factory of this server's listener: each call makes the channel of one
        accepted connection (as ``options`` say, TLS aside: that is the listener's), counted in
        (or refused) by this server. :func:`serve` gives it to a socket listener,
        :class:`~compass.wire.memory.MemoryNetwork` to an in-memory one."""
        token, name, limits = options.token, options.name, options.limits

        def channel_ready(channel: Channel) -> None:
            self._handshaking.pop(channel, None)
            self.channels.add(channel)
            if on_channel is not None:
                try:
                    on_channel(channel)
                except Exception:
                    log.exception("on_channel callback failed for %r", channel)

        def channel_ended(channel: Channel, _: BaseException | None) -> None:
            self.channels.discard(channel)
            self._forget(channel)

        def accept() -> asyncio.BufferedProtocol:
            conn = Connection("acceptor", token=token, name=name, peer_kind=role, limits=limits)
            channel = Channel(
                conn,
                handler=handler,
                notify_handler=notify_handler,
                timeouts=options.timeouts,
                on_ready=channel_ready,
            )
            channel.on_close.append(channel_ended)
            if self._closing:
                channel.refuse_requests()
            self._admit(channel)
            return channel.protocol()

        return accept

    def _admit(self, channel: Channel) -> None:
        """Count ``channel`` in, making room by evicting the oldest handshake, or reject it."""
        handshaking = self._handshaking
        if len(handshaking) >= self.max_unauthenticated or (
            handshaking and len(self._accepted) >= self.max_connections
        ):
            oldest = next(iter(handshaking))
            self._forget(oldest)
            self.evicted += 1
            _note(
                self.evicted,
                "%s: %d connections still in the handshake: closed the oldest (%d so far)",
                self._name,
                len(handshaking) + 1,
            )
            oldest.reject(
                WorkerUnavailable(
                    f"{self._name!r} closed this connection: too many connections in the "
                    f"handshake (max_unauthenticated={self.max_unauthenticated}); reconnect"
                )
            )
        if len(self._accepted) >= self.max_connections:
            self.refused += 1
            _note(
                self.refused,
                "%s: refused a connection: %d open (%d refused so far)",
                self._name,
                len(self._accepted),
            )
            channel.reject(
                WorkerUnavailable(
                    f"{self._name!r} holds max_connections={self.max_connections} connections; "
                    "try another worker, or later"
                )
            )
            return
        self._accepted.add(channel)
        handshaking[channel] = None

    def _forget(self, channel: Channel) -> None:
        self._accepted.discard(channel)
        self._handshaking.pop(channel, None)

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
            channel.refuse_requests()
        await asyncio.gather(
            *(channel.finish_handlers(self._timeouts.close) for channel in channels)
        )
        await asyncio.gather(*(channel.aclose() for channel in channels))
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _note(count: int, message: str, name: str, amount: int) -> None:
    """A WARNING at the 1st, 2nd, 4th, 8th, ... occurrence: an attack logs a few lines."""
    if count & (count - 1) == 0:
        log.warning(message, name, amount, count)


async def serve(
    host: str,
    port: int,
    options: ChannelOptions,
    *,
    role: str = "worker",
    handler: Handler,
    notify_handler: NotifyHandler | None = None,
    on_channel: Callable[[Channel], None] | None = None,
) -> Server:
    """Listen on ``host:port`` (0: any free port, see ``Server.address``), each connection's
    channel as ``options`` say (name, token, limits, timeouts, TLS), this side being a ``role``.

    Each connection is authenticated first; ``on_channel`` is called with the channel once
    its handshake is complete. Requests run ``handler`` in a task of their own; notifies run
    ``notify_handler`` inline, in order of arrival.
    """
    # validates role and name now rather than on the first connection
    Connection(
        "acceptor", token=options.token, name=options.name, peer_kind=role, limits=options.limits
    )
    server = Server(options.timeouts, options.limits, options.name)
    accept = server.acceptor(
        options,
        role=role,
        handler=handler,
        notify_handler=notify_handler,
        on_channel=on_channel,
    )
    loop = asyncio.get_running_loop()
    try:
        listener = await loop.create_server(accept, host, port, ssl=options.ssl)
    except OSError as exc:
        raise ConnectFailed(f"could not listen on {host}:{port}: {exc}") from exc
    server._server = listener
    bound = listener.sockets[0].getsockname()
    server.address = (str(bound[0]), int(bound[1]))
    return server


class Dialer(Protocol):
    """How a channel to an address is opened: :func:`compass.wire.tcp.connect`, or the
    ``connect`` of a :class:`compass.wire.memory.MemoryNetwork` (no sockets), which take the
    same arguments and raise the same errors."""

    async def __call__(
        self,
        address: str | tuple[str, int],
        options: ChannelOptions,
        *,
        role: str = ...,
        handler: Handler | None = ...,
        notify_handler: NotifyHandler | None = ...,
    ) -> Channel: ...
