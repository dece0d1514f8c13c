"""The framer, without an event loop: round trips, split feeding, limits, buffer reuse."""

from __future__ import annotations

import contextlib
import struct
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass.config import Limits
from compass.errors import ProtocolError
from compass.wire.frames import ALIGN, PREFIX_BYTES, Frame, FrameDecoder, encode_frame

LIMITS = Limits()


def wire_bytes(header: bytes, buffers: list[bytes]) -> bytes:
    return b"".join(bytes(p) for p in encode_frame(header, [memoryview(b) for b in buffers]))


def drain(decoder: FrameDecoder) -> list[Frame]:
    frames: list[Frame] = []
    for _ in range(10_000):
        frame = decoder.next_frame()
        if frame is None:
            return frames
        frames.append(frame)
    raise AssertionError("decoder never asked for more data")


def as_tuple(frame: Frame) -> tuple[bytes, list[bytes]]:
    return bytes(frame.header), [bytes(b) for b in frame.buffers]


frame_parts = st.tuples(
    st.binary(min_size=1, max_size=300),
    st.lists(st.binary(max_size=200), max_size=5),
)


@given(frames=st.lists(frame_parts, min_size=1, max_size=6), data=st.data())
@settings(max_examples=150, deadline=None)
def test_frames_round_trip_in_random_chunks(frames, data):
    stream = b"".join(wire_bytes(h, bufs) for h, bufs in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = FrameDecoder(LIMITS)
    got: list[Frame] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        decoder.receive_data(stream[start:cut])
        got.extend(drain(decoder))
        start = cut
    assert [as_tuple(f) for f in got] == [(h, bufs) for h, bufs in frames]


def test_frame_split_at_every_byte_boundary():
    header = bytes(range(200))
    buffers = [b"a" * 37, b"", bytes(range(100))]
    stream = wire_bytes(header, buffers)
    assert 300 < len(stream) < 1000
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder(LIMITS)
        decoder.receive_data(stream[:cut])
        first = drain(decoder)
        decoder.receive_data(stream[cut:])
        frames = first + drain(decoder)
        assert [as_tuple(f) for f in frames] == [(header, buffers)], cut


def test_frame_fed_one_byte_at_a_time_through_get_buffer():
    header = b"\x92\x01\x02"
    stream = wire_bytes(header, [b"xyz" * 10]) * 3
    decoder = FrameDecoder(LIMITS)
    frames: list[Frame] = []
    for byte in stream:
        decoder.get_buffer(1)[0] = byte
        decoder.buffer_updated(1)
        frames.extend(drain(decoder))
    assert [as_tuple(f) for f in frames] == [(header, [b"xyz" * 10])] * 3


def test_many_small_frames_in_one_read():
    stream = b"".join(wire_bytes(b"h%d" % i, []) for i in range(1000))
    decoder = FrameDecoder(LIMITS)
    decoder.receive_data(stream)
    assert [bytes(f.header) for f in drain(decoder)] == [b"h%d" % i for i in range(1000)]


def test_frame_without_buffers_is_one_write():
    pieces = encode_frame(b"abc", [])
    assert len(pieces) == 1
    assert isinstance(pieces[0], bytes)


def test_buffers_are_sent_from_caller_memory():
    payload = bytearray(b"q" * 100)
    view = memoryview(payload)
    pieces = encode_frame(b"h", [view])
    assert any(p is view for p in pieces)


def test_buffers_are_aligned_writable_views_of_one_allocation():
    buffers = [b"x" * 3, b"y" * 70_000, b"z" * 5, b""]
    decoder = FrameDecoder(LIMITS)
    decoder.receive_data(wire_bytes(b"h", buffers))
    (frame,) = drain(decoder)
    assert [bytes(b) for b in frame.buffers] == buffers
    owners = {id(b.obj) for b in frame.buffers}
    assert len(owners) == 1
    for buf in frame.buffers:
        assert not buf.readonly
        if buf.nbytes:
            assert np.frombuffer(buf, np.uint8).ctypes.data % ALIGN == 0


def test_large_payload_is_received_straight_into_its_buffer():
    payload = bytes(range(256)) * 8192  # 2 MiB
    stream = wire_bytes(b"head", [payload])
    decoder = FrameDecoder(LIMITS)
    decoder.receive_data(stream[:100])
    assert decoder.next_frame() is None
    target = decoder.get_buffer(1 << 16)
    # the kernel would write straight into the payload buffer, nothing smaller or staged
    assert isinstance(target.obj, np.ndarray)
    assert len(target) == len(stream) - 100
    target[:] = stream[100:]
    decoder.buffer_updated(len(target))
    (frame,) = drain(decoder)
    assert bytes(frame.buffers[0]) == payload
    assert frame.buffers[0].obj is target.obj


def test_large_payload_buffer_is_reused_once_released():
    stream = wire_bytes(b"h", [b"\x01" * (2 << 20)])
    decoder = FrameDecoder(LIMITS)
    decoder.receive_data(stream)
    (frame,) = drain(decoder)
    kept = np.frombuffer(frame.buffers[0], np.uint8)
    del frame
    decoder.receive_data(stream)
    (frame,) = drain(decoder)
    # the first payload is still referenced through `kept`: a new buffer was needed
    assert (decoder.payload_buffers_allocated, decoder.payload_buffers_reused) == (2, 0)
    assert kept[0] == 1
    del frame, kept
    decoder.receive_data(stream)
    (frame,) = drain(decoder)
    assert decoder.payload_buffers_reused == 1
    assert bytes(frame.buffers[0]) == b"\x01" * (2 << 20)


def prefix(total: int, hlen: int, nbuf: int, lengths: tuple[int, ...] = ()) -> bytes:
    return struct.pack(f"<QII{len(lengths)}Q", total, hlen, nbuf, *lengths)


@pytest.mark.parametrize(
    ("data", "limits", "message"),
    [
        (prefix(2**31, 10, 0), Limits(), "frame of 2147483648 bytes exceeds max_frame_bytes="),
        (prefix(2**60, 10, 1), Limits(), "exceeds max_frame_bytes=1073741824"),
        (prefix(5000, 4000, 0), Limits(max_header_bytes=1024), "max_header_bytes=1024"),
        (prefix(5000, 10, 9), Limits(max_buffers=8), "exceeds max_buffers=8"),
        (prefix(100, 0, 0), Limits(), "empty header"),
        (prefix(20, 10, 0), Limits(), "too short"),
        (prefix(PREFIX_BYTES + 8 + 4 + 50, 4, 1, (2**40,)), Limits(), "do not add up"),
        (prefix(PREFIX_BYTES + 8 + 4 + 50, 4, 1, (20,)), Limits(), "do not add up"),
        (prefix(PREFIX_BYTES + 4 + 50, 4, 0), Limits(), "do not add up"),
    ],
)
def test_bad_prefix_is_a_protocol_error(data, limits, message):
    decoder = FrameDecoder(limits)
    decoder.receive_data(data)
    with pytest.raises(ProtocolError, match=message):
        drain(decoder)
    # a failed decoder stays failed
    with pytest.raises(ProtocolError):
        decoder.next_frame()


def test_huge_announcement_is_rejected_before_allocating():
    decoder = FrameDecoder(Limits(max_frame_bytes=1 << 40, max_header_bytes=1 << 30))
    tracemalloc.start()
    try:
        decoder.receive_data(prefix(2**60, 16, 2, (2**59, 2**59)))
        with pytest.raises(ProtocolError, match="max_frame_bytes"):
            drain(decoder)
        decoder2 = FrameDecoder(Limits(max_frame_bytes=1 << 40, max_header_bytes=1 << 30))
        decoder2.receive_data(prefix(PREFIX_BYTES + 2**30 - 1, 2**30 - 1, 0))
        assert decoder2.next_frame() is None
        decoder2.receive_data(b"x" * 1000)
        assert decoder2.next_frame() is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_truncated_frame_waits_for_more_data():
    stream = wire_bytes(b"header", [b"payload"])
    for cut in range(len(stream)):
        decoder = FrameDecoder(LIMITS)
        decoder.receive_data(stream[:cut])
        assert decoder.next_frame() is None


@given(st.binary(min_size=1, max_size=2000))
@settings(max_examples=300, deadline=None)
def test_random_bytes_never_raise_anything_but_protocol_error(data):
    decoder = FrameDecoder(Limits(max_frame_bytes=1 << 20, max_header_bytes=1 << 16))
    tracemalloc.start()
    try:
        decoder.receive_data(data)
        with contextlib.suppress(ProtocolError):
            drain(decoder)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20


def test_limits_can_tighten_between_frames():
    decoder = FrameDecoder(Limits(max_frame_bytes=64, max_header_bytes=64))
    decoder.receive_data(wire_bytes(b"x" * 10, []) + wire_bytes(b"y" * 100, []))
    assert bytes(drain_one(decoder).header) == b"x" * 10
    with pytest.raises(ProtocolError, match="max_frame_bytes=64"):
        decoder.next_frame()
    relaxed = FrameDecoder(Limits(max_frame_bytes=64, max_header_bytes=64))
    relaxed.receive_data(wire_bytes(b"x" * 10, []) + wire_bytes(b"y" * 100, []))
    drain_one(relaxed)
    relaxed.limits = Limits()
    assert bytes(drain_one(relaxed).header) == b"y" * 100


def drain_one(decoder: FrameDecoder) -> Frame:
    frame = decoder.next_frame()
    assert frame is not None
    return frame


def test_large_header_grows_staging_within_limits():
    header = bytes(range(256)) * 4096  # 1 MiB header, beyond the staging area
    stream = wire_bytes(header, [b"tail"]) + wire_bytes(b"small", [])
    decoder = FrameDecoder(LIMITS)
    for start in range(0, len(stream), 70_000):
        decoder.receive_data(stream[start : start + 70_000])
    frames = drain(decoder)
    assert [as_tuple(f) for f in frames] == [(header, [b"tail"]), (b"small", [])]


def test_a_reused_buffer_still_referenced_is_not_reused_again():
    decoder = FrameDecoder(LIMITS)
    size = 2 << 20
    decoder.receive_data(wire_bytes(b"h", [b"\x01" * size]))
    drain(decoder)  # dropped at once: its buffer is free
    decoder.receive_data(wire_bytes(b"h", [b"\x02" * size]))
    (second,) = drain(decoder)
    assert decoder.payload_buffers_reused == 1
    held = np.frombuffer(second.buffers[0], np.uint8)[10:20]  # a view of a view, kept
    del second
    decoder.receive_data(wire_bytes(b"h", [b"\x03" * size]))
    (third,) = drain(decoder)
    assert bytes(third.buffers[0][:1]) == b"\x03"
    assert held.tolist() == [2] * 10, "a live array was overwritten"
    assert decoder.payload_buffers_reused == 1


def test_a_small_complete_frame_past_max_header_bytes_is_refused_on_the_fast_path() -> None:
    # no buffers, whole in the receive buffer, well under max_frame_bytes: only the header
    # bound stops it
    limits = Limits(max_header_bytes=1024)
    decoder = FrameDecoder(limits)
    for data in encode_frame(msgpack.packb("x" * 1100), []):
        decoder.receive_data(bytes(data))
    with pytest.raises(ProtocolError, match="max_header_bytes=1024"):
        decoder.next_header_or_frame()
    fits = FrameDecoder(limits)
    for data in encode_frame(msgpack.packb("x" * 1000), []):
        fits.receive_data(bytes(data))
    assert fits.next_header_or_frame() == msgpack.packb("x" * 1000)
