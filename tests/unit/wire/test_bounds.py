"""Decoding cost bounded by what was received, and limits reported to the sender (sans-IO)."""

from __future__ import annotations

import struct
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest

from compass.config import Limits
from compass.errors import ConfigError, ProtocolError, WorkerUnavailable
from compass.wire.codec import check_structure, decode_message
from compass.wire.frames import PREFIX, STAGING_BYTES, FrameDecoder
from compass.wire.protocol import (
    HANDSHAKE_STAGING_BYTES,
    Connection,
    ErrorResponse,
    Event,
    Request,
    Response,
)

MiB = 1 << 20


def make(role: Any, limits: Limits = Limits()) -> Connection:
    kind = "client" if role == "initiator" else "worker"
    return Connection(role, token="secret", name=role[:3], peer_kind=kind, limits=limits)


def join(pieces: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def events(conn: Connection, data: bytes = b"") -> list[Event]:
    if data:
        conn.receive_data(data)
    out: list[Event] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def ready_pair(
    initiator_limits: Limits = Limits(), acceptor_limits: Limits = Limits()
) -> tuple[Connection, Connection]:
    initiator, acceptor = make("initiator", initiator_limits), make("acceptor", acceptor_limits)
    events(acceptor, join(initiator.initiate()))
    events(initiator, join(acceptor.data_to_send()))
    events(acceptor, join(initiator.data_to_send()))
    events(initiator, join(acceptor.data_to_send()))
    return initiator, acceptor


def frame(header: bytes) -> bytes:
    return PREFIX.pack(PREFIX.size + len(header), len(header), 0) + header


def request_of_empty_arrays(nbytes: int, request_id: int = 7) -> bytes:
    """The header of a REQUEST whose body is an array of empty arrays, ``nbytes`` long: each
    is one byte on the wire and about 80 bytes of Python list once decoded."""
    head: bytes = b"\x94\x04" + msgpack.packb(request_id) + msgpack.packb("echo")
    count = nbytes - len(head) - 5
    return head + b"\xdd" + struct.pack(">I", count) + b"\x90" * count


def request_of_array_descriptors(nbytes: int) -> bytes:
    """A REQUEST whose body is ``nbytes`` of empty-ndarray descriptors (ext type 1)."""
    ext: bytes = msgpack.packb(msgpack.ExtType(1, msgpack.packb([0, "uint8", [0]])))
    head = b"\x94\x04\x07\xa4echo"
    count = (nbytes - len(head) - 5) // len(ext)
    return head + b"\xdd" + struct.pack(">I", count) + ext * count


def feed_in_reads(decoder_owner: Connection, data: bytes, read: int = 64 * 1024) -> None:
    """Feed ``data`` the way a transport does, a read at a time, taking events after each."""
    for start in range(0, len(data), read):
        decoder_owner.receive_data(data[start : start + read])
        events(decoder_owner)


def peak_allocated(action: Any) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        action()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_4_mib_frame_of_empty_arrays_is_refused_at_its_prefix():
    _, acceptor = ready_pair()
    data = frame(request_of_empty_arrays(4 * MiB))

    def receive() -> None:
        with pytest.raises(ProtocolError, match="exceeds max_header_bytes=1048576"):
            feed_in_reads(acceptor, data)

    # before these limits, decoding it allocated 76 times its size and took seconds
    assert peak_allocated(receive) < len(data) // 8


@pytest.mark.parametrize(
    ("build", "nbytes", "reason"),
    [
        (request_of_empty_arrays, MiB - 64, "max_elements=131072"),
        (request_of_array_descriptors, 2 * MiB, "max_elements=131072"),
        # fewer descriptors than the limit: the first one is refused (no buffer to describe)
        (request_of_array_descriptors, MiB - 64, "carries no buffers"),
    ],
)
def test_a_header_of_too_many_objects_is_refused_before_it_is_unpacked(build, nbytes, reason):
    header = build(nbytes)
    limits = Limits(max_header_bytes=4 * MiB)  # the element count, not the size, must catch it
    errors: list[ProtocolError] = []

    def decode() -> None:
        try:
            decode_message(header, [], limits)
        except ProtocolError as exc:
            errors.append(exc)

    peak = peak_allocated(decode)
    assert len(errors) == 1 and reason in str(errors[0])
    assert peak < 2 * len(header)


def test_through_the_connection_the_same_header_costs_a_few_times_its_size():
    _, acceptor = ready_pair()
    data = frame(request_of_empty_arrays(MiB - 64))

    def receive() -> None:
        with pytest.raises(ProtocolError, match="max_elements=131072"):
            feed_in_reads(acceptor, data)

    # staging grows (by doubling) to hold the header, then one copy of it is decoded
    assert peak_allocated(receive) < 5 * len(data)


def test_the_walk_stops_at_the_element_limit_whatever_the_header_declares():
    header = b"\xdd\xff\xff\xff\xff" + b"\xc0" * 5000  # announces 4 billion objects
    with pytest.raises(ProtocolError, match="max_elements=1000"):
        check_structure(header, 64, 1000)
    # a header within both limits passes, however many container bytes it holds
    check_structure(msgpack.packb([[1, 2]] * 300), 64, 1000)
    with pytest.raises(ProtocolError, match="max_depth=64"):
        check_structure(b"\x91" * 100 + b"\xc0", 64, 1000)


def test_many_small_objects_within_the_limit_still_decode():
    body = list(range(100_000))
    conn_i, conn_a = ready_pair()
    conn_i.send_request("echo", body)
    (request,) = events(conn_a, join(conn_i.data_to_send()))
    assert isinstance(request, Request) and request.body == body


def test_a_sender_learns_the_receivers_limits_and_refuses_locally():
    small = Limits(max_frame_bytes=MiB, max_header_bytes=64 * 1024, max_elements=1000)
    initiator, acceptor = ready_pair(initiator_limits=small)
    assert acceptor.send_limits.max_frame_bytes == MiB
    assert initiator.send_limits == small  # the acceptor's defaults are looser: own ones hold
    with pytest.raises(ProtocolError, match="the peer's max_header_bytes=65536"):
        acceptor.send_response(1, "x" * 100_000)
    with pytest.raises(ProtocolError, match="max_elements=1000"):
        acceptor.send_response(1, list(range(2000)))
    assert acceptor.data_to_send() == []  # nothing was queued: the connection is intact
    acceptor.send_response(1, "fits")
    assert events(initiator, join(acceptor.data_to_send())) == [Response(1, "fits")]


def test_an_oversized_request_is_answered_with_the_limit_then_refused():
    tight = Limits(max_frame_bytes=MiB, max_header_bytes=64 * 1024)
    initiator, acceptor = ready_pair(acceptor_limits=tight)
    initiator.send_limits = Limits()  # a sender that ignores what the acceptor announced
    request_id = initiator.send_request("echo", np.zeros(2 * MiB, dtype=np.uint8))
    with pytest.raises(ProtocolError, match="max_frame_bytes=1048576"):
        feed_in_reads(acceptor, join(initiator.data_to_send()))
    reply = join(acceptor.data_to_send())
    initiator.receive_data(reply)
    answer = initiator.next_event()
    assert isinstance(answer, ErrorResponse) and answer.id == request_id
    assert answer.code == "protocol" and "max_frame_bytes=1048576" in answer.message
    with pytest.raises(ProtocolError, match=r"closed the connection: frame of .* max_frame_bytes"):
        initiator.next_event()


def test_a_refused_notify_gets_the_reason_without_an_error_response():
    initiator, acceptor = ready_pair()
    initiator.receive_data(frame(b"\x93\x07\xa4note" + b"\x91" * 200 + b"\xc0"))
    with pytest.raises(ProtocolError, match="max_depth"):
        events(initiator)
    acceptor.receive_data(join(initiator.data_to_send()))
    with pytest.raises(ProtocolError, match=r"peer 'ini' closed the connection: .*max_depth"):
        events(acceptor)
    assert acceptor.data_to_send() == []  # a REFUSE is not answered with another


def test_refuse_tells_a_peer_in_the_handshake_why():
    initiator, acceptor = make("initiator"), make("acceptor")
    acceptor.refuse(WorkerUnavailable("holds max_connections=3 connections"))
    initiator.initiate()
    with pytest.raises(WorkerUnavailable, match="max_connections=3"):
        events(initiator, join(acceptor.data_to_send()))


def test_staging_is_small_until_the_peer_authenticates():
    initiator, acceptor = make("initiator"), make("acceptor")
    assert acceptor.decoder.staging_bytes == HANDSHAKE_STAGING_BYTES
    events(acceptor, join(initiator.initiate()))
    events(initiator, join(acceptor.data_to_send()))
    assert acceptor.decoder.staging_bytes == HANDSHAKE_STAGING_BYTES
    events(acceptor, join(initiator.data_to_send()))
    assert acceptor.decoder.staging_bytes == STAGING_BYTES


def test_staging_grows_only_as_a_frame_needs_and_shrinks_back():
    decoder = FrameDecoder(Limits(), staging_bytes=4096)
    header = msgpack.packb("x" * 40_000)
    data = frame(header)
    decoder.receive_data(data[:5000])
    assert decoder.next_frame() is None
    assert decoder.staging_bytes <= 8192  # grown by what arrived, not by what was announced
    decoder.receive_data(data[5000:])
    got = decoder.next_frame()
    assert got is not None and bytes(got.header) == header
    assert decoder.staging_bytes == 4096
    decoder.release()
    assert decoder.staging_bytes == 0
    with pytest.raises(ProtocolError, match="closed"):
        decoder.next_frame()


@pytest.mark.parametrize("name", ["max_elements", "max_connections", "max_unauthenticated"])
def test_new_limits_are_validated(name):
    with pytest.raises(ConfigError, match=f"Limits.{name} must be > 0"):
        Limits(**{name: 0})
