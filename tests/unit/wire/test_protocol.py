"""The sans-IO connection: handshake outcomes, message flow, peer faults, local misuse."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compass.config import PROTOCOL_VERSION, Limits
from compass.errors import (
    AuthenticationError,
    CompassError,
    ConfigError,
    ProtocolError,
    VersionMismatch,
)
from compass.wire.codec import encode_message
from compass.wire.frames import encode_frame
from compass.wire.protocol import (
    HANDSHAKE_MAX_FRAME_BYTES,
    Connection,
    ErrorResponse,
    Event,
    HandshakeComplete,
    LocalProtocolError,
    MessageKind,
    Notify,
    Request,
    Response,
    State,
)

LIMITS = Limits()


def make(
    role: Any,
    token: str | None = "secret",
    name: str | None = None,
    kind: str | None = None,
    limits: Limits = LIMITS,
) -> Connection:
    return Connection(
        role,
        token=token,
        name=name or role[0] + "1",
        peer_kind=kind or ("client" if role == "initiator" else "worker"),
        limits=limits,
    )


def join(pieces: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def events(conn: Connection, data: bytes = b"") -> list[Event]:
    if data:
        conn.receive_data(data)
    out: list[Event] = []
    for _ in range(10_000):
        event = conn.next_event()
        if event is None:
            return out
        out.append(event)
    raise AssertionError("connection never asked for more data")


def handshake(initiator: Connection, acceptor: Connection) -> tuple[list[Event], list[Event]]:
    """Shuttle bytes until both sides are ready; returns each side's events."""
    got_i: list[Event] = []
    got_a: list[Event] = []
    got_a += events(acceptor, join(initiator.initiate()))
    got_i += events(initiator, join(acceptor.data_to_send()))
    got_a += events(acceptor, join(initiator.data_to_send()))
    got_i += events(initiator, join(acceptor.data_to_send()))
    return got_i, got_a


def raw_frame(message: Any) -> bytes:
    header, buffers = encode_message(message)
    return join(encode_frame(header, buffers))


def ready_pair() -> tuple[Connection, Connection]:
    initiator, acceptor = make("initiator"), make("acceptor")
    handshake(initiator, acceptor)
    return initiator, acceptor


@pytest.mark.parametrize("token", ["secret", "", None, "päss wörd"])
def test_matching_tokens_complete_the_handshake(token):
    initiator = make("initiator", token=token, name="client-7")
    acceptor = make("acceptor", token=token, name="w3")
    got_i, got_a = handshake(initiator, acceptor)
    assert got_i == [HandshakeComplete(peer_name="w3", peer_role="worker")]
    assert got_a == [HandshakeComplete(peer_name="client-7", peer_role="client")]
    assert initiator.state is acceptor.state is State.READY


def test_wrong_token_fails_on_both_sides():
    initiator, acceptor = make("initiator", token="a"), make("acceptor", token="b")
    assert events(acceptor, join(initiator.initiate())) == []
    with pytest.raises(AuthenticationError, match="different cluster token"):
        events(initiator, join(acceptor.data_to_send()))
    refusal = join(initiator.data_to_send())
    assert refusal, "the initiator must tell the acceptor why it closes"
    with pytest.raises(AuthenticationError, match="different cluster token"):
        events(acceptor, refusal)
    assert initiator.state is acceptor.state is State.FAILED


@pytest.mark.parametrize(
    ("token_i", "token_a", "message_i"),
    [
        (None, "secret", "requires a cluster token and this side has none"),
        ("secret", None, "has no cluster token but this side requires one"),
    ],
)
def test_missing_token_fails_on_both_sides(token_i, token_a, message_i):
    initiator, acceptor = make("initiator", token=token_i), make("acceptor", token=token_a)
    events(acceptor, join(initiator.initiate()))
    with pytest.raises(AuthenticationError, match=message_i):
        events(initiator, join(acceptor.data_to_send()))
    with pytest.raises(AuthenticationError, match="token"):
        events(acceptor, join(initiator.data_to_send()))


def test_initiator_with_a_forged_auth_is_refused_by_the_acceptor():
    initiator, acceptor = make("initiator"), make("acceptor")
    events(acceptor, join(initiator.initiate()))
    events(initiator, join(acceptor.data_to_send()))
    initiator.data_to_send()  # drop the genuine AUTH
    with pytest.raises(AuthenticationError):
        events(acceptor, raw_frame([MessageKind.AUTH, b"\x00" * 32]))
    refusal = join(acceptor.data_to_send())
    fresh = make("initiator")
    fresh.initiate()
    fresh._state = State.SENT_AUTH
    with pytest.raises(AuthenticationError, match="peer refused the connection"):
        events(fresh, refusal)


def hello(version: int = PROTOCOL_VERSION, **fields: Any) -> bytes:
    base = {"version": version, "role": "client", "name": "x", "nonce": b"n" * 32}
    base.update(fields)
    return raw_frame([MessageKind.HELLO, base])


def test_version_mismatch_fails_on_both_sides():
    acceptor = make("acceptor")
    with pytest.raises(VersionMismatch, match=f"version 99, this side speaks {PROTOCOL_VERSION}"):
        events(acceptor, hello(version=99))
    refusal = join(acceptor.data_to_send())
    initiator = make("initiator")
    initiator.initiate()
    with pytest.raises(VersionMismatch, match="peer refused the connection"):
        events(initiator, refusal)


def test_initiator_checks_the_acceptor_version_too():
    initiator = make("initiator")
    initiator.initiate()
    with pytest.raises(VersionMismatch):
        events(initiator, hello(version=PROTOCOL_VERSION + 1, proof=b"p" * 32))


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ([MessageKind.REQUEST, 1, "ping", None], "REQUEST before the handshake completed"),
        ([MessageKind.NOTIFY, "gossip", None], "NOTIFY before the handshake completed"),
        ([MessageKind.READY], "READY during the handshake"),
        ([42], "unknown message kind 42"),
        ([[4], 1], "unknown message kind \\[4\\]"),
        ({"version": 1}, "not a non-empty array"),
        ([], "not a non-empty array"),
        ([MessageKind.HELLO, "not a map"], "malformed HELLO"),
    ],
)
def test_anything_but_hello_first_is_a_protocol_error(message, match):
    acceptor = make("acceptor")
    with pytest.raises(ProtocolError, match=match):
        events(acceptor, raw_frame(message))
    # failed for good, and nothing queued but (at most) a refusal
    with pytest.raises(ProtocolError):
        acceptor.next_event()


@pytest.mark.parametrize(
    "fields",
    [
        {"role": "admin"},
        {"role": ["worker"]},
        {"name": 5},
        {"nonce": b"short"},
        {"nonce": "x" * 32},
    ],
)
def test_malformed_hello_fields_are_rejected(fields):
    with pytest.raises(ProtocolError, match="malformed HELLO"):
        events(make("acceptor"), hello(**fields))


def test_unauthenticated_peer_cannot_announce_a_large_frame():
    acceptor = make("acceptor")
    with pytest.raises(ProtocolError, match=f"max_frame_bytes={HANDSHAKE_MAX_FRAME_BYTES}"):
        events(acceptor, raw_frame([MessageKind.HELLO, {"pad": b"x" * 100_000}]))


def test_messages_flow_both_ways_after_the_handshake():
    initiator, acceptor = ready_pair()
    first = initiator.send_request("ping", {"n": 1})
    second = initiator.send_request("ping", [2])
    initiator.send_notify("gossip", "hi")
    assert second == first + 1
    got = events(acceptor, join(initiator.data_to_send()))
    assert got == [
        Request(first, "ping", {"n": 1}),
        Request(second, "ping", [2]),
        Notify("gossip", "hi"),
    ]
    acceptor.send_response(second, "pong")
    acceptor.send_error(first, "unknown_workflow", "no such workflow", {"w": "x"})
    back = acceptor.send_request("reverse", None)
    got = events(initiator, join(acceptor.data_to_send()))
    assert got == [
        Response(second, "pong"),
        ErrorResponse(first, "unknown_workflow", "no such workflow", {"w": "x"}),
        Request(back, "reverse", None),
    ]


def test_arrays_cross_a_connection_split_at_every_byte():
    initiator, _ = ready_pair()
    array = np.arange(30, dtype=np.float32).reshape(5, 6)
    tensor = torch.arange(7, dtype=torch.bfloat16)
    initiator.send_notify("arrays", {"a": array, "t": tensor})
    stream = join(initiator.data_to_send())
    for cut in range(len(stream) + 1):
        receiver = make("acceptor")
        sender = make("initiator")
        handshake(sender, receiver)
        got = events(receiver, stream[:cut]) + events(receiver, stream[cut:])
        assert len(got) == 1, cut
        assert isinstance(got[0], Notify)
        body = got[0].body
        np.testing.assert_array_equal(body["a"], array)
        assert torch.equal(body["t"], tensor)


def test_undecodable_error_detail_is_sent_as_text():
    initiator, acceptor = ready_pair()
    rid = initiator.send_request("x")
    events(acceptor, join(initiator.data_to_send()))
    acceptor.send_error(rid, "internal", "boom", detail={"obj": object()})
    (event,) = events(initiator, join(acceptor.data_to_send()))
    assert isinstance(event, ErrorResponse)
    assert "object object" in event.detail


@pytest.mark.parametrize(
    "message",
    [
        [MessageKind.REQUEST, "1", "op", None],
        [MessageKind.REQUEST, 1, 2, None],
        [MessageKind.REQUEST, 1, "op"],
        [MessageKind.RESPONSE, None, 1],
        [MessageKind.ERROR, 1, 2, "m", None],
        [MessageKind.NOTIFY, b"op", None],
        [MessageKind.HELLO, {}],
        [MessageKind.AUTH, b"x"],
    ],
)
def test_malformed_messages_after_the_handshake_are_protocol_errors(message):
    _, acceptor = ready_pair()
    with pytest.raises(ProtocolError):
        events(acceptor, raw_frame(message))


def test_sending_limits_are_checked_locally_and_queue_nothing():
    limits = Limits(max_frame_bytes=4096, max_header_bytes=1024, max_buffers=2, max_depth=5)
    initiator, acceptor = make("initiator", limits=limits), make("acceptor", limits=limits)
    handshake(initiator, acceptor)
    cases = [
        (b"x" * 2000, "max_header_bytes=1024"),
        ([np.zeros(1)] * 3, "max_buffers=2"),
        (np.zeros(1000), "max_frame_bytes=4096"),
        ([[[[[[1]]]]]], "max_depth=5"),
        ({1, 2}, "builtins.set"),
    ]
    for body, match in cases:
        with pytest.raises(ProtocolError, match=match):
            initiator.send_notify("op", body)
        assert initiator.data_to_send() == []
    initiator.send_notify("op", [[[[1]]]])
    assert events(acceptor, join(initiator.data_to_send())) == [Notify("op", [[[[1]]]])]


def test_local_misuse_raises_local_errors():
    initiator = make("initiator")
    with pytest.raises(LocalProtocolError):
        initiator.send_request("ping")
    with pytest.raises(LocalProtocolError):
        make("acceptor").initiate()
    initiator.initiate()
    with pytest.raises(LocalProtocolError):
        initiator.initiate()
    a, _ = ready_pair()
    with pytest.raises(LocalProtocolError, match="op must be a str"):
        a.send_notify(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        make("initiator", kind="admin")
    with pytest.raises(ConfigError):
        Connection("both", token=None, name="x", peer_kind="worker", limits=LIMITS)  # type: ignore[arg-type]


@given(st.binary(min_size=1, max_size=500), st.booleans())
@settings(max_examples=300, deadline=None)
def test_random_bytes_only_raise_protocol_errors(data, as_acceptor):
    conn = make("acceptor")
    if not as_acceptor:
        conn = make("initiator")
        conn.initiate()
    with contextlib.suppress(ProtocolError, AuthenticationError):
        events(conn, data)


def test_random_bytes_after_the_handshake_fail_the_connection():
    _, acceptor = ready_pair()
    stream = msgpack.packb([9, 9]) * 100
    with pytest.raises(ProtocolError):
        events(acceptor, stream)


def test_a_held_tensor_keeps_its_receive_buffer_from_reuse():
    initiator, acceptor = ready_pair()
    ones = torch.ones(1 << 20, dtype=torch.bfloat16)  # 2 MiB: received into its own buffer
    initiator.send_notify("t", ones)
    (first,) = events(acceptor, join(initiator.data_to_send()))
    assert isinstance(first, Notify)
    held = first.body[5:10]  # a torch view: only the tensor chain keeps the memory alive
    del first
    initiator.send_notify("t", torch.zeros(1 << 20, dtype=torch.bfloat16))
    (second,) = events(acceptor, join(initiator.data_to_send()))
    assert isinstance(second, Notify)
    assert torch.equal(held, torch.ones(5, dtype=torch.bfloat16))
    assert acceptor.decoder.payload_buffers_reused == 0
    del held, second
    initiator.send_notify("t", ones)
    (third,) = events(acceptor, join(initiator.data_to_send()))
    assert isinstance(third, Notify)
    assert acceptor.decoder.payload_buffers_reused == 1
    assert torch.equal(third.body, ones)


messages = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=8) | st.binary(max_size=40),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=6), children)
    ),
    max_leaves=12,
)


# arrays that start with a real message kind reach the per-kind field checks
enveloped = st.builds(lambda kind, rest: [kind, *rest], st.integers(0, 8), st.lists(messages))


@given(st.lists(messages | enveloped, min_size=1, max_size=4), st.booleans())
@settings(max_examples=300, deadline=None)
def test_well_framed_nonsense_only_raises_peer_errors(bodies, after_handshake):
    conn = make("acceptor")
    if after_handshake:
        _, conn = ready_pair()
    stream = b"".join(raw_frame(body) for body in bodies)
    # a REFUSE raises the typed error the peer named; anything else is a ProtocolError
    with contextlib.suppress(CompassError):
        events(conn, stream)
