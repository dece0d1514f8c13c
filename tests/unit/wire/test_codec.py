"""The message codec, without an event loop: plain values, arrays, tensors, malformed input."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import textwrap
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from compass.config import Limits
from compass.errors import ProtocolError
from compass.wire.codec import (
    EXT_NDARRAY,
    EXT_TENSOR,
    WIRE_DTYPES,
    check_depth,
    decode_message,
    encode_message,
    payload_bytes,
)

LIMITS = Limits()
NUMPY_DTYPES = [name for name in WIRE_DTYPES if name != "bfloat16"]


def round_trip(obj: Any, limits: Limits = LIMITS) -> tuple[Any, list[memoryview]]:
    header, buffers = encode_message(obj)
    # what a receiver has: writable copies of the bytes, no link to the sender's memory
    received = [memoryview(bytearray(b)) for b in buffers]
    return decode_message(header, received, limits), received


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    tensor = tensor.detach().resolve_conj().resolve_neg().contiguous()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().tobytes()


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray):
        assert type(b) is np.ndarray
        assert (a.dtype, a.shape) == (b.dtype.newbyteorder("="), b.shape) or (
            a.dtype == b.dtype and a.shape == b.shape
        )
        assert np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes() == b.tobytes()
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert tensor_bytes(a) == tensor_bytes(b)
    elif isinstance(a, list | tuple):
        assert type(b) is list
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert type(b) is dict
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert type(a) is type(b)
        assert a == b


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=30)
    | st.binary(max_size=30),
    lambda children: (
        st.lists(children, max_size=5)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


@given(plain)
@settings(max_examples=300, deadline=None)
def test_plain_values_round_trip(value):
    decoded, buffers = round_trip(value)
    assert buffers == []
    assert_same(value, decoded)


def numpy_arrays(name: str) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(
        WIRE_DTYPES[name],
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    )


any_array = st.sampled_from(NUMPY_DTYPES).flatmap(numpy_arrays)


@given(st.lists(any_array, max_size=4), plain)
@settings(max_examples=200, deadline=None)
def test_arrays_of_every_dtype_round_trip_in_messages(arrays, value):
    message = {"arrays": arrays, "value": value, "nested": [arrays[:1], {"x": arrays[-1:]}]}
    decoded, _ = round_trip(message)
    assert_same(message, decoded)


@pytest.mark.parametrize("name", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (4,), (2, 3)])
def test_every_dtype_and_shape_decodes_as_a_view(name, shape):
    dtype = WIRE_DTYPES[name]
    array = np.arange(math.prod(shape), dtype=np.int64).astype(dtype).reshape(shape)
    decoded, buffers = round_trip(array)
    assert decoded.dtype == dtype
    assert decoded.shape == shape
    assert decoded.tobytes() == array.tobytes()
    assert decoded.flags.writeable
    if array.size:
        assert decoded.ctypes.data == np.frombuffer(buffers[0], np.uint8).ctypes.data


def test_non_contiguous_and_big_endian_arrays():
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    for array in (base[::2, 1::3], base.T, base.astype(">f8"), base.astype(">i4")[:, ::2]):
        decoded, _ = round_trip(array)
        assert decoded.flags.c_contiguous
        np.testing.assert_array_equal(decoded, array)


def test_numpy_scalars_become_python_values():
    decoded, _ = round_trip([np.int64(7), np.float32(1.5), np.bool_(True), np.uint64(2**64 - 1)])
    assert decoded == [7, 1.5, True, 2**64 - 1]
    assert [type(v) for v in decoded] == [int, float, bool, int]
    (value,), _ = round_trip([np.complex64(1 + 2j)])
    assert value.shape == ()
    assert value.dtype == np.complex64
    assert value == 1 + 2j


TORCH_DTYPES = [getattr(torch, name) for name in WIRE_DTYPES]


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (2, 0), (5,), (2, 3)])
def test_tensors_of_every_dtype_round_trip_as_views(dtype, shape):
    tensor = (torch.arange(math.prod(shape), dtype=torch.float64) - 2).reshape(shape).to(dtype)
    decoded, buffers = round_trip(tensor)
    assert isinstance(decoded, torch.Tensor)
    assert (decoded.dtype, decoded.shape) == (dtype, tensor.shape)
    assert torch.equal(decoded, tensor)
    if tensor.numel():
        assert decoded.data_ptr() == np.frombuffer(buffers[0], np.uint8).ctypes.data


@given(st.sampled_from([*NUMPY_DTYPES, "bfloat16"]).flatmap(numpy_arrays))
@settings(max_examples=150, deadline=None)
def test_random_tensors_round_trip_bit_exact(array):
    if array.dtype == np.dtype("<u2") and np.random.default_rng(array.size).random() < 0.5:
        tensor = torch.from_numpy(array.copy()).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array.copy())
    decoded, _ = round_trip({"t": tensor})
    assert_same({"t": tensor}, decoded)


def test_tensor_views_grad_and_conj_are_materialised():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    leaf = torch.ones(3, requires_grad=True)
    complex_conj = torch.tensor([1 + 2j, 3 - 1j]).conj()
    for tensor in (base.T, base[:, ::2], leaf * 2, complex_conj, -torch.arange(3.0)):
        decoded, _ = round_trip(tensor)
        assert not decoded.requires_grad
        assert torch.equal(decoded, tensor.detach().resolve_conj().resolve_neg())


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (object(), "builtins.object"),
        ({1, 2}, "builtins.set"),
        ([1, {"a": 1j}], "builtins.complex"),
        (np.array(["a"]), "dtype <U1"),
        (np.array([1], dtype=object), "dtype object"),
        (torch.empty(2, device="meta"), "meta"),
        (torch.zeros(2, dtype=torch.float8_e4m3fn), "float8"),
        (2**64, "out of range"),
    ],
)
def test_unencodable_values_name_the_problem(value, named):
    with pytest.raises(ProtocolError, match=named):
        encode_message(value)


def ext(code: int, meta: Any) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(meta))


def buf(nbytes: int) -> memoryview:
    return memoryview(bytearray(nbytes))


@pytest.mark.parametrize(
    ("obj", "buffers", "message"),
    [
        (ext(99, [0, "int8", [1]]), [buf(1)], "unknown msgpack extension type 99"),
        (ext(EXT_NDARRAY, [0, "int8", [1]]), [], "carries no buffers"),
        (msgpack.ExtType(EXT_NDARRAY, b"\xc1"), [buf(1)], "bad array descriptor"),
        (ext(EXT_NDARRAY, {"a": 1}), [buf(1)], "expected \\[index, dtype, shape\\]"),
        (ext(EXT_NDARRAY, [1, "int8", [1]]), [buf(1)], "refers to buffer 1"),
        (ext(EXT_NDARRAY, [True, "int8", [1]]), [buf(1)], "refers to buffer True"),
        (ext(EXT_NDARRAY, [0, "float128", [1]]), [buf(16)], "unsupported dtype 'float128'"),
        (ext(EXT_NDARRAY, [0, "bfloat16", [1]]), [buf(2)], "unsupported dtype 'bfloat16'"),
        (ext(EXT_NDARRAY, [0, "int8", [-1]]), [buf(1)], "bad shape"),
        (ext(EXT_NDARRAY, [0, "int8", "3"]), [buf(3)], "bad shape"),
        (ext(EXT_NDARRAY, [0, "int32", [3]]), [buf(11)], "needs 12 bytes, its buffer has 11"),
        (ext(EXT_TENSOR, [0, "float64", [2**40, 2**40]]), [buf(8)], "needs"),
        ([ext(EXT_NDARRAY, [0, "int8", [1]])] * 2, [buf(1)], "each may be used once"),
        (ext(EXT_NDARRAY, [0, "int8", [1]]), [buf(1), buf(1)], "carries 2 buffers but"),
    ],
)
def test_malformed_arrays_are_protocol_errors(obj, buffers, message):
    with pytest.raises(ProtocolError, match=message):
        decode_message(msgpack.packb(obj), buffers, LIMITS)


def test_bool_array_with_other_bytes_is_rejected():
    data = memoryview(bytearray(b"\x00\x01\x07"))
    with pytest.raises(ProtocolError, match="bool array"):
        decode_message(msgpack.packb(ext(EXT_NDARRAY, [0, "bool", [3]])), [data], LIMITS)


@pytest.mark.parametrize(
    "header",
    [b"", b"\xc1", b"\x92\x01", b"\x81\xa1a", b"\x93\x01\x02\x03\x04", b"\xdb\xff\xff\xff\xff"],
)
def test_truncated_or_invalid_msgpack_is_a_protocol_error(header):
    with pytest.raises(ProtocolError):
        decode_message(header, [], LIMITS)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("padding", [b"", bytes(range(0x80, 0xA0)) * 10])
def test_nesting_depth_is_checked_before_unpacking(padding):
    limits = Limits(max_depth=10)
    ok, _ = encode_message([padding, nested(9)])
    deep, _ = encode_message([padding, nested(10)])
    assert decode_message(ok, [], limits)[1] == nested(9)
    with pytest.raises(ProtocolError, match="max_depth=10"):
        decode_message(deep, [], limits)


def depth_of(value: Any) -> int:
    if isinstance(value, list | tuple):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


@given(plain, st.integers(0, 6))
@settings(max_examples=300, deadline=None)
def test_depth_check_agrees_with_the_structure(value, limit):
    header = msgpack.packb(value)
    if depth_of(value) > limit:
        with pytest.raises(ProtocolError):
            check_depth(header, limit)
    else:
        check_depth(header, limit)


@given(st.binary(max_size=300))
@settings(max_examples=300, deadline=None)
def test_random_headers_raise_only_protocol_errors(data):
    with contextlib.suppress(ProtocolError):
        decode_message(data, [], Limits(max_depth=8))


def test_torch_is_not_imported_to_decode_arrays():
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        from compass.config import Limits
        from compass.wire.codec import decode_message, encode_message
        if "torch" in sys.modules:
            sys.exit(3)  # the package imported it already: nothing to learn here
        header, buffers = encode_message({"a": np.arange(4)})
        out = decode_message(header, [memoryview(bytearray(b)) for b in buffers], Limits())
        assert out["a"].tolist() == [0, 1, 2, 3]
        assert "torch" not in sys.modules, "decoding an ndarray imported torch"
        """
    )
    result = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    if result.returncode == 3:
        pytest.skip("importing compass already imports torch")
    assert result.returncode == 0, result.stderr.decode()


# -- the bounds hold on the fast paths too ------------------------------------------------------


@pytest.mark.parametrize("item", [0, "a"], ids=["scalars", "short strings"])
def test_one_flat_array_past_max_elements_is_refused_and_one_at_it_decodes(item: Any) -> None:
    limits = Limits()
    at_limit = msgpack.packb([item] * (limits.max_elements - 1))  # the list counts too
    assert len(decode_message(at_limit, [], limits)) == limits.max_elements - 1
    past = msgpack.packb([item] * limits.max_elements)
    with pytest.raises(ProtocolError, match="max_elements"):
        decode_message(past, [], limits)


class _Sized(str):
    """A str that says its own size (``nbytes`` is asked before the type)."""

    nbytes = 3


def test_payload_bytes_of_each_kind_of_value() -> None:
    for scalar in (0, -7, 10**30, 2.5, True, None, 1j, np.float32(1.0), np.int64(3)):
        expected = getattr(scalar, "nbytes", 16)
        assert payload_bytes(scalar) == expected
    assert payload_bytes("abc") == 3 and payload_bytes(b"xy") == 2
    assert payload_bytes(bytearray(b"abc")) == 3 and payload_bytes(memoryview(b"abcd")) == 4
    assert payload_bytes(_Sized("hello")) == 3
    assert payload_bytes({"x": 1, "y": "ab"}) == 16 + 2 + 2 * 8
    assert payload_bytes([1, 2.0, "x"]) == 16 + 16 + 1 + 3 * 8
    assert payload_bytes((b"1",)) == 1 + 8
    assert payload_bytes({"a": [np.ones(3), {"b": "cc"}]}) == (24 + (2 + 8) + 2 * 8) + 8
    assert payload_bytes(np.zeros(10)) == 80
    assert payload_bytes(torch.zeros(3, 4)) == 48
    assert payload_bytes(object()) == 16 and payload_bytes({1, 2}) == 16
