"""The wire protocol: frames, codec, sans-IO connection, asyncio transport, handler tables.

The sans-IO layers (:mod:`.frames`, :mod:`.codec`, :mod:`.protocol`) import no event loop;
the asyncio layer (:mod:`.channel`, :mod:`.writes`, :mod:`.tcp`, :mod:`.eventloop`, gathered
under :mod:`.transport`) and :mod:`.rpc` are imported from here only when one of their names is
first used, so importing a sans-IO module does not pull in asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from compass.wire.codec import decode_message, encode_message
from compass.wire.frames import Frame, FrameDecoder, encode_frame
from compass.wire.protocol import (
    Connection,
    ErrorResponse,
    Event,
    HandshakeComplete,
    LocalProtocolError,
    Notify,
    Request,
    Response,
)

if TYPE_CHECKING:
    from compass.wire.channel import DEFAULT, Channel, Handler, NotifyHandler
    from compass.wire.eventloop import install_event_loop_policy, new_event_loop
    from compass.wire.options import ChannelOptions
    from compass.wire.rpc import Router, exception_to_wire
    from compass.wire.tcp import Server, connect, serve

__all__ = [
    "DEFAULT",
    "Channel",
    "ChannelOptions",
    "Connection",
    "ErrorResponse",
    "Event",
    "Frame",
    "FrameDecoder",
    "Handler",
    "HandshakeComplete",
    "LocalProtocolError",
    "Notify",
    "NotifyHandler",
    "Request",
    "Response",
    "Router",
    "Server",
    "connect",
    "decode_message",
    "encode_frame",
    "encode_message",
    "exception_to_wire",
    "install_event_loop_policy",
    "new_event_loop",
    "serve",
]

_LAZY = {
    "DEFAULT": "channel",
    "Channel": "channel",
    "ChannelOptions": "options",
    "Handler": "handlers",
    "NotifyHandler": "handlers",
    "Server": "tcp",
    "connect": "tcp",
    "install_event_loop_policy": "eventloop",
    "new_event_loop": "eventloop",
    "serve": "tcp",
    "Router": "rpc",
    "exception_to_wire": "rpc",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"compass.wire.{module}"), name)
    globals()[name] = value
    return value
