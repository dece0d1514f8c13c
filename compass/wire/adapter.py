"""The asyncio protocol of a :class:`~compass.wire.channel.Channel`: forwards the transport's
callbacks to it (the read path straight to its framer and its reader, once per read)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from compass.wire.protocol import Connection

__all__ = ["ChannelProtocol"]


class _Channel(Protocol):
    """What the protocol calls of its channel (:class:`~compass.wire.channel.Channel`, which
    imports this module)."""

    _conn: Connection
    _write_paused: bool

    def _connection_made(self, transport: asyncio.Transport) -> None: ...
    def _buffer_updated(self, nbytes: int) -> None: ...
    def _connection_lost(self, exc: Exception | None) -> None: ...
    def _resume_writing(self) -> None: ...


class ChannelProtocol(asyncio.BufferedProtocol):
    """Forwards transport callbacks to its :class:`Channel`."""

    def __init__(self, channel: _Channel) -> None:
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
        # the transport may keep its protocol; do not let it keep the channel and its buffers
        self.__dict__.clear()

    def pause_writing(self) -> None:
        self.channel._write_paused = True

    def resume_writing(self) -> None:
        self.channel._resume_writing()
