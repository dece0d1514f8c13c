"""The callback types a channel runs, shared by the channel and the handler table.

Both :mod:`compass.wire.channel` and :mod:`compass.wire.rpc` import this module; it imports
neither at run time (``Channel`` appears here only in annotations), so the two do not import
each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from compass.wire.channel import Channel
    from compass.wire.options import ChannelOptions

__all__ = ["CloseCallback", "Dialer", "Handler", "Immediate", "NotifyHandler"]


class Immediate:
    """A request handler's answer that is ready at once (see :meth:`Router.inline`).

    The channel answers it inside the callback that read the request: no task, no extra
    loop iteration. Only for handlers that never block.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


#: ``handler(channel, op, body)``: an awaitable of the answer (run in a task of its own), or an
#: :class:`Immediate`; raising before any await answers with that error
Handler = Callable[["Channel", str, Any], "Awaitable[Any] | Immediate"]
#: ``notify_handler(channel, op, body)``: runs inline, in order of arrival
NotifyHandler = Callable[["Channel", str, Any], None]
#: ``callback(channel, None)`` when this side closed the channel, else ``(channel, ConnectionLost)``
CloseCallback = Callable[["Channel", BaseException | None], None]


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
