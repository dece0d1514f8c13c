"""Streams on one connection, sans-IO: their messages and their credit windows.

A stream is a request answered by many items, in order. The side that opens it (the *reader*)
gives the side that serves it (the *producer*) credit for ``window`` items; each item uses one;
the reader grants more as it consumes them. The producer never has more credit than the window,
so the reader never holds more than ``window`` items it has not consumed, and the producer never
sends more than the reader allowed: a slow reader holds the producer, it does not make anyone
buffer. The messages (msgpack arrays, after the kinds of :mod:`compass.wire.protocol`)::

    OPEN    [8, id, op, body, window]         reader -> producer: open stream ``id``
    ITEM    [9, id, body]                     producer -> reader: the next item (one credit)
    END     [10, id, body]                    producer -> reader: the final body; it is over
    FAIL    [11, id, code, message, detail]   producer -> reader: it failed; it is over
    CREDIT  [12, id, n]                       reader -> producer: ``n`` more items

Stream ids are request ids: one counter per sender for both, so a reader that stops early
sends the same ``$cancel`` notify as for a request. The producer answers a cancelled stream
with END (or FAIL); until END or FAIL arrives the reader keeps the stream's window (an int),
so items already in flight are still counted, and dropped. Peer faults, each a
:class:`ProtocolError` that fails the connection like any malformed frame: an item beyond the
credit, an item, END or FAIL for a stream this side did not open (or that is over), an OPEN
reusing an open id or with a window outside 1..:data:`MAX_WINDOW`, credit beyond the window
or for a stream the peer never opened. Credit for a stream that ended here is ignored (it
crossed the END on the wire).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compass.errors import ConfigError, ProtocolError

__all__ = [
    "MAX_WINDOW",
    "StreamCredit",
    "StreamEnd",
    "StreamFailed",
    "StreamItem",
    "StreamMisuse",
    "StreamOpen",
    "StreamWindows",
    "check_window",
]

#: the most items one stream's window may hold (what the reader may have to buffer)
MAX_WINDOW = 4096


class StreamMisuse(RuntimeError):
    """This side misused a stream: sent on one that is not open here, or beyond its credit."""


@dataclass(frozen=True, slots=True)
class StreamOpen:
    """The peer opens stream ``id`` of ``op`` with credit for ``window`` items."""

    id: int
    op: str
    body: Any
    window: int


@dataclass(frozen=True, slots=True)
class StreamItem:
    """The next item of our stream ``id``."""

    id: int
    body: Any


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Our stream ``id`` is over; ``body`` is its final body."""

    id: int
    body: Any


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """Our stream ``id`` failed on the peer (see :func:`compass.errors.error_from_wire`)."""

    id: int
    code: str
    message: str
    detail: Any


@dataclass(frozen=True, slots=True)
class StreamCredit:
    """The reader of stream ``id`` (served here) grants ``n`` more items."""

    id: int
    n: int


def check_window(window: object) -> int:
    """``window`` if it is a valid window, else a :class:`ConfigError` saying why."""
    if type(window) is not int or not 1 <= window <= MAX_WINDOW:
        raise ConfigError(f"a stream's window is 1..{MAX_WINDOW} items, got {window!r:.40}")
    return window


class StreamWindows:
    """The credit of every stream open on one connection, both ways.

    For a stream this side reads: the credit it has granted that items have not used yet
    (:meth:`opened`, :meth:`grant`, :meth:`item_received`, :meth:`ended`). For a stream this
    side produces: the credit left (:meth:`open_received`, :meth:`credit_received`,
    :meth:`item_sent`, :meth:`finished`). Peer faults raise :class:`ProtocolError`; misuse on
    this side :class:`StreamMisuse`.
    """

    __slots__ = ("_peer_top", "_producing", "_reading")

    def __init__(self) -> None:
        # stream id -> [credit outstanding, window]
        self._reading: dict[int, list[int]] = {}
        self._producing: dict[int, list[int]] = {}
        self._peer_top = 0  # the highest stream id the peer opened

    @property
    def reading(self) -> int:
        """Streams this side opened that have not ended."""
        return len(self._reading)

    @property
    def producing(self) -> int:
        """Streams the peer opened that this side has not finished."""
        return len(self._producing)

    # -- this side reads ----------------------------------------------------------------------

    def opened(self, stream_id: int, window: int) -> None:
        """This side opened ``stream_id`` with credit for ``window`` items."""
        self._reading[stream_id] = [check_window(window), window]

    def grant(self, stream_id: int, n: int) -> None:
        """This side grants ``n`` more items; never more than the window outstanding."""
        state = self._reading.get(stream_id)
        if state is None:
            raise StreamMisuse(f"stream {stream_id} is not open here")
        if type(n) is not int or n < 1 or state[0] + n > state[1]:
            raise StreamMisuse(
                f"credit of {n!r:.20} on stream {stream_id} would exceed its window of "
                f"{state[1]} (outstanding {state[0]})"
            )
        state[0] += n

    def item_received(self, stream_id: int) -> None:
        """An item of ``stream_id`` arrived: it uses one credit."""
        state = self._reading.get(stream_id)
        if state is None:
            raise ProtocolError(f"item for stream {stream_id}, which is not open")
        if state[0] <= 0:
            raise ProtocolError(
                f"item for stream {stream_id} beyond its credit (window {state[1]})"
            )
        state[0] -= 1

    def ended(self, stream_id: int, kind: str) -> None:
        """``kind`` (END or FAIL) of ``stream_id`` arrived: the stream is over."""
        if self._reading.pop(stream_id, None) is None:
            raise ProtocolError(f"{kind} for stream {stream_id}, which is not open")

    # -- this side produces -------------------------------------------------------------------

    def open_received(self, stream_id: int, window: object) -> None:
        """The peer opened ``stream_id`` with ``window`` items of credit."""
        if stream_id in self._producing:
            raise ProtocolError(f"OPEN of stream {stream_id}, which is already open")
        if type(window) is not int or not 1 <= window <= MAX_WINDOW:
            raise ProtocolError(
                f"OPEN of stream {stream_id} with window {window!r:.40} (1..{MAX_WINDOW})"
            )
        self._producing[stream_id] = [window, window]
        if stream_id > self._peer_top:
            self._peer_top = stream_id

    def credit_received(self, stream_id: int, n: object) -> bool:
        """The peer granted ``n`` items of ``stream_id``; False if the stream is over here
        (the credit crossed its END)."""
        if type(n) is not int or n < 1:
            raise ProtocolError(f"credit of {n!r:.40} items on stream {stream_id}")
        state = self._producing.get(stream_id)
        if state is None:
            if 0 < stream_id <= self._peer_top:
                return False
            raise ProtocolError(f"credit for stream {stream_id}, which the peer never opened")
        if state[0] + n > state[1]:
            raise ProtocolError(
                f"credit of {n} on stream {stream_id} beyond its window of {state[1]}"
            )
        state[0] += n
        return True

    def credit(self, stream_id: int) -> int:
        """The items this side may still send on ``stream_id`` (0 if it is not open)."""
        state = self._producing.get(stream_id)
        return 0 if state is None else state[0]

    def item_sent(self, stream_id: int) -> None:
        """This side is sending an item of ``stream_id``: one credit used."""
        state = self._producing.get(stream_id)
        if state is None or state[0] <= 0:
            raise StreamMisuse(
                f"stream {stream_id} is not open here"
                if state is None
                else f"stream {stream_id} has no credit left (window {state[1]})"
            )
        state[0] -= 1

    def refund(self, stream_id: int) -> None:
        """The item counted by :meth:`item_sent` could not be sent after all."""
        state = self._producing.get(stream_id)
        if state is not None:
            state[0] += 1

    def finished(self, stream_id: int) -> bool:
        """This side ends ``stream_id`` (sends END or FAIL, or forgets it); False if it was
        not open."""
        return self._producing.pop(stream_id, None) is not None
