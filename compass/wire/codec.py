"""Sans-IO message codec: msgpack for plain values, out-of-band buffers for arrays.

A message is a msgpack header plus a list of raw buffers (see :mod:`compass.wire.frames`).
numpy arrays and CPU torch tensors travel as an ExtType in the header that holds
``[buffer index, dtype name, shape]``; their bytes travel as a buffer of their own, written from
the sender's memory and decoded as a view on the received bytes (no copy into or out of msgpack).

Plain values: ``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``, ``bytes``, ``list`` and
``tuple`` (both decode as ``list``) and ``dict`` (keys of a hashable scalar type). numpy scalars
become Python scalars (complex ones 0-d arrays). Anything else is refused on encode with a
:class:`ProtocolError` naming the type. Nothing is ever pickled.

torch is imported only when a tensor is decoded (an encoded tensor implies it is loaded), so a
process that never sees a tensor never pays for importing it; one that does pays once, about a
second, and :func:`torch_import_s` says how long, for a client's trace to name.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import msgpack
import numpy as np

from compass.config import Limits
from compass.errors import ProtocolError
from compass.payload import payload_bytes  # re-exported: it lives below the wire and the core

__all__ = [
    "EXT_NDARRAY",
    "EXT_TENSOR",
    "WIRE_DTYPES",
    "Encoder",
    "check_depth",
    "check_structure",
    "decode_message",
    "encode_message",
    "payload_bytes",
    "torch_import_s",
]

EXT_NDARRAY = 1
EXT_TENSOR = 2

#: numpy dtypes (little-endian) of every name allowed on the wire; bfloat16 travels as its
#: uint16 bit pattern and is only valid for tensors
WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    "bool": np.dtype("?"),
    "int8": np.dtype("<i1"),
    "int16": np.dtype("<i2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("<u1"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
    "uint64": np.dtype("<u8"),
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "complex64": np.dtype("<c8"),
    "complex128": np.dtype("<c16"),
    "bfloat16": np.dtype("<u2"),
}

_NAME_BY_KIND_SIZE = {
    (dtype.kind, dtype.itemsize): name for name, dtype in WIRE_DTYPES.items() if name != "bfloat16"
}

#: numpy has at most 64 dimensions; no sane message needs more than this
_MAX_DIMS = 32

_LITTLE_ENDIAN_HOST = sys.byteorder == "little"
_unpackb = msgpack.unpackb


# -- encoding -------------------------------------------------------------------------------


class Encoder:
    """A reusable msgpack packer whose ``default`` hook moves arrays out of band.

    Not thread-safe: one per thread (:func:`encode_message`) or per connection.
    """

    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.packer = msgpack.Packer(default=self._default, autoreset=True, use_bin_type=True)

    def encode(self, obj: Any) -> tuple[bytes, list[memoryview]]:
        """See :func:`encode_message`."""
        try:
            header: bytes = self.packer.pack(obj)
        except ProtocolError:
            self.buffers = []
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            self.buffers = []
            raise ProtocolError(f"cannot encode message: {exc}") from exc
        buffers = self.buffers
        if buffers:
            self.buffers = []
            return header, buffers
        return header, []

    def _default(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return self._array(EXT_NDARRAY, obj, None)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if isinstance(obj, np.generic):
            if isinstance(obj, np.bool_ | np.integer | np.floating):
                return obj.item()
            if isinstance(obj, np.complexfloating):
                return self._array(EXT_NDARRAY, np.asarray(obj), None)
        if isinstance(obj, int):
            raise ProtocolError(f"cannot encode integer {obj}: out of range for 64 bits")
        kind = type(obj)
        raise ProtocolError(
            f"cannot encode an object of type {kind.__module__}.{kind.__qualname__}: messages "
            "carry None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays and "
            "CPU torch tensors"
        )

    def _array(self, code: int, array: np.ndarray, name: str | None) -> msgpack.ExtType:
        dtype = array.dtype
        if name is None:
            found = _NAME_BY_KIND_SIZE.get((dtype.kind, dtype.itemsize))
            if found is None:
                raise ProtocolError(
                    f"cannot encode an array of dtype {dtype}: supported are "
                    f"{', '.join(n for n in WIRE_DTYPES if n != 'bfloat16')}"
                )
            name = found
        swapped = dtype.byteorder == ">" or (dtype.byteorder == "=" and not _LITTLE_ENDIAN_HOST)
        if swapped:
            array = array.astype(dtype.newbyteorder("<"))
        elif not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self.buffers.append(array.reshape(-1).view(np.uint8).data)
        meta = msgpack.packb([len(self.buffers) - 1, name, list(array.shape)])
        return msgpack.ExtType(code, meta)

    def _tensor(self, tensor: Any) -> msgpack.ExtType:
        import torch

        if tensor.device.type != "cpu":
            raise ProtocolError(
                f"cannot encode a tensor on {tensor.device}: move it to the CPU (.cpu()) first"
            )
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise ProtocolError(f"cannot encode a {tensor.layout} / quantized tensor")
        tensor = tensor.detach().resolve_conj().resolve_neg()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        if tensor.dtype == torch.bfloat16:
            return self._array(EXT_TENSOR, tensor.view(torch.uint16).numpy(), "bfloat16")
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in WIRE_DTYPES:
            raise ProtocolError(
                f"cannot encode a tensor of dtype {tensor.dtype}: supported are "
                f"{', '.join(WIRE_DTYPES)}"
            )
        return self._array(EXT_TENSOR, tensor.numpy(), name)


_local = threading.local()


def encode_message(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Encode ``obj``: the msgpack header and the out-of-band buffers, in the order referenced.

    The buffers view the caller's arrays: do not modify those until the message is written.
    Raises :class:`ProtocolError` naming the first value that cannot be encoded.
    """
    encoder: Encoder | None = getattr(_local, "encoder", None)
    if encoder is None:
        encoder = _local.encoder = Encoder()
    return encoder.encode(obj)


# -- decoding -------------------------------------------------------------------------------


class _ArrayDecoder:
    """msgpack ``ext_hook``: rebuilds arrays and tensors as views on the frame's buffers."""

    __slots__ = ("buffers", "used")

    def __init__(self, buffers: list[memoryview]) -> None:
        self.buffers = buffers
        self.used = [False] * len(buffers)

    def __call__(self, code: int, data: bytes) -> Any:
        if code not in (EXT_NDARRAY, EXT_TENSOR):
            raise ProtocolError(f"unknown msgpack extension type {code}")
        try:
            meta = msgpack.unpackb(data)
        except (ValueError, TypeError) as exc:
            raise ProtocolError(f"bad array descriptor: {exc}") from exc
        if not (isinstance(meta, list) and len(meta) == 3):
            raise ProtocolError(f"bad array descriptor {meta!r}: expected [index, dtype, shape]")
        index, name, shape = meta
        if type(index) is not int or not 0 <= index < len(self.buffers) or self.used[index]:
            raise ProtocolError(
                f"array refers to buffer {index!r}; the frame has {len(self.buffers)} buffers "
                "and each may be used once"
            )
        dtype = WIRE_DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None or (name == "bfloat16" and code == EXT_NDARRAY):
            raise ProtocolError(f"array has unsupported dtype {name!r}")
        if (
            not isinstance(shape, list)
            or len(shape) > _MAX_DIMS
            or any(type(d) is not int or d < 0 for d in shape)
        ):
            raise ProtocolError(f"array has a bad shape {shape!r}")
        buffer = self.buffers[index]
        count = 1
        for dim in shape:
            count *= dim
        if count * dtype.itemsize != buffer.nbytes:
            raise ProtocolError(
                f"array of shape {shape} and dtype {name} needs {count * dtype.itemsize} bytes, "
                f"its buffer has {buffer.nbytes}"
            )
        self.used[index] = True
        array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
        if name == "bool" and array.size and array.view(np.uint8).max() > 1:
            raise ProtocolError("bool array holds bytes other than 0 and 1")
        if code == EXT_NDARRAY:
            return array
        return _to_tensor(array, name)


#: seconds this process spent importing torch to rebuild the tensors it received
_torch_import_s = [0.0]


def torch_import_s() -> float:
    """Seconds this process has spent importing torch to rebuild a tensor it received: about a
    second, once, in a process that had not imported it (a client that sends no tensors, the
    CLI), and 0.0 where the application imported it first. A client's trace names them
    (``import``) rather than counting them in its hop to the worker."""
    return _torch_import_s[0]


def _to_tensor(array: np.ndarray, name: str) -> Any:
    started = time.perf_counter()
    loaded = "torch" in sys.modules
    import torch

    if not loaded:  # this was the process's import of torch: its time is named, not hidden
        _torch_import_s[0] += time.perf_counter() - started

    if not array.flags.writeable:
        # torch cannot share read-only memory; only reached when decoding from bytes objects
        array = array.copy()
    tensor = torch.from_numpy(array)
    if name == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


def _no_buffers_hook(code: int, data: bytes) -> Any:
    if code in (EXT_NDARRAY, EXT_TENSOR):
        raise ProtocolError("message refers to an array but its frame carries no buffers")
    raise ProtocolError(f"unknown msgpack extension type {code}")


def decode_message(header: bytes | memoryview, buffers: list[memoryview], limits: Limits) -> Any:
    """Decode a message; arrays and tensors come back as views on ``buffers``.

    Raises :class:`ProtocolError` for anything malformed: bad msgpack, nesting deeper than
    ``limits.max_depth``, more than ``limits.max_elements`` objects, unknown extension types,
    dtype or shape not matching its buffer.
    """
    max_depth, max_elements = limits.max_depth, limits.max_elements
    size = len(header)
    # inline fast case of check_structure: too short to hold too many objects, and few enough
    # bytes that could open a container
    if size > max_elements or (
        size > max_depth
        and (type(header) is not bytes or len(header.translate(None, _OTHER_BYTES)) > max_depth)
    ):
        check_structure(header, max_depth, max_elements)
    if not buffers:
        try:
            return _unpackb(header, ext_hook=_no_buffers_hook, strict_map_key=False)
        except ProtocolError:
            raise
        except (ValueError, TypeError, RecursionError) as exc:
            raise ProtocolError(f"undecodable message: {type(exc).__name__}: {exc}") from exc
    hook = _ArrayDecoder(buffers)
    try:
        obj = _unpackb(header, ext_hook=hook, strict_map_key=False)
    except ProtocolError:
        raise
    except (ValueError, TypeError, RecursionError) as exc:
        raise ProtocolError(f"undecodable message: {type(exc).__name__}: {exc}") from exc
    if not all(hook.used):
        raise ProtocolError(
            f"frame carries {len(buffers)} buffers but the message uses {sum(hook.used)}"
        )
    return obj


# -- nesting depth --------------------------------------------------------------------------

_CONTAINER_MARKERS = bytes([*range(0x80, 0xA0), *range(0xDC, 0xE0)])
_OTHER_BYTES = bytes(b for b in range(256) if b not in _CONTAINER_MARKERS)

# first byte -> bytes to skip after it, for fixed-size msgpack types
_FIXED_SKIP = {
    0xC0: 0, 0xC2: 0, 0xC3: 0,
    0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
    0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,
    0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,
}  # fmt: skip
# first byte -> (size of its length field, extra bytes after the length field besides data)
_SIZED = {
    0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0),
    0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
    0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),
}  # fmt: skip
# first byte -> (size of its count field, elements per count)
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}


def check_depth(data: bytes | memoryview, max_depth: int) -> None:
    """Raise :class:`ProtocolError` if msgpack ``data`` nests deeper than ``max_depth``."""
    check_structure(data, max_depth, len(data))


def check_structure(data: bytes | memoryview, max_depth: int, max_elements: int) -> None:
    """Raise :class:`ProtocolError` if msgpack ``data`` nests deeper than ``max_depth`` or holds
    more than ``max_elements`` objects (containers and scalars alike).

    Runs before anything is unpacked, so a header cannot make the decoder build millions of
    objects: an empty array is one byte on the wire and about 80 bytes of Python list. Every
    object takes at least one byte, so a header no longer than ``max_elements`` holds few enough;
    each level of nesting needs one container marker byte, so counting those bytes (at C speed)
    settles the depth of nearly every message. Only the rest are walked object by object, and
    the walk stops at the first object past the limit: its cost is bounded by ``max_elements``.
    """
    size = len(data)
    if size <= max_depth and size <= max_elements:
        return
    raw = data if isinstance(data, bytes) else bytes(data)
    # what survives deleting every other byte value: the bytes that could open a container
    if size <= max_elements and len(raw.translate(None, _OTHER_BYTES)) <= max_depth:
        return
    _walk(raw, max_depth, max_elements)


def _walk(data: bytes, max_depth: int, max_elements: int) -> None:
    remaining = [1]  # elements still to read in each open container; [0] is the top level
    pos, end = 0, len(data)
    budget = max_elements  # objects still allowed
    while remaining:
        if remaining[-1] == 0:
            remaining.pop()
            continue
        remaining[-1] -= 1
        budget -= 1
        if budget < 0:
            raise ProtocolError(
                f"message holds more than max_elements={max_elements} objects; send bulk data "
                "as numpy arrays or tensors, which travel out of band"
            )
        if pos >= end:
            raise ProtocolError("truncated message header")
        first = data[pos]
        pos += 1
        if first <= 0x7F or first >= 0xE0:
            continue
        count = -1
        if first <= 0x8F:
            count = 2 * (first & 0x0F)
        elif first <= 0x9F:
            count = first & 0x0F
        elif first <= 0xBF:
            pos += first & 0x1F
        elif first in _FIXED_SKIP:
            pos += _FIXED_SKIP[first]
        elif first in _SIZED:
            size, extra = _SIZED[first]
            pos += size + extra + int.from_bytes(data[pos : pos + size], "big")
        elif first in _CONTAINERS:
            size, per = _CONTAINERS[first]
            count = per * int.from_bytes(data[pos : pos + size], "big")
            pos += size
        else:
            raise ProtocolError(f"invalid msgpack type byte 0x{first:02x}")
        if count >= 0:
            if len(remaining) > max_depth:
                raise ProtocolError(f"message nests deeper than max_depth={max_depth}")
            remaining.append(count)
