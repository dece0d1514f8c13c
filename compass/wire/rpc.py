"""Handler tables, and the one place where exceptions become wire errors.

::

    router = Router()

    @router.request("ping")
    async def ping(channel: Channel, body: Any) -> Any:
        return body

    @router.stream("count")
    async def count(channel: Channel, body: Any) -> AsyncIterator[Any]:
        for n in range(body):
            yield n  # sent when the reader has credit; until then not resumed

    @router.notify("heartbeat")
    def heartbeat(channel: Channel, body: Any) -> None: ...

    server = await serve(host, port, ChannelOptions(name=..., token=...),
                         handler=router.handle_request, notify_handler=router.handle_notify)

A :class:`~compass.errors.CompassError` raised by a handler reaches the caller as the same class
(its ``code`` travels); any other exception arrives as :class:`~compass.errors.RemoteError` with
the remote traceback as text in ``detail["traceback"]``. Nothing is pickled.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from compass.errors import ConfigError, UnknownOperation
from compass.wire.handlers import Immediate, Later, Streamed, exception_to_wire

if TYPE_CHECKING:
    from compass.wire.channel import Channel

__all__ = [
    "Immediate",
    "InlineFunc",
    "Later",
    "NotifyFunc",
    "RequestFunc",
    "Router",
    "StreamFunc",
    "exception_to_wire",
]

log = logging.getLogger("compass.wire")

RequestFunc = Callable[["Channel", Any], "Awaitable[Any] | Later"]
InlineFunc = Callable[["Channel", Any], Any]
NotifyFunc = Callable[["Channel", Any], None]
StreamFunc = Callable[["Channel", Any], AsyncIterator[Any]]
_R = TypeVar("_R", bound=RequestFunc)
_N = TypeVar("_N", bound=NotifyFunc)
_I = TypeVar("_I", bound=InlineFunc)
_S = TypeVar("_S", bound=StreamFunc)


class Router:
    """Maps op names to handlers; ``handle_request``/``handle_notify`` plug into the transport."""

    def __init__(self) -> None:
        self._requests: dict[str, RequestFunc] = {}
        self._inline: dict[str, InlineFunc] = {}
        self._notifies: dict[str, NotifyFunc] = {}

    @property
    def request_ops(self) -> frozenset[str]:
        """Ops with a request handler."""
        return frozenset(self._requests) | frozenset(self._inline)

    @property
    def notify_ops(self) -> frozenset[str]:
        """Ops with a notify handler."""
        return frozenset(self._notifies)

    def request(self, op: str) -> Callable[[_R], _R]:
        """Decorator: ``async def f(channel, body) -> response`` handles requests for ``op``
        (or a plain function returning an awaitable, or a :class:`Later`: a future the
        response will be, answered as soon as it is set, with no task)."""

        def register(func: _R) -> _R:
            self.add_request(op, func)
            return func

        return register

    def inline(self, op: str) -> Callable[[_I], _I]:
        """Decorator: ``def f(channel, body) -> response``, a *synchronous* handler for ``op``
        answered inside the callback that read the request (no task, one loop iteration less).

        For cheap handlers that never block (``ping``, ``status``); anything that awaits
        belongs in :meth:`request`.
        """

        def register(func: _I) -> _I:
            if op in self._requests or op in self._inline:
                raise ConfigError(f"request op {op!r} already has a handler")
            self._inline[op] = func
            return func

        return register

    def stream(self, op: str) -> Callable[[_S], _S]:
        """Decorator: ``async def f(channel, body)``, an async generator, serves streams of
        ``op`` (see :mod:`compass.wire.streams`): each item it yields is sent in order, and
        while the reader's window is full it is not resumed. Yielding a
        :class:`~compass.wire.handlers.StreamResult` ends the stream with that final body;
        leaving the stream early (or losing the connection) closes the generator."""

        def register(func: _S) -> _S:
            generator: bool = inspect.isasyncgenfunction(func)  # a bool: func stays _S
            if not generator:
                raise ConfigError(
                    f"the stream handler for {op!r} must be an async generator function "
                    f"(async def with yield), got {func!r:.80}"
                )
            self.add_request(op, lambda channel, body: Streamed(func(channel, body), op))
            return func

        return register

    def notify(self, op: str) -> Callable[[_N], _N]:
        """Decorator: ``def f(channel, body) -> None`` handles one-way ``op`` (sync, inline)."""

        def register(func: _N) -> _N:
            self.add_notify(op, func)
            return func

        return register

    def add_request(self, op: str, func: RequestFunc) -> None:
        """Register ``func`` for request ``op``; an op may have one handler."""
        if op in self._requests or op in self._inline:
            raise ConfigError(f"request op {op!r} already has a handler")
        self._requests[op] = func

    def add_notify(self, op: str, func: NotifyFunc) -> None:
        """Register ``func`` for notify ``op``; an op may have one handler."""
        if op in self._notifies:
            raise ConfigError(f"notify op {op!r} already has a handler")
        self._notifies[op] = func

    def handle_request(
        self, channel: Channel, op: str, body: Any
    ) -> Awaitable[Any] | Immediate | Later:
        """The handler for ``op``, called; :class:`UnknownOperation` if there is none.

        A plain function returning the handler's awaitable (one coroutine frame less per
        request); an unknown op raises when called, which the transport answers the same way.
        """
        func = self._requests.get(op)
        if func is None:
            inline = self._inline.get(op)
            if inline is not None:
                return Immediate(inline(channel, body))
            raise UnknownOperation(
                f"{channel.local_name!r} has no handler for request {op!r}",
                detail={"op": op},
            )
        return func(channel, body)

    def handle_notify(self, channel: Channel, op: str, body: Any) -> None:
        """Run the handler for ``op``; an unknown op is logged and dropped."""
        func = self._notifies.get(op)
        if func is None:
            log.warning("dropping notify %r from %r: no handler", op, channel.peer_name)
            return
        func(channel, body)
