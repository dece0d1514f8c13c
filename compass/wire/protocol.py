"""Sans-IO connection: handshake, request ids and message kinds, in the style of h11.

Bytes go in (``get_buffer``/``buffer_updated`` or ``receive_data``), events come out
(``next_event``), and ``send_*`` calls queue bytes that the caller collects with
``data_to_send``. Nothing here touches a socket or an event loop.

Every message is a msgpack array whose first element is its kind::

    HELLO    [0, {version, role, name, nonce, token, proof?}]
    AUTH     [1, proof]
    READY    [2]
    REFUSE   [3, code, message]                 handshake failed; the sender closes
    REQUEST  [4, id, op, body]
    RESPONSE [5, id, body]
    ERROR    [6, id, code, message, detail]     the request ``id`` failed
    NOTIFY   [7, op, body]
    OPEN, ITEM, END, FAIL, CREDIT   [8..12, id, ...]   streams: see :mod:`compass.wire.flow`

Handshake (mutual HMAC-SHA256 over the cluster token; no token means an empty key)::

    initiator                                   acceptor
    HELLO{nonce_i}                      ->
                                        <-      HELLO{nonce_a, proof=H("acceptor"+nonce_i+nonce_a)}
    checks proof; AUTH{H("initiator"+nonce_a+nonce_i)} ->
                                        <-      READY   (or REFUSE{auth} and close)

Each HELLO says ``streams: true``: a peer whose HELLO lacks it (an older compass) is never sent
a stream frame; opening a stream to it fails on this side, and requests flow as before.

A version mismatch is answered with REFUSE{version}; a failed proof on either side with
REFUSE{auth}, so both ends report the same typed error. The initiator proves itself only after
the acceptor has, so a peer without the token learns nothing it could replay. Until READY,
frames are limited to :data:`HANDSHAKE_MAX_FRAME_BYTES` and received into a small staging area
(:data:`HANDSHAKE_STAGING_BYTES`, grown only as a frame needs), so an unauthenticated peer
cannot make this side allocate much.

Each HELLO also carries the sender's receive limits (frame, header and element counts); a side
refuses to send a message the peer would refuse, with a :class:`ProtocolError` naming the
limit, instead of writing it. A peer that sends one anyway (or any frame this side cannot
accept) is told why before the connection closes: an ERROR for the request, when the refused
frame is a request whose id can be read, then REFUSE with the reason, in any state. Received
in the READY state, REFUSE means "closing because of this", and raises its typed error.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

import msgpack

from compass.config import PROTOCOL_VERSION, Limits
from compass.errors import (
    AuthenticationError,
    CompassError,
    ConfigError,
    ProtocolError,
    VersionMismatch,
    error_from_wire,
)
from compass.wire.codec import (
    _OTHER_BYTES,
    Encoder,
    _no_buffers_hook,
    check_structure,
    decode_message,
)
from compass.wire.flow import (
    StreamCredit,
    StreamEnd,
    StreamFailed,
    StreamItem,
    StreamOpen,
    StreamWindows,
    check_window,
)
from compass.wire.frames import PREFIX as _PREFIX
from compass.wire.frames import (
    PREFIX_BYTES,
    STAGING_BYTES,
    Frame,
    FrameDecoder,
    encode_frame,
    padded_size,
)

__all__ = [
    "HANDSHAKE_MAX_FRAME_BYTES",
    "HANDSHAKE_STAGING_BYTES",
    "PEER_ROLES",
    "Connection",
    "ErrorResponse",
    "Event",
    "HandshakeComplete",
    "LocalProtocolError",
    "MessageKind",
    "Notify",
    "Request",
    "Response",
    "State",
]

#: frame size limit while the peer is not yet authenticated
HANDSHAKE_MAX_FRAME_BYTES = 64 * 1024
#: receive staging area until the peer is authenticated (a HELLO is about 150 bytes)
HANDSHAKE_STAGING_BYTES = 4 * 1024
#: the receive limits a HELLO announces, in this order
_ANNOUNCED = ("max_frame_bytes", "max_header_bytes", "max_buffers", "max_depth", "max_elements")
#: what a peer may say it is
PEER_ROLES = frozenset({"worker", "client"})
#: body types that nest nothing: the envelope alone sets the depth of such a message
_FLAT = frozenset({type(None), bool, int, float, str, bytes, bytearray, memoryview})
_NONCE_BYTES = 32
_unpackb = msgpack.unpackb
_NO_BUFFERS: list[memoryview] = []  # never appended to
_MAX_NAME_CHARS = 1024


class LocalProtocolError(RuntimeError):
    """The caller misused the connection (a bug on this side, not a fault of the peer)."""


class MessageKind(enum.IntEnum):
    HELLO = 0
    AUTH = 1
    READY = 2
    REFUSE = 3
    REQUEST = 4
    RESPONSE = 5
    ERROR = 6
    NOTIFY = 7
    OPEN = 8
    ITEM = 9
    END = 10
    FAIL = 11
    CREDIT = 12


_HELLO, _AUTH, _READY, _REFUSE = 0, 1, 2, 3
_REQUEST, _RESPONSE, _ERROR, _NOTIFY = 4, 5, 6, 7
_OPEN, _ITEM, _END, _FAIL, _CREDIT = 8, 9, 10, 11, 12


class State(enum.Enum):
    IDLE = "idle"  # initiator, before initiate()
    SENT_HELLO = "sent hello"  # initiator waits for the acceptor's HELLO
    WAIT_HELLO = "wait hello"  # acceptor waits for the initiator's HELLO
    WAIT_AUTH = "wait auth"  # acceptor proved itself, waits for the initiator's AUTH
    SENT_AUTH = "sent auth"  # initiator proved itself, waits for READY
    READY = "ready"
    FAILED = "failed"


_STATE_READY = State.READY

#: message kinds the peer may send in each state; anything else is a protocol error
_EXPECTED: dict[State, frozenset[int]] = {
    State.IDLE: frozenset(),
    State.SENT_HELLO: frozenset({_HELLO, _REFUSE}),
    State.WAIT_HELLO: frozenset({_HELLO, _REFUSE}),
    State.WAIT_AUTH: frozenset({_AUTH, _REFUSE}),
    State.SENT_AUTH: frozenset({_READY, _REFUSE}),
    State.READY: frozenset(
        {_REQUEST, _RESPONSE, _ERROR, _NOTIFY, _REFUSE, _OPEN, _ITEM, _END, _FAIL, _CREDIT}
    ),
    State.FAILED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class HandshakeComplete:
    """The peer is authenticated; requests and notifies may flow both ways."""

    peer_name: str
    peer_role: str


@dataclass(frozen=True, slots=True)
class Request:
    """The peer asks for ``op``; answer with ``send_response(id, ...)`` or ``send_error``."""

    id: int
    op: str
    body: Any


@dataclass(frozen=True, slots=True)
class Response:
    """The answer to our request ``id``."""

    id: int
    body: Any


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """Our request ``id`` failed on the peer (see :func:`compass.errors.error_from_wire`)."""

    id: int
    code: str
    message: str
    detail: Any


@dataclass(frozen=True, slots=True)
class Notify:
    """A one-way message; there is no answer."""

    op: str
    body: Any


Event = (
    HandshakeComplete
    | Request
    | Response
    | ErrorResponse
    | Notify
    | StreamOpen
    | StreamItem
    | StreamEnd
    | StreamFailed
    | StreamCredit
)

# slot setters of the two hot events (see next_event)
_new = object.__new__
_set_request_id = Request.__dict__["id"].__set__
_set_request_op = Request.__dict__["op"].__set__
_set_request_body = Request.__dict__["body"].__set__
_set_response_id = Response.__dict__["id"].__set__
_set_response_body = Response.__dict__["body"].__set__


def _handshake_limits(limits: Limits) -> Limits:
    cap = min(limits.max_frame_bytes, HANDSHAKE_MAX_FRAME_BYTES)
    return dataclasses.replace(
        limits, max_frame_bytes=cap, max_header_bytes=min(limits.max_header_bytes, cap)
    )


def _proof(key: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, label + first + second, hashlib.sha256).digest()


def _peer_limits(own: Limits, announced: object) -> Limits:
    """``own`` tightened by the receive limits a peer announced (ignored if malformed)."""
    if not (
        isinstance(announced, list)
        and len(announced) == len(_ANNOUNCED)
        and all(type(v) is int and v > 0 for v in announced)
    ):
        return own
    tighter = {
        name: min(value, getattr(own, name))
        for name, value in zip(_ANNOUNCED, announced, strict=True)
    }
    tighter["max_header_bytes"] = min(tighter["max_header_bytes"], tighter["max_frame_bytes"])
    return dataclasses.replace(own, **tighter)


def _request_id(head: bytes | memoryview) -> int | None:
    """The id of the REQUEST whose header starts with ``head``, or ``None`` if it is not one.

    Read by hand: ``[4, id, ...]`` is a 4-array marker, the kind, then an unsigned integer.
    """
    if len(head) < 3 or head[0] != 0x94 or head[1] != _REQUEST:
        return None
    first = head[2]
    if first < 0x80:
        return int(first)
    size = _UINT_SIZES.get(first)
    if size is None or len(head) < 3 + size:
        return None
    return int.from_bytes(head[3 : 3 + size], "big")


_UINT_SIZES = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}


class Connection:
    """One end of a compass connection, without I/O.

    ``role`` says who opened the connection (``"initiator"``) and who accepted it
    (``"acceptor"``); ``peer_kind`` is what *this* side is (``"worker"`` or ``"client"``), sent
    to the peer in the handshake. Peer faults raise :class:`ProtocolError`,
    :class:`AuthenticationError` or :class:`VersionMismatch` from ``next_event``; after one,
    the connection is failed and should be closed once ``data_to_send`` is flushed (it may hold
    a REFUSE telling the peer why).
    """

    def __init__(
        self,
        role: Literal["initiator", "acceptor"],
        *,
        token: str | None,
        name: str,
        peer_kind: str,
        limits: Limits,
    ) -> None:
        if role not in ("initiator", "acceptor"):
            raise ConfigError(f"connection role must be 'initiator' or 'acceptor', got {role!r}")
        if peer_kind not in PEER_ROLES:
            raise ConfigError(f"role must be 'worker' or 'client', got {peer_kind!r}")
        if not isinstance(name, str) or len(name) > _MAX_NAME_CHARS:
            raise ConfigError(f"name must be a str of at most {_MAX_NAME_CHARS} characters")
        self.role = role
        self.name = name
        self.peer_kind = peer_kind
        self.limits = limits
        self.peer_name = ""
        self.peer_role = ""
        self._key = (token or "").encode()
        self._has_token = bool(token)
        self._nonce = secrets.token_bytes(_NONCE_BYTES)
        self._peer_nonce = b""
        self._peer_has_token = False
        self._decoder = FrameDecoder(
            _handshake_limits(limits), staging_bytes=HANDSHAKE_STAGING_BYTES
        )
        #: what this side sends must fit these: its own limits, tightened by the peer's
        self.send_limits = limits
        # headers this short need no depth or element count (every object takes a byte)
        self._direct_bytes = min(limits.max_depth, limits.max_elements)
        self._peer_refused = False  # the failure is the peer's REFUSE: nothing to answer
        self._out: list[bytes | memoryview] = []
        # made on the first send: a msgpack packer reserves a 256 KiB buffer, and a connection
        # that never says HELLO never needs one. Until then calling _pack fails, and _queue's
        # fallback makes the encoder (no bound method of self here: that would be a cycle)
        self._encoder_made: Encoder | None = None
        self._pack: Callable[[Any], bytes] | None = None
        self._next_id = 1
        #: the credit windows of the streams open on this connection, both ways
        self.streams = StreamWindows()
        #: the peer's HELLO said it speaks streams (an older compass's does not)
        self.peer_streams = False
        self._error: CompassError | None = None
        self._state = State.IDLE if role == "initiator" else State.WAIT_HELLO

    @property
    def state(self) -> State:
        """Where the connection stands (see the table ``_EXPECTED``)."""
        return self._state

    # -- input ------------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        """See :meth:`FrameDecoder.get_buffer`."""
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        """See :meth:`FrameDecoder.buffer_updated`."""
        self._decoder.buffer_updated(nbytes)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Copy received bytes in; then call ``next_event`` until it returns ``None``."""
        self._decoder.receive_data(data)

    @property
    def decoder(self) -> FrameDecoder:
        """The framer underneath (its reuse counters are useful in benchmarks)."""
        return self._decoder

    def next_event(self) -> Event | None:
        """The next event, or ``None`` when more bytes are needed."""
        if self._error is not None:
            raise self._error
        try:
            while True:
                got = self._decoder.next_header_or_frame()
                if got is None:
                    return None
                header: bytes | memoryview
                if type(got) is bytes:
                    header, buffers = got, _NO_BUFFERS
                else:
                    # a frame the framer did not take through its fast path
                    header, buffers = cast(Frame, got)
                size = len(header)
                if not buffers and (
                    size <= self._direct_bytes
                    or (
                        type(header) is bytes
                        and size <= self.limits.max_elements
                        and len(header.translate(None, _OTHER_BYTES)) <= self.limits.max_depth
                    )
                ):
                    # inline fast case of decode_message: no arrays, too short for too many
                    # objects, too few container markers to nest deeper than the limit
                    try:
                        message = _unpackb(header, ext_hook=_no_buffers_hook, strict_map_key=False)
                    except ProtocolError:
                        raise
                    except (ValueError, TypeError, RecursionError) as exc:
                        raise ProtocolError(
                            f"undecodable message: {type(exc).__name__}: {exc}"
                        ) from exc
                else:
                    message = decode_message(header, buffers, self.limits)
                if type(message) is not list or not message:
                    raise ProtocolError(f"message is not a non-empty array: {message!r:.80}")
                kind = message[0]
                if self._state is _STATE_READY:
                    # the two hot kinds first, inline
                    if kind == _RESPONSE and len(message) == 3 and type(message[1]) is int:
                        # filled through the slots: a frozen dataclass's __init__ costs
                        # twice as much, and this runs once per message
                        response: Response = _new(Response)
                        _set_response_id(response, message[1])
                        _set_response_body(response, message[2])
                        return response
                    if (
                        kind == _REQUEST
                        and len(message) == 4
                        and type(message[1]) is int
                        and type(message[2]) is str
                    ):
                        request: Request = _new(Request)
                        _set_request_id(request, message[1])
                        _set_request_op(request, message[2])
                        _set_request_body(request, message[3])
                        return request
                    return self._ready_event(kind, message)
                event = self._handshake_event(kind, message)
                if event is not None:
                    return event
        except CompassError as exc:
            if (
                isinstance(exc, ProtocolError)
                and not isinstance(exc, VersionMismatch)  # already answered with REFUSE
                and not self._peer_refused
            ):
                self._tell_peer(exc, header if self._decoder.error is None else None)
            self._state = State.FAILED
            self._error = exc
            raise

    def _tell_peer(self, exc: ProtocolError, header: bytes | memoryview | None) -> None:
        """Queue the reason this side is closing: an ERROR for the offending request if its id
        can be read, then REFUSE, so the sender learns which limit it broke."""
        head = self._decoder.rejected_head if header is None else header
        request_id = _request_id(head) if self._state is _STATE_READY else None
        text = str(exc)
        try:
            if request_id is not None:
                self._queue([_ERROR, request_id, exc.code, text, exc.detail])
            self._queue([_REFUSE, exc.code, text])
        except CompassError:  # unencodable detail: the REFUSE alone will do
            self._queue([_REFUSE, exc.code, text[:4096]])

    def refuse(self, error: CompassError) -> None:
        """Tell the peer this side will not serve it (``error``'s code and message) and fail the
        connection; the caller writes ``data_to_send`` and closes."""
        self._queue([_REFUSE, error.code, str(error)])
        self._state = State.FAILED
        self._error = error

    def _ready_event(self, kind: object, message: list[Any]) -> Event:
        size = len(message)
        if kind == _ITEM and size == 3 and type(message[1]) is int:
            self.streams.item_received(message[1])
            return StreamItem(message[1], message[2])
        if kind == _CREDIT and size == 3 and type(message[1]) is int:
            if self.streams.credit_received(message[1], message[2]):
                return StreamCredit(message[1], message[2])
            return StreamCredit(message[1], 0)  # the stream ended here: nothing to wake
        if kind == _OPEN and size == 5 and type(message[1]) is int and type(message[2]) is str:
            self.streams.open_received(message[1], message[4])
            return StreamOpen(message[1], message[2], message[3], message[4])
        if kind == _END and size == 3 and type(message[1]) is int:
            self.streams.ended(message[1], "END")
            return StreamEnd(message[1], message[2])
        if kind == _FAIL and size == 5:
            _, sid, code, text, detail = message
            if type(sid) is int and type(code) is str and type(text) is str:
                self.streams.ended(sid, "FAIL")
                return StreamFailed(sid, code, text, detail)
        if kind == _REQUEST and size == 4:
            _, rid, op, body = message
            if type(rid) is int and type(op) is str:
                return Request(rid, op, body)
        elif kind == _RESPONSE and size == 3:
            _, rid, body = message
            if type(rid) is int:
                return Response(rid, body)
        elif kind == _NOTIFY and size == 3:
            _, op, body = message
            if type(op) is str:
                return Notify(op, body)
        elif kind == _ERROR and size == 5:
            _, rid, code, text, detail = message
            if type(rid) is int and type(code) is str and type(text) is str:
                return ErrorResponse(rid, code, text, detail)
        elif kind == _REFUSE:
            code, text = _refusal(message)
            self._peer_refused = True
            raise error_from_wire(code, f"peer {self.peer_name!r} closed the connection: {text}")
        raise ProtocolError(f"malformed {_kind_name(kind)} message: {message!r:.200}")

    # -- handshake --------------------------------------------------------------------------

    def initiate(self) -> list[bytes | memoryview]:
        """Start the handshake (initiator only); returns the bytes to send first."""
        if self.role != "initiator" or self._state is not State.IDLE:
            raise LocalProtocolError(f"initiate() on an {self.role} in state {self._state.value}")
        self._queue([_HELLO, self._hello_fields()])
        self._state = State.SENT_HELLO
        return self.data_to_send()

    def _hello_fields(self) -> dict[str, Any]:
        return {
            "version": PROTOCOL_VERSION,
            "role": self.peer_kind,
            "name": self.name,
            "nonce": self._nonce,
            "token": self._has_token,
            "limits": [getattr(self.limits, name) for name in _ANNOUNCED],
            "streams": True,
        }

    def _handshake_event(self, kind: object, message: list[Any]) -> Event | None:
        if type(kind) is not int or kind not in _EXPECTED[self._state]:
            if type(kind) is int and kind in _EXPECTED[State.READY]:
                raise ProtocolError(f"peer sent {_kind_name(kind)} before the handshake completed")
            raise ProtocolError(
                f"peer sent {_kind_name(kind)} during the handshake (state {self._state.value})"
            )
        if kind == _REFUSE:
            code, text = _refusal(message)
            self._peer_refused = True
            raise error_from_wire(code, f"peer refused the connection: {text}")
        if kind == _HELLO:
            self._receive_hello(message)
            return None
        if kind == _AUTH:
            proof = message[1] if len(message) == 2 else None
            expected = _proof(self._key, b"initiator", self._nonce, self._peer_nonce)
            if not isinstance(proof, bytes) or not hmac.compare_digest(proof, expected):
                self._refuse_auth()
            self._queue([_READY])
        return self._complete()

    def _receive_hello(self, message: list[Any]) -> None:
        fields = message[1] if len(message) == 2 else None
        if not isinstance(fields, dict):
            raise ProtocolError(f"malformed HELLO: {message!r:.200}")
        version = fields.get("version")
        if version != PROTOCOL_VERSION:
            text = (
                f"peer {fields.get('name')!r} speaks protocol version {version!r}, this side "
                f"speaks {PROTOCOL_VERSION}; run the same compass version on both"
            )
            self._queue([_REFUSE, VersionMismatch.code, text])
            raise VersionMismatch(text)
        name, role, nonce = fields.get("name"), fields.get("role"), fields.get("nonce")
        if not (
            isinstance(name, str)
            and len(name) <= _MAX_NAME_CHARS
            and isinstance(role, str)
            and role in PEER_ROLES
            and isinstance(nonce, bytes)
            and len(nonce) == _NONCE_BYTES
        ):
            raise ProtocolError(f"malformed HELLO fields: {fields!r:.200}")
        self.peer_name, self.peer_role, self._peer_nonce = name, str(role), nonce
        self._peer_has_token = bool(fields.get("token"))
        self.peer_streams = fields.get("streams") is True
        self.send_limits = _peer_limits(self.limits, fields.get("limits"))
        if self.role == "acceptor":
            fields = self._hello_fields()
            fields["proof"] = _proof(self._key, b"acceptor", nonce, self._nonce)
            self._queue([_HELLO, fields])
            self._state = State.WAIT_AUTH
            return
        proof = fields.get("proof")
        expected = _proof(self._key, b"acceptor", self._nonce, nonce)
        if not isinstance(proof, bytes) or not hmac.compare_digest(proof, expected):
            self._refuse_auth()
        self._queue([_AUTH, _proof(self._key, b"initiator", nonce, self._nonce)])
        self._state = State.SENT_AUTH

    def _refuse_auth(self) -> None:
        peer = repr(self.peer_name)
        if self._has_token and not self._peer_has_token:
            text = f"peer {peer} has no cluster token but this side requires one"
        elif self._peer_has_token and not self._has_token:
            text = f"peer {peer} requires a cluster token and this side has none"
        else:
            text = f"peer {peer} holds a different cluster token"
        self._queue([_REFUSE, AuthenticationError.code, f"authentication failed: {text}"])
        raise AuthenticationError(f"authentication failed: {text}")

    def _complete(self) -> HandshakeComplete:
        self._state = State.READY
        self._decoder.limits = self.limits
        self._decoder.set_staging_bytes(STAGING_BYTES)
        return HandshakeComplete(self.peer_name, self.peer_role)

    # -- output -----------------------------------------------------------------------------

    def data_to_send(self) -> list[bytes | memoryview]:
        """Take the bytes queued so far (write them in order)."""
        out = self._out
        self._out = []
        return out

    def send_request(self, op: str, body: Any = None) -> int:
        """Queue a request; returns its id (unique on this connection)."""
        if self._state is not _STATE_READY or type(op) is not str:
            self._require_ready(op)
        request_id = self._next_id
        self._next_id = request_id + 1
        self._queue([_REQUEST, request_id, op, body], type(body) in _FLAT)
        return request_id

    def send_response(self, request_id: int, body: Any = None) -> None:
        """Queue the answer to the peer's request ``request_id``."""
        if self._state is not _STATE_READY:
            self._require_ready()
        self._queue([_RESPONSE, request_id, body], type(body) in _FLAT)

    def send_error(self, request_id: int, code: str, message: str, detail: Any = None) -> None:
        """Queue a failure answer to the peer's request ``request_id``.

        A ``detail`` that cannot be encoded is sent as its ``repr`` rather than lost.
        """
        self._require_ready()
        try:
            self._queue([_ERROR, request_id, code, message, detail])
        except ProtocolError:
            self._queue([_ERROR, request_id, code, message, repr(detail)[:4096]])

    def send_notify(self, op: str, body: Any = None) -> None:
        """Queue a one-way message."""
        if self._state is not _STATE_READY or type(op) is not str:
            self._require_ready(op)
        self._queue([_NOTIFY, op, body], type(body) in _FLAT)

    # -- streams (see compass.wire.flow) ------------------------------------------------------

    def send_stream_open(self, op: str, body: Any, window: int) -> int:
        """Open a stream of ``op`` at the peer with credit for ``window`` items; returns its id
        (a request id). Raises :class:`VersionMismatch` if the peer speaks no streams."""
        self._require_ready(op)
        check_window(window)
        if not self.peer_streams:
            raise VersionMismatch(
                f"peer {self.peer_name!r} runs a compass without streams; upgrade it to open "
                f"stream {op!r}"
            )
        stream_id = self._next_id
        self._queue([_OPEN, stream_id, op, body, window], type(body) in _FLAT)
        self._next_id = stream_id + 1
        self.streams.opened(stream_id, window)
        return stream_id

    def send_credit(self, stream_id: int, n: int) -> None:
        """Grant the producer of our stream ``stream_id`` ``n`` more items."""
        self._require_ready()
        self.streams.grant(stream_id, n)
        self._queue([_CREDIT, stream_id, n], True)

    def send_stream_item(self, stream_id: int, body: Any) -> None:
        """Queue the next item of the peer's stream ``stream_id``; uses one credit
        (:class:`~compass.wire.flow.StreamMisuse` if none is left)."""
        self._require_ready()
        windows = self.streams
        windows.item_sent(stream_id)
        try:
            self._queue([_ITEM, stream_id, body], type(body) in _FLAT)
        except BaseException:
            windows.refund(stream_id)
            raise

    def send_stream_end(self, stream_id: int, body: Any = None) -> None:
        """End the peer's stream ``stream_id`` with final ``body``."""
        self._require_ready()
        self._queue([_END, stream_id, body], type(body) in _FLAT)
        self.streams.finished(stream_id)

    def send_stream_error(
        self, stream_id: int, code: str, message: str, detail: Any = None
    ) -> None:
        """End the peer's stream ``stream_id`` with an error (an unencodable ``detail`` is sent
        as its ``repr``)."""
        self._require_ready()
        try:
            self._queue([_FAIL, stream_id, code, message, detail])
        except ProtocolError:
            self._queue([_FAIL, stream_id, code, message, repr(detail)[:4096]])
        self.streams.finished(stream_id)

    def _require_ready(self, op: object = "") -> None:
        if self._state is not State.READY:
            raise LocalProtocolError(f"cannot send in state {self._state.value}")
        if type(op) is not str:
            raise LocalProtocolError(f"op must be a str, got {type(op).__name__}")

    def _queue(self, message: list[Any], flat: bool = False) -> None:
        """Encode and frame ``message``; ``flat``: its body holds no container (depth known)."""
        if flat:
            # a flat body can produce no out-of-band buffer: pack directly; on any failure the
            # full encoder runs again to raise its typed error
            try:
                header: bytes = self._pack(message)  # type: ignore[misc]
            except Exception:
                header, buffers = self._encoder().encode(message)
            else:
                buffers = _NO_BUFFERS
        else:
            header, buffers = self._encoder().encode(message)
        # checked here, against the peer's limits too, so that a message the peer would refuse
        # fails on this side, with the connection intact, instead of being written
        limits = self.send_limits
        size = len(header)
        if size > limits.max_header_bytes:
            raise ProtocolError(
                f"message header of {size} bytes exceeds "
                f"{self._whose('max_header_bytes')}={limits.max_header_bytes}"
            )
        if not flat and (size > limits.max_depth or size > limits.max_elements):
            try:
                check_structure(header, limits.max_depth, limits.max_elements)
            except ProtocolError as exc:
                raise ProtocolError(f"cannot send: {exc}") from None
        if not buffers:
            if PREFIX_BYTES + size > limits.max_frame_bytes:
                raise ProtocolError(
                    f"frame of {PREFIX_BYTES + size} bytes exceeds "
                    f"{self._whose('max_frame_bytes')}={limits.max_frame_bytes}"
                )
            self._out.append(_PREFIX.pack(PREFIX_BYTES + size, size, 0) + header)
            return
        if len(buffers) > limits.max_buffers:
            raise ProtocolError(
                f"message with {len(buffers)} arrays exceeds "
                f"{self._whose('max_buffers')}={limits.max_buffers}"
            )
        lengths = [b.nbytes for b in buffers]
        total = PREFIX_BYTES + 8 * len(buffers) + size + padded_size(lengths)
        if total > limits.max_frame_bytes:
            raise ProtocolError(
                f"frame of {total} bytes exceeds "
                f"{self._whose('max_frame_bytes')}={limits.max_frame_bytes}"
            )
        self._out.extend(encode_frame(header, buffers))

    def _encoder(self) -> Encoder:
        encoder = self._encoder_made
        if encoder is None:
            encoder = self._encoder_made = Encoder()
            self._pack = encoder.packer.pack
        return encoder

    def _whose(self, name: str) -> str:
        """``name``, saying so when the limit is the peer's rather than this side's."""
        if getattr(self.send_limits, name) < getattr(self.limits, name):
            return f"the peer's {name}"
        return name


def _refusal(message: list[Any]) -> tuple[str | None, str]:
    """``(code, text)`` of a REFUSE message, whatever the peer put in it."""
    code, text = [*message, None, None][1:3]
    return (code if type(code) is str else None), (text if type(text) is str else f"{text!r:.200}")


def _kind_name(kind: object) -> str:
    try:
        return MessageKind(kind).name  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return f"unknown message kind {kind!r:.20}"
