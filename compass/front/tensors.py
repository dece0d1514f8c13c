"""The Open Inference Protocol's tensors, in and out: sans-IO, bytes to job inputs and back.

A request (``POST /v2/models/{workflow}/infer``) is JSON, or with the binary tensor data
extension a JSON header of ``Inference-Header-Content-Length`` bytes followed by the raw
tensors, one after another, each input saying its size in ``parameters.binary_data_size``.

Into a job's inputs (one per tensor, by name):

- a numeric or BOOL tensor becomes a ``numpy.ndarray`` of its shape (a shape ``[]`` one, a
  Python scalar);
- a BYTES tensor of one element becomes a ``str`` (``bytes`` where it is not UTF-8), a longer
  one a flat list of them.

Out of a job's answer (a dict is one output per key, anything else one output named
``output`` or the one output the app declared): an ndarray, a torch tensor (anything with
``.numpy()``), a number or a bool as its tensor; a ``str``/``bytes``, or a list of them, as
BYTES; any other list as ``numpy.asarray`` makes it. Outputs go back binary when the request
asks (``parameters.binary_data_output``, or ``binary_data`` on a requested output), as
tritonclient does by default.

Every refusal is an :class:`~compass.front.errors.HttpError` 400 with a one-line message.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from compass.front import jsonio
from compass.front.errors import HttpError

__all__ = ["InferRequest", "encode_answer", "objective_fields", "parse_infer"]

_NUMERIC: dict[str, np.dtype[Any]] = {
    name: np.dtype(code)
    for name, code in (
        ("BOOL", "?"), ("UINT8", "u1"), ("UINT16", "<u2"), ("UINT32", "<u4"), ("UINT64", "<u8"),
        ("INT8", "i1"), ("INT16", "<i2"), ("INT32", "<i4"), ("INT64", "<i8"),
        ("FP16", "<f2"), ("FP32", "<f4"), ("FP64", "<f8"),
    )
}  # fmt: skip
_BY_KIND = {(dt.kind, dt.itemsize): name for name, dt in _NUMERIC.items()}
_INT_RANGE = {
    name: (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
    for name, dt in _NUMERIC.items()
    if dt.kind in "iu"
}
#: elements one tensor may have (its shape's product), whatever its bytes say
MAX_ELEMENTS = 1 << 31


@dataclass(slots=True)  # not frozen: a frozen one's __init__ costs a setattr call per field
class InferRequest:
    """A parsed infer request: the job's inputs and what the answer should look like."""

    id: str | None
    inputs: dict[str, Any]
    parameters: dict[str, Any]
    #: the outputs asked for by name (None: all), and which of them go back binary
    outputs: tuple[str, ...] | None
    binary: frozenset[str]
    binary_all: bool


def _bad(message: str) -> HttpError:
    return HttpError(400, message)


def _header(
    body: bytes | bytearray | memoryview, header_length: int | None
) -> tuple[Any, memoryview]:
    if header_length is None:
        header, rest = body, memoryview(b"")
    else:
        if not 0 < header_length <= len(body):
            raise _bad(
                f"Inference-Header-Content-Length is {header_length} but the body has "
                f"{len(body)} bytes"
            )
        header, rest = body[:header_length], memoryview(body)[header_length:]
    try:
        doc = jsonio.loads(header)
    except UnicodeDecodeError:
        raise _bad("malformed JSON: the request header is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise _bad(f"malformed JSON: {exc.msg} (byte {exc.pos})") from None
    if not isinstance(doc, dict):
        raise _bad("an infer request must be a JSON object with an 'inputs' list")
    return doc, rest


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise _bad(f"input {name!r}: shape must be a list of sizes >= 0, got {shape!r}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise _bad(f"input {name!r}: shape {shape} has more than {MAX_ELEMENTS} elements")
    return tuple(shape)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _text(item: bytes) -> str | bytes:
    try:
        return item.decode()
    except UnicodeDecodeError:
        return item


def _bytes_value(shape: tuple[int, ...], items: list[str | bytes]) -> Any:
    return items[0] if len(items) == 1 and len(shape) <= 1 else items


def _split_bytes(name: str, raw: memoryview, count: int) -> list[str | bytes]:
    items: list[str | bytes] = []
    at = 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise _bad(f"input {name!r}: BYTES data ends inside an element's length")
        (size,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + size > len(raw):
            raise _bad(f"input {name!r}: BYTES element of {size} bytes runs past its data")
        items.append(_text(bytes(raw[at : at + size])))
        at += size
    if len(items) != count:
        raise _bad(f"input {name!r}: {len(items)} BYTES elements for a shape of {count}")
    return items


def _tensor(spec: Any, rest: memoryview, at: int) -> tuple[str, Any, int]:
    """One input tensor: its name, its value, and where the next binary input starts."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _bad("each input must be an object with a name, a datatype, a shape and data")
    name: str = spec["name"]
    datatype = spec.get("datatype")
    shape = _shape(name, spec.get("shape"))
    count = math.prod(shape)
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise _bad(f"input {name!r}: parameters must be an object")
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _bad(f"input {name!r}: binary_data_size must be a byte count")
        if at + size > len(rest):
            raise _bad(
                f"input {name!r}: binary_data_size {size} runs past the body's "
                f"{len(rest) - at} remaining bytes"
            )
        raw = rest[at : at + size]
        at += size
    elif "data" not in spec:
        raise _bad(f"input {name!r}: no data and no binary_data_size")
    if datatype == "BYTES":
        if size is not None:
            items = _split_bytes(name, raw, count)
        else:
            items = [_json_bytes(name, item) for item in _flatten(spec["data"])]
            if len(items) != count:
                raise _bad(f"input {name!r}: {len(items)} elements for shape {list(shape)}")
        return name, _bytes_value(shape, items), at
    dtype = _NUMERIC.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        known = ", ".join([*_NUMERIC, "BYTES"])
        raise _bad(f"input {name!r}: datatype must be one of {known}, got {datatype!r}")
    if size is not None:
        if size != count * dtype.itemsize:
            raise _bad(
                f"input {name!r}: {size} bytes of {datatype} for shape {list(shape)} "
                f"(expected {count * dtype.itemsize})"
            )
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    elif shape == () and (scalar := _scalar(name, datatype, spec["data"])) is not None:
        return name, scalar, at  # a job's scalar, as a Python number: no array made
    else:
        flat = _flatten(spec["data"])
        if len(flat) != count:
            raise _bad(f"input {name!r}: {len(flat)} elements for shape {list(shape)}")
        if not all(isinstance(x, (int, float)) for x in flat):
            raise _bad(f"input {name!r}: {datatype} data must be numbers")
        try:
            array = np.asarray(flat, dtype=dtype).reshape(shape)
        except (OverflowError, ValueError) as exc:
            raise _bad(f"input {name!r}: data does not fit {datatype}: {exc}") from None
    return name, (array.item() if shape == () else array), at


def _scalar(name: str, datatype: Any, data: Any) -> int | float | bool | None:
    """A shape ``[]`` tensor's one JSON value, checked, without numpy (None: not a plain
    number, left to the array path and its messages)."""
    value = data[0] if isinstance(data, list) and len(data) == 1 else data
    kind = type(value)
    if datatype == "BOOL":
        return bool(value) if kind is bool else None
    if kind is int and datatype in _INT_RANGE:
        low, high = _INT_RANGE[datatype]
        number: int = value
        if not low <= number <= high:
            raise _bad(f"input {name!r}: {number} does not fit {datatype}")
        return number
    if kind in (int, float) and datatype in ("FP16", "FP32", "FP64"):
        return float(value)
    return None


def _json_bytes(name: str, item: Any) -> str | bytes:
    if not isinstance(item, str):
        raise _bad(f"input {name!r}: BYTES data must be strings, got {type(item).__name__}")
    return item


def _requested(doc: dict[str, Any]) -> tuple[tuple[str, ...] | None, frozenset[str]]:
    outputs = doc.get("outputs")
    if outputs is None:
        return None, frozenset()
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
    ):
        raise _bad("outputs must be a list of {name, parameters} objects")
    binary = frozenset(
        o["name"] for o in outputs if (o.get("parameters") or {}).get("binary_data") is True
    )
    return tuple(o["name"] for o in outputs), binary


def parse_infer(body: bytes | bytearray | memoryview, header_length: int | None) -> InferRequest:
    """An infer request's body (``header_length``: the binary extension's header size)."""
    doc, rest = _header(body, header_length)
    specs = doc.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise _bad("an infer request needs a non-empty 'inputs' list")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise _bad("an infer request's parameters must be an object")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _bad("an infer request's id must be a string")
    inputs: dict[str, Any] = {}
    at = 0
    for spec in specs:
        name, value, at = _tensor(spec, rest, at)
        if name in inputs:
            raise _bad(f"input {name!r} is given twice")
        inputs[name] = value
    if at != len(rest):
        raise _bad(f"{len(rest) - at} bytes of binary data after the last input's")
    outputs, binary = _requested(doc)
    return InferRequest(
        id=request_id,
        inputs=inputs,
        parameters=parameters,
        outputs=outputs,
        binary=binary,
        binary_all=parameters.get("binary_data_output") is True,
    )


def objective_fields(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``deadline_ms``, ``priority`` and ``on_miss`` from a request's parameters, for
    :meth:`~compass.objective.Objective.from_wire`: the protocol's own ``timeout``
    (microseconds) is a deadline where no ``deadline_ms`` is given, and its ``priority`` is
    compass's (higher runs first)."""
    fields = {k: parameters[k] for k in ("deadline_ms", "priority", "on_miss") if k in parameters}
    timeout = parameters.get("timeout")
    if "deadline_ms" not in fields and timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise _bad(f"timeout must be a number of microseconds, got {timeout!r}")
        fields["deadline_ms"] = timeout / 1000.0
    return fields


def _as_array(name: str, value: Any) -> np.ndarray[Any, Any]:
    if isinstance(value, np.ndarray):
        return value
    numpy = getattr(value, "numpy", None)
    if callable(numpy) and hasattr(value, "detach"):  # a torch tensor
        return np.asarray(value.detach().cpu().numpy())
    if isinstance(value, (str, bytes)):
        return np.array([value], dtype=object)
    if isinstance(value, (bool, int, float, np.generic)):
        return np.asarray(value)
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (str, bytes)) for v in value):
            return np.array(value, dtype=object)
        array = np.asarray(value)
        if array.dtype.kind in "biuf":
            return array
    raise HttpError(
        500, f"output {name!r} is a {type(value).__name__}, which is not a tensor, a number "
        "or a string"
    )  # fmt: skip


def _datatype(name: str, array: np.ndarray[Any, Any]) -> str:
    if array.dtype.kind in "OUS":
        return "BYTES"
    found = _BY_KIND.get((array.dtype.kind, array.dtype.itemsize))
    if found is None:
        raise HttpError(500, f"output {name!r} has dtype {array.dtype}, which has no datatype")
    return found


_PLAIN = (int, float, bool)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _plain(name: str, value: int | float | bool) -> dict[str, Any]:
    if type(value) is bool:
        datatype = "BOOL"
    elif type(value) is float:
        datatype = "FP64"
    elif _INT64[0] <= value <= _INT64[1]:
        datatype = "INT64"
    else:
        raise HttpError(500, f"output {name!r}: {value} does not fit INT64")
    return {"name": name, "datatype": datatype, "shape": [], "data": [value]}


def _encode_bytes(array: np.ndarray[Any, Any]) -> list[bytes]:
    items = []
    for item in array.reshape(-1):
        items.append(item if isinstance(item, bytes) else str(item).encode())
    return items


def _outputs(value: Any, default_name: str) -> dict[str, Any]:
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        return value
    return {default_name: value}


def encode_answer(
    model: str, job_id: str, value: Any, request: InferRequest, default_name: str = "output"
) -> tuple[bytes, list[bytes | memoryview]]:
    """The infer response for ``value``, in parts sent one after another: its JSON (with
    binary outputs, the header whose length is the ``Inference-Header-Content-Length`` to
    send), then each binary output's bytes (none: a JSON answer), a numeric one a view of its
    array's memory where the array is contiguous and of its datatype already, not a copy."""
    outputs = _outputs(value, default_name)
    names = tuple(outputs) if request.outputs is None else request.outputs
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name in names:
        if name not in outputs:
            raise _bad(f"no output {name!r} (the job gave {', '.join(map(repr, outputs))})")
        value = outputs[name]
        if type(value) in _PLAIN and not (request.binary_all or name in request.binary):
            tensors.append(_plain(name, value))  # a Python number: no array made
            continue
        array = _as_array(name, value)
        datatype = _datatype(name, array)
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if request.binary_all or name in request.binary:
            raw: bytes | memoryview
            if datatype == "BYTES":
                raw = b"".join(struct.pack("<I", len(b)) + b for b in _encode_bytes(array))
            else:  # the array's bytes as they are (a copy only where it is not contiguous)
                contiguous = np.ascontiguousarray(array, dtype=_NUMERIC[datatype])
                raw = contiguous.reshape(-1).view(np.uint8).data
            tensor["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif datatype == "BYTES":
            tensor["data"] = [_text(b) if isinstance(b, bytes) else b for b in _encode_bytes(array)]
            if any(isinstance(d, bytes) for d in tensor["data"]):
                raise HttpError(500, f"output {name!r} is not UTF-8: ask for it as binary data")
        else:
            tensor["data"] = array.reshape(-1).tolist()
        tensors.append(tensor)
    header = jsonio.dumps({"model_name": model, "id": request.id or job_id, "outputs": tensors})
    return header, blobs
