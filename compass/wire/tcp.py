"""TCP (optionally TLS) endpoints: :func:`serve` and its :class:`Server`, and :func:`connect`.

Each connection becomes a :class:`~compass.wire.channel.Channel` once its handshake is done; a
server closes gracefully (running handlers get ``timeouts.close`` to finish).
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
from collections.abc import Callable

from compass.config import Limits, Timeouts, parse_address
from compass.errors import CompassTimeout, ConnectFailed
from compass.wire.channel import Channel
from compass.wire.handlers import Handler, NotifyHandler
from compass.wire.protocol import Connection

__all__ = ["Server", "connect", "serve"]

log = logging.getLogger("compass.wire")


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
            await loop.create_connection(channel.protocol, host, port, ssl=ssl)
    except TimeoutError as exc:
        raise ConnectFailed(
            f"could not connect to {host}:{port}: no answer within {timeouts.connect} s"
        ) from exc
    except OSError as exc:
        raise ConnectFailed(f"could not connect to {host}:{port}: {exc}") from exc
    try:
        async with asyncio.timeout(timeouts.handshake):
            await channel.handshake_done()
    except TimeoutError:
        await channel.aclose()
        raise CompassTimeout(
            f"handshake with {host}:{port} did not finish within {timeouts.handshake} s"
        ) from None
    except BaseException:
        if channel.closed:
            # failed handshake: the transport is already closing after telling the peer why;
            # aclose waits for it (at most timeouts.close)
            await channel.aclose()
        else:
            channel.abort()
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

    def accept() -> asyncio.BufferedProtocol:
        conn = Connection("acceptor", token=token, name=name, peer_kind=role, limits=limits)
        channel = Channel(
            conn,
            handler=handler,
            notify_handler=notify_handler,
            timeouts=timeouts,
            on_ready=channel_ready,
        )
        channel.on_close.append(channel_ended)
        if server._closing:
            channel.refuse_requests()
        server._accepted.add(channel)
        return channel.protocol()

    loop = asyncio.get_running_loop()
    try:
        listener = await loop.create_server(accept, host, port, ssl=ssl)
    except OSError as exc:
        raise ConnectFailed(f"could not listen on {host}:{port}: {exc}") from exc
    server._server = listener
    bound = listener.sockets[0].getsockname()
    server.address = (str(bound[0]), int(bound[1]))
    return server
