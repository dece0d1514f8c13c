"""Sans-IO framing: a frame is a msgpack header plus zero or more raw buffers.

Wire layout of one frame (all integers little-endian)::

    u64 total     bytes in the whole frame, this field included
    u32 hlen      header bytes
    u32 nbuf      number of raw buffers
    u64 len[nbuf] byte length of each buffer
    header        hlen bytes of msgpack
    payload       the buffers, each starting at a multiple of ALIGN bytes from the payload
                  start (zero padding between them), so a receiver that lands the payload in an
                  aligned allocation gets aligned arrays without copying

Every limit (:class:`compass.config.Limits`) is checked on the fixed-size prefix, before any
memory is set aside for what the prefix announces.

The decoder is shaped for :class:`asyncio.BufferedProtocol`: ``get_buffer`` hands out a
writable view, the kernel writes into it, ``buffer_updated`` says how much. Small frames land in
one reusable staging area (many per read); a large payload is received straight into a buffer of
its own, and the buffers of the decoded frame are views into it. That buffer is kept and reused
for the next large payload once nothing refers to it any more, because first-touching fresh
pages costs more than the copy the kernel does.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from compass.config import Limits
from compass.errors import ProtocolError

__all__ = [
    "ALIGN",
    "PREFIX",
    "PREFIX_BYTES",
    "STAGING_BYTES",
    "Frame",
    "FrameDecoder",
    "encode_frame",
    "padded_size",
]

#: buffers start at multiples of this many bytes from the payload start (one cache line)
ALIGN = 64

#: the fixed prefix: total frame bytes, header bytes, buffer count
PREFIX = struct.Struct("<QII")
_PREFIX = PREFIX
_LENGTH = struct.Struct("<Q")
#: bytes of the fixed prefix (total, hlen, nbuf)
PREFIX_BYTES = _PREFIX.size

_PADDING = tuple(bytes(n) for n in range(ALIGN))

#: staging area for small frames; a read can fill it with many frames at once
STAGING_BYTES = 256 * 1024
#: bytes of a rejected frame's header kept for the reply naming its request id
_HEAD_BYTES = 16
#: where a released decoder lets bytes land, shared by all: nobody reads them
_DISCARD = bytearray(64 * 1024)
_DISCARD_VIEW = memoryview(_DISCARD)
#: payloads above this are received straight into their own buffer instead of via staging
_DIRECT_PAYLOAD_BYTES = 64 * 1024
#: a received payload buffer at least this large is kept for reuse
_REUSE_MIN_BYTES = 1 << 20


def padded_size(lengths: Sequence[int]) -> int:
    """Bytes the payload of buffers with these lengths takes on the wire, padding included."""
    end = 0
    for length in lengths:
        end = ((end + ALIGN - 1) & -ALIGN) + length
    return end


class Frame(NamedTuple):
    """One decoded frame. ``buffers`` are writable views into the frame's payload memory."""

    header: bytes | memoryview
    buffers: list[memoryview]


def encode_frame(header: bytes, buffers: Sequence[memoryview]) -> list[bytes | memoryview]:
    """The pieces to write for one frame, in order; the buffers themselves are not copied.

    A frame without buffers comes back as one ``bytes`` object, ready for a single write.
    """
    hlen = len(header)
    if not buffers:
        return [_PREFIX.pack(PREFIX_BYTES + hlen, hlen, 0) + header]
    lengths = [b.nbytes for b in buffers]
    total = PREFIX_BYTES + 8 * len(lengths) + hlen + padded_size(lengths)
    head = struct.pack(f"<QII{len(lengths)}Q", total, hlen, len(lengths), *lengths) + header
    out: list[bytes | memoryview] = [head]
    end = 0
    for buf, length in zip(buffers, lengths, strict=True):
        pad = -end & (ALIGN - 1)
        if pad:
            out.append(_PADDING[pad])
        if length:
            out.append(buf)
        end += pad + length
    return out


def _aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array whose data starts on an ALIGN boundary."""
    return _aligned_view(np.empty(nbytes + ALIGN, dtype=np.uint8), nbytes)


def _aligned_view(owner: np.ndarray, nbytes: int) -> np.ndarray:
    offset = -owner.ctypes.data & (ALIGN - 1)
    return owner[offset : offset + nbytes]


class FrameDecoder:
    """Turns received bytes into :class:`Frame` objects, checking ``limits`` before allocating.

    Feed it either through ``get_buffer``/``buffer_updated`` (zero-copy, as
    :class:`asyncio.BufferedProtocol` does) or ``receive_data``; take frames out with
    ``next_frame`` until it returns ``None``. ``limits`` may be replaced between frames (the
    handshake runs under tighter ones). Any :class:`ProtocolError` leaves the decoder unusable.

    ``staging_bytes`` is the staging area kept between frames; it grows while a frame needs more
    (never past what the peer actually sent) and shrinks back after it. An unauthenticated peer
    gets a small one (see :meth:`set_staging_bytes`), so idle connections hold little memory.
    """

    def __init__(self, limits: Limits, *, staging_bytes: int = STAGING_BYTES) -> None:
        self.limits = limits
        self._base = staging_bytes
        self._staging = bytearray(staging_bytes)
        self._staging_view = memoryview(self._staging)
        self._read = 0  # first unread byte in staging
        self._write = 0  # end of received bytes in staging
        # the frame being assembled, once its prefix has been read
        self._total = 0
        self._hlen = 0
        self._nbuf = 0
        self._lengths: list[int] | None = None
        # a large payload being received straight into its own buffer
        self._payload: np.ndarray | None = None
        self._payload_view: memoryview | None = None
        self._payload_filled = 0
        self._direct_header = b""
        # the allocation behind the last large payload (a view's .base is always the owner
        # of the memory, however views are stacked, so its refcount sees every user)
        self._spare: np.ndarray | None = None
        self._failed: ProtocolError | None = None
        #: the first bytes of the header of a frame refused at its prefix, when they had arrived
        #: (enough to read a request id and answer it)
        self.rejected_head = b""
        #: bytes dropped by :meth:`drop_received`
        self.discarded = 0
        self._released = False
        #: counters, for tests and benchmarks
        self.payload_buffers_allocated = 0
        self.payload_buffers_reused = 0

    @property
    def error(self) -> ProtocolError | None:
        """The error that made this decoder unusable, if any."""
        return self._failed

    @property
    def staging_bytes(self) -> int:
        """Bytes of the staging area this decoder holds (for tests and memory accounting)."""
        return 0 if self._released else len(self._staging)

    def set_staging_bytes(self, nbytes: int) -> None:
        """Keep a staging area of ``nbytes`` between frames from now on (grown at once)."""
        self._base = nbytes
        if len(self._staging) < nbytes:
            self._grow(nbytes)

    def release(self) -> None:
        """Drop every buffer now; from then on received bytes are counted in :attr:`discarded`
        and dropped (a closing connection may still receive some), and ``next_frame`` raises.
        """
        self._staging = _DISCARD
        self._staging_view = _DISCARD_VIEW
        self._read = self._write = 0
        self._payload = self._payload_view = self._spare = None
        self._direct_header = b""
        self._released = True
        if self._failed is None:
            self._failed = ProtocolError("the connection is closed")

    def drop_received(self) -> None:
        """Forget the bytes received and not yet taken (counted in :attr:`discarded`)."""
        self.discarded += self._write - self._read
        self._read = self._write = 0

    @property
    def drained(self) -> bool:
        """True when every received byte has been consumed and no large payload is under way.

        A reader may stop asking for frames then: ``next_frame`` would return ``None``.
        """
        return not self._write and self._payload is None

    # -- input ------------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        """A writable view to receive into; report how much was written with ``buffer_updated``."""
        view = self._payload_view
        if view is not None and self._payload_filled < len(view):
            return view[self._payload_filled :]
        write = self._write
        if not write:
            return self._staging_view  # the common case: everything before was consumed
        if write == len(self._staging):
            self._make_room()
            write = self._write
        return self._staging_view[write:]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the view the last ``get_buffer`` returned."""
        view = self._payload_view
        if view is not None and self._payload_filled < len(view):
            self._payload_filled += nbytes
        else:
            self._write += nbytes

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` in (convenience for tests and non-buffered transports).

        Take frames out with ``next_frame`` as data arrives: unconsumed frames stay buffered.
        """
        source = memoryview(data).cast("B")
        while source:
            target = self.get_buffer(len(source))
            count = min(len(target), len(source))
            target[:count] = source[:count]
            self.buffer_updated(count)
            source = source[count:]

    def _make_room(self) -> None:
        """Free space at the end of staging: drop consumed bytes, else double its size."""
        unread = self._write - self._read
        staging = self._staging
        if self._read:
            # equal-length slice assignment: never resizes, so the exported view stays valid
            staging[:unread] = staging[self._read : self._write]
            self._read, self._write = 0, unread
        if unread == len(staging):
            self._grow(2 * len(staging))

    def _grow(self, size: int) -> None:
        # a new bytearray rather than a resize: views handed out earlier may still exist
        staging = bytearray(size)
        staging[: self._write] = self._staging_view[: self._write]
        self._staging, self._staging_view = staging, memoryview(staging)

    # -- output -----------------------------------------------------------------------------

    def next_frame(self) -> Frame | None:
        """The next complete frame, or ``None`` when more bytes are needed."""
        frame = self.next_header_or_frame()
        if type(frame) is bytes:
            return Frame(frame, [])
        return frame  # type: ignore[return-value]

    def next_header_or_frame(self) -> bytes | Frame | None:
        """Like :meth:`next_frame`, but a frame without buffers comes back as its header alone.

        The hot path of :class:`~compass.wire.protocol.Connection`: most messages are small
        and carry no arrays, and this spares building a :class:`Frame` for each.
        """
        if self._failed is not None:
            raise self._failed
        if self._payload is None and not self._total:
            start = self._read
            available = self._write - start
            if available < PREFIX_BYTES:
                return None
            # fast path: a complete small frame without buffers, within every limit
            total, hlen, nbuf = _PREFIX.unpack_from(self._staging, start)
            limits = self.limits
            if (
                not nbuf
                and total <= available
                and total == PREFIX_BYTES + hlen
                and 0 < hlen <= limits.max_header_bytes
                and total <= limits.max_frame_bytes
            ):
                end = start + total
                if end == self._write:
                    self._read = self._write = 0
                else:
                    self._read = end
                return bytes(self._staging_view[start + PREFIX_BYTES : end])
        try:
            return self._next_frame()
        except ProtocolError as exc:
            self._failed = exc
            raise

    def _next_frame(self) -> Frame | None:
        if self._payload is not None:
            return self._finish_direct()
        available = self._write - self._read
        if self._lengths is None:
            if not self._total:
                if available < PREFIX_BYTES:
                    return None
                self._read_prefix()
            if available < PREFIX_BYTES + 8 * self._nbuf:
                self._reserve(PREFIX_BYTES + 8 * self._nbuf)
                return None
            self._read_lengths()
        lengths = self._lengths
        assert lengths is not None
        head = PREFIX_BYTES + 8 * self._nbuf + self._hlen
        payload_bytes = self._total - head
        if payload_bytes > _DIRECT_PAYLOAD_BYTES or self._total > len(self._staging):
            if available < head:
                self._reserve(head)
                return None
            return self._start_direct(head, payload_bytes)
        if available < self._total:
            self._reserve(self._total)
            return None
        start = self._read
        header = bytes(self._staging_view[start + head - self._hlen : start + head])
        buffers: list[memoryview] = []
        if lengths:
            payload = _aligned_empty(payload_bytes)
            payload_view = payload.data
            payload_view[:] = self._staging_view[start + head : start + self._total]
            buffers = _split(payload_view, lengths)
        self._read = start + self._total
        if self._read == self._write:
            self._read = self._write = 0
        self._end_frame()
        return Frame(header, buffers)

    def _read_prefix(self) -> None:
        total, hlen, nbuf = _PREFIX.unpack_from(self._staging, self._read)
        limits = self.limits
        if (
            total > limits.max_frame_bytes
            or hlen > limits.max_header_bytes
            or nbuf > limits.max_buffers
        ):
            self._keep_head(hlen, nbuf)
        if total > limits.max_frame_bytes:
            raise ProtocolError(
                f"frame of {total} bytes exceeds max_frame_bytes={limits.max_frame_bytes}"
            )
        if hlen > limits.max_header_bytes:
            raise ProtocolError(
                f"frame header of {hlen} bytes exceeds max_header_bytes={limits.max_header_bytes}"
            )
        if nbuf > limits.max_buffers:
            raise ProtocolError(
                f"frame with {nbuf} buffers exceeds max_buffers={limits.max_buffers}"
            )
        if hlen == 0:
            raise ProtocolError("frame has an empty header")
        if total < PREFIX_BYTES + 8 * nbuf + hlen:
            raise ProtocolError(
                f"frame of {total} bytes is too short for its {hlen}-byte header "
                f"and {nbuf} buffer lengths"
            )
        self._total, self._hlen, self._nbuf = total, hlen, nbuf

    def _keep_head(self, hlen: int, nbuf: int) -> None:
        start = self._read + PREFIX_BYTES + 8 * nbuf
        end = start + min(hlen, _HEAD_BYTES)
        if end <= self._write:
            self.rejected_head = bytes(self._staging_view[start:end])

    def _read_lengths(self) -> None:
        start = self._read + PREFIX_BYTES
        lengths = list(struct.unpack_from(f"<{self._nbuf}Q", self._staging, start))
        expected = self._total - PREFIX_BYTES - 8 * self._nbuf - self._hlen
        # an announced length beyond the frame would make the padded sum meaningless
        if any(length > expected for length in lengths) or padded_size(lengths) != expected:
            raise ProtocolError(
                f"frame of {self._total} bytes announces buffers of {lengths} bytes that do not "
                f"add up to its {expected}-byte payload"
            )
        self._lengths = lengths

    def _reserve(self, nbytes: int) -> None:
        """Move the frame being read to the start of staging if it would not fit where it is.

        Staging itself grows only in ``_make_room``, as bytes actually arrive: a peer must send
        a large header before this side holds memory for it.
        """
        if self._read + nbytes <= len(self._staging) or not self._read:
            return
        unread = self._write - self._read
        self._staging[:unread] = self._staging[self._read : self._write]
        self._read, self._write = 0, unread

    def _start_direct(self, head: int, payload_bytes: int) -> Frame | None:
        lengths = self._lengths
        assert lengths is not None
        start = self._read
        self._direct_header = bytes(self._staging_view[start + head - self._hlen : start + head])
        payload = self._payload_buffer(payload_bytes)
        view = payload.data
        staged = min(self._write - start - head, payload_bytes)
        view[:staged] = self._staging_view[start + head : start + head + staged]
        self._read = start + head + staged
        if self._read == self._write:
            self._read = self._write = 0
        self._payload, self._payload_view, self._payload_filled = payload, view, staged
        return self._finish_direct()

    def _payload_buffer(self, nbytes: int) -> np.ndarray:
        spare = self._spare
        # 3 references: self._spare, the local name and getrefcount's argument; any more means
        # a decoded array, a view of one or a memoryview on one is still alive somewhere
        if spare is not None and len(spare) - ALIGN >= nbytes and sys.getrefcount(spare) == 3:
            self.payload_buffers_reused += 1
            return _aligned_view(spare, nbytes)
        self.payload_buffers_allocated += 1
        owner = np.empty(nbytes + ALIGN, dtype=np.uint8)
        if nbytes >= _REUSE_MIN_BYTES:
            self._spare = owner
        return _aligned_view(owner, nbytes)

    def _finish_direct(self) -> Frame | None:
        view = self._payload_view
        assert view is not None
        assert self._lengths is not None
        if self._payload_filled < len(view):
            return None
        frame = Frame(self._direct_header, _split(view, self._lengths))
        self._payload = self._payload_view = None
        self._direct_header = b""
        self._end_frame()
        return frame

    def _end_frame(self) -> None:
        self._total = self._hlen = self._nbuf = 0
        self._lengths = None
        if len(self._staging) > self._base and self._read == self._write:
            # a large header grew staging; do not keep that memory for small frames
            self._staging = bytearray(self._base)
            self._staging_view = memoryview(self._staging)
            self._read = self._write = 0


def _split(payload: memoryview, lengths: list[int]) -> list[memoryview]:
    out = []
    end = 0
    for length in lengths:
        start = (end + ALIGN - 1) & -ALIGN
        end = start + length
        out.append(payload[start:end])
    return out
