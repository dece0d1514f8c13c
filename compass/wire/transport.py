"""The asyncio side of the wire, under one name: the modules behind it, each with one job.

- :mod:`.channel`: :class:`Channel` (request waiters and deadlines, handler tasks,
  cancellation, flow control, closing), :data:`DEFAULT`, :data:`CANCEL_OP`;
- :mod:`.writes`: write batching (a few small messages per system call);
- :mod:`.tcp`: :func:`serve` and its :class:`Server`, :func:`connect`, :func:`send_limits`;
- :mod:`.options`: :class:`ChannelOptions`, what this side brings to a channel (name, token,
  limits, timeouts, TLS), for :func:`serve` and :func:`connect`;
- :mod:`.eventloop`: :func:`new_event_loop`, :func:`install_event_loop_policy` (uvloop);
- :mod:`.handlers`: the callback types :data:`Handler`, :data:`NotifyHandler`,
  :data:`CloseCallback` and :class:`Immediate`, shared with :mod:`.rpc`.
"""

from __future__ import annotations

from compass.wire.channel import CANCEL_OP, DEFAULT, Channel, CloseCallback, Handler, NotifyHandler
from compass.wire.eventloop import install_event_loop_policy, new_event_loop
from compass.wire.handlers import Immediate
from compass.wire.options import ChannelOptions
from compass.wire.tcp import Server, connect, send_limits, serve

__all__ = [
    "CANCEL_OP",
    "DEFAULT",
    "Channel",
    "ChannelOptions",
    "CloseCallback",
    "Handler",
    "Immediate",
    "NotifyHandler",
    "Server",
    "connect",
    "install_event_loop_policy",
    "new_event_loop",
    "send_limits",
    "serve",
]
