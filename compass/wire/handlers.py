"""What a request handler answers: a value ready at once (:class:`Immediate`), one that a future
will hold (:class:`Later`), a stream of items
(:class:`Streamed`, ended early by a :class:`StreamResult`), or an error in wire form
(:func:`exception_to_wire`, the one place where exceptions become wire errors).

Both :mod:`compass.wire.channel` and :mod:`compass.wire.rpc` import this module, and it imports
neither, not even for types: the channel's callback types are the channel's
(:data:`compass.wire.channel.Handler`), the handler table is :mod:`compass.wire.rpc`.
"""

from __future__ import annotations

import traceback
from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

from compass.errors import CompassError, RemoteError, UnknownOperation

__all__ = ["Immediate", "Later", "StreamResult", "Streamed", "exception_to_wire"]


class Immediate:
    """A request handler's answer that is ready at once (see :meth:`Router.inline`).

    The channel answers it inside the callback that read the request: no task, no extra
    loop iteration. Only for handlers that never block.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Later:
    """A request handler's answer that ``future`` will hold: its result, or its error.

    The channel answers it from the future's done callback, as soon as it is set: no task, no
    coroutine, no loop turn between the value and its answer (a job's answer: the submit path).
    Whatever stops the request (its caller gave up, the channel closed, a drain's time ran
    out) cancels ``future``; its owner hears that as the future's cancellation.
    """

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future


class Streamed:
    """A request handler's answer that is a stream (see :meth:`Router.stream`): the channel
    sends each item ``items`` yields, as credit allows, to a peer that opened it with
    :meth:`Channel.stream <compass.wire.channel.Channel.stream>`.

    Asked for as a plain request, it answers :class:`UnknownOperation` (the op streams).
    """

    __slots__ = ("items", "op")

    def __init__(self, items: AsyncIterator[Any], op: str) -> None:
        self.items = items
        self.op = op

    def __await__(self) -> Generator[Any, None, Any]:
        aclose = getattr(self.items, "aclose", None)
        if aclose is not None:
            yield from aclose().__await__()
        raise UnknownOperation(
            f"{self.op!r} is a stream: open it with Channel.stream, not Channel.request",
            detail={"op": self.op},
        )


class StreamResult:
    """Yielded by a stream handler: the stream ends, with ``value`` as its final body (the
    reader's :attr:`ItemStream.result <compass.wire.streams.ItemStream.result>`); the
    generator is not resumed. A stream that simply ends has the final body ``None``."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def exception_to_wire(exc: BaseException, *, context: str = "") -> tuple[str, str, Any]:
    """``(code, message, detail)`` for an exception raised while serving a request.

    A :class:`CompassError` keeps its code, message and detail. Anything else becomes
    ``"internal"`` with ``context`` (e.g. "handling 'ping' on w1") in the message and the
    traceback text in ``detail["traceback"]``.
    """
    if isinstance(exc, CompassError):
        wire = exc.to_wire()
        return wire["code"], wire["message"], wire["detail"]
    where = f" while {context}" if context else ""
    message = f"{type(exc).__name__}{where}: {exc}"
    text = "".join(traceback.format_exception(exc))
    return RemoteError.code, message, {"exception": type(exc).__qualname__, "traceback": text}
