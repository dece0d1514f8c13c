"""What a request handler answers: a value ready at once (:class:`Immediate`), or an error in
wire form (:func:`exception_to_wire`, the one place where exceptions become wire errors).

Both :mod:`compass.wire.channel` and :mod:`compass.wire.rpc` import this module, and it imports
neither, not even for types: the channel's callback types are the channel's
(:data:`compass.wire.channel.Handler`), the handler table is :mod:`compass.wire.rpc`.
"""

from __future__ import annotations

import traceback
from typing import Any

from compass.errors import CompassError, RemoteError

__all__ = ["Immediate", "exception_to_wire"]


class Immediate:
    """A request handler's answer that is ready at once (see :meth:`Router.inline`).

    The channel answers it inside the callback that read the request: no task, no extra
    loop iteration. Only for handlers that never block.
    """

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
